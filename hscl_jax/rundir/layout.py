"""The names a training run writes at the top of its workdir, defined here only.

A run stopped before its first checkpoint removes what it wrote (`lock.WorkdirLock.release`
with `undo`): exactly these names (`is_run_entry`), where they appeared after the lock was
taken, so a file or another run's directory put in the workdir meanwhile is never touched.
"""

from __future__ import annotations

import uuid

CONFIG_FILE = 'config.json'
METRICS_FILE = 'metrics.jsonl'
STEPS_FILE = 'steps.jsonl'  # the per-step scalars, every log_every_steps
EVENTS_DIR = 'tensorboard'
# The per-step scalars' TensorBoard run, inside EVENTS_DIR: its own run, so that the epoch
# records' purge on resume (from the epoch end a resumed run redoes) never hides a step's.
STEP_EVENTS_DIR = 'steps'
PROFILE_DIR = 'profile'  # a jax.profiler trace of --config.profile_steps steps
CHECKPOINT_DIR = 'checkpoints'
UNUSABLE_DIR = 'checkpoints_unusable'  # checkpoints that failed to restore, kept to inspect
LOCK_FILE = 'run.lock'


def temporary(name: str) -> str:
  """The file an atomic write of `name` goes through (`atomic.write`): hidden, beside it,
  its own per write, so two processes writing one file never share it."""
  return f'.{name}.{uuid.uuid4().hex[:12]}.tmp'


def is_temporary_of(entry: str, name: str) -> bool:
  return entry.startswith(f'.{name}.') and entry.endswith('.tmp')


# What the run itself writes at the top of its workdir (the lock, which the lock removes,
# apart); with the temporary files of its atomic writes, `is_run_entry`.
RUN_ENTRIES = frozenset(
  {CONFIG_FILE, METRICS_FILE, STEPS_FILE, EVENTS_DIR, CHECKPOINT_DIR, UNUSABLE_DIR, PROFILE_DIR}
)


def is_run_entry(entry: str) -> bool:
  return entry in RUN_ENTRIES or any(is_temporary_of(entry, n) for n in RUN_ENTRIES)
