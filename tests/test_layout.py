"""The package's import rules (docs/layout.md): import-linter's contracts in pyproject.toml
hold on the sources and report a planted break; the checks the linter cannot make (a unit
package's `__init__` imports nothing of ours; short functions) read the sources here."""

from __future__ import annotations

import ast
import os
import pathlib
import shutil
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = REPO / 'hscl_jax'
LINT_IMPORTS = pathlib.Path(sys.executable).parent / 'lint-imports'  # import-linter, [test]

# The packages whose modules are read one at a time; their `__init__`s are docstrings.
NAMESPACES = ('config', 'evaluation', 'experiments', 'rundir', 'training')


def _lint_imports(root: pathlib.Path) -> subprocess.CompletedProcess:
  """`lint-imports` on the hscl_jax under `root`, with the contracts of root/pyproject.toml."""
  return subprocess.run(
    [str(LINT_IMPORTS), '--no-cache', '--config', str(root / 'pyproject.toml')],
    cwd=root,
    env={**os.environ, 'PYTHONPATH': str(root)},
    capture_output=True,
    text=True,
    timeout=120,
  )


def _append(path: pathlib.Path, line: str) -> None:
  with path.open('a') as file:
    file.write(f'\n{line}\n')


def test_the_import_contracts_hold_and_report_a_planted_break(tmp_path):
  """On a copy of the package: kept as it is; then config importing data (a layer above it,
  and a cycle, since data reads config's choices), losses importing errors (its own layer)
  and config importing losses (config is a leaf beside errors) are each named as the import
  that breaks a contract."""
  shutil.copytree(PACKAGE, tmp_path / 'hscl_jax', ignore=shutil.ignore_patterns('__pycache__'))
  shutil.copy(REPO / 'pyproject.toml', tmp_path)
  kept = _lint_imports(tmp_path)
  assert kept.returncode == 0, kept.stdout[-3000:] + kept.stderr[-3000:]
  assert 'Contracts: 3 kept, 0 broken.' in kept.stdout
  _append(tmp_path / 'hscl_jax' / 'config' / 'choices.py', 'from hscl_jax import data')
  _append(tmp_path / 'hscl_jax' / 'losses' / 'kernel.py', 'from hscl_jax import errors')
  _append(tmp_path / 'hscl_jax' / 'config' / 'methods.py', 'from hscl_jax import losses')
  broken = _lint_imports(tmp_path)
  assert broken.returncode == 1, broken.stdout[-3000:]
  assert 'Contracts: 0 kept, 3 broken.' in broken.stdout
  report = broken.stdout.split('Broken contracts')[1]
  assert 'hscl_jax.config is not allowed to import hscl_jax.data' in report
  assert 'hscl_jax.config.choices -> hscl_jax.data' in report
  assert 'hscl_jax.losses is not allowed to import hscl_jax.errors' in report
  assert 'hscl_jax.config is not allowed to import hscl_jax.losses' in report
  assert '.config -> .data' in report or '.data -> .config' in report  # the cycle


def _imports_of_ours(path: pathlib.Path) -> list[str]:
  """The `hscl_jax` modules a file imports (local imports too)."""
  names = []
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.ImportFrom) and (node.module or '').split('.')[0] == 'hscl_jax':
      names.append(node.module)
    elif isinstance(node, ast.Import):
      names.extend(a.name for a in node.names if a.name.split('.')[0] == 'hscl_jax')
  return names


def test_the_namespace_packages_init_modules_import_nothing_of_ours():
  """`hscl_jax.training` and the like are their modules' namespace: importing one module
  does not import its neighbours."""
  heavy = {
    name: _imports_of_ours(PACKAGE / name / '__init__.py')
    for name in NAMESPACES
    if _imports_of_ours(PACKAGE / name / '__init__.py')
  }
  assert heavy == {}


def test_the_init_check_sees_a_local_import(tmp_path):
  module = tmp_path / 'mod.py'
  module.write_text('def f():\n  from hscl_jax.rundir import checkpoints\n  import hscl_jax.data\n')
  assert _imports_of_ours(module) == ['hscl_jax.rundir', 'hscl_jax.data']


MAX_FUNCTION_LINES = 60


def test_no_function_is_longer_than_60_lines():
  """Short functions (docstrings included): a longer one is split by job."""
  long = []
  for path in sorted(PACKAGE.rglob('*.py')):
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        lines = node.end_lineno - node.lineno + 1
        if lines > MAX_FUNCTION_LINES:
          long.append(f'{path.relative_to(REPO)}:{node.lineno} {node.name} ({lines} lines)')
  assert long == []
