"""How every program starts: its config file made importable, its flags parsed, `main` run.

Each program's `run()` is its console script (setup.py's `console_scripts`: `hscl-train`,
`hscl-linear-eval`, ...) and what `python -m` runs, so the two start the same way; the help
of each names the command it was started by. A program that defines `--config_help`
(`CONFIG_HELP`) lists the config fields for it and exits, before its flags are parsed (so
without its required flags).
"""

from __future__ import annotations

from collections.abc import Callable
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
  value = errors.flag_argument(argv, 'config')
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
  config_file = errors.flag_argument(argv, 'config')
  config = flags.FLAGS['config'].parser.parse(config_file) if config_file else None
  try:
    print(config_help(selection, config, config_file))
  except errors.UserError as error:
    sys.exit(str(error))
  sys.exit(0)


def run(main: Callable[[list[str]], None]) -> None:
  """Runs a program's `main(argv)` under absl with the programs' flag parser (a misspelt
  --config.FIELD is one line), after its --config file is made importable; with
  `--config_help`, lists the config fields instead; Ctrl-C ends it with one line and exit
  status 130 (errors.exit_on_interrupt)."""
  from absl import app  # the [train] extra, as every program needs

  make_config_importable(sys.argv)
  _help_as_a_program(sys.modules[main.__module__])
  _exit_after_config_help(sys.argv)
  errors.exit_on_interrupt(lambda: app.run(main, flags_parser=errors.parse_flags))
