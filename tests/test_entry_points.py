"""The `python -m` programs: thin, never imported, flags at module level, each --help works.

absl keeps one global flag registry and several programs define the same names (--workdir,
--config), so two entry points can never share a process, and no user needs them to: each
is a program. What keeps every process free of flag clashes is checked here: flags are
defined only by entry points (at module level, as flax's examples/imagenet main.py), nothing
imports an entry point (tests run them as subprocesses), and each one's --help, in its own
process, imports everything it needs and lists its flags.
"""

from __future__ import annotations

import ast
import importlib.metadata
import os
import pathlib
import re
import subprocess
import sys

import pytest
import requirements

REPO = pathlib.Path(__file__).resolve().parents[1]
# Module -> the name `python -m` takes: the programs setup.py declares as console scripts.
CONSOLE_SCRIPTS = requirements.setup_arguments()['entry_points']['console_scripts']
ENTRY_POINTS = {
  module: module.removesuffix('.__main__')
  for module, _ in (entry.split('=', 1)[1].split(':') for entry in CONSOLE_SCRIPTS)
}
SOURCE_DIRS = ('hscl_jax', 'tests', 'benchmarks', 'launch', 'configs')


def _module_name(path: pathlib.Path) -> str:
  return '.'.join(path.relative_to(REPO).with_suffix('').parts)


def _sources():
  for folder in SOURCE_DIRS:
    for path in sorted((REPO / folder).rglob('*.py')):
      yield path, ast.parse(path.read_text(), str(path))


def _imported_modules(tree: ast.Module, module: str) -> set[str]:
  """Every module an import statement or importlib.import_module('...') call names."""
  package = module.rsplit('.', 1)[0]
  names = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      names.update(alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ''
      if node.level:
        parent = package.rsplit('.', node.level - 1)[0] if node.level > 1 else package
        base = f'{parent}.{base}' if base else parent
      names.add(base)
      names.update(f'{base}.{alias.name}' for alias in node.names)
    elif (
      isinstance(node, ast.Call)
      and getattr(node.func, 'attr', None) == 'import_module'
      and node.args
      and isinstance(node.args[0], ast.Constant)
    ):
      names.add(node.args[0].value)
  return names


def _flag_definitions(tree: ast.Module):
  """(flag name or None, at module level) of every flags.DEFINE_*(...) call on the global
  FLAGS (a call given its own flag_values= touches no other program's flags)."""
  top_level = {id(n) for stmt in tree.body for n in ast.walk(stmt)} - {
    id(n)
    for stmt in tree.body
    if isinstance(stmt, (ast.FunctionDef, ast.ClassDef))
    for n in ast.walk(stmt)
  }
  for node in ast.walk(tree):
    if (
      isinstance(node, ast.Call)
      and getattr(node.func, 'attr', '').startswith('DEFINE')
      and not any(keyword.arg == 'flag_values' for keyword in node.keywords)
    ):
      first = node.args[0] if node.args else None
      name = first.value if isinstance(first, ast.Constant) else None
      yield name, id(node) in top_level


def program_flags(module: str) -> set[str]:
  """The flags entry point `module` defines (absl's own aside)."""
  tree = ast.parse((REPO / (module.replace('.', '/') + '.py')).read_text())
  return {name for name, _ in _flag_definitions(tree)}


def test_nothing_imports_an_entry_point():
  importers = {
    str(path.relative_to(REPO)): sorted(
      _imported_modules(tree, _module_name(path)) & set(ENTRY_POINTS)
    )
    for path, tree in _sources()
  }
  assert {path: names for path, names in importers.items() if names} == {}


def test_only_entry_points_define_flags_and_at_module_level():
  definitions = {_module_name(path): list(_flag_definitions(tree)) for path, tree in _sources()}
  outside = {m: d for m, d in definitions.items() if d and m not in ENTRY_POINTS}
  assert outside == {}, 'global flags belong to entry points'
  for module in ENTRY_POINTS:
    assert definitions[module], f'{module} defines no flag'
    assert all(at_top for _, at_top in definitions[module]), f'{module}: flags inside a function'


@pytest.mark.parametrize('module', sorted(ENTRY_POINTS))
def test_entry_point_is_thin(module):
  """Public code lives in libraries: an entry point defines `main` and `run`, its console
  script, which `python -m` runs too."""
  source = (REPO / (module.replace('.', '/') + '.py')).read_text()
  tree = ast.parse(source)
  public = {
    node.name
    for node in tree.body
    if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and not node.name.startswith('_')
  }
  assert public == {'main', 'run'}
  guard = tree.body[-1]
  assert isinstance(guard, ast.If) and ast.unparse(guard.test) == "__name__ == '__main__'"
  assert [ast.unparse(stmt) for stmt in guard.body] == ['run()']
  # Every program starts the same way: its config importable, its overrides parsed by
  # command_line.parse_flags (a misspelt field is one line).
  (run,) = [node for node in tree.body if getattr(node, 'name', None) == 'run']
  assert ast.unparse(run.body[-1]) == 'command_line.run(main)'


def test_each_program_is_one_console_script_of_its_own():
  """setup.py's console scripts: hscl-<name>, one per program, each calling its run()."""
  names = [entry.split('=', 1)[0] for entry in CONSOLE_SCRIPTS]
  targets = [entry.split('=', 1)[1] for entry in CONSOLE_SCRIPTS]
  assert len(set(names)) == len(names) == len(set(targets)) == len(ENTRY_POINTS)
  assert all(name.startswith('hscl-') for name in names)
  assert all(target.endswith(':run') for target in targets)
  assert names[0] == 'hscl-train' and targets[0] == 'hscl_jax.main:run'


def test_the_docs_table_of_console_scripts_is_setups():
  table = re.findall(
    r'^\| `(hscl-[a-z-]+)` \| `python -m ([\w.]+)` \|$',
    (REPO / 'docs' / 'training.md').read_text(),
    re.M,
  )
  declared = [(entry.split('=', 1)[0], entry.split('=', 1)[1]) for entry in CONSOLE_SCRIPTS]
  assert table == [(name, ENTRY_POINTS[target.split(':')[0]]) for name, target in declared]


def test_the_installed_console_scripts_run_the_programs():
  """The scripts a `pip install` of setup.py puts beside this Python (a fresh install in
  CI), each in its own process: --help shows its program's usage, as `python -m` does,
  its examples spelt with the command it was started by (`hscl-train ...`, not `python -m
  hscl_jax.main ...`)."""
  installed = {
    entry.name: entry.value
    for entry in importlib.metadata.entry_points(group='console_scripts')
    if entry.dist is not None and entry.dist.name.replace('-', '_') == 'hscl_jax'
  }
  declared = dict(entry.split('=', 1) for entry in CONSOLE_SCRIPTS)
  assert installed == declared, (
    "the installed hscl_jax's console scripts differ from setup.py's. Fix: reinstall, "
    "pip install -e '.[test]' -c constraints.txt"
  )
  bin_dir = pathlib.Path(sys.executable).parent
  env = {**os.environ, 'JAX_PLATFORMS': 'cpu'}
  procs = {
    name: subprocess.Popen(
      [str(bin_dir / name), '--help'],
      cwd=REPO,
      env=env,
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
    )  # fmt: skip
    for name in declared
  }
  for name, proc in procs.items():
    out, err = proc.communicate(timeout=300)
    module = declared[name].split(':')[0]
    assert 'Traceback' not in err, f'{name}:\n{err[-3000:]}'
    usage = out.split('\nflags:\n', 1)[0]  # its docstring
    assert re.search(rf'^ +{name} ', usage, re.M), (name, usage)
    assert not re.search(rf'python -m {re.escape(ENTRY_POINTS[module])}(?![\w.])', usage), usage
    tree = ast.parse((REPO / (module.replace('.', '/') + '.py')).read_text())
    for flag, _ in _flag_definitions(tree):
      assert re.search(rf'^  --(\[no\])?{flag}:', out, re.M), f'{name}: --{flag} not in --help'
  # Past the help, main runs: a missing config file is its one line.
  out = subprocess.run(
    [str(bin_dir / 'hscl-train'), '--config=configs/nothing.py', '--workdir=unused'],
    cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
  )  # fmt: skip
  assert out.returncode == 1 and 'config file configs/nothing.py not found' in out.stderr


# Run as `python -m NAME` runs it (runpy, as __main__), with absl's app.run wrapped: first
# main(argv) with positional arguments left over (flags not yet parsed, as app.run would
# call it after parsing), then the real app.run with --help (which exits after the help).
_AS_A_PROGRAM = """
import runpy
import sys
from absl import app

name = sys.argv[1]
real_run = app.run

def run(main, **kwargs):
  for argv in (['p', 'stray'], ['p', 'a', 'b'], ['p']):
    try:
      main(argv)
      print('ran')
    except app.UsageError as error:
      print(f'usage: {error}')
    except BaseException as error:  # flags left unparsed here: main went past its check
      print(f'past: {type(error).__name__}')
  print(%r)
  real_run(main, argv=[name, '--help'], **kwargs)

app.run = run
sys.argv = [name]
runpy.run_module(name, run_name='__main__', alter_sys=True)
"""
_HELP_FOLLOWS = '--- the help follows ---'


@pytest.fixture(scope='module')
def programs() -> dict[str, tuple[list[str], str, str]]:
  """{module: (stray-argument lines, --help output, stderr)} of every entry point run as
  `python -m` runs it, one fresh process each (all started at once): a process per
  program is what keeps absl's one flag registry free of clashes."""
  env = {**os.environ, 'PYTHONPATH': str(REPO), 'JAX_PLATFORMS': 'cpu'}
  procs = {
    module: subprocess.Popen(
      [sys.executable, '-c', _AS_A_PROGRAM % _HELP_FOLLOWS, ENTRY_POINTS[module]],
      cwd=REPO,
      env=env,
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
    )
    for module in ENTRY_POINTS
  }
  outputs = {}
  for module, proc in procs.items():
    out, err = proc.communicate(timeout=300)
    assert _HELP_FOLLOWS in out, f'{module}:\n{out}\n{err[-3000:]}'  # (absl's --help exits 1)
    stray, help_text = out.split(_HELP_FOLLOWS + '\n', 1)
    outputs[module] = (stray.splitlines(), help_text, err)
  return outputs


def test_every_entry_point_help_lists_its_flags(programs):
  """Each program's --help (`python -m` in its own fresh process): the imports work (no flag
  defined twice) and the help shows the usage line and every flag."""
  for module, (_, out, err) in programs.items():
    assert 'Traceback' not in err, f'{module}:\n{err[-3000:]}'
    assert f'python -m {ENTRY_POINTS[module]}' in out, module
    tree = ast.parse((REPO / (module.replace('.', '/') + '.py')).read_text())
    for name, _ in _flag_definitions(tree):
      assert re.search(rf'^  --(\[no\])?{name}:', out, re.M), f'{module}: --{name} not in --help'
  # A help that lists the choices lists them in order: prepare's TFDS datasets, A to Z.
  prepare_help = ' '.join(programs['hscl_jax.prepare'][1].split())
  assert 'one of cifar10, cifar100, stl10 (digits and image_folder' in prepare_help


def test_every_entry_point_refuses_stray_arguments_and_only_them(programs):
  """main(argv) with positional arguments left over by absl is a usage error naming them;
  with none it goes on (the `main` each program's own `app.run(main)` line passes)."""
  for module, (lines, _, err) in programs.items():
    assert lines[:2] == [
      'usage: Unexpected arguments: stray',
      'usage: Unexpected arguments: a b',
    ], (module, lines, err[-2000:])
    assert len(lines) == 3 and not lines[2].startswith('usage:'), (module, lines)


def test_compare_graphs_refuses_unknown_methods_naming_them_in_order(tmp_path):
  """Before any work: the unknown names of --methods, A to Z, and the methods to pick from."""
  out = subprocess.run(
    [sys.executable, '-m', 'hscl_jax.experiments.compare_graphs', f'--data_dir={tmp_path}',
     f'--workdir={tmp_path}', '--methods=zeta,ucl,alpha'],
    cwd=REPO, env={**os.environ, 'PYTHONPATH': str(REPO), 'JAX_PLATFORMS': 'cpu'},
    capture_output=True, text=True, timeout=300,
  )  # fmt: skip
  assert out.returncode != 0 and os.listdir(tmp_path) == []
  assert "--methods: unknown ['alpha', 'zeta']; use some of " in out.stderr


@pytest.mark.parametrize(
  'stop, status, line',
  [
    (
      'os.kill(os.getpid(), signal.SIGINT); time.sleep(60)',
      130,
      'Ctrl-C (SIGINT): stopped before finishing; rerun the same command.',
    ),
    ("raise errors.Interrupted('stopped here', signal.SIGTERM)", 143, 'stopped here'),
  ],
  ids=['ctrl-c', 'a-stop-at-once'],
)
def test_a_program_stopped_by_a_signal_says_so_in_one_line(tmp_path, stop, status, line):
  """Every program starts by command_line.run: Ctrl-C in one that has no stop of its own
  (training has: tests/end_to_end/test_train.py), or a stop at once a program raises, ends it
  with one line instead of a traceback and the status of a process the signal killed (128 +
  its number: 130 for Ctrl-C, what a shell reports for an interrupted command)."""
  program = tmp_path / 'program.py'
  program.write_text(
    'import os, signal, time\n'
    'from hscl_jax import errors\n'
    'from hscl_jax.config import command_line\n'
    f'def main(argv):\n  {stop}\n'
    'command_line.run(main)\n'
  )
  out = subprocess.run(
    [sys.executable, str(program)],
    cwd=REPO, env={**os.environ, 'PYTHONPATH': str(REPO)},
    capture_output=True, text=True, timeout=120,
  )  # fmt: skip
  assert out.returncode == status, out.stderr[-3000:]
  assert 'Traceback' not in out.stderr, out.stderr[-3000:]
  (error,) = [text for text in out.stderr.splitlines() if text.startswith('E')]
  assert error.endswith(f'] {line}'), error
