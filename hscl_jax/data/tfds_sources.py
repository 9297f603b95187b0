"""TFDS datasets (CIFAR-10/100, STL-10) read from prepared array_record files.

Reading goes through ``tfds.data_source`` and needs no TensorFlow. Preparing
(download + conversion) is a separate command, ``python -m hscl_jax.prepare``.
Before touching anything that could start a download, we look for the
prepared ``dataset_info.json`` on disk and fail fast with that command.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from hscl_jax.data.errors import DatasetNotPreparedError

# The label of the unlabelled STL-10 split (no class is known).
UNLABELLED = -1


@dataclasses.dataclass(frozen=True)
class TfdsSpec:
  """What we need to know about a TFDS dataset before it is prepared."""

  splits: tuple[str, ...]
  archive: str  # The official archive TFDS looks for in --manual_dir.
  unlabelled_splits: tuple[str, ...] = ()


TFDS_DATASETS = {
  'cifar10': TfdsSpec(('train', 'test'), 'cifar-10-binary.tar.gz'),
  'cifar100': TfdsSpec(('train', 'test'), 'cifar-100-binary.tar.gz'),
  'stl10': TfdsSpec(
    ('train', 'test', 'unlabelled'), 'stl10_binary.tar.gz', unlabelled_splits=('unlabelled',)
  ),
}


def prepare_command(name: str, data_dir: str | None) -> str:
  data_dir_flag = f' --data_dir={data_dir}' if data_dir else ''
  return f'python -m hscl_jax.prepare --dataset={name}{data_dir_flag}'


def not_prepared_message(name: str, data_dir: str | None, looked_at: str) -> str:
  spec = TFDS_DATASETS[name]
  return (
    f"Dataset '{name}' is not prepared: {looked_at} does not exist.\n"
    f"Prepare it once (needs the [prepare] extra: pip install -e '.[prepare]'):\n"
    f'  {prepare_command(name, data_dir)}\n'
    f'On a machine without internet, download {spec.archive} elsewhere, put it in a '
    f'folder and add --manual_dir=THAT_FOLDER to the command.'
  )


def prepared_builder(name: str, data_dir: str | None):
  """The TFDS builder of a prepared dataset; raises DatasetNotPreparedError otherwise.

  ``tfds.builder`` only reads metadata from disk (no network); the download
  could only start in ``download_and_prepare``, which we never call here.
  """
  from etils import epath
  import tensorflow_datasets as tfds  # Local import: tfds is slow to import.

  builder = tfds.builder(name, data_dir=data_dir)
  info_file = epath.Path(builder.data_dir) / 'dataset_info.json'
  if not info_file.exists():
    raise DatasetNotPreparedError(not_prepared_message(name, data_dir, str(info_file)))
  file_format = builder.info.file_format
  if file_format is None or file_format.value != 'array_record':
    raise DatasetNotPreparedError(
      f"Dataset '{name}' in {builder.data_dir} was prepared as "
      f'{getattr(file_format, "value", file_format)}, which cannot be read without '
      f'TensorFlow. Delete that folder (or use another --data_dir) and run:\n'
      f'  {prepare_command(name, data_dir)}'
    )
  return builder


class TfdsSource:
  """Random-access source over one split of a prepared TFDS dataset.

  Items are ``{'image': uint8 [H, W, 3], 'label': int}``; the label is -1 for
  the unlabelled split of STL-10.
  """

  def __init__(self, name: str, split: str, data_dir: str | None = None):
    import tensorflow_datasets as tfds

    spec = TFDS_DATASETS[name]
    if split not in spec.splits:
      raise ValueError(f"'{name}' has no split '{split}'; valid: {list(spec.splits)}")
    builder = prepared_builder(name, data_dir)
    if split not in builder.info.splits:
      raise DatasetNotPreparedError(
        f"Dataset '{name}' in {builder.data_dir} has no prepared split '{split}' "
        f'(found {sorted(builder.info.splits)}). Re-run: {prepare_command(name, data_dir)}'
      )
    self.name = name
    self.split = split
    self.num_classes = builder.info.features['label'].num_classes
    self.image_shape = tuple(builder.info.features['image'].shape)
    self.is_labelled = split not in spec.unlabelled_splits
    # download=False: never start a download from the training job.
    self._data = tfds.data_source(name, split=split, data_dir=data_dir, download=False)
    self._labels = None

  def __len__(self) -> int:
    return len(self._data)

  def __getitem__(self, index: int) -> dict:
    example = self._data[int(index)]
    label = int(example['label']) if self.is_labelled else UNLABELLED
    return {'image': np.asarray(example['image'], np.uint8), 'label': label}

  def labels(self) -> np.ndarray:
    """All labels, int32 [N]. Reads (and decodes) the whole split once, then caches."""
    if self._labels is None and not self.is_labelled:
      self._labels = np.full(len(self), UNLABELLED, np.int32)
    if self._labels is None:
      self._labels = np.array([self[i]['label'] for i in range(len(self))], np.int32)
    return self._labels
