"""User errors end a program with one line and the fix; programming errors keep their traceback.

Exceptions caused by the user's input (a config value, a workdir, a dataset, a full disk)
derive from `UserError` or are recognised here; entry points run their work through
`exit_on_user_error`, which logs the message and exits with status 1. A program stopped by
Ctrl-C ends with one line too, and the signal's exit status (`exit_on_interrupt`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
import difflib
import errno
import os
import re
import signal
import sys
from typing import Any, TypeVar

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


def flag_argument(argv: list[str], name: str) -> str | None:
  """The value of `--name` in `argv`, in either form (`--name=V` or `--name V`)."""
  for i, arg in enumerate(argv):
    if arg.startswith(f'--{name}='):
      return arg.split('=', 1)[1]
    if arg == f'--{name}' and i + 1 < len(argv):
      return argv[i + 1]
  return None


def unknown_override(argv: list[str], config: Any) -> str | None:
  """The one line for the first `--config.A.B=V` in `argv` that names no field of `config`
  (ml_collections reports it as an AttributeError traceback), None if all name one."""
  for arg in argv[1:]:
    name = arg.split('=', 1)[0]
    prefix = next((p for p in ('--config.', '--noconfig.') if name.startswith(p)), None)
    if prefix is None:
      continue
    path = name[len(prefix) :].split('.')
    node = config
    for depth, key in enumerate(path):
      if not hasattr(node, 'keys'):
        value = '.'.join(['config', *path[:depth]])
        return (
          f'--config.{".".join(path)}: {value} is a value ({node!r}), not a section. '
          f'Fix: --{value}=NEW_VALUE'
        )
      if key not in node.keys():
        if depth < len(path) - 1:  # a section misspelt: about it, not about the leaf
          return _no_such_section(path, depth, node)
        return _no_such_field(path[: depth + 1], sorted(node.keys()), _field_paths(config))
      node = node[key]
  return None


def _no_such_section(path: list[str], depth: int, node: Any) -> str:
  """`--config.optimiser.learning_rate`: the unknown section named, and the override
  respelt with the closest section that has the rest of the path."""
  parent = '.'.join(['config', *path[:depth]])
  sections = sorted(k for k in node.keys() if hasattr(node[k], 'keys'))
  close = difflib.get_close_matches(path[depth], sections, n=1)
  problem = f'--config.{".".join(path)}: {parent} has no section {path[depth]!r}.'
  if not close:
    return f'{problem} Fix: spell one of the sections of {parent}: {", ".join(sections) or "none"}'
  fixed = [*path[:depth], close[0], *path[depth + 1 :]]
  return f'{problem} Fix: did you mean --config.{".".join(fixed)}?'


def _field_paths(node: Any, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
  """Every field of a config, as its path, sections included."""
  paths = []
  for key in node.keys():
    paths.append((*prefix, key))
    if hasattr(node[key], 'keys'):
      paths.extend(_field_paths(node[key], (*prefix, key)))
  return paths


def _no_such_field(path: list[str], siblings: list[str], everywhere: list[tuple[str, ...]]) -> str:
  """The closest spelling beside the unknown name, else the same name (or a close one) in
  another section (`--config.learning_rate` for `--config.optimizer.learning_rate`)."""
  parent = '.'.join(['config', *path[:-1]])
  close = difflib.get_close_matches(path[-1], siblings, n=1)
  elsewhere = [p for p in everywhere if difflib.get_close_matches(path[-1], [p[-1]], n=1)]
  if close:
    fix = f'did you mean --{parent}.{close[0]}?'
  elif elsewhere:
    ratio = lambda p: difflib.SequenceMatcher(None, path[-1], p[-1]).ratio()
    best = max(map(ratio, elsewhere))
    names = [f'--config.{".".join(p)}' for p in elsewhere if ratio(p) == best]
    fix = f'did you mean {" or ".join(names)}?'
  else:
    fix = f'spell one of the fields of {parent}: {", ".join(siblings)}'
  return f'--config.{".".join(path)}: {parent} has no field {path[-1]!r}. Fix: {fix}'


def _config_default(argv: list[str], path: str) -> Any:
  """The config file's value of the dotted field `path`, None if there is none to read."""
  from absl import flags

  value = flag_argument(argv, 'config')
  if 'config' not in flags.FLAGS or value is None:
    return None
  try:
    node = flags.FLAGS['config'].parser.parse(value)
    for key in path.split('.'):
      node = node[key]
  except Exception:  # the file or field is broken: the plain message says enough
    return None
  return node


_KINDS = {bool: 'True or False', int: 'a whole number', float: 'a number', str: 'a string'}


def flag_error_line(argv: list[str], message: str) -> str:
  """One line for a flag absl could not parse (a value of the wrong type, a missing
  required flag), with the fix: for `--config.FIELD`, the field's type and a value of it."""
  message = ' '.join(message.split())
  if 'Fix:' in message:
    return message
  bad = re.match(r'flag (--config\.([\w.]+))=(.*?): ', message)
  default = _config_default(argv, bad.group(2)) if bad else None
  if default is not None and not hasattr(default, 'keys'):
    kind = _KINDS.get(type(default), type(default).__name__)
    return (
      f'{bad.group(1)}={bad.group(3)}: config.{bad.group(2)} takes {kind}, not '
      f'{bad.group(3)!r}. Fix: e.g. {bad.group(1)}={default}'
    )
  return f'{message.rstrip(".")}. Fix: --helpshort lists the flags and their types'


def parse_flags(argv: list[str]) -> list[str]:
  """absl's flag parsing (`app.run(main, flags_parser=errors.parse_flags)`), where an
  override naming no config field, or a value absl cannot parse, ends the program with
  one line instead of a traceback (or absl's two-line FATAL report)."""
  from absl import flags

  try:
    return flags.FLAGS(argv)
  except flags.Error as error:
    sys.exit(flag_error_line(argv, str(error)))
  except (AttributeError, KeyError, TypeError):
    config_flag = flags.FLAGS['config'] if 'config' in flags.FLAGS else None
    value = flag_argument(argv, 'config')
    if config_flag is None or value is None:
      raise
    message = unknown_override(argv, config_flag.parser.parse(value))
    if message is None:
      raise
    sys.exit(message)
