"""Dataset registry: names -> random-access sources and their metadata."""

from __future__ import annotations

import dataclasses

import numpy as np

from hscl_jax.config.choices import DATASETS
from hscl_jax.data import arrays
from hscl_jax.data import image_folder
from hscl_jax.data import tfds_sources
from hscl_jax.data.errors import ImageFolderError
from hscl_jax.data.errors import UnknownDatasetError
from hscl_jax.errors import fail

# Default cap on a split decoded into memory (config.decode_cache_gib).
DEFAULT_CACHE_BYTES = 2 * 2**30

SPLITS = {
  'digits': ('train', 'test'),
  'image_folder': ('train', 'test'),
  **{name: spec.splits for name, spec in tfds_sources.TFDS_DATASETS.items()},
}


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
  """Static facts about a dataset; split_sizes covers every available split."""

  name: str
  num_classes: int
  image_shape: tuple[int, int, int]
  split_sizes: dict[str, int]
  unlabelled_splits: tuple[str, ...] = ()


# Names of the classes of datasets whose sources carry none (image folders name theirs).
KNOWN_CLASS_NAMES = {
  'digits': tuple('0123456789'),
  'cifar10': (
    'airplane', 'automobile', 'bird', 'cat', 'deer', 'dog', 'frog', 'horse', 'ship', 'truck',
  ),
  'stl10': ('airplane', 'bird', 'car', 'cat', 'deer', 'dog', 'horse', 'monkey', 'ship', 'truck'),
}  # fmt: skip


def class_names(dataset: str, source) -> list[str]:
  """The class names of a source of `dataset`: its own (`source.class_names`), the known
  ones, or the class indices as text."""
  own = getattr(source, 'class_names', None)
  if own:
    return list(own)
  return list(KNOWN_CLASS_NAMES.get(dataset, map(str, range(source.num_classes))))


def check_name(name: str) -> None:
  if name not in DATASETS:
    raise UnknownDatasetError(f"unknown dataset '{name}'; valid names: {', '.join(DATASETS)}")


def get_source(
  name: str,
  split: str,
  *,
  data_dir: str | None = None,
  seed: int = 0,
  folder: str | None = None,
  folder_image_size: int = image_folder.DEFAULT_IMAGE_SIZE,
  num_examples: int | None = None,
  cache_bytes: int = DEFAULT_CACHE_BYTES,
):
  """A random-access source: ``len(source)``, ``source[i] -> {'image', 'label'}``.

  Sources also have ``num_classes``, ``image_shape`` and ``labels()`` (int32 [N]).

  Args:
    name: one of DATASETS.
    split: 'train' | 'test' | 'unlabelled' (stl10 only; labels are -1).
    data_dir: TFDS data directory (default: $TFDS_DATA_DIR or ~/tensorflow_datasets).
    seed: seed of the train/test split of digits and of image folders without
      train/ and test/ sub-folders. Keep it fixed across runs to compare them.
    folder: root of the image folder (image_folder only).
    folder_image_size: side every image_folder image is resized/cropped to.
    num_examples: keep only this many examples, spread evenly over the classes and drawn
      by `seed` (`arrays.balanced_subset`); None keeps the whole split.
    cache_bytes: a split of image files or TFDS records whose decoded uint8 size is at most
      this is decoded once, in parallel, and then served from memory; a larger one is read
      lazily. 0 always reads lazily.
  """
  source = _lazy_source(
    name, split, data_dir=data_dir, seed=seed, folder=folder, folder_image_size=folder_image_size
  )
  return _subset_and_cache(source, num_examples, seed, cache_bytes, f'{name} {split}')


def _subset_and_cache(source, num_examples: int | None, seed: int, cache_bytes: int, name: str):
  if num_examples is not None:
    indices = arrays.balanced_subset(source.labels(), num_examples, seed)
    source = arrays.SubsetSource(source, indices)
  if not isinstance(source, arrays.ArraySource) and arrays.decoded_bytes(source) <= cache_bytes:
    source = arrays.load_into_memory(source, name=name)
  return source


def _lazy_source(name, split, *, data_dir, seed, folder, folder_image_size):
  check_name(name)
  if split not in SPLITS[name]:
    raise ValueError(f"'{name}' has no split '{split}'; valid: {list(SPLITS[name])}")
  if name == 'digits':
    return arrays.digits_source(split, seed)
  if name == 'image_folder':
    if folder is None:
      raise ImageFolderError("dataset 'image_folder' needs folder=<root of the class folders>")
    return image_folder.ImageFolderSource(folder, split, seed=seed, image_size=folder_image_size)
  return tfds_sources.TfdsSource(name, split, data_dir)


def run_sources(config) -> tuple:
  """(train source, test source) of a run's config, as training and evaluation read them.

  The train split is a class-balanced subset of `config.train_examples` examples when set
  (drawn by `config.split_seed`, so every method and seed of a comparison shares it); the
  test split is always whole. Image folders are read at `config.augment.image_size`.
  """
  kwargs = dict(
    data_dir=config.data_dir,
    seed=config.split_seed,
    folder=config.folder,
    folder_image_size=config.augment.image_size,
  )
  # .get: a config.json written before these fields existed (linear_eval of an old run).
  cache_bytes = int(config.get('decode_cache_gib', DEFAULT_CACHE_BYTES / 2**30) * 2**30)
  num_examples = config.get('train_examples') or None  # 0, like None, is the whole split
  train = _lazy_source(config.dataset, config.train_split, **kwargs)
  if num_examples is not None:
    num_classes = len(np.unique(train.labels()))
    if not num_classes <= num_examples <= len(train):
      fail(
        'train_examples',
        f'{num_examples} is not between the {num_classes} classes and the '
        f'{len(train)} examples of the {config.dataset} {config.train_split} split',
        f'use a value in [{num_classes}, {len(train)}], or 0 for the whole split',
      )
  name = f'{config.dataset} {config.train_split}'
  train = _subset_and_cache(train, num_examples, config.split_seed, cache_bytes, name)
  test = get_source(config.dataset, config.test_split, **kwargs, cache_bytes=cache_bytes)
  return train, test


def dataset_info(
  name: str,
  *,
  data_dir: str | None = None,
  seed: int = 0,
  folder: str | None = None,
  folder_image_size: int = image_folder.DEFAULT_IMAGE_SIZE,
) -> DatasetInfo:
  """Number of classes, image shape and split sizes (TFDS: from the prepared metadata)."""
  check_name(name)
  if name in tfds_sources.TFDS_DATASETS:
    builder = tfds_sources.prepared_builder(name, data_dir)
    return DatasetInfo(
      name=name,
      num_classes=builder.info.features['label'].num_classes,
      image_shape=tuple(builder.info.features['image'].shape),
      split_sizes={
        split: builder.info.splits[split].num_examples
        for split in tfds_sources.TFDS_DATASETS[name].splits
        if split in builder.info.splits
      },
      unlabelled_splits=tfds_sources.TFDS_DATASETS[name].unlabelled_splits,
    )
  splits = {
    split: get_source(
      name, split, data_dir=data_dir, seed=seed, folder=folder, folder_image_size=folder_image_size
    )
    for split in SPLITS[name]
  }
  train = splits['train']
  return DatasetInfo(
    name=name,
    num_classes=train.num_classes,
    image_shape=train.image_shape,
    split_sizes={split: len(source) for split, source in splits.items()},
  )
