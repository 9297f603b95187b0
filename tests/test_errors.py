"""User errors: one line and the fix; programming errors keep their traceback."""

from __future__ import annotations

import errno

import pytest

from hscl_jax import errors
from hscl_jax.rundir import checkpoints
from hscl_jax.rundir import lock as workdir_lock


def test_disk_full_is_recognised_through_wrappers():
  assert errors.is_disk_full(OSError(errno.ENOSPC, 'No space left on device'))
  try:
    try:
      raise OSError(errno.ENOSPC, 'No space left on device')
    except OSError as cause:
      raise ValueError('RESOURCE_EXHAUSTED: Error writing chunk') from cause
  except ValueError as wrapped:
    assert errors.is_disk_full(wrapped)
  assert errors.is_disk_full(ValueError('RESOURCE_EXHAUSTED: [OS error: No space left on device]'))
  assert not errors.is_disk_full(RuntimeError('RESOURCE_EXHAUSTED: Out of memory allocating'))


def test_disk_full_message_names_the_last_good_checkpoint_or_says_a_rerun_starts_over(tmp_path):
  for step in (3, 6):
    (tmp_path / 'checkpoints' / str(step)).mkdir(parents=True)
  (tmp_path / 'checkpoints' / '9.orbax-checkpoint-tmp-123').mkdir()  # the failed write
  assert checkpoints.disk_full_message(str(tmp_path)).startswith(
    f'no space at {tmp_path}, last good checkpoint 6 is intact. Fix: '
  )
  # Before the first checkpoint the run removed what it wrote: a rerun starts over.
  none_yet = checkpoints.disk_full_message(str(tmp_path / 'new'))
  assert none_yet == (
    f'no space at {tmp_path / "new"}, no checkpoint had been written. Fix: free space (or move '
    'the workdir) and rerun the same command; it starts over, as nothing was kept.'
  )


def test_a_full_disk_outside_training_is_one_line_with_the_fix():
  """errors.disk_full_message, user_message's default for a full disk (the programs that
  write no checkpoint: embed, inspect, export); training passes rundir/checkpoints'."""
  full = OSError(errno.ENOSPC, 'No space left on device')
  expected = 'no space at /w/run. Fix: free space (or move the workdir) and rerun the same command.'
  assert errors.disk_full_message('/w/run') == expected
  assert errors.user_message(full, '/w/run') == expected
  assert errors.user_message(full, '/w/run', lambda w: f'full: {w}') == 'full: /w/run'
  assert errors.user_message(full, None) is None  # no workdir: not a user error


def test_checkpointer_lists_the_steps_it_keeps(tmp_path):
  import jax.numpy as jnp

  checkpointer = checkpoints.Checkpointer(str(tmp_path), keep=2)
  for step in (1, 2, 3):
    assert checkpointer.save(step, {'w': jnp.full((3,), step, jnp.float32)}, {'position': step})
  checkpointer.close()
  reopened = checkpoints.Checkpointer(str(tmp_path), keep=2)
  assert reopened.all_steps() == [2, 3] and reopened.latest_step() == 3  # keep=2: 1 removed
  assert not reopened.save(3, {'w': jnp.zeros((3,), jnp.float32)}, {'position': 0})  # skipped
  reopened.close()
  assert checkpoints.finished_steps(str(tmp_path)) == [2, 3]


def test_user_errors_exit_with_one_line_others_keep_their_traceback(tmp_path, caplog):
  def user_mistake():
    raise workdir_lock.WorkdirError('workdir X is a file. Fix: pass a directory')

  with pytest.raises(SystemExit) as exit_info:
    errors.exit_on_user_error(user_mistake)
  assert exit_info.value.code == 1
  assert [r.getMessage() for r in caplog.records] == ['workdir X is a file. Fix: pass a directory']

  def bug():
    raise KeyError('a programming error')

  with pytest.raises(KeyError):
    errors.exit_on_user_error(bug, workdir=str(tmp_path))


def test_unusable_workdirs_are_one_line(tmp_path):
  (tmp_path / 'file').write_text('')
  with pytest.raises(workdir_lock.WorkdirError, match='is a file, not a directory. Fix: '):
    workdir_lock.WorkdirLock(str(tmp_path / 'file')).acquire()
  with pytest.raises(workdir_lock.WorkdirError, match='cannot create workdir .*Fix: '):
    workdir_lock.make_workdir(str(tmp_path / 'file' / 'below'))


def test_checkpoint_that_cannot_fit_is_refused_before_writing(tmp_path, monkeypatch):
  import collections

  import jax.numpy as jnp

  from hscl_jax.rundir import checkpoints

  checkpointer = checkpoints.Checkpointer(str(tmp_path), keep=2)
  state = {'w': jnp.zeros((1000,), jnp.float32)}  # 4,000 bytes
  usage = collections.namedtuple('usage', 'total used free')
  monkeypatch.setattr(checkpoints.shutil, 'disk_usage', lambda path: usage(10**6, 0, 3999))
  with pytest.raises(OSError) as error:
    checkpointer.save(1, state, {'position': 0})
  assert errors.is_disk_full(error.value)
  monkeypatch.undo()
  checkpointer.save(1, state, {'position': 0})
  checkpointer.close()
  assert checkpoints.finished_steps(str(tmp_path)) == [1]
  assert checkpoints.disk_full_message(str(tmp_path)).startswith(
    f'no space at {tmp_path}, last good checkpoint 1 is intact'
  )


def test_a_checkpoint_error_is_quoted_by_its_type_and_first_line():
  """What the restore refusal and the moved-aside warning quote of Orbax's error: its type
  and its first non-empty line (Orbax's messages run over many lines)."""
  error = ValueError('\n  the first line\nthe second line\nthe last line\n')
  assert checkpoints._first_line(error) == 'ValueError: the first line'
  assert checkpoints._first_line(OSError()) == 'OSError: '


def test_no_checkpoint_restoring_on_another_process_names_the_newest(tmp_path, monkeypatch):
  """Here every checkpoint restores, on another process none does (`_all_processes` false):
  the run stops naming the newest checkpoint, the first one tried."""
  checkpointer = checkpoints.Checkpointer(str(tmp_path), keep=3)
  steps = type('Manager', (), {'all_steps': lambda self: [3, 9, 6]})()
  monkeypatch.setattr(checkpointer, '_manager', steps)
  monkeypatch.setattr(checkpointer, 'restore', lambda step, target: ('state', 'iterator'))
  monkeypatch.setattr(checkpoints, '_all_processes', lambda ok: False)
  with pytest.raises(RuntimeError, match=r'^checkpoint 9 failed to restore on another process'):
    checkpointer.restore_latest(target=None)
