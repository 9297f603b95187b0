"""Prepares a TFDS dataset (download + conversion to array_record), once per data_dir.

The library behind `python -m hscl_jax.prepare` for CIFAR-10/100 and STL-10. Needs
TensorFlow, which TFDS uses to write the files (pip install -e '.[prepare]'); it is
imported only when a dataset is prepared. Training then reads the array_record files
without TensorFlow (hscl_jax.data.tfds_sources).
"""

from __future__ import annotations

import importlib.util
import os

from hscl_jax.data.errors import PreparationError
from hscl_jax.data.tfds_sources import TFDS_DATASETS

NEEDS_TENSORFLOW = (
  'Preparing a TFDS dataset needs TensorFlow, which is not installed. '
  "Install the extra with:  pip install -e '.[prepare]'"
)


def require_tensorflow() -> None:
  """Raises PreparationError with the install command when TensorFlow is missing (checked
  without importing it)."""
  if importlib.util.find_spec('tensorflow') is None:
    raise PreparationError(NEEDS_TENSORFLOW)


def check_manual_dir(dataset: str, manual_dir: str | None) -> None:
  """With manual_dir, the official archive must be there (else TFDS would try to download)."""
  if manual_dir is None:
    return
  archive = os.path.join(manual_dir, TFDS_DATASETS[dataset].archive)
  if not os.path.isfile(archive):
    raise PreparationError(
      f'--manual_dir={manual_dir} has no {TFDS_DATASETS[dataset].archive}; '
      f'expected the official archive at {archive}'
    )


def prepare(dataset: str, data_dir: str | None = None, manual_dir: str | None = None) -> dict:
  """Downloads (or reads from manual_dir) and writes array_record files; returns split sizes."""
  check_manual_dir(dataset, manual_dir)
  require_tensorflow()
  import tensorflow_datasets as tfds

  builder = tfds.builder(dataset, data_dir=data_dir, file_format='array_record')
  download_config = tfds.download.DownloadConfig(manual_dir=manual_dir)
  builder.download_and_prepare(download_config=download_config, file_format='array_record')
  return {str(split): info.num_examples for split, info in builder.info.splits.items()}
