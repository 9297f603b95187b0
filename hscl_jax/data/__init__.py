"""Input pipeline: dataset sources, sharded two-view training batches, eval batches.

Augmentations run on the accelerator and live in :mod:`hscl_jax.augment`.
"""
from hscl_jax.data.arrays import ArraySource, stratified_split
from hscl_jax.data.errors import DatasetNotPreparedError, ImageFolderError, UnknownDatasetError
from hscl_jax.data.image_folder import ImageFolderSource
from hscl_jax.data.loaders import POSITIVE_MODES, EvalLoader, TrainLoader, steps_per_epoch
from hscl_jax.data.sources import DATASETS, SPLITS, DatasetInfo, dataset_info, get_source
from hscl_jax.data.tfds_sources import TFDS_DATASETS, TfdsSource

__all__ = [
    'ArraySource', 'DATASETS', 'DatasetInfo', 'DatasetNotPreparedError', 'EvalLoader',
    'ImageFolderError', 'ImageFolderSource', 'POSITIVE_MODES', 'SPLITS', 'TFDS_DATASETS',
    'TfdsSource', 'TrainLoader', 'UnknownDatasetError', 'dataset_info', 'get_source',
    'steps_per_epoch', 'stratified_split',
]
