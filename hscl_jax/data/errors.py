"""Errors of the input pipeline, each with a message that says what to do."""

from __future__ import annotations

from hscl_jax.errors import UserError


class UnknownDatasetError(UserError, ValueError):
  """The dataset name is not one of hscl_jax.data.DATASETS."""


class DatasetNotPreparedError(UserError, FileNotFoundError):
  """A TFDS dataset has no prepared array_record files under data_dir."""


class ImageFolderError(UserError, ValueError):
  """An image folder is missing, empty, badly laid out or has an unreadable file."""


class PreparationError(UserError, RuntimeError):
  """A TFDS dataset cannot be prepared: TensorFlow missing, or no archive in manual_dir."""
