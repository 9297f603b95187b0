"""A trained run read back from its workdir: its resolved config (DIR/config.json), the
checkpoint step to use, and its encoder (and head) restored from that checkpoint, a damaged
newest checkpoint skipped. What linear evaluation, the embeddings, inspection and the
export start from."""

from __future__ import annotations

import os
from typing import Any

from absl import logging
import jax
from ml_collections import config_dict

from hscl_jax import errors
from hscl_jax import models
from hscl_jax.rundir import checkpoints
from hscl_jax.rundir import layout
from hscl_jax.rundir import versions


class LinearEvalError(errors.UserError, RuntimeError):
  """A workdir, config or checkpoint that linear evaluation cannot use (names the path)."""


def load_run_config(workdir: str) -> config_dict.ConfigDict:
  path = os.path.join(workdir, layout.CONFIG_FILE)
  if not os.path.isfile(path):
    raise LinearEvalError(
      f'{path} not found: --workdir must be the directory of a training run '
      '(python -m hscl_jax.main --workdir=DIR writes it), or pass --config=FILE.'
    )
  return config_dict.ConfigDict(versions.read_config(path))


def resolve_step(workdir: str, step: int | None) -> int:
  steps = checkpoints.finished_steps(workdir)
  where = checkpoints.directory(workdir)
  if not steps:
    raise LinearEvalError(f'no checkpoint in {where}: train first (python -m hscl_jax.main).')
  if step is None:
    return steps[-1]
  if step not in steps:
    raise LinearEvalError(f'no checkpoint for step {step} in {where}; available: {steps}.')
  return step


def restore_encoder(
  workdir: str,
  step: int,
  model: models.ContrastiveModel,
  image_shape: tuple[int, int, int],
  modules: tuple[str, ...] = ('encoder',),
) -> dict[str, Any]:
  """Model variables holding only the entries of `modules` (the encoder by default; add
  'head' for the projection head), restored onto the default device."""
  abstract = jax.eval_shape(lambda: models.initialize(model, jax.random.key(0), image_shape))
  target = {
    collection: {module: abstract[collection][module] for module in modules}
    for collection in ('params', 'batch_stats')
  }
  try:
    return checkpoints.restore_subtree(workdir, step, target)
  except checkpoints.RestoreError as e:
    raise LinearEvalError(str(e)) from e


def restore_usable_encoder(
  workdir: str,
  step: int | None,
  model: models.ContrastiveModel,
  image_shape: tuple[int, int, int],
  modules: tuple[str, ...] = ('encoder',),
) -> tuple[int, dict[str, Any]]:
  """(step, encoder variables) of checkpoint `step`, or by default of the newest one that
  restores (a damaged newer one is skipped with a warning). An unusable checkpoint raises
  LinearEvalError listing the steps that can be used. `modules` as `restore_encoder`'s."""
  steps = checkpoints.finished_steps(workdir)
  first = resolve_step(workdir, step)  # raises if there is none, or no such step
  candidates = [first] if step is not None else steps[::-1]
  failed = {}
  for candidate in candidates:
    try:
      variables = restore_encoder(workdir, candidate, model, image_shape, modules)
    except LinearEvalError as e:
      failed[candidate] = e
      continue
    if failed:
      logging.warning(
        'Checkpoint step(s) %s cannot be restored (%s); using step %d.',
        sorted(failed),
        next(iter(failed.values())),
        candidate,
      )
    return candidate, variables
  usable = [
    s for s in steps[::-1] if s not in failed and _restores(workdir, s, model, image_shape, modules)
  ]
  first_step, first_error = next(iter(failed.items()))
  raise LinearEvalError(
    f'checkpoint step {first_step} cannot be used: {first_error} Usable steps: '
    f'{sorted(usable) or "none"}' + (f'; pass --checkpoint_step={usable[0]}.' if usable else '.')
  )


def _restores(workdir, step, model, image_shape, modules) -> bool:
  try:
    restore_encoder(workdir, step, model, image_shape, modules)
  except LinearEvalError:
    return False
  return True
