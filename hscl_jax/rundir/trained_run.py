"""A trained run read back from its workdir: its resolved config (DIR/config.json), the
checkpoint step to use, and its encoder (and head) restored from that checkpoint, a damaged
newest checkpoint skipped. What linear evaluation, the embeddings, inspection, retrieval and
the export start from.

Each of those programs takes `--checkpoint=best|latest|STEP` (`CHECKPOINT_HELP`) and
`--checkpoint_step=N`, the same as `--checkpoint=N`; `checkpoint_choice` reads the two into
the `Checkpoint` the evaluations take: 'latest' (or None), 'best' or a step.
"""

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


def load_run_config(workdir: str, *, config_flag: bool = False) -> config_dict.ConfigDict:
  """DIR/config.json; `config_flag`: the program takes --config=FILE instead, and a missing
  file's refusal says so (the others' would name a flag they lack)."""
  path = os.path.join(workdir, layout.CONFIG_FILE)
  if not os.path.isfile(path):
    instead = ', or pass --config=FILE' if config_flag else ''
    raise LinearEvalError(
      f'{path} not found: --workdir must be the directory of a training run '
      f'(python -m hscl_jax.main --workdir=DIR writes it){instead}.'
    )
  return config_dict.ConfigDict(versions.read_config(path))


LATEST, BEST = 'latest', 'best'
Checkpoint = int | str | None  # a step, 'latest' or 'best' (None: 'latest')
CHECKPOINT_HELP = (
  "Checkpoint: 'latest' (the newest that restores; the default), 'best' (the run's best by "
  'config.keep_best) or a step number.'
)
CHECKPOINT_STEP_HELP = 'Checkpoint step; the same as --checkpoint=N.'


def parse_checkpoint(value: str | int | None) -> str | int:
  """'best', 'latest' or a step from `--checkpoint`'s text (None: 'latest')."""
  if value is None:
    return LATEST
  if isinstance(value, int):
    return value
  text = value.strip().lower()
  if text in (LATEST, BEST):
    return text
  if text.isdigit():
    return int(text)
  raise LinearEvalError(
    f'--checkpoint={value} is not a checkpoint. Fix: pass --checkpoint=best, '
    '--checkpoint=latest or a step number (--checkpoint=12).'
  )


def checkpoint_choice(checkpoint: str | None, checkpoint_step: int | None) -> str | int:
  """What `--checkpoint` and `--checkpoint_step` ask for together: one of them, or 'latest'.
  Only the flags are read: the workdir is checked where the checkpoint is restored."""
  if checkpoint is not None and checkpoint_step is not None:
    raise LinearEvalError(
      f'--checkpoint={checkpoint} and --checkpoint_step={checkpoint_step} both given. Fix: '
      f'pass one (--checkpoint_step={checkpoint_step} is --checkpoint={checkpoint_step}).'
    )
  return checkpoint_step if checkpoint_step is not None else parse_checkpoint(checkpoint)


def resolve_step(workdir: str, step: Checkpoint) -> int:
  """The step of checkpoint `step`: an int, 'latest' or None (the newest), or 'best'
  (`checkpoints.best_checkpoint`: the step the run kept as its best by config.keep_best)."""
  steps = checkpoints.finished_steps(workdir)
  where = checkpoints.directory(workdir)
  if not steps:
    raise LinearEvalError(f'no checkpoint in {where}: train first (python -m hscl_jax.main).')
  step = parse_checkpoint(step)
  if step == LATEST:
    return steps[-1]
  if step == BEST:
    return _best_step(workdir, steps)
  if step not in steps:
    raise LinearEvalError(f'no checkpoint for step {step} in {where}; available: {steps}.')
  return step


def _best_step(workdir: str, steps: list[int]) -> int:
  best = checkpoints.best_checkpoint(workdir)
  if best is None:
    raise LinearEvalError(
      f'no best checkpoint in {checkpoints.directory(workdir)}: the run kept none (its '
      f'checkpoints {steps} carry no ranked figure). Fix: pass --checkpoint=latest or a '
      'step, or train with python -m hscl_jax.main ... --config.keep_best=knn_top1 added.'
    )
  return best.step


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


def _candidates(workdir: str, step: Checkpoint) -> list[int]:
  """The steps to try in turn: every one, newest first, for 'latest'; else only `step`."""
  first = resolve_step(workdir, step)  # raises if there is none, no such step or no best
  choice = parse_checkpoint(step)
  if choice == LATEST:
    return checkpoints.finished_steps(workdir)[::-1]
  if choice == BEST:
    best = checkpoints.best_checkpoint(workdir)
    logging.info('The best checkpoint is step %d: %s = %.6g.', best.step, best.metric, best.value)
  return [first]


def restore_usable_encoder(
  workdir: str,
  step: Checkpoint,
  model: models.ContrastiveModel,
  image_shape: tuple[int, int, int],
  modules: tuple[str, ...] = ('encoder',),
) -> tuple[int, dict[str, Any]]:
  """(step, encoder variables) of checkpoint `step` (a step or 'best'), or for 'latest' (and
  None) of the newest one that restores (a damaged newer one is skipped with a warning). An
  unusable checkpoint raises LinearEvalError listing the steps that can be used. `modules`
  as `restore_encoder`'s."""
  steps = checkpoints.finished_steps(workdir)
  candidates = _candidates(workdir, step)
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
