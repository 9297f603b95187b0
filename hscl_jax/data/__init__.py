"""Input pipeline: dataset sources, sharded two-view training batches, eval batches.

Augmentations run on the accelerator and live in :mod:`hscl_jax.augment`.
"""

from __future__ import annotations

from hscl_jax.data.arrays import ArraySource
from hscl_jax.data.arrays import SubsetSource
from hscl_jax.data.arrays import balanced_subset
from hscl_jax.data.arrays import stratified_split
from hscl_jax.data.errors import DatasetNotPreparedError
from hscl_jax.data.errors import ImageFolderError
from hscl_jax.data.errors import UnknownDatasetError
from hscl_jax.data.image_folder import ImageFilesSource
from hscl_jax.data.image_folder import ImageFolderSource
from hscl_jax.data.image_folder import list_image_files
from hscl_jax.data.loaders import POSITIVE_MODES
from hscl_jax.data.loaders import EvalLoader
from hscl_jax.data.loaders import TrainLoader
from hscl_jax.data.sampling import EpochOrder
from hscl_jax.data.sampling import check_samples_per_class
from hscl_jax.data.sampling import epoch_permutation
from hscl_jax.data.sampling import steps_per_epoch
from hscl_jax.data.sources import DATASETS
from hscl_jax.data.sources import SPLITS
from hscl_jax.data.sources import DatasetInfo
from hscl_jax.data.sources import class_names
from hscl_jax.data.sources import dataset_info
from hscl_jax.data.sources import get_source
from hscl_jax.data.sources import run_sources
from hscl_jax.data.tfds_sources import TFDS_DATASETS
from hscl_jax.data.tfds_sources import TfdsSource

__all__ = [
  'ArraySource',
  'SubsetSource',
  'balanced_subset',
  'check_samples_per_class',
  'class_names',
  'DATASETS',
  'DatasetInfo',
  'DatasetNotPreparedError',
  'EpochOrder',
  'EvalLoader',
  'ImageFolderError',
  'ImageFilesSource',
  'ImageFolderSource',
  'POSITIVE_MODES',
  'SPLITS',
  'TFDS_DATASETS',
  'TfdsSource',
  'TrainLoader',
  'UnknownDatasetError',
  'dataset_info',
  'epoch_permutation',
  'get_source',
  'list_image_files',
  'run_sources',
  'steps_per_epoch',
  'stratified_split',
]
