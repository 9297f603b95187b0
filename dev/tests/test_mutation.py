"""dev/mutation.py finds a module's tests: its mirrored test file, else the test files that
import it; none found is one line naming the file to write."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import mutation
import pytest


def _tree(root: pathlib.Path, files: dict[str, str]) -> pathlib.Path:
  for name, text in files.items():
    (root / name).parent.mkdir(parents=True, exist_ok=True)
    (root / name).write_text(text)
  return root


PACKAGE = {
  'hscl_jax/__init__.py': '',
  'hscl_jax/errors.py': '',
  'hscl_jax/training/__init__.py': '',
  'hscl_jax/training/step.py': '',
  'hscl_jax/training/loop.py': '',
  'tools/first_light.py': '',
}


@pytest.mark.parametrize(
  'module,mirrored',
  [
    ('hscl_jax/training/step.py', 'tests/training/test_step.py'),
    ('hscl_jax/errors.py', 'tests/test_errors.py'),
    ('tools/first_light.py', 'tests/test_first_light.py'),
  ],
)
def test_the_mirrored_test_file_is_the_modules_tests_where_it_exists(tmp_path, module, mirrored):
  """Only the mirrored file, though another test file imports the module too."""
  root = _tree(
    tmp_path, {**PACKAGE, mirrored: '', 'tests/test_other.py': 'import hscl_jax.training.step\n'}
  )
  assert mutation.tests_of(pathlib.Path(module), root) == [mirrored]


def test_without_a_mirrored_file_the_test_files_importing_the_module_are_its_tests(tmp_path):
  """Each spelling of the import finds the module; a file importing its package or a sibling
  module, or naming it in a string, does not."""
  root = _tree(
    tmp_path,
    {
      **PACKAGE,
      'tests/test_a.py': 'from hscl_jax.training import step\n',
      'tests/training/test_b.py': 'import hscl_jax.training.step as s\n',
      'tests/test_c.py': 'from hscl_jax.training.step import make_train_step\n',
      'tests/test_d.py': 'from hscl_jax import training\nfrom hscl_jax.training import loop\n',
      'tests/test_e.py': "NAME = 'hscl_jax.training.step'\n",
      'tests/helper.py': 'from hscl_jax.training import step\n',
    },
  )
  assert mutation.tests_of(pathlib.Path('hscl_jax/training/step.py'), root) == [
    'tests/test_a.py',
    'tests/test_c.py',
    'tests/training/test_b.py',
  ]
  tools = _tree(tmp_path, {'tests/test_f.py': 'import first_light\n'})
  assert mutation.tests_of(pathlib.Path('tools/first_light.py'), tools) == ['tests/test_f.py']


def test_a_module_without_tests_is_one_line_naming_the_file_to_write(tmp_path):
  root = _tree(tmp_path, {**PACKAGE, 'tests/test_a.py': 'import hscl_jax.errors\n'})
  with pytest.raises(SystemExit) as stop:
    mutation.tests_of(pathlib.Path('hscl_jax/training/loop.py'), root)
  assert str(stop.value) == (
    'hscl_jax/training/loop.py: no tests found: neither tests/training/test_loop.py nor a '
    'test file importing hscl_jax.training.loop exists; write tests/training/test_loop.py '
    'or pass --tests'
  )


def _session(tmp_path: pathlib.Path, name: str) -> pathlib.Path:
  """A cosmic-ray session of a small module, initialised by `cosmic-ray init`."""
  module = _tree(tmp_path, {'pkg/m.py': 'def f(a, b):\n  return a + b * 2 - (a < b) or a\n'})
  config = tmp_path / 'cosmic-ray.toml'
  config.write_text(mutation.TEMPLATE.read_text().replace('MODULE', 'pkg/m.py'))
  program = pathlib.Path(sys.executable).with_name('cosmic-ray')
  subprocess.run([program, 'init', config, name], cwd=module, check=True, capture_output=True)
  return tmp_path / name


def _sampled(session: pathlib.Path) -> set[tuple]:
  from cosmic_ray.work_db import WorkDB
  from cosmic_ray.work_db import use_db

  with use_db(str(session), WorkDB.Mode.open) as db:
    return {tuple(mutation.mutation_key(item)[0]) for item in db.pending_work_items}


def test_a_seeded_sample_is_the_same_mutants_in_every_session(tmp_path):
  """Two sessions of one module (their job ids differ) keep the same 5 mutants for a seed;
  another seed keeps others. The rest are marked skipped."""
  sessions = [_session(tmp_path, f'{name}.sqlite') for name in ('a', 'b', 'c')]
  total = len(_sampled(sessions[0]))
  assert total > 20
  for session, seed in zip(sessions, (0, 0, 1)):
    assert mutation.sample_jobs(session, 5, seed) == total - 5
  first, second, other = map(_sampled, sessions)
  assert len(first) == 5 and first == second and other != first
