"""rundir/run_log: a run's bookkeeping (`RunLog`) in a temporary workdir with a tiny
state and no training: which checkpoint restores, where its epoch stood (`EpochPosition`),
the records and per-step rows cut back to its step, and keep_best's ranking."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from hscl_jax.rundir import checkpoints
from hscl_jax.rundir import metrics
from hscl_jax.rundir import run_log as run_log_lib
from hscl_jax.rundir import timing


class Loader:
  """The input pipeline's position, as a RunLog saves and restores it."""

  def __init__(self, served=0):
    self.served = served

  def get_state(self):
    return {'served': self.served}

  def set_state(self, state):
    self.served = state['served']


def _tree(step):
  """A small state whose values say which step it was saved at."""
  return {'w': jnp.full((3,), float(step), jnp.float32), 'step': jnp.asarray(step, jnp.int32)}


def _target():
  return jax.tree.map(jnp.zeros_like, _tree(0))


def _record(step, **figures):
  return {'epoch': step // 6, 'train_loss': 1.0 / step, **figures}


def test_a_new_workdir_restores_nothing_and_leaves_the_loader_at_its_start(tmp_path):
  run_log, loader = run_log_lib.RunLog(str(tmp_path), keep=2), Loader(served=3)
  restored = run_log.restore(_target(), loader)
  run_log.close()
  assert (restored.step, restored.tree, restored.position) == (0, None, run_log_lib.EpochPosition())
  assert loader.served == 3 and run_log.records == []


def test_the_newest_checkpoint_restores_with_its_loader_position_and_epoch(tmp_path):
  run_log, loader = run_log_lib.RunLog(str(tmp_path), keep=2), Loader()
  run_log.restore(_target(), loader)
  times = timing.EpochTimes(seconds=9.5, steps_timed=4, compile_seconds=3.25, compile_steps=1)
  for step in (6, 12):
    loader.served = step
    run_log.write_record(step, _record(step))
    run_log.save(step, _tree(step), loader, run_log_lib.EpochPosition())
  loader.served = 16  # a SIGTERM mid-epoch 3
  run_log.save(16, _tree(16), loader, run_log_lib.EpochPosition(times=times))
  run_log.close()

  run_log, loader = run_log_lib.RunLog(str(tmp_path), keep=2), Loader()
  restored = run_log.restore(_target(), loader)
  run_log.close()
  assert restored.step == 16 and loader.served == 16
  assert restored.position == run_log_lib.EpochPosition(steps_done=False, times=times)
  np.testing.assert_array_equal(restored.tree['w'], [16.0] * 3)
  assert int(restored.tree['step']) == 16
  assert [r['step'] for r in run_log.records] == [6, 12]


def test_records_and_step_rows_after_the_checkpoint_are_cut_back(tmp_path):
  """A run that died after writing epoch 2's record and steps 8-12's rows, with its last
  checkpoint at step 6: resumed, the files hold what they held at step 6."""
  run_log, loader = run_log_lib.RunLog(str(tmp_path), keep=2), Loader()
  run_log.restore(_target(), loader)
  for step in (2, 4, 6):
    run_log.write_step(step, {'train_loss': float(step)})
  run_log.write_record(6, _record(6))
  run_log.save(6, _tree(6), loader, run_log_lib.EpochPosition())
  for step in (8, 10, 12):
    run_log.write_step(step, {'train_loss': float(step)})
  run_log.write_record(12, _record(12))
  run_log.close()
  assert [r['step'] for r in metrics.read_steps(str(tmp_path))] == [2, 4, 6, 8, 10, 12]

  run_log = run_log_lib.RunLog(str(tmp_path), keep=2)
  assert run_log.restore(_target(), Loader()).step == 6
  run_log.close()
  assert _untimed(metrics.read_metrics(str(tmp_path))) == [{'step': 6, **_record(6)}]
  assert [r['step'] for r in metrics.read_steps(str(tmp_path))] == [2, 4, 6]


def _untimed(rows):
  """The rows without their wall-clock time (rundir/metrics stamps each row; a row rebuilt
  from a checkpoint keeps the time it was first written at), which every row must have."""
  assert all(isinstance(row['time'], float) for row in rows), rows
  return [{k: v for k, v in row.items() if k != 'time'} for row in rows]


def test_an_epoch_end_saved_before_its_record_is_redone(tmp_path):
  """A checkpoint at an epoch's last step taken before its record (SIGTERM during the
  kNN): resumed, the record written after it is dropped, for the resumed run to write."""
  run_log, loader = run_log_lib.RunLog(str(tmp_path), keep=2), Loader()
  run_log.restore(_target(), loader)
  run_log.write_record(6, _record(6))
  run_log.save(6, _tree(6), loader, run_log_lib.EpochPosition())
  run_log.save(12, _tree(12), loader, run_log_lib.EpochPosition(steps_done=True))
  run_log.write_record(12, _record(12))  # the stopped run got this far after its checkpoint
  run_log.close()

  run_log = run_log_lib.RunLog(str(tmp_path), keep=2)
  restored = run_log.restore(_target(), Loader())
  run_log.close()
  assert restored.step == 12 and restored.position.steps_done
  assert [r['step'] for r in metrics.read_metrics(str(tmp_path))] == [6]


def test_a_damaged_metrics_file_is_rebuilt_from_the_checkpoints_records(tmp_path):
  run_log, loader = run_log_lib.RunLog(str(tmp_path), keep=2), Loader()
  run_log.restore(_target(), loader)
  for step in (6, 12):
    run_log.write_record(step, _record(step))
  run_log.save(12, _tree(12), loader, run_log_lib.EpochPosition())
  run_log.close()
  (tmp_path / 'metrics.jsonl').write_text('{"step": 6, "epoch": 1, "train_loss": 9.0}\n')

  run_log = run_log_lib.RunLog(str(tmp_path), keep=2)
  run_log.restore(_target(), Loader())
  run_log.close()
  assert _untimed(metrics.read_metrics(str(tmp_path))) == [
    {'step': step, **_record(step)} for step in (6, 12)
  ]


def test_the_metadata_keeps_a_copy_of_the_records_and_reads_back_the_position():
  times = timing.EpochTimes(seconds=2.5, steps_timed=3, compile_seconds=1.5, compile_steps=1)
  records = [{'step': 6, 'epoch': 1, 'knn_top1': 0.5}]
  metadata = run_log_lib.EpochPosition(steps_done=True, times=times).to_metadata(records)
  records[0]['knn_top1'] = 0.0  # the next epoch goes on with the list
  records.append({'step': 12})
  position, kept = run_log_lib.EpochPosition.from_metadata(metadata)
  assert position == run_log_lib.EpochPosition(steps_done=True, times=times)
  assert kept == [{'step': 6, 'epoch': 1, 'knn_top1': 0.5}]


def test_a_run_resumed_with_another_keep_best_ranks_by_the_new_figure(tmp_path):
  """Checkpoints ranked by knn_top1 (max), then by train_loss (min) after a resume, both
  kept (the newest 3): the best is the best by train_loss among those ranked by it, a
  knn-ranked one never."""
  run_log, loader = run_log_lib.RunLog(str(tmp_path), keep=1, keep_best='knn_top1'), Loader()
  run_log.restore(_target(), loader)
  for step, knn, loss in ((6, 0.9, 0.1), (12, 0.5, 0.9)):
    run_log.write_record(step, _record(step, knn_top1=knn) | {'train_loss': loss})
    run_log.save(step, _tree(step), loader, run_log_lib.EpochPosition())
  run_log.close()
  assert checkpoints.best_checkpoint(str(tmp_path)) == checkpoints.Best(6, 'knn_top1', 'max', 0.9)

  run_log = run_log_lib.RunLog(str(tmp_path), keep=3, keep_best='train_loss')
  assert run_log.restore(_target(), loader).step == 12
  for step, knn, loss in ((18, 0.1, 0.4), (24, 0.2, 0.6)):
    run_log.write_record(step, _record(step, knn_top1=knn) | {'train_loss': loss})
    run_log.save(step, _tree(step), loader, run_log_lib.EpochPosition())
  run_log.close()
  assert checkpoints.best_checkpoint(str(tmp_path)) == checkpoints.Best(
    18, 'train_loss', 'min', 0.4
  )
  assert checkpoints.finished_steps(str(tmp_path)) == [12, 18, 24]


def test_a_run_record_ranks_each_checkpoint_by_the_record_of_its_step(tmp_path):
  """Training's bookkeeping (rundir/run_log) with keep_best, across a resume: a save
  mid-epoch follows the last epoch's record and is ranked by none."""
  tree, loader = {'w': jnp.zeros((3,), jnp.float32)}, Loader()
  run_log = run_log_lib.RunLog(str(tmp_path), keep=1, keep_best='knn_top1')
  assert run_log.restore(tree, loader).step == 0
  for step, knn in ((5, 0.9), (10, 0.5)):
    run_log.write_record(step, {'epoch': step // 5, 'knn_top1': knn})
    run_log.save(step, tree, loader, run_log_lib.EpochPosition())
  run_log.save(12, tree, loader, run_log_lib.EpochPosition())  # a SIGTERM mid-epoch 3
  run_log.close()
  assert checkpoints.finished_steps(str(tmp_path)) == [5, 12]
  run_log = run_log_lib.RunLog(str(tmp_path), keep=1, keep_best='knn_top1')
  assert run_log.restore(tree, loader).step == 12
  run_log.write_record(15, {'epoch': 3, 'knn_top1': 0.7})
  run_log.save(15, tree, loader, run_log_lib.EpochPosition())
  run_log.close()
  assert checkpoints.finished_steps(str(tmp_path)) == [5, 15]
  assert checkpoints.best_checkpoint(str(tmp_path)) == checkpoints.Best(5, 'knn_top1', 'max', 0.9)
