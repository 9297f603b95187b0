"""rundir/checkpoints: which checkpoint restores and which error is reported when some or
all of several checkpoints are damaged, on a tiny state."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from hscl_jax.rundir import checkpoints
from hscl_jax.rundir import layout


def _tree(step):
  return {'w': jnp.full((3,), float(step), jnp.float32)}


def _saved(workdir, steps):
  checkpointer = checkpoints.Checkpointer(str(workdir), keep=len(steps))
  for step in steps:
    checkpointer.save(step, _tree(step), {'served': step}, {'step': step})
  checkpointer.close()
  assert checkpoints.finished_steps(str(workdir)) == list(steps)


def _damage(workdir, step):
  """Step's input position lost (a file truncated away): the checkpoint no longer restores."""
  for path in (workdir / layout.CHECKPOINT_DIR / str(step) / checkpoints.DATA_ITERATOR).glob(
    'process_*.json'
  ):
    path.unlink()


def _restore_latest(workdir):
  checkpointer = checkpoints.Checkpointer(str(workdir), keep=3)
  try:
    return checkpointer.restore_latest(_tree(0))
  finally:
    checkpointer.close()


def test_the_newest_checkpoint_that_restores_is_taken_and_the_newer_ones_moved_aside(tmp_path):
  _saved(tmp_path, (4, 8, 12))
  for step in (8, 12):
    _damage(tmp_path, step)
  step, state, iterator_state = _restore_latest(tmp_path)
  assert (step, iterator_state) == (4, {'served': 4})
  np.testing.assert_array_equal(state['w'], [4.0] * 3)
  assert checkpoints.finished_steps(str(tmp_path)) == [4]
  unusable = tmp_path / layout.UNUSABLE_DIR
  assert sorted(p.name for p in unusable.iterdir()) == ['12', '8']


def test_when_every_checkpoint_fails_the_newest_ones_error_is_raised_and_none_moved(tmp_path):
  """All unusable: rather a model change or a bug than damage, so nothing is moved; the
  error reported is the newest checkpoint's (the one a rerun would try first)."""
  _saved(tmp_path, (4, 8, 12))
  for step in (4, 8, 12):
    _damage(tmp_path, step)
  with pytest.raises(FileNotFoundError) as raised:
    _restore_latest(tmp_path)
  assert f'{layout.CHECKPOINT_DIR}/12/' in str(raised.value)
  assert all(f'{layout.CHECKPOINT_DIR}/{old}/' not in str(raised.value) for old in (4, 8))
  assert checkpoints.finished_steps(str(tmp_path)) == [4, 8, 12]
  assert not (tmp_path / layout.UNUSABLE_DIR).exists()


def test_a_workdir_without_checkpoints_restores_none(tmp_path):
  assert _restore_latest(tmp_path) is None
