"""One run per workdir: a live holder refuses a second run by name; a dead one is taken over."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from hscl_jax import workdir_lock

HOLD = """
import sys, time
from hscl_jax import workdir_lock
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
  return json.loads((workdir / workdir_lock.LOCK_FILE).read_text())


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
  assert not (tmp_path / workdir_lock.LOCK_FILE).exists()  # released on exit
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
  (tmp_path / workdir_lock.LOCK_FILE).write_text(json.dumps(other))
  with pytest.raises(workdir_lock.WorkdirBusyError, match=f'host {here}-other, pid 1'):
    workdir_lock.WorkdirLock(str(tmp_path)).acquire()


def test_heartbeat_keeps_the_lock_fresh_for_other_hosts(tmp_path):
  with workdir_lock.WorkdirLock(str(tmp_path), heartbeat_seconds=0.05):
    first = _lock_record(tmp_path)['heartbeat']
    time.sleep(0.5)
    assert _lock_record(tmp_path)['heartbeat'] > first
