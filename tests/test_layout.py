"""The package's import rules, as docs/layout.md states them, checked on the sources.

Every module of hscl_jax belongs to a unit: a top-level module (`errors`, `main`), a
package whose modules may import each other (`data`, `graphs`, `losses`, `models`), or a
module of a package whose modules are units of their own (`training/step`,
`rundir/checkpoints`, `experiments/image_grid`). docs/layout.md's tables list, per unit,
the units it may import; this test reads every `hscl_jax` import (local ones included) and
fails on one the tables do not allow, and on a unit they do not list.
"""

from __future__ import annotations

import ast
import os
import pathlib
import re
import shutil
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = REPO / 'hscl_jax'
LAYOUT = REPO / 'docs' / 'layout.md'
LINT_IMPORTS = pathlib.Path(sys.executable).parent / 'lint-imports'  # import-linter, [test]


# The packages whose modules are units of their own; their `__init__`s are docstrings.
MODULE_UNITS = ('config', 'evaluation', 'experiments', 'rundir', 'training')


def unit_of(parts: list[str]) -> str:
  """`['data', 'sources']` -> 'data'; `['training', 'step']` -> 'training/step'."""
  if parts[0] in MODULE_UNITS and len(parts) > 1:
    return '/'.join(parts[:2])
  return parts[0]


def module_parts(path: pathlib.Path) -> list[str]:
  parts = list(path.relative_to(PACKAGE).with_suffix('').parts)
  return parts[:-1] if parts[-1] == '__init__' else parts


def imported_units(path: pathlib.Path) -> set[str]:
  """The units of every `hscl_jax` import in the file (`from hscl_jax import x` is unit x)."""
  units = set()
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.ImportFrom) and node.module and node.module.split('.')[0] == 'hscl_jax':
      base = node.module.split('.')[1:]
      names = (
        [[*base, alias.name] for alias in node.names]
        if len(base) == 0 or (len(base) == 1 and base[0] in MODULE_UNITS)
        else [base]
      )
      units.update(unit_of(parts) for parts in names)
    elif isinstance(node, ast.Import):
      for alias in node.names:
        if alias.name.startswith('hscl_jax.'):
          units.add(unit_of(alias.name.split('.')[1:]))
  return units


def layout_rules() -> dict[str, set[str]]:
  """{unit: the units it may import} from docs/layout.md's `module | owns | may import` table."""
  rules = {}
  for line in LAYOUT.read_text().splitlines():
    cells = [cell.strip() for cell in line.strip().strip('|').split('|')]
    if len(cells) != 3 or not cells[0].startswith('`'):
      continue
    allowed = set(re.findall(r'`([^`]+)`', cells[2]))
    for unit in re.findall(r'`([^`]+)`', cells[0]):
      rules[unit] = allowed
  return rules


def units_of_package() -> dict[str, list[pathlib.Path]]:
  units: dict[str, list[pathlib.Path]] = {}
  for path in sorted(PACKAGE.rglob('*.py')):
    parts = module_parts(path)
    if parts and not (len(parts) == 1 and parts[0] in MODULE_UNITS):
      units.setdefault(unit_of(parts), []).append(path)
  return units


def test_the_layout_table_lists_every_unit():
  rules, units = layout_rules(), units_of_package()
  assert sorted(set(units) - set(rules)) == []
  assert sorted(set(rules) - set(units)) == []


def test_every_import_follows_the_layout_rules():
  rules = layout_rules()
  broken = []
  for unit, paths in units_of_package().items():
    for path in paths:
      for imported in sorted(imported_units(path) - {unit} - rules.get(unit, set())):
        broken.append(f'{path.relative_to(REPO)} imports {imported}')
  assert broken == []


def test_the_check_sees_a_forbidden_import(tmp_path):
  """The reader finds local imports too (the kind that broke the rules before)."""
  module = tmp_path / 'mod.py'
  module.write_text(
    'def f():\n  from hscl_jax.rundir import checkpoints\n  from hscl_jax.data import arrays\n'
    '  from hscl_jax.training.step import make_train_step\n'
  )
  assert imported_units(module) == {'rundir/checkpoints', 'data', 'training/step'}


def test_evaluation_never_imports_training():
  """Evaluation reads a trained run (rundir/trained_run) and shares the mesh (parallel):
  nothing of training's run, only its leaf optimizer factory (the linear probe's Adam)."""
  rules = layout_rules()
  reaching = {
    unit: sorted(a for a in allowed if a.startswith('training/') and a != 'optimizers')
    for unit, allowed in rules.items()
    if unit.startswith('evaluation/')
  }
  assert {unit: names for unit, names in reaching.items() if names} == {}
  assert not any(unit.startswith('training/') for unit in rules['optimizers'])


def test_the_unit_packages_init_modules_import_nothing_of_ours():
  """`hscl_jax.training` and the like are their modules' namespace: importing one module
  does not import its neighbours."""
  heavy = {
    name: sorted(imported_units(PACKAGE / name / '__init__.py'))
    for name in MODULE_UNITS
    if imported_units(PACKAGE / name / '__init__.py')
  }
  assert heavy == {}


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
  and a cycle, since data reads config's choices) and losses importing errors (its own layer)
  are each named as the import that breaks a contract."""
  shutil.copytree(PACKAGE, tmp_path / 'hscl_jax', ignore=shutil.ignore_patterns('__pycache__'))
  shutil.copy(REPO / 'pyproject.toml', tmp_path)
  kept = _lint_imports(tmp_path)
  assert kept.returncode == 0, kept.stdout[-3000:] + kept.stderr[-3000:]
  assert 'Contracts: 2 kept, 0 broken.' in kept.stdout
  _append(tmp_path / 'hscl_jax' / 'config' / 'choices.py', 'from hscl_jax import data')
  _append(tmp_path / 'hscl_jax' / 'losses' / 'kernel.py', 'from hscl_jax import errors')
  broken = _lint_imports(tmp_path)
  assert broken.returncode == 1, broken.stdout[-3000:]
  assert 'Contracts: 0 kept, 2 broken.' in broken.stdout
  report = broken.stdout.split('Broken contracts')[1]
  assert 'hscl_jax.config is not allowed to import hscl_jax.data' in report
  assert 'hscl_jax.config.choices -> hscl_jax.data' in report
  assert 'hscl_jax.losses is not allowed to import hscl_jax.errors' in report
  assert '.config -> .data' in report or '.data -> .config' in report  # the cycle


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
