"""Several JAX processes on 127.0.0.1 for a test: start them, wait with a deadline, read
their results, and kill them all whatever happens.

A test file that is also its workers' script starts groups of workers, each group one JAX
cluster (``num_processes`` > 1: joined through a free port of 127.0.0.1, gloo collectives)
or one lone process, every worker with ``devices_per_process`` fake CPU devices. A worker
gets its spec as JSON in argv[1] (the group's ``args`` plus ``task``, ``out``,
``coordinator_address``, ``num_processes``, ``process_id``), calls `start` first and writes
its results to ``spec['out']`` (an .npz file, `np.savez`); the parent reads them back. A
worker that `start` leaves before its cluster is joined (JAX aborts the process where the
coordinator cannot be reached, raises where the CPU collectives cannot load) skips the
test, saying why; any other exit, or a worker still running at the deadline, fails it.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
import xla_flags

REPO = pathlib.Path(__file__).resolve().parents[1]
TESTS = pathlib.Path(__file__).resolve().parent
TIMEOUT_SECONDS = 300  # per group of workers: ~1 min each on a quiet 2-core machine
START_TIMEOUT_SECONDS = 60  # for every process of a cluster to connect
JOINING, JOINED = 'joining', 'joined'  # what `start` writes to the worker's .start file


# ----------------------------------------------------------------------------------------
# Parent side: start, wait for, and clean up workers.


def free_port() -> int:
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def worker_env(devices_per_process: int) -> dict[str, str]:
  """The environment of a worker: CPU, its fake devices, the repository and tests/ (these
  helpers) importable."""
  # Not a cluster job, even when the tests run inside one (SLURM / TPU auto-detection).
  env = {
    k: v
    for k, v in os.environ.items()
    if not k.startswith(('SLURM_', 'TPU_', 'MEGASCALE_', 'JAX_COORDINATOR'))
  }
  path = [str(REPO), str(TESTS), env.get('PYTHONPATH', '')]
  env.update(
    XLA_FLAGS=xla_flags.with_devices(devices_per_process),
    JAX_PLATFORMS='cpu',
    PYTHONPATH=os.pathsep.join(path).rstrip(os.pathsep),
  )
  return env


def _tail(path: pathlib.Path, lines: int = 40) -> str:
  try:
    return '\n'.join(path.read_text(errors='replace').splitlines()[-lines:])
  except OSError:
    return '(no log)'


class Workers:
  """A group of worker processes of one task (one JAX cluster, or one lone process)."""

  def __init__(
    self,
    script: pathlib.Path,
    task: str,
    out_dir: pathlib.Path,
    *,
    num_processes: int,
    devices_per_process: int,
    args: dict,
  ):
    self.task, self.out_dir, self.num_processes = task, out_dir, num_processes
    self.procs, self.logs = [], []
    out_dir.mkdir(parents=True, exist_ok=True)
    coordinator = f'127.0.0.1:{free_port()}' if num_processes > 1 else None
    env = worker_env(devices_per_process)
    try:
      for process_id in range(num_processes):
        spec = dict(
          args,
          task=task,
          out=str(out_dir / f'process_{process_id}.npz'),
          coordinator_address=coordinator,
          num_processes=num_processes if coordinator else None,
          process_id=process_id if coordinator else None,
        )
        log = out_dir / f'process_{process_id}.log'
        self.logs.append(log)
        with open(log, 'w') as f:
          self.procs.append(
            subprocess.Popen(
              [sys.executable, str(script), json.dumps(spec)],
              env=env,
              cwd=REPO,
              stdout=f,
              stderr=subprocess.STDOUT,
            )
          )
    except BaseException:
      self.kill()
      raise

  def kill(self) -> None:
    for proc in self.procs:
      if proc.poll() is None:
        proc.kill()
        proc.wait()

  def wait(self, deadline: float) -> list[dict]:
    """The workers' .npz results; fails (after killing them all) on error or timeout, and
    skips where jax.distributed could not start."""
    try:
      for process_id, proc in enumerate(self.procs):
        try:
          code = proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
          pytest.fail(
            f'{self.task}: process {process_id} still running at the deadline:\n'
            + _tail(self.logs[process_id])
          )
        if code != 0 and _start_state(self.out_dir / f'process_{process_id}.npz') == JOINING:
          pytest.skip(f'{self.task}: jax.distributed cannot start here: {self._reason(process_id)}')
        if code != 0:
          pytest.fail(
            f'{self.task}: process {process_id} exited with {code}:\n'
            + _tail(self.logs[process_id])
          )
    finally:
      self.kill()
    return [dict(np.load(self.out_dir / f'process_{i}.npz')) for i in range(self.num_processes)]

  def _reason(self, process_id: int) -> str:
    """The log's last line naming an error or a status (JAX's abort), else its last."""
    lines = _tail(self.logs[process_id]).splitlines() or ['(empty log)']
    named = [line for line in lines if re.search('error|status', line, re.IGNORECASE)]
    return (named or lines)[-1].strip()


def run_concurrently(
  script: pathlib.Path, *groups: dict, timeout: float = TIMEOUT_SECONDS
) -> list[list[dict]]:
  """Starts every group (kwargs of Workers) of ``script`` at once; returns each group's
  results."""
  started = []
  try:
    for group in groups:
      started.append(Workers(script, **group))
    deadline = time.monotonic() + timeout
    return [workers.wait(deadline) for workers in started]
  finally:
    for workers in started:
      workers.kill()


# ----------------------------------------------------------------------------------------
# Worker side.


def _start_file(out: str | pathlib.Path) -> pathlib.Path:
  return pathlib.Path(f'{out}.start')


def _start_state(out: pathlib.Path) -> str | None:
  """JOINING where the worker left `start` unjoined, JOINED, or None (no `start`)."""
  try:
    return _start_file(out).read_text()
  except OSError:
    return None


def start(spec: dict):
  """Joins the worker's cluster (before any other JAX call; a lone worker starts nothing)
  and returns hscl_jax.training.distributed's Setup. A worker that dies in here (JAX's
  abort or error) is read by the parent as: jax.distributed cannot start (a skip)."""
  from hscl_jax.training import distributed

  args = (spec['coordinator_address'], spec['num_processes'], spec['process_id'])
  distributed.decide(*args)  # a bad spec is the test's error, not a skip
  _start_file(spec['out']).write_text(JOINING)
  setup = distributed.initialize(*args, initialization_timeout=START_TIMEOUT_SECONDS)
  _start_file(spec['out']).write_text(JOINED)
  return setup
