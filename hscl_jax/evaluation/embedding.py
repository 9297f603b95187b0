"""Embeddings of a trained run: its encoder restored from the workdir, the L2-normalised
features of any source computed on every device, and the .npz that `python -m
hscl_jax.embed` writes.

The features are the kNN monitor's: the same feature function (`eval_features.make_feature_fn`),
the same evaluation preprocessing (resize to `config.augment.image_size` and normalise),
the same batch size (`config.knn.batch_size`, rounded up to a multiple of the devices).
One pass over the images, no state kept between batches: an interrupted embedding is
simply rerun (ResNet-18 on the 60,000 CIFAR-10 images takes about a minute on one GPU).
"""

from __future__ import annotations

from collections.abc import Callable
import dataclasses
import itertools
import os
import time
from typing import Any

from absl import logging
import jax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from ml_collections import config_dict
import numpy as np

from hscl_jax import data
from hscl_jax import errors
from hscl_jax import models
from hscl_jax import parallel
from hscl_jax import progress
from hscl_jax.data import augment
from hscl_jax.evaluation import features as eval_features
from hscl_jax.rundir import atomic
from hscl_jax.rundir import trained_run

SPLITS = ('train', 'test')


class EmbedError(errors.UserError, ValueError):
  """Input that embedding cannot use (names the value and the fix)."""


@dataclasses.dataclass(frozen=True)
class TrainedEncoder:
  """A run's restored encoder (and projection head, when asked for)."""

  config: config_dict.ConfigDict
  step: int
  model: models.ContrastiveModel
  variables: dict[str, Any]
  augment_params: augment.AugmentParams

  @property
  def image_size(self) -> int:
    return self.augment_params.image_size


def restore(
  workdir: str,
  config: config_dict.ConfigDict,
  *,
  checkpoint_step: trained_run.Checkpoint = None,
  with_head: bool = False,
) -> TrainedEncoder:
  """The encoder of `workdir`'s checkpoint (default: the newest that restores; a damaged
  newer one is skipped), with the projection head when `with_head`."""
  model = models.create_model(config.model)
  params = augment.AugmentParams.from_config(config.augment)
  size = params.image_size
  modules = ('encoder', 'head') if with_head else ('encoder',)
  step, variables = trained_run.restore_usable_encoder(
    workdir, checkpoint_step, model, (size, size, 3), modules
  )
  return TrainedEncoder(config, step, model, variables, params)


def folder_source(folder: str, image_size: int) -> data.ImageFilesSource:
  """Every image under `folder` (headers read now: an unreadable file is refused here,
  naming it), each centre-cropped and resized to `image_size`, as the run's images were."""
  source = data.ImageFilesSource(*data.list_image_files(folder), image_size=image_size)
  other = {size: n for size, n in source.file_sizes.items() if size != (image_size, image_size)}
  if other:
    (width, height), _ = max(other.items(), key=lambda item: item[1])
    side = f'{image_size}x{image_size}'
    logging.info(
      '%d of the %d images of %s are not %s (e.g. %dx%d): each is centre-cropped to a square '
      "and resized to %s, the run's config.augment.image_size.",
      sum(other.values()),
      len(source),
      folder,
      side,
      width,
      height,
      side,
    )
  return source


def split_source(config: config_dict.ConfigDict, split: str):
  """The run's own train or test split, as training and the kNN monitor read it."""
  if split not in SPLITS:
    raise EmbedError(f'--split={split!r} is not a split of the run; use train or test.')
  train, test = data.run_sources(config)
  return train if split == 'train' else test


def _progress_check(total: int, batch_size: int) -> Callable[[], None]:
  """The check the extraction calls before each batch: the progress line of the images
  embedded, at most every progress.EVERY_SECONDS."""
  line = progress.ProgressLine(total, unit='image', every_seconds=progress.EVERY_SECONDS)
  batches = itertools.count()

  def check() -> None:
    line.update(min(next(batches) * batch_size, total), head='embedding')

  return check


def compute_features(
  encoder: TrainedEncoder, source, *, projections: bool = False
) -> tuple[np.ndarray, np.ndarray]:
  """(L2-normalised features [N, D], labels [N]) of `source` in its order, sharded over
  every device: the backbone's (the kNN monitor's), or the projection head's."""
  mesh = parallel.make_mesh()
  batch_size = -(-encoder.config.knn.batch_size // mesh.size) * mesh.size
  feature_fn = eval_features.make_feature_fn(
    encoder.model, encoder.augment_params, mesh, projections=projections
  )
  # Restored onto one device; the feature function wants them replicated over the mesh.
  variables = jax.device_put(encoder.variables, NamedSharding(mesh, P()))
  features, labels, mask = eval_features.extract_features(
    feature_fn, variables, source, batch_size, mesh, check=_progress_check(len(source), batch_size)
  )
  return features[mask], labels[mask]


def _write_npz(path: str, arrays: dict[str, np.ndarray]) -> None:
  """Writes atomically (a partial file never has the final name)."""
  directory = os.path.dirname(os.path.abspath(path))
  os.makedirs(directory, exist_ok=True)
  atomic.write(path, lambda f: np.savez(f, **arrays))  # a file object: no suffix appended


def _check_request(out: str, folder: str | None, split: str | None) -> None:
  if (folder is None) == (split is None):
    raise EmbedError(
      "pass exactly one of --folder=DIR (your images) and --split=train|test (the run's "
      f'own data); got folder={folder!r}, split={split!r}.'
    )
  if not out.endswith('.npz'):
    raise EmbedError(f'--out={out!r} must name a .npz file, e.g. --out=embeddings.npz.')


def embed(
  workdir: str,
  out: str,
  *,
  folder: str | None = None,
  split: str | None = None,
  projections: bool = False,
  checkpoint_step: trained_run.Checkpoint = None,
) -> dict[str, Any]:
  """Writes OUT.npz: `features` (float32 [N, D], L2-normalised), `labels` (int32 [N]; -1
  where unknown), `class_names`, `checkpoint_step`, and `paths` (folder) or `indices` and
  `split` (split: row i is example i of the split as the run reads it). Inputs are checked
  before any work. Returns a summary."""
  _check_request(out, folder, split)
  config = trained_run.load_run_config(workdir)
  trained_run.resolve_step(workdir, checkpoint_step)  # no checkpoint: one line, now
  image_size = augment.AugmentParams.from_config(config.augment).image_size
  source = folder_source(folder, image_size) if folder is not None else split_source(config, split)
  encoder = restore(workdir, config, checkpoint_step=checkpoint_step, with_head=projections)
  what = 'projection-head outputs' if projections else 'backbone features'
  logging.info('embedding %d images (%s, checkpoint step %d)', len(source), what, encoder.step)
  start = time.perf_counter()
  features, labels = compute_features(encoder, source, projections=projections)
  arrays = {
    'features': features.astype(np.float32),
    'labels': labels.astype(np.int32),
    'class_names': np.asarray(
      source.class_names if folder is not None else data.class_names(config.dataset, source), str
    ),
  }
  # What the file was made from: the checkpoint, and the images (their paths, or the split).
  arrays['checkpoint_step'] = np.int64(encoder.step)
  if folder is not None:
    arrays['paths'] = np.asarray(source.paths, str)
  else:
    arrays['indices'] = np.arange(len(source), dtype=np.int64)
    arrays['split'] = np.asarray(split, str)
  if jax.process_index() == 0:
    _write_npz(out, arrays)
  return {
    'out': out,
    'num_images': len(features),
    'dim': features.shape[1],
    'what': what,
    'checkpoint_step': encoder.step,
    'seconds': time.perf_counter() - start,
  }
