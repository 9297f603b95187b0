"""rundir/atomic with rundir/layout and rundir/lock: the temporary file an atomic write
really creates is the one the clean-up of a stopped run recognises."""

from __future__ import annotations

import pytest

from hscl_jax.rundir import atomic
from hscl_jax.rundir import layout
from hscl_jax.rundir import lock as workdir_lock


@pytest.mark.parametrize('name', sorted(layout.RUN_ENTRIES - {layout.EVENTS_DIR}))
def test_the_temporary_a_write_creates_is_its_names_and_a_run_entry(tmp_path, name):
  created = []

  def write_to(stream):
    created.extend(p.name for p in tmp_path.iterdir())
    stream.write(b'x')

  atomic.write_text(tmp_path / 'other.txt', 'not a run entry')
  atomic.write(tmp_path / name, write_to)
  (temporary,) = set(created) - {'other.txt'}
  assert temporary.startswith('.') and layout.is_temporary_of(temporary, name)
  assert layout.is_run_entry(temporary)
  assert not layout.is_run_entry('other.txt')
  assert sorted(p.name for p in tmp_path.iterdir()) == sorted([name, 'other.txt'])


def test_a_run_stopped_during_a_write_leaves_no_temporary(tmp_path):
  """The stop's clean-up (lock undo) runs while the metrics file is being written (a
  SIGTERM handler's): the write's temporary goes with the run's other entries."""
  (tmp_path / 'notes.txt').write_text('mine')
  lock = workdir_lock.WorkdirLock(str(tmp_path))
  lock.acquire()
  atomic.write_text(tmp_path / layout.CONFIG_FILE, '{}')

  def stopped_meanwhile(stream):
    stream.write(b'{"step": 1}\n')
    stream.flush()
    lock.release(undo=True)

  with pytest.raises(FileNotFoundError):  # its temporary was removed under it
    atomic.write(tmp_path / layout.METRICS_FILE, stopped_meanwhile)
  assert sorted(p.name for p in tmp_path.iterdir()) == ['notes.txt']
