"""rundir/lock: what a run stopped before its first checkpoint removes (`release(undo=True)`)
when the workdir already held entries of a run's names, and after another run took the
workdir over."""

from __future__ import annotations

import pytest

from hscl_jax.rundir import layout
from hscl_jax.rundir import lock as workdir_lock


def _tree(workdir):
  return sorted(str(p.relative_to(workdir)) for p in workdir.rglob('*'))


def test_undo_keeps_the_run_named_entries_that_were_there_before(tmp_path):
  """A workdir that already held a config, metrics, a checkpoint directory and an atomic
  write's temporary (a run that left them): a stopped run removes only its own."""
  before = {
    layout.CONFIG_FILE: '{"old": 1}',
    layout.METRICS_FILE: '{"step": 1}\n',
    layout.temporary(layout.METRICS_FILE): 'torn',
  }
  for name, text in before.items():
    (tmp_path / name).write_text(text)
  (tmp_path / layout.CHECKPOINT_DIR / '5').mkdir(parents=True)
  lock = workdir_lock.WorkdirLock(str(tmp_path))
  lock.acquire()
  (tmp_path / layout.STEPS_FILE).write_text('{"step": 2}\n')
  (tmp_path / layout.EVENTS_DIR).mkdir()
  (tmp_path / layout.CHECKPOINT_DIR / '7').mkdir()  # inside an entry that was there: kept
  lock.release(undo=True)
  assert _tree(tmp_path) == sorted([*before, 'checkpoints', 'checkpoints/5', 'checkpoints/7'])
  assert all((tmp_path / name).read_text() == text for name, text in before.items())


def test_undo_after_another_run_took_the_workdir_over_removes_nothing(tmp_path, monkeypatch):
  """Run A judged stale and taken over by run B: A's undo must not remove what B wrote,
  nor B's lock."""
  first = workdir_lock.WorkdirLock(str(tmp_path), heartbeat_seconds=3600)
  first.acquire()
  with monkeypatch.context() as patch:
    patch.setattr(workdir_lock, 'is_stale', lambda holder, **kwargs: True)
    second = workdir_lock.WorkdirLock(str(tmp_path), heartbeat_seconds=3600)
    second.acquire()
  (tmp_path / layout.CONFIG_FILE).write_text('{"run": "B"}')
  (tmp_path / layout.CHECKPOINT_DIR).mkdir()
  first.release(undo=True)
  assert _tree(tmp_path) == sorted([layout.CHECKPOINT_DIR, layout.CONFIG_FILE, layout.LOCK_FILE])
  with pytest.raises(workdir_lock.WorkdirBusyError):
    workdir_lock.WorkdirLock(str(tmp_path)).acquire()
  second.release(undo=True)
  assert _tree(tmp_path) == []
