"""User errors end a program with one line and the fix; programming errors keep their traceback.

Exceptions caused by the user's input (a config value, a workdir, a dataset, a full disk)
derive from `UserError` or are recognised here; entry points run their work through
`exit_on_user_error`, which logs the message and exits with status 1. A program stopped by
Ctrl-C ends with one line too, and the signal's exit status (`exit_on_interrupt`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
import errno
import os
import signal
import sys
from typing import TypeVar

T = TypeVar('T')

# absl (the `[train]` extra) is imported inside the functions of the programs below, so
# that the sampler (hscl_jax.data.sampling, core install) can raise ConfigError.


class UserError(Exception):
  """Caused by the user's input; its message names the problem and the fix."""


class ConfigError(UserError, ValueError):
  """An invalid configuration; raised before anything is compiled."""


class NonFiniteLossError(UserError, FloatingPointError):
  """The training loss became NaN/inf; the bad state was not saved."""


class Interrupted(BaseException):
  """A program stopped at once by a signal, its one line the message. A BaseException, as
  KeyboardInterrupt, so that no `except Exception` on its way takes it for a failure."""

  def __init__(self, message: str, signum: int):
    super().__init__(message)
    self.signum = signum

  @property
  def exit_status(self) -> int:
    return signal_exit_status(self.signum)


def signal_exit_status(signum: int) -> int:
  """A program a signal stopped exits as one the signal killed would: 128 + its number (130
  for Ctrl-C, 143 for SIGTERM), so a shell or scheduler sees that it did not finish."""
  return 128 + int(signum)


def signal_name(signum: int) -> str:
  """How a line names the signal that stopped a program: Ctrl-C is what a person pressed."""
  return 'Ctrl-C (SIGINT)' if signum == signal.SIGINT else signal.Signals(signum).name


def exit_on_interrupt(work: Callable[[], T]) -> T:
  """Runs `work` (a whole program); a Ctrl-C that reaches here (a program with no stop of
  its own: training saves first) or an `Interrupted` ends the program with one line and
  the signal's exit status, instead of a traceback."""
  from absl import logging

  try:
    return work()
  except KeyboardInterrupt:
    name = signal_name(signal.SIGINT)
    stop = Interrupted(f'{name}: stopped before finishing; rerun the same command.', signal.SIGINT)
  except Interrupted as error:
    stop = error
  logging.error('%s', stop)
  logging.flush()
  sys.stdout.flush()
  sys.stderr.flush()
  # Not sys.exit: a compilation the signal cut short goes on in XLA's threads, and the
  # interpreter's shutdown beside them waits for it, then crashes (a segmentation fault).
  os._exit(stop.exit_status)


def config_message(field: str, problem: str, fix: str) -> str:
  """The one line of a bad config value: `config.<field>: <problem>. Fix: <fix>.`"""
  return f'config.{field}: {problem}. Fix: {fix}.'


def fail(field: str, problem: str, fix: str):
  """Raises ConfigError as one line: `config.<field>: <problem>. Fix: <fix>.`"""
  raise ConfigError(config_message(field, problem, fix))


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
  intact: `rundir.checkpoints.disk_full_message`)."""
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
  from absl import logging

  try:
    return work()
  except Exception as error:
    message = user_message(error, workdir, describe_disk_full)
    if message is None:
      raise
    logging.error('%s', message)
    sys.exit(1)
