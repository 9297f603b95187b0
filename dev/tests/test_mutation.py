"""dev/mutation.py finds a module's tests: its mirrored test file, else the test files that
import it; none found is one line naming the file to write."""

from __future__ import annotations

import pathlib

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
