"""How every program starts: its config file made importable, its flags parsed, `main` run.

Each program's `run()` is its console script (setup.py's `console_scripts`: `hscl-train`,
`hscl-linear-eval`, ...) and what `python -m` runs, so the two start the same way; the help
of each names the command it was started by. A program that defines `--config_help`
(`CONFIG_HELP`) lists the config fields for it and exits, before its flags are parsed (so
without its required flags). Flags are parsed by `parse_flags`: an override naming no
config field, or a value absl cannot parse, is one line with the fix.
"""

from __future__ import annotations

from collections.abc import Callable
import difflib
import os
import re
import shlex
import sys
import textwrap
from typing import Any

from hscl_jax import errors

CONFIG_HELP = (
  "List the config fields, each with its value (the --config file's, else the default), "
  'its default and its meaning, and exit: --config_help for every field, '
  '--config_help=SECTION (e.g. augment) or --config_help=FIELD (e.g. batch_size) for some.'
)


def config_file_argument(argv: list[str]) -> str | None:
  """The value of --config in `argv` (its path part: config_flags allows PATH:ARG)."""
  value = flag_argument(argv, 'config')
  if value is None:
    return None
  return value if os.path.exists(value) else value.split(':', 1)[0]


def make_config_importable(argv: list[str]) -> None:
  """Lets configs/<name>.py, which imports `configs.default`, load from any directory;
  a missing file is one line naming it, before flags are parsed."""
  path = config_file_argument(argv)
  if path is None:
    return
  if not os.path.isfile(path):
    sys.exit(
      f'config file {path} not found (from directory {os.getcwd()}). Fix: pass the '
      "path of a file in the repository's configs/ folder, e.g. "
      '--config=configs/digits.py from the repository root, or its absolute path.'
    )
  configs_dir = os.path.dirname(os.path.abspath(path))
  if os.path.isfile(os.path.join(configs_dir, '__init__.py')):
    sys.path.insert(0, os.path.dirname(configs_dir))


def _help_as_a_program(program) -> None:
  """absl's --help shows `__main__`'s docstring and the flags of the module named
  sys.argv[0]; a console script's `__main__` is pip's wrapper, so its help would show
  neither. The program's docstring, its examples spelt with the script's name, and its
  flags are given to the wrapper."""
  from absl import flags

  main_module = sys.modules['__main__']
  if main_module is program:  # python -m: absl finds both itself
    return
  python_m = re.escape(f'python -m {program.__name__.removesuffix(".__main__")}')
  script = os.path.basename(sys.argv[0])
  main_module.__doc__ = re.sub(rf'{python_m}(?![\w.])', script, program.__doc__ or '')
  for flag in flags.FLAGS.get_key_flags_for_module(program.__name__):
    flags.FLAGS.register_key_flag_for_module(sys.argv[0], flag)


def config_help_argument(argv: list[str]) -> str | None:
  """What `--config_help` asks for: '' (every field) alone, SELECTION from
  `--config_help=SELECTION`, None without it."""
  for arg in argv[1:]:
    if arg == '--config_help':
      return ''
    if arg.startswith('--config_help='):
      return arg.split('=', 1)[1]
  return None


def config_help(selection: str, config: Any = None, config_file: str | None = None) -> str:
  """The fields named `selection` or in its section ('' = every field), each as the
  override that sets it to its value in `config` (None: the defaults), with the default
  where that differs, and its meaning."""
  from hscl_jax.config import fields  # its imports (JAX, the data) only when asked

  name = selection.removeprefix('config.')
  chosen = [
    f for f in fields.DECLARED if f.name == name or f.name.startswith(f'{name}.') or not name
  ]
  if not chosen:
    sections = ', '.join(s for s in fields.CONFIG_FIELDS if s)
    raise errors.UserError(
      f'--config_help={selection}: no config section or field of that name. Fix: pass a '
      f'section ({sections}) or a field (e.g. batch_size), or --config_help alone for all.'
    )
  source = config_file or 'configs/default.py (the defaults)'
  lines = [f'Config fields of {source}; set one with --config.FIELD=VALUE:']
  for field in chosen:
    lines.append(f'  --config.{field.name}={_field_value(field, config)}')
    if field.doc:
      lines.append(textwrap.fill(field.doc, 100, initial_indent=' ' * 6, subsequent_indent=' ' * 6))
  return '\n'.join(lines)


def _field_value(field, config) -> str:
  """`VALUE` as an override spells it (quoted for a shell where needed), then the default
  where it differs and the type a field unset by default takes."""
  from hscl_jax.config import checks
  from hscl_jax.config import fields

  unset = isinstance(field.default, checks.Unset)
  default = None if unset else field.default
  value = default if config is None else fields.value_of(config, field.name)
  shown = _shown(value)
  notes = [f'default {_shown(default)}'] if shown != _shown(default) else []
  if unset:
    notes.append(f'None = unset; type {field.default.type.__name__}')
  return shown + (f'  ({"; ".join(notes)})' if notes else '')


def _shown(value: Any) -> str:
  return 'None' if value is None else shlex.quote(str(value))


def _exit_after_config_help(argv: list[str]) -> None:
  """`--config_help`, in a program that defines it: the fields listed, then exit 0 (a bad
  selection: one line, exit 1)."""
  from absl import flags

  selection = config_help_argument(argv)
  if selection is None or 'config_help' not in flags.FLAGS:
    return  # absl refuses the flag of a program without it
  config_file = flag_argument(argv, 'config')
  config = flags.FLAGS['config'].parser.parse(config_file) if config_file else None
  try:
    print(config_help(selection, config, config_file))
  except errors.UserError as error:
    sys.exit(str(error))
  sys.exit(0)


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
  """absl's flag parsing (`app.run(main, flags_parser=parse_flags)`), where an
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


def run(main: Callable[[list[str]], None]) -> None:
  """Runs a program's `main(argv)` under absl with the programs' flag parser (a misspelt
  --config.FIELD is one line), after its --config file is made importable; with
  `--config_help`, lists the config fields instead; Ctrl-C ends it with one line and exit
  status 130 (errors.exit_on_interrupt)."""
  from absl import app  # the [train] extra, as every program needs

  make_config_importable(sys.argv)
  _help_as_a_program(sys.modules[main.__module__])
  _exit_after_config_help(sys.argv)
  errors.exit_on_interrupt(lambda: app.run(main, flags_parser=parse_flags))
