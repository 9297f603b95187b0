"""Dataset registry: names -> random-access sources and their metadata."""

from __future__ import annotations

import dataclasses

from hscl_jax.data import arrays
from hscl_jax.data import image_folder
from hscl_jax.data import tfds_sources
from hscl_jax.data.errors import ImageFolderError
from hscl_jax.data.errors import UnknownDatasetError

DATASETS = ('digits', 'cifar10', 'cifar100', 'stl10', 'image_folder')
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
  """
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
