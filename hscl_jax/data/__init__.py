"""Input pipeline: dataset sources, sharded two-view training batches, eval batches.

Augmentations run on the accelerator and live in :mod:`hscl_jax.data.augment`.

Each name is imported from its module on first use, so that `hscl_jax.data.sampling`
(NumPy only: uniform and class-aware epoch orders) works with the core install, as
`hscl_jax.losses` does; the sources and loaders need the `[train]` extra.
"""

from __future__ import annotations

import importlib
from typing import Any

# The public name -> the module of this package that defines it.
_MODULE_OF = {
  'ArraySource': 'arrays',
  'SubsetSource': 'arrays',
  'balanced_subset': 'arrays',
  'stratified_split': 'arrays',
  'DatasetNotPreparedError': 'errors',
  'ImageFolderError': 'errors',
  'UnknownDatasetError': 'errors',
  'ImageFilesSource': 'image_folder',
  'ImageFolderSource': 'image_folder',
  'list_image_files': 'image_folder',
  'POSITIVE_MODES': 'loaders',
  'EvalLoader': 'loaders',
  'TrainLoader': 'loaders',
  'EpochOrder': 'sampling',
  'check_samples_per_class': 'sampling',
  'epoch_permutation': 'sampling',
  'steps_per_epoch': 'sampling',
  'DATASETS': 'sources',
  'SPLITS': 'sources',
  'DatasetInfo': 'sources',
  'class_names': 'sources',
  'dataset_info': 'sources',
  'get_source': 'sources',
  'run_sources': 'sources',
  'TFDS_DATASETS': 'tfds_sources',
  'TfdsSource': 'tfds_sources',
}

__all__ = sorted(_MODULE_OF, key=str.lower)


def __getattr__(name: str) -> Any:
  module = _MODULE_OF.get(name)
  if module is None:
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
  value = getattr(importlib.import_module(f'{__name__}.{module}'), name)
  globals()[name] = value  # later lookups skip this function
  return value


def __dir__() -> list[str]:
  return sorted(set(globals()) | set(_MODULE_OF))
