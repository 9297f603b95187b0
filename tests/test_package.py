"""Packaging: the loss kernels are importable without the training stack."""

from __future__ import annotations

import ast
import importlib.metadata
import json
import os
import pathlib
import re
import subprocess
import sys

import requirements

import hscl_jax

# Top-level modules that only training, data, evaluation or plotting need.
HEAVY = (
  'flax',
  'optax',
  'orbax',
  'grain',
  'tensorflow',
  'tensorflow_datasets',
  'tensorboardX',
  'matplotlib',
  'sklearn',
  'PIL',
  'ml_collections',
  'absl',
  'array_record',
)

_PROBE = """
import json, sys
import jax, jax.numpy
with_jax = set(sys.modules)
from hscl_jax import losses
print(json.dumps({'jax': sorted(with_jax), 'losses': sorted(set(sys.modules) - with_jax)}))
"""


def test_losses_import_no_package_beyond_jax():
  out = subprocess.run(
    [sys.executable, '-c', _PROBE],
    capture_output=True,
    text=True,
    env={**os.environ, 'JAX_PLATFORMS': 'cpu'},
    timeout=120,
    check=True,
  )
  modules = json.loads(out.stdout.splitlines()[-1])
  assert 'jax' in modules['jax']
  jax_packages = {m.split('.')[0] for m in modules['jax']}
  # Only our package and lazily loaded parts of packages `import jax` already loaded.
  assert {m.split('.')[0] for m in modules['losses']} - jax_packages == {'hscl_jax'}
  ours = [m for m in modules['losses'] if m.startswith('hscl_jax')]
  assert ours[:2] == ['hscl_jax', 'hscl_jax.losses']
  assert all(m.startswith('hscl_jax.losses.') for m in ours[2:])
  assert not [m for m in modules['jax'] + modules['losses'] if m.split('.')[0] in HEAVY]


REPO = pathlib.Path(__file__).resolve().parents[1]
# Imported lazily by the one feature that needs it, which names its extra when it is missing.
OPTIONAL = {'tensorflow': 'prepare'}


def _third_party_imports() -> set[str]:
  """Top-level modules the package imports (anywhere in its code) that are not its own or
  the standard library's."""
  found = set()
  for path in (REPO / 'hscl_jax').rglob('*.py'):
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, ast.Import):
        found.update(alias.name.split('.')[0] for alias in node.names)
      elif isinstance(node, ast.ImportFrom) and node.level == 0:
        found.add(node.module.split('.')[0])
  return found - set(sys.stdlib_module_names) - {'hscl_jax', '__future__'}


def test_the_package_needs_jax_numpy_and_the_train_extra_only():
  """install_requires is JAX and NumPy; every other import is the [train] extra's (so a
  missing one is the one-line error naming it) or an optional feature's."""
  assert requirements.install_requires() == ['jax', 'numpy']
  imports = _third_party_imports()
  # scipy (the reports' tests of significance): jax and jaxlib require it, so every
  # install has it, as numpy.
  assert imports - {'jax', 'numpy', 'scipy'} - set(OPTIONAL) == hscl_jax.TRAINER_MODULES
  top_levels = importlib.metadata.packages_distributions()
  train = set(requirements.extra('train'))
  extra_modules = {
    module
    for module in hscl_jax.TRAINER_MODULES
    if {requirements.distribution(d) for d in top_levels.get(module, [])} & train
  }
  assert extra_modules == hscl_jax.TRAINER_MODULES  # each one is the extra's own


def _without(hidden, code: str) -> subprocess.CompletedProcess:
  return subprocess.run(
    [sys.executable, '-c', requirements.hiding(hidden, code)],
    capture_output=True,
    text=True,
    env={**os.environ, 'JAX_PLATFORMS': 'cpu'},
    timeout=120,
  )


def test_a_missing_trainer_dependency_is_one_line_naming_the_extra():
  """As if the [train] extra were not installed (tests/losses_alone.py checks a real bare
  install in CI, the losses running there): a program stops with the line alone
  (SystemExit: printed, exit status 1), a library import raises ModuleNotFoundError in one
  line."""
  code = """
try:
  runpy.run_module('hscl_jax.embed', run_name='__main__', alter_sys=True)  # imports absl
except SystemExit as error:
  print(repr(error.code))
HIDDEN.clear()
HIDDEN.add('optax')
try:
  import hscl_jax.optimizers
except ModuleNotFoundError as error:
  print(repr(str(error)), error.name)
"""
  out = _without({'absl'}, code)
  fix = f'Fix: {hscl_jax.INSTALL_TRAINER}'
  assert out.stdout.splitlines() == [
    repr(f"hscl_jax.embed needs the trainer's dependencies (absl is not installed). {fix}"),
    repr(f"hscl_jax.optimizers needs the trainer's dependencies (optax is not installed). {fix}")
    + ' optax',
  ], out.stderr[-2000:]


def test_a_missing_trainer_dependency_names_the_program_run_not_the_importing_module():
  """`python -m hscl_jax.main` (run as `-m` runs it) without optax: optax is imported by a
  library module several imports down (hscl_jax.optimizers), but the line names the
  program the user ran, the missing module and the extra, and nothing else."""
  code = """
for program in ('hscl_jax.main', 'hscl_jax.linear_eval'):
  try:
    runpy.run_module(program, run_name='__main__', alter_sys=True)
  except SystemExit as error:
    print(repr(error.code))
  else:
    print(program, 'ran')
"""
  out = _without({'optax'}, code)
  fix = f'Fix: {hscl_jax.INSTALL_TRAINER}'
  assert out.stdout.splitlines() == [
    repr(f"{program} needs the trainer's dependencies (optax is not installed). {fix}")
    for program in ('hscl_jax.main', 'hscl_jax.linear_eval')
  ], out.stdout + out.stderr[-2000:]


def test_every_extra_an_install_command_names_exists():
  """`.[X]`, `hscl_jax[X]` in the docs, scripts, messages and CI name extras of setup.py."""
  files = [REPO / 'README.md', REPO / '.ci' / 'run', *(REPO / 'docs').rglob('*.md')]
  for folder in ('hscl_jax', 'launch', 'tools', 'benchmarks', 'tests', 'dev'):
    files += [p for p in (REPO / folder).rglob('*') if p.suffix in ('.py', '.sh', '.md', '')]
  named = {}
  stored = REPO / 'tests' / 'fixtures'  # a workdir's binary files, not commands
  for path in files:
    if path.is_file() and stored not in path.parents:
      for match in re.finditer(r'(?:\.|hscl_jax|\$remote_dir)\[([a-z0-9_,]+)\]', path.read_text()):
        for extra in match.group(1).split(','):
          named.setdefault(extra, path.relative_to(REPO))
  assert {'train', 'test', 'torch'} <= set(named)
  assert {e: p for e, p in named.items() if e not in requirements.extras()} == {}
