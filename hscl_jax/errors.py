"""User errors end a program with one line and the fix; programming errors keep their traceback.

Exceptions caused by the user's input (a config value, a workdir, a dataset, a full disk)
derive from `UserError` or are recognised here; entry points run their work through
`exit_on_user_error`, which logs the message and exits with status 1.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
import errno
import sys
from typing import TypeVar

from absl import logging

T = TypeVar('T')


class UserError(Exception):
  """Caused by the user's input; its message names the problem and the fix."""


class ConfigError(UserError, ValueError):
  """An invalid configuration; raised before anything is compiled."""


class NonFiniteLossError(UserError, FloatingPointError):
  """The training loss became NaN/inf; the bad state was not saved."""


def fail(field: str, problem: str, fix: str):
  """Raises ConfigError as one line: `config.<field>: <problem>. Fix: <fix>.`"""
  raise ConfigError(f'config.{field}: {problem}. Fix: {fix}.')


def _chain(error: BaseException) -> Iterator[BaseException]:
  """The error and the errors it was raised from or while handling (Orbax wraps them)."""
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    yield error
    error = error.__cause__ or error.__context__


def is_disk_full(error: BaseException) -> bool:
  """Whether `error` comes from a full disk (also as TensorStore's RESOURCE_EXHAUSTED text)."""
  return any(
    (isinstance(e, OSError) and e.errno == errno.ENOSPC) or 'No space left on device' in str(e)
    for e in _chain(error)
  )


def disk_full_message(workdir: str) -> str:
  """The one line for a full disk under `workdir` (training says which checkpoint is
  intact: `checkpointing.disk_full_message`)."""
  return f'no space at {workdir}. Fix: free space (or move the workdir) and rerun the same command.'


def user_message(
  error: BaseException,
  workdir: str | None,
  describe_disk_full: Callable[[str], str] = disk_full_message,
) -> str | None:
  """The one-line report of a user error, None for anything else."""
  if workdir is not None and is_disk_full(error):
    return describe_disk_full(workdir)
  for e in _chain(error):
    if isinstance(e, UserError):
      return str(e)
  return None


def exit_on_user_error(
  work: Callable[[], T],
  *,
  workdir: str | None = None,
  describe_disk_full: Callable[[str], str] = disk_full_message,
) -> T:
  """Runs `work`; a user error is logged as one line and exits with status 1. A full disk
  under `workdir` is one too, described by `describe_disk_full(workdir)`."""
  try:
    return work()
  except Exception as error:
    message = user_message(error, workdir, describe_disk_full)
    if message is None:
      raise
    logging.error('%s', message)
    sys.exit(1)
