"""How every program starts: its config file made importable, its flags parsed, `main` run.

Each program's `run()` is its console script (setup.py's `console_scripts`: `hscl-train`,
`hscl-linear-eval`, ...) and what `python -m` runs, so the two start the same way.
"""

from __future__ import annotations

from collections.abc import Callable
import os
import sys

from hscl_jax import errors


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
  neither. The program's docstring and flags are given to the wrapper."""
  from absl import flags

  main_module = sys.modules['__main__']
  if main_module is program:  # python -m: absl finds both itself
    return
  main_module.__doc__ = program.__doc__
  for flag in flags.FLAGS.get_key_flags_for_module(program.__name__):
    flags.FLAGS.register_key_flag_for_module(sys.argv[0], flag)


def run(main: Callable[[list[str]], None]) -> None:
  """Runs a program's `main(argv)` under absl with the programs' flag parser (a misspelt
  --config.FIELD is one line), after its --config file is made importable; Ctrl-C ends it
  with one line and exit status 130 (errors.exit_on_interrupt)."""
  from absl import app  # the [train] extra, as every program needs

  make_config_importable(sys.argv)
  _help_as_a_program(sys.modules[main.__module__])
  errors.exit_on_interrupt(lambda: app.run(main, flags_parser=errors.parse_flags))
