"""A resumed run must be the run that was started: compare with DIR/config.json.

Rerunning on a workdir with checkpoints continues that run, so a config that differs
from the stored one in anything that shapes the result (method, batch size, schedule,
model, data, ...) is refused, listing the differences and the fix. Fields that cannot
change the trained model may change freely (those config/fields declares `free`); a
deliberate change (e.g. extending num_epochs) is allowed by naming the fields.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from absl import logging
from etils import epath
from flax import traverse_util
import ml_collections

from hscl_jax import errors
from hscl_jax.config import fields
from hscl_jax.rundir import layout
from hscl_jax.rundir import metrics
from hscl_jax.rundir import versions


class ConfigChangedError(errors.UserError, ValueError):
  """The config differs from the one the workdir was trained with: `problem` (which run,
  which fields) and `fix`, in `python -m hscl_jax.main`'s flags (a program without them
  raises it again with its own fix)."""

  def __init__(self, problem: str, fix: str):
    super().__init__(f'{problem} Fix: {fix}')
    self.problem = problem


def _flatten(tree: dict[str, Any]) -> dict[str, Any]:
  """{dotted field: value}, as rundir/versions reads a stored config."""
  return traverse_util.flatten_dict(tree, sep='.')


def is_free(field: str, allowed=()) -> bool:
  """Whether `field` (dotted) cannot change the trained model, or is one of `allowed`."""
  return any(field == f or field.startswith(f + '.') for f in (*fields.FREE_FIELDS, *allowed))


def differences(stored: dict[str, Any], current: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
  """{dotted field: (stored value, current value)} of the fields both have that differ.

  `stored` is migrated to the current format first (rundir/versions: a model field an
  older run lacks is what it trained with, and is compared). A field only one of them has
  otherwise comes from another version of hscl_jax (a field added or removed since the run
  started); it does not stop the run from resuming.
  """
  old, new = _flatten(versions.migrate_config(stored)), _flatten(current)
  return {
    field: (old[field], new[field])
    for field in sorted(old.keys() & new.keys())
    if old[field] != new[field]
  }


def as_resumed(workdir: str, config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """`config` as the workdir's run continues: a field its config.json lacks whose
  declaration states what the run trained with then (versions.absent_values, e.g. no
  online probe for a run stored before it) keeps that, whatever `config` says (the
  checkpoints hold no state for it); keep_best left at its default keeps what the run was
  started with (`_stored_keep_best`)."""
  stored = _stored(workdir)
  if stored is None:
    return config
  held = _held_absent_fields(stored, config)
  keep_best = _stored_keep_best(stored, config)
  if not held and keep_best is None:
    return config
  config = copy.deepcopy(config)
  config.update_from_flattened_dict(held)
  for field, value in held.items():
    logging.info(
      'The run in %s was stored without config.%s: it continues with %s=%r.',
      workdir,
      field,
      field,
      value,
    )
  if keep_best is not None:
    config.keep_best = keep_best
    logging.info(
      'The run in %s keeps the checkpoints it kept: keep_best=%r (--config.keep_best=NAME '
      'changes it).',
      workdir,
      keep_best,
    )
  return config


def _held_absent_fields(stored: dict[str, Any], config) -> dict[str, Any]:
  """{dotted field: what the run trained with} of the fields the stored config lacks, as
  migrated (a model field it fills is compared instead), that a resumed run may not change
  (a free field changes at will: keep_best, `_stored_keep_best`) and `config` gives another
  value of."""
  absent = versions.absent_values(versions.migrate_config(stored))
  return {
    field: value
    for field, value in absent.items()
    if not is_free(field) and fields.value_of(config, field) != value
  }


def _stored(workdir: str) -> dict[str, Any] | None:
  """DIR/config.json as written (None: none, or not a JSON object: check_unchanged's case)."""
  path = epath.Path(workdir) / layout.CONFIG_FILE
  try:
    stored = json.loads(path.read_text()) if path.exists() else None
  except json.JSONDecodeError:
    return None
  return stored if isinstance(stored, dict) else None


def _stored_keep_best(stored: dict[str, Any], config: ml_collections.ConfigDict) -> str | None:
  """The stored keep_best a resumed run whose config leaves the field at its default
  ('auto') continues with: a run started with another value, or stored before 'auto' was
  the default (none kept: '', the field's `absent` where it lacks the field), resumes
  keeping what it kept. None: nothing to change."""
  default = fields.FIELDS['keep_best'].default
  kept = stored.get('keep_best', fields.FIELDS['keep_best'].absent)
  if config.keep_best != default or kept == default:
    return None
  return kept


def check_unchanged(
  workdir: str, config: ml_collections.ConfigDict, *, allowed: tuple[str, ...] = ()
) -> None:
  """Raises ConfigChangedError if `config` differs from DIR/config.json in a field that is
  neither free nor `allowed` (dotted names; a section name allows all its fields)."""
  path = epath.Path(workdir) / layout.CONFIG_FILE
  if not path.exists():
    return
  try:
    stored = json.loads(path.read_text())
  except json.JSONDecodeError:
    return  # unreadable (an older, torn write): nothing to compare with; it is rewritten
  changed = {
    f: v
    for f, v in differences(stored, metrics.config_as_json(config)).items()
    if not is_free(f, allowed)
  }
  if not changed:
    return
  listed = '; '.join(
    f'{f}: {json.dumps(old)} -> {json.dumps(new)}' for f, (old, new) in changed.items()
  )
  # A model field the run's config.json lacks (it predates the field): the run continues
  # only as trained, so the fix names that value, not a deliberate change.
  migrated = versions.added_by_migration(stored)
  as_trained = [f'--config.{f}={old}' for f, (old, _) in changed.items() if f in migrated]
  if as_trained:
    raise ConfigChangedError(
      f'workdir {workdir} holds a run trained before this field existed ({listed}).',
      f'resume it as it was trained, add {" ".join(as_trained)}; or use a new --workdir',
    )
  raise ConfigChangedError(
    f'workdir {workdir} holds a run trained with another config ({listed}).',
    'use a new --workdir, or, to change it deliberately (e.g. more epochs), '
    f'add --allow_config_change={",".join(changed)}',
  )
