"""One run per workdir: DIR/run.lock names the holder (host, pid) while a run is live.

A second run on a live workdir stops within seconds, naming the holder. A lock left by
a run that was killed (kill -9, a lost host) is stale and taken over: on the holder's
host, a lock whose process no longer exists (or is another process with the same pid)
is stale; from another host, one whose heartbeat (rewritten every `heartbeat_seconds`
by the holder) is older than `stale_seconds`. The processes of one multi-host run share
the workdir: only process 0 takes the lock (see `acquire_for_run`).

The lock relies on an atomic exclusive create and rename, i.e. a local or POSIX network
filesystem.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import threading
import time
import uuid

import jax
from jax.experimental import multihost_utils
import numpy as np

from hscl_jax import errors
from hscl_jax.rundir import atomic
from hscl_jax.rundir import layout

HEARTBEAT_SECONDS = 15.0
# 4 missed heartbeats: a run restarted on other hosts after a hard preemption (the old
# hosts gone without releasing) waits about a minute at most.
STALE_SECONDS = 60.0


class WorkdirBusyError(errors.UserError, RuntimeError):
  """Another live run holds the workdir."""


class WorkdirError(errors.UserError, OSError):
  """The workdir cannot be used (a file, read-only, not permitted)."""


def make_workdir(workdir: str) -> list[str]:
  """Creates the workdir if needed; raises WorkdirError (one line) if it is unusable.
  Returns the directories it created (the workdir and missing parents), deepest first."""
  missing, path = [], os.path.abspath(workdir)
  while not os.path.exists(path):
    missing.append(path)
    path = os.path.dirname(path)
  if os.path.exists(workdir) and not os.path.isdir(workdir):
    raise WorkdirError(
      f'workdir {workdir} is a file, not a directory. '
      'Fix: pass a directory path (it is created if missing).'
    )
  try:
    os.makedirs(workdir, exist_ok=True)
  except OSError as e:
    raise WorkdirError(
      f'cannot create workdir {workdir}: {e.strerror}. Fix: pass a --workdir where you can write.'
    ) from None
  return missing


def _process_start_time(pid: int) -> str | None:
  """The kernel's start time of `pid` (tells a reused pid apart), None if not known."""
  try:
    with open(f'/proc/{pid}/stat') as f:
      return f.read().rsplit(')', 1)[1].split()[19]
  except (OSError, IndexError):
    return None


def _pid_alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True  # exists, owned by someone else
  return True


def _identity() -> dict:
  pid = os.getpid()
  return {
    'host': socket.gethostname(),
    'pid': pid,
    'start_time': _process_start_time(pid),
    'token': uuid.uuid4().hex,
  }


def describe(holder: dict, *, stale_seconds: float = STALE_SECONDS) -> str:
  text = f'host {holder.get("host")}, pid {holder.get("pid")}'
  if holder.get('host') != socket.gethostname() and 'heartbeat' in holder:
    text += (
      f'; alive {time.time() - holder["heartbeat"]:.0f} s ago, taken over once '
      f'{stale_seconds:.0f} s pass without a sign of life'
    )
  return text


def is_stale(holder: dict, *, stale_seconds: float = STALE_SECONDS) -> bool:
  """Whether the run that wrote `holder` is gone."""
  if holder.get('host') == socket.gethostname():
    pid = holder.get('pid')
    if not isinstance(pid, int) or not _pid_alive(pid):
      return True
    start_time = holder.get('start_time')
    return start_time is not None and _process_start_time(pid) != start_time
  return time.time() - holder.get('heartbeat', 0.0) > stale_seconds


class WorkdirLock:
  """Exclusive lock of a workdir for one process (use `acquire_for_run` in the program)."""

  def __init__(
    self,
    workdir: str,
    *,
    heartbeat_seconds: float = HEARTBEAT_SECONDS,
    stale_seconds: float = STALE_SECONDS,
  ):
    self.path = os.path.join(workdir, layout.LOCK_FILE)
    self._heartbeat_seconds = heartbeat_seconds
    self._stale_seconds = stale_seconds
    self._record = None
    self._stop = threading.Event()
    self._thread = None
    self._created: list[str] = []  # directories `acquire` created, deepest first
    self._found: set[str] = set()  # the workdir's entries before the lock was taken

  def _read(self) -> dict | None:
    """The holder's record; {} if the file is unreadable (being written, or torn)."""
    try:
      with open(self.path) as f:
        return json.load(f)
    except FileNotFoundError:
      return None
    except (OSError, ValueError):
      return {}

  def _create(self) -> bool:
    record = {**_identity(), 'heartbeat': time.time()}
    try:
      with open(self.path, 'x') as f:
        json.dump(record, f)
    except FileExistsError:
      return False
    except OSError as e:
      if errors.is_disk_full(e):
        raise
      raise WorkdirError(
        f'cannot write to workdir {os.path.dirname(self.path)}: {e.strerror}. '
        'Fix: pass a --workdir where you can write.'
      ) from None
    self._record = record
    return True

  def acquire(self) -> None:
    """Takes the lock (taking over a stale one); raises WorkdirBusyError if it is live."""
    workdir = os.path.dirname(self.path) or '.'
    self._created = make_workdir(workdir)
    self._found = set(os.listdir(workdir))
    deadline = time.monotonic() + 5.0
    while not self._create():
      holder = self._read()
      if holder is None:
        continue  # released meanwhile
      if holder == {} and time.monotonic() < deadline:
        time.sleep(0.1)  # a holder that is writing it
        continue
      if holder and not is_stale(holder, stale_seconds=self._stale_seconds):
        holder_text = describe(holder, stale_seconds=self._stale_seconds)
        raise WorkdirBusyError(
          f'workdir {os.path.dirname(self.path)} is in use by another run ({holder_text}). '
          'Fix: wait for it or stop it, or use another --workdir.'
        )
      self._move_aside()
    self._thread = threading.Thread(target=self._beat, name='workdir-lock-heartbeat', daemon=True)
    self._thread.start()

  def _move_aside(self) -> None:
    """Renames a stale lock away (atomic: of two runs taking it over, one wins)."""
    try:
      os.rename(self.path, f'{self.path}.stale-{uuid.uuid4().hex[:8]}')
    except FileNotFoundError:
      return
    for stale in sorted(
      p
      for p in os.listdir(os.path.dirname(self.path) or '.')
      if p.startswith(layout.LOCK_FILE + '.stale-')
    ):
      try:
        os.remove(os.path.join(os.path.dirname(self.path) or '.', stale))
      except FileNotFoundError:
        pass

  def _beat(self) -> None:
    while not self._stop.wait(self._heartbeat_seconds):
      if self._read() != self._record:
        return  # taken over (we were judged stale): never overwrite the new holder
      self._record = {**self._record, 'heartbeat': time.time()}
      atomic.write_text(self.path, json.dumps(self._record))

  def release(self, *, undo: bool = False) -> None:
    """Removes the lock if this process still holds it. With `undo` (a run that stopped
    before its first checkpoint), also what the run wrote: the entries named by
    `layout.is_run_entry` that appeared since the lock was taken, then the directories
    `acquire` created if they are empty. Nothing that was there before, and nothing of
    another name (a user's file, another run's directory put there meanwhile), is touched."""
    if undo and self._record is not None and self._read() == self._record:
      self._remove_new_entries()
    self._stop.set()
    if self._thread is not None:
      self._thread.join()
      self._thread = None
    if self._record is not None and self._read() == self._record:
      os.remove(self.path)
      if undo:
        for directory in self._created:
          try:
            os.rmdir(directory)  # only if empty: another process may have written there
          except OSError:
            break
    self._record = None

  def _remove_new_entries(self) -> None:
    workdir = os.path.dirname(self.path) or '.'
    for name in filter(layout.is_run_entry, set(os.listdir(workdir)) - self._found):
      path = os.path.join(workdir, name)
      if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
      else:
        try:
          os.remove(path)
        except FileNotFoundError:
          pass

  def __enter__(self) -> WorkdirLock:
    self.acquire()
    return self

  def __exit__(self, *exc_info) -> None:
    self.release()


def acquire_for_run(workdir: str) -> WorkdirLock | None:
  """Process 0 takes the lock for the whole run; every process learns the outcome, so all
  of a refused multi-host run stop. Returns the lock on process 0, None elsewhere."""
  lock, error = None, ''
  if jax.process_index() == 0:
    lock = WorkdirLock(workdir)
    try:
      lock.acquire()
    except WorkdirBusyError as e:
      lock, error = None, str(e)
  if jax.process_count() > 1:
    busy = bool(multihost_utils.broadcast_one_to_all(np.int32(bool(error))))
    if busy and not error:
      error = (
        f'workdir {workdir} is in use by another run (process 0 logs the holder). '
        'Fix: wait for it or stop it, or use another --workdir.'
      )
  if error:
    raise WorkdirBusyError(error)
  return lock
