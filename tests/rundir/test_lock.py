"""rundir/lock, one run per workdir: a live holder refuses a second run by name and a dead
one is taken over; what a run stopped before its first checkpoint removes
(`release(undo=True)`) when the workdir already held entries of a run's names, and after
another run took the workdir over."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

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


HOLD = """
import sys, time
from hscl_jax.rundir import lock as workdir_lock
lock = workdir_lock.WorkdirLock(sys.argv[1])
lock.acquire()
print('held', flush=True)
sys.stdin.readline()
lock.release()
"""


def _holder(workdir):
  process = subprocess.Popen(
    [sys.executable, '-c', HOLD, str(workdir)],
    stdin=subprocess.PIPE,
    stdout=subprocess.PIPE,
    text=True,
  )
  assert process.stdout.readline().strip() == 'held'
  return process


def _lock_record(workdir):
  return json.loads((workdir / layout.LOCK_FILE).read_text())


def test_live_holder_refuses_within_seconds_naming_host_and_pid(tmp_path):
  holder = _holder(tmp_path)
  try:
    start = time.monotonic()
    with pytest.raises(
      workdir_lock.WorkdirBusyError,
      match=f'in use by another run \\(host {socket.gethostname()}, pid {holder.pid}\\).*Fix: ',
    ):
      workdir_lock.WorkdirLock(str(tmp_path)).acquire()
    assert time.monotonic() - start < 5
  finally:
    holder.communicate('\n', timeout=30)
  assert not (tmp_path / layout.LOCK_FILE).exists()  # released on exit
  with workdir_lock.WorkdirLock(str(tmp_path)):
    assert _lock_record(tmp_path)['pid'] == os.getpid()


def test_lock_of_a_killed_run_is_taken_over(tmp_path):
  holder = _holder(tmp_path)
  holder.send_signal(signal.SIGKILL)
  holder.wait(timeout=30)
  assert _lock_record(tmp_path)['pid'] == holder.pid  # left behind
  lock = workdir_lock.WorkdirLock(str(tmp_path))
  lock.acquire()
  assert _lock_record(tmp_path)['pid'] == os.getpid()
  lock.release()
  assert os.listdir(tmp_path) == []  # the stale lock is not kept either


def test_reused_pid_and_other_hosts(tmp_path):
  here = socket.gethostname()
  me = dict(workdir_lock._identity(), heartbeat=time.time())
  assert not workdir_lock.is_stale(me)
  assert workdir_lock.is_stale({**me, 'start_time': 'another process with this pid'})
  other = {'host': here + '-other', 'pid': 1, 'heartbeat': time.time()}
  assert not workdir_lock.is_stale(other)
  assert workdir_lock.is_stale({**other, 'heartbeat': time.time() - 2 * workdir_lock.STALE_SECONDS})
  (tmp_path / layout.LOCK_FILE).write_text(json.dumps(other))
  with pytest.raises(workdir_lock.WorkdirBusyError, match=f'host {here}-other, pid 1'):
    workdir_lock.WorkdirLock(str(tmp_path)).acquire()


def test_heartbeat_keeps_the_lock_fresh_for_other_hosts(tmp_path):
  with workdir_lock.WorkdirLock(str(tmp_path), heartbeat_seconds=0.05):
    first = _lock_record(tmp_path)['heartbeat']
    time.sleep(0.5)
    assert _lock_record(tmp_path)['heartbeat'] > first


def test_a_run_taken_over_before_it_releases_leaves_the_new_holder_alone(tmp_path, monkeypatch):
  """Run A holds the lock; run B judges it stale (as another host does once A's heartbeat
  is late) and takes it over. A's heartbeat must stop writing, and A's release must not
  remove B's lock: the file names B until B releases."""
  first = workdir_lock.WorkdirLock(str(tmp_path), heartbeat_seconds=0.02)
  first.acquire()
  with monkeypatch.context() as patch:
    patch.setattr(workdir_lock, 'is_stale', lambda holder, **kwargs: True)
    second = workdir_lock.WorkdirLock(str(tmp_path), heartbeat_seconds=3600)
    second.acquire()
  taken = _lock_record(tmp_path)
  assert taken['token'] != first._record['token']
  # A's heartbeat (every 0.02 s) sees the takeover and stops; give it 10 s on a busy host.
  deadline = time.monotonic() + 10
  while first._thread.is_alive() and time.monotonic() < deadline:
    time.sleep(0.02)
  assert _lock_record(tmp_path) == taken  # A never wrote over B's record
  first.release()
  assert (tmp_path / layout.LOCK_FILE).exists()  # nor removed it
  assert _lock_record(tmp_path) == taken
  with pytest.raises(workdir_lock.WorkdirBusyError):
    workdir_lock.WorkdirLock(str(tmp_path)).acquire()
  second.release()
  assert os.listdir(tmp_path) == []  # B's release removes its lock; A's moved-aside one is gone


def _foreign_lock(workdir, **fields):
  record = {'host': socket.gethostname(), 'pid': 4242, 'start_time': None, **fields}
  (workdir / layout.LOCK_FILE).write_text(json.dumps(record))
  return record


def _probe_raising(error, calls):
  def kill(pid, signal_number):
    calls.append((pid, signal_number))
    raise error

  return kill


def test_permission_error_from_the_liveness_probe_means_a_live_holder(tmp_path, monkeypatch):
  """os.kill(pid, 0) raising PermissionError: the process exists under another user (it
  cannot happen as root, so the probe is patched). The holder is live: refused, named."""
  _foreign_lock(tmp_path)
  calls = []
  monkeypatch.setattr(workdir_lock.os, 'kill', _probe_raising(PermissionError(1, 'EPERM'), calls))
  with pytest.raises(workdir_lock.WorkdirBusyError, match=r'pid 4242\)'):
    workdir_lock.WorkdirLock(str(tmp_path)).acquire()
  assert calls and calls[0] == (4242, 0)  # the probe ran, with signal 0
  assert _lock_record(tmp_path)['pid'] == 4242  # left in place


def test_probe_finding_no_process_means_a_dead_holder(tmp_path, monkeypatch):
  _foreign_lock(tmp_path)
  calls = []
  monkeypatch.setattr(
    workdir_lock.os, 'kill', _probe_raising(ProcessLookupError(3, 'ESRCH'), calls)
  )
  with workdir_lock.WorkdirLock(str(tmp_path)):
    assert _lock_record(tmp_path)['pid'] == os.getpid()
  assert calls == [(4242, 0)]
  assert os.listdir(tmp_path) == []


def test_live_process_on_this_host_holds_and_its_death_frees(tmp_path):
  """A record naming a live process of this host (its pid and kernel start time) refuses;
  the same record once that process has exited is stale and taken over."""
  sleeper = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])
  try:
    start_time = workdir_lock._process_start_time(sleeper.pid)
    assert start_time is not None
    _foreign_lock(tmp_path, pid=sleeper.pid, start_time=start_time)
    with pytest.raises(workdir_lock.WorkdirBusyError, match=f'pid {sleeper.pid}'):
      workdir_lock.WorkdirLock(str(tmp_path)).acquire()
  finally:
    sleeper.kill()
    sleeper.wait(timeout=30)
  with workdir_lock.WorkdirLock(str(tmp_path)):
    assert _lock_record(tmp_path)['pid'] == os.getpid()


@pytest.mark.parametrize(
  'age, stale',
  [(0.0, False), (0.5, False), (2.0, True), (None, True)],  # None: no heartbeat written
)
def test_other_hosts_lock_is_stale_after_stale_seconds_without_a_heartbeat(tmp_path, age, stale):
  """Another host's record is judged by its heartbeat's age against stale_seconds (1 s
  here); a record without a heartbeat gives no sign of life, so it is stale."""
  fields = {} if age is None else {'heartbeat': time.time() - age}
  _foreign_lock(tmp_path, host=socket.gethostname() + '-other', pid=1, **fields)
  record = json.loads((tmp_path / layout.LOCK_FILE).read_text())
  assert workdir_lock.is_stale(record, stale_seconds=1.0) == stale
  lock = workdir_lock.WorkdirLock(str(tmp_path), stale_seconds=1.0)
  if stale:
    with lock:
      assert _lock_record(tmp_path)['pid'] == os.getpid()
  else:
    # The message gives this lock's patience (1 s), not the default's.
    busy = r'pid 1; alive [01] s ago, taken over once 1 s pass without'
    with pytest.raises(workdir_lock.WorkdirBusyError, match=busy):
      lock.acquire()


def test_a_run_on_one_process_takes_the_lock_and_a_live_holder_refuses_it(tmp_path):
  lock = workdir_lock.acquire_for_run(str(tmp_path))  # process 0 of 1
  assert isinstance(lock, workdir_lock.WorkdirLock)
  try:
    assert _lock_record(tmp_path)['pid'] == os.getpid()
  finally:
    lock.release()
  assert not (tmp_path / layout.LOCK_FILE).exists()
  holder = _holder(tmp_path)
  try:
    with pytest.raises(workdir_lock.WorkdirBusyError, match=f'pid {holder.pid}\\)'):
      workdir_lock.acquire_for_run(str(tmp_path))
  finally:
    holder.communicate('\n', timeout=30)


def test_undo_removes_what_the_run_created_and_nothing_that_was_there(tmp_path):
  """A new workdir goes with the parents made for it; in an existing one, only the entries
  added since the lock was taken (files and directories) go."""
  lock = workdir_lock.WorkdirLock(str(tmp_path / 'made' / 'for' / 'run'))
  lock.acquire()
  (tmp_path / 'made' / 'for' / 'run' / 'checkpoints').mkdir()
  (tmp_path / 'made' / 'for' / 'run' / 'config.json').write_text('{}')
  lock.release(undo=True)
  assert list(tmp_path.iterdir()) == []

  existing = tmp_path / 'existing'
  (existing / 'old').mkdir(parents=True)
  (existing / 'notes.txt').write_text('mine')
  with workdir_lock.WorkdirLock(str(existing)):
    (existing / 'kept.txt').write_text('')  # a plain release keeps what the run wrote
  lock = workdir_lock.WorkdirLock(str(existing))
  lock.acquire()
  (existing / 'metrics.jsonl').write_text('')
  (existing / 'old' / 'inside.txt').write_text('')  # inside an entry that was there: kept
  (existing / 'tensorboard').mkdir()
  lock.release(undo=True)
  assert sorted(str(p.relative_to(existing)) for p in existing.rglob('*')) == [
    'kept.txt',
    'notes.txt',
    'old',
    'old/inside.txt',
  ]
