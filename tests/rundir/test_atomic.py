"""rundir/atomic, the one atomic writer: a failed write keeps the old file, a reader never
meets a partial one, the mode is any new file's; with rundir/layout and rundir/lock, the
temporary file an atomic write really creates is the one the clean-up of a stopped run
recognises."""

from __future__ import annotations

import json
import os
import stat
import threading

import numpy as np
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


def test_a_write_that_fails_keeps_the_old_contents_and_leaves_no_temporary(tmp_path):
  path = tmp_path / 'linear_eval.json'
  atomic.write_json(path, {'top1': 0.5})

  def half_then_crash(f):
    f.write(b'{"top1": 0.')
    raise OSError(28, 'No space left on device')

  with pytest.raises(OSError, match='No space'):
    atomic.write(path, half_then_crash)
  assert json.loads(path.read_text()) == {'top1': 0.5}
  assert sorted(p.name for p in tmp_path.iterdir()) == ['linear_eval.json']


def test_the_bytes_are_json_dump_s_and_the_mode_any_new_file_s(tmp_path):
  old = os.umask(0o027)
  try:
    atomic.write_json(tmp_path / 'a.json', {'k': [1, 2.5]}, newline=True)
    atomic.write_text(tmp_path / 'b.md', 'é\n')
  finally:
    os.umask(old)
  assert (tmp_path / 'a.json').read_text() == json.dumps({'k': [1, 2.5]}, indent=2) + '\n'
  assert (tmp_path / 'b.md').read_bytes() == 'é\n'.encode()
  for name in ('a.json', 'b.md'):
    assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o666 & ~0o027


def test_arrays_figures_and_copies(tmp_path):
  """np.savez through a file object (no suffix added), a PNG, a copy of bytes."""
  atomic.write(tmp_path / 'e.npz', lambda f: np.savez(f, x=np.arange(3)))
  with np.load(tmp_path / 'e.npz') as stored:
    np.testing.assert_array_equal(stored['x'], np.arange(3))

  class Figure:
    def savefig(self, f, *, format, dpi):
      f.write(f'{format} at {dpi}'.encode())

  atomic.write_figure(tmp_path / 'fig.png', Figure(), dpi=110)
  assert (tmp_path / 'fig.png').read_text() == 'png at 110'
  atomic.copy(tmp_path / 'fig.png', tmp_path / 'copy.png')
  assert (tmp_path / 'copy.png').read_bytes() == (tmp_path / 'fig.png').read_bytes()
  assert sorted(p.name for p in tmp_path.iterdir()) == ['copy.png', 'e.npz', 'fig.png']


def test_writers_of_one_file_at_once_never_share_a_temporary(tmp_path):
  """Two grid workers writing one report: each rename lands a whole report."""
  path, seen, errors = tmp_path / 'report.md', set(), []

  def writer(text):
    try:
      for _ in range(50):
        atomic.write_text(path, text)
        seen.add(path.read_text())
    except Exception as error:  # collected: the assertion below names it
      errors.append(error)

  threads = [threading.Thread(target=writer, args=(t * 5000,)) for t in 'ab']
  for thread in threads:
    thread.start()
  for thread in threads:
    thread.join()
  assert errors == [] and seen <= {'a' * 5000, 'b' * 5000}
  assert sorted(p.name for p in tmp_path.iterdir()) == ['report.md']


def test_the_temporaries_of_a_run_s_files_are_run_entries():
  """A run stopped before its first checkpoint removes them (rundir/lock); a user's hidden
  file or another name's temporary is no run entry."""
  for name in (layout.CONFIG_FILE, layout.METRICS_FILE):
    temporary = layout.temporary(name)
    assert temporary.startswith('.') and layout.is_run_entry(temporary)
    assert temporary != layout.temporary(name)  # one per write
  assert not layout.is_run_entry(layout.temporary('notes.txt'))
  assert not layout.is_run_entry('.config.json.swp') and not layout.is_run_entry('run.lock')
