"""rundir/checkpoints: which checkpoint restores and which error is reported when some or
all of several checkpoints are damaged, on a tiny state; the best checkpoint kept besides
the newest by `keep_best`, through a resume and keep=1, against a reference written here:
the newest `keep` steps and the best by the figure (ties to the newer), over the steps
saved so far."""

from __future__ import annotations

import math
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hscl_jax import errors
from hscl_jax.config import choices
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


KNN = checkpoints.KeepBest('knn_top1', 'max')


def _expected_kept(figures: dict[int, float | None], keep: int, mode: str) -> list[int]:
  """The reference: the newest `keep` steps and the best step by its figure (a larger one
  for 'max', a smaller for 'min'; of equal figures the newer)."""
  steps = sorted(figures)
  ranked = [s for s in steps if figures[s] is not None and math.isfinite(figures[s])]
  kept = set(steps[-keep:])
  if ranked:
    sign = 1 if mode == 'max' else -1
    kept.add(max(ranked, key=lambda s: (sign * figures[s], s)))
  return sorted(kept)


def _save_all(workdir, figures: dict[int, float | None], *, keep: int, keep_best):
  checkpointer = checkpoints.Checkpointer(str(workdir), keep=keep, keep_best=keep_best)
  for step, figure in figures.items():
    assert checkpointer.save(
      step, {'w': jnp.full((3,), step, jnp.float32)}, {'at': step}, {}, metric_value=figure
    )
  checkpointer.close()


def test_an_old_best_is_kept_besides_the_newest_and_survives_a_resume(tmp_path):
  first = {1: 0.5, 2: 0.9, 3: None, 4: 0.6, 5: 0.7, 6: 0.8}  # step 2 is best and oldest
  _save_all(tmp_path, first, keep=2, keep_best=KNN)
  assert checkpoints.finished_steps(str(tmp_path)) == _expected_kept(first, 2, 'max') == [2, 5, 6]
  assert checkpoints.best_checkpoint(str(tmp_path)) == checkpoints.Best(2, 'knn_top1', 'max', 0.9)

  # A new Checkpointer on the same directory, as a resumed run builds: step 2 stays.
  second = {7: 0.4, 8: 0.3}
  _save_all(tmp_path, second, keep=2, keep_best=KNN)
  assert checkpoints.finished_steps(str(tmp_path)) == [2, 7, 8]
  assert checkpoints.best_checkpoint(str(tmp_path)).step == 2

  # A better figure takes over; the old best goes, and a best among the newest is one copy.
  third = {9: 0.95}
  _save_all(tmp_path, third, keep=2, keep_best=KNN)
  everything = {**first, **second, **third}
  assert checkpoints.finished_steps(str(tmp_path)) == _expected_kept(everything, 2, 'max')
  assert checkpoints.finished_steps(str(tmp_path)) == [8, 9]
  assert checkpoints.best_checkpoint(str(tmp_path)) == checkpoints.Best(9, 'knn_top1', 'max', 0.95)


def test_keep_1_and_min_mode_keep_at_most_two_and_ties_go_to_the_newer(tmp_path):
  loss = checkpoints.KeepBest.parse('train_loss')
  assert loss == checkpoints.KeepBest('train_loss', 'min')
  figures = {1: 3.0, 2: 1.0, 3: 2.0, 4: 2.5}
  _save_all(tmp_path, figures, keep=1, keep_best=loss)
  assert checkpoints.finished_steps(str(tmp_path)) == _expected_kept(figures, 1, 'min') == [2, 4]
  assert checkpoints.best_checkpoint(str(tmp_path)) == checkpoints.Best(2, 'train_loss', 'min', 1.0)
  _save_all(tmp_path, {5: 1.0}, keep=1, keep_best=loss)  # equal to step 2's: the newer is best
  assert checkpoints.finished_steps(str(tmp_path)) == [5]
  assert checkpoints.best_checkpoint(str(tmp_path)).step == 5


def test_the_same_figures_by_max_and_by_min_keep_opposite_ends(tmp_path):
  figures = {1: 0.2, 2: 0.9, 3: 0.1, 4: 0.5, 5: 0.4}
  for mode in choices.KEEP_BEST_MODES:
    workdir = tmp_path / mode
    _save_all(workdir, figures, keep=1, keep_best=checkpoints.KeepBest('knn_top1', mode))
    assert checkpoints.finished_steps(str(workdir)) == _expected_kept(figures, 1, mode)
  assert checkpoints.finished_steps(str(tmp_path / 'max')) == [2, 5]
  assert checkpoints.finished_steps(str(tmp_path / 'min')) == [3, 5]


def test_a_checkpoint_is_ranked_by_its_own_steps_record_only(tmp_path):
  """A save mid-epoch (a SIGTERM) passes the last epoch's record: it ranks nothing, nor
  does a record without the figure (an epoch without the kNN), nor a NaN."""
  records = {
    5: {'step': 5, 'knn_top1': 0.9, 'train_loss': 2.0},
    7: {'step': 5, 'knn_top1': 0.9},  # saved mid-epoch, after step 5's record
    10: {'step': 10, 'train_loss': 1.5},  # no kNN this epoch
    15: {'step': 15, 'knn_top1': math.nan},
    20: {'step': 20, 'knn_top1': 0.6},
  }
  _save_all(tmp_path, records, keep=1, keep_best=KNN)
  assert checkpoints.finished_steps(str(tmp_path)) == [5, 20]
  entries = {step: KNN.entry(step, record) for step, record in records.items()}
  assert [entries[s]['value'] for s in records] == [0.9, None, None, None, 0.6]
  assert KNN.entry(3, jnp.float32(0.5)) == {'metric': 'knn_top1', 'mode': 'max', 'value': 0.5}
  assert checkpoints.best_checkpoint(str(tmp_path)).step == 5


def test_a_run_resumed_with_another_figure_ranks_by_the_new_one(tmp_path):
  _save_all(tmp_path, {1: 0.9, 2: 0.5}, keep=1, keep_best=KNN)
  probe = checkpoints.KeepBest('probe_top1', 'max')
  _save_all(tmp_path, {3: 0.3, 4: 0.2}, keep=1, keep_best=probe)
  assert checkpoints.finished_steps(str(tmp_path)) == [3, 4]
  assert checkpoints.best_checkpoint(str(tmp_path)) == checkpoints.Best(3, 'probe_top1', 'max', 0.3)


def test_without_keep_best_only_the_newest_are_kept_and_none_is_best(tmp_path):
  _save_all(tmp_path, {1: 0.9, 2: 0.1, 3: 0.2}, keep=2, keep_best=None)
  assert checkpoints.finished_steps(str(tmp_path)) == [2, 3]
  assert checkpoints.best_checkpoint(str(tmp_path)) is None
  assert checkpoints.best_checkpoint(str(tmp_path / 'nothing')) is None


def test_keep_best_is_parsed_from_the_configs_text():
  assert checkpoints.KeepBest.parse(None) is None
  assert checkpoints.KeepBest.parse('') is None
  assert checkpoints.KeepBest.parse('knn_top1') == KNN
  assert checkpoints.KeepBest.parse('knn_top1:min') == checkpoints.KeepBest('knn_top1', 'min')
  assert checkpoints.KeepBest.parse('loss_hscl:max') == checkpoints.KeepBest('loss_hscl', 'max')
  for bad in ('knn_top1:up', ':max'):
    with pytest.raises(errors.ConfigError, match=r'^config\.keep_best: .* Fix: .*\.$'):
      checkpoints.KeepBest.parse(bad)


def test_wiring_finished_steps_in_increasing_order(tmp_path):
  directory = checkpoints.directory(str(tmp_path))
  for name in ('10', '3', '7', '12.orbax-checkpoint-tmp', 'other'):
    (pathlib.Path(str(directory)) / name).mkdir(parents=True)
  assert checkpoints.finished_steps(str(tmp_path)) == [3, 7, 10]


def test_part_of_a_state_restores_from_a_workdir_given_relative_to_the_current_folder(
  tmp_path, monkeypatch
):
  """`--workdir=run` (as a user types it) reads the same entries as the absolute path."""
  _saved(tmp_path / 'run', [5, 7])
  monkeypatch.chdir(tmp_path)
  target = {'w': jax.ShapeDtypeStruct((3,), jnp.float32)}
  restored = checkpoints.restore_subtree('run', 7, target)
  np.testing.assert_array_equal(restored['w'], np.full((3,), 7.0, np.float32))
