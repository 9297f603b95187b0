"""The names a training run writes at the top of its workdir, defined here only.

A run stopped before its first checkpoint removes what it wrote (`lock.WorkdirLock.release`
with `undo`): exactly these names, where they appeared after the lock was taken, so a file
or another run's directory that someone put in the workdir meanwhile is never touched.
"""

from __future__ import annotations

CONFIG_FILE = 'config.json'
METRICS_FILE = 'metrics.jsonl'
EVENTS_DIR = 'tensorboard'
CHECKPOINT_DIR = 'checkpoints'
UNUSABLE_DIR = 'checkpoints_unusable'  # checkpoints that failed to restore, kept to inspect
LOCK_FILE = 'run.lock'


def temporary(name: str) -> str:
  """The file an atomic write of `name` goes through (hidden, beside it)."""
  return f'.{name}.tmp'


# What the run itself writes (the lock, which the lock removes, apart).
RUN_ENTRIES = frozenset(
  {CONFIG_FILE, METRICS_FILE, EVENTS_DIR, CHECKPOINT_DIR, UNUSABLE_DIR}
  | {temporary(CONFIG_FILE), temporary(METRICS_FILE)}
)
