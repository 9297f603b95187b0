"""The README's Set-up says what its test command costs, and what it says holds."""

from __future__ import annotations

import os
import pathlib
import re
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / 'tests'))

import conftest  # noqa: E402


def _sentence_before_the_test_command() -> str:
  readme = (REPO / 'README.md').read_text()
  setup = readme.split('## Set-up', 1)[1].split('\n## ', 1)[0]
  before, _ = setup.split('python -m pytest -q', 1)
  return ' '.join(before.rsplit('```bash', 2)[-2].split())


def test_the_test_command_says_it_runs_in_parallel_and_how_long_it_takes():
  text = _sentence_before_the_test_command()
  assert re.search(r'about \d+-\d+ minutes on two cores', text), text
  workers = re.search(r'in parallel on one pytest-xdist worker per core \(at most (\d+)\)', text)
  assert workers, text
  # The stated cap is conftest's (`-n auto` in pytest.ini): a machine with more cores
  # than the cap gets the cap, one with fewer a worker per core.
  cores = len(os.sched_getaffinity(0))
  assert conftest.pytest_xdist_auto_num_workers(None) == min(int(workers.group(1)), cores)


def test_a_run_whose_output_is_not_a_terminal_says_bringing_up_nodes_once():
  """xdist writes the line at start-up and again after collection unless conftest's hook
  stops the second (CI's output is a pipe, as here)."""
  import subprocess

  selected = 'tests/end_to_end/test_readme_setup.py::test_the_test_command_says_it_runs_in_parallel'
  result = subprocess.run(
    [sys.executable, '-m', 'pytest', '-q', '-n', '2', selected + '_and_how_long_it_takes'],
    cwd=REPO,
    capture_output=True,
    text=True,
    check=False,
  )
  assert result.returncode == 0, result.stdout + result.stderr
  assert result.stdout.count('bringing up nodes') == 1, result.stdout


def test_the_longest_groups_named_first_exist_and_come_first():
  """conftest's scheduling hint names real groups (a renamed file would silently drop out
  of it), and collection hands them out in that order, each file's tests in theirs."""
  tests = REPO / 'tests'
  files = {path.relative_to(tests).as_posix() for path in tests.rglob('test_*.py')}
  assert set(conftest.LONGEST_FIRST) <= files | {'digits_run'}
  option = type('Option', (), {'loadscopereorder': True})()
  conftest.keep_the_group_order(type('Config', (), {'option': option})())
  assert option.loadscopereorder is False

  class Item:
    def __init__(self, nodeid, fixtures=()):
      self.nodeid, self.fixturenames, self.marks = nodeid, list(fixtures), []

    def add_marker(self, mark):
      self.marks.append(mark)

    def get_closest_marker(self, name):
      del name  # none is `covering` (tests/covering.py)

  items = [
    Item('tests/test_a.py::one'),
    Item('tests/test_embed.py::x', ['digits_run']),
    Item(f'tests/{conftest.LONGEST_FIRST[1]}::first'),
    Item('tests/test_a.py::two'),
    Item(f'tests/{conftest.LONGEST_FIRST[1]}::second'),
    Item(f'tests/{conftest.LONGEST_FIRST[0]}::only'),
  ]
  no_options = type('Config', (), {'getoption': lambda self, name: False})()
  conftest.pytest_collection_modifyitems(no_options, items)
  assert [item.nodeid.removeprefix('tests/') for item in items] == [
    f'{conftest.LONGEST_FIRST[0]}::only',
    f'{conftest.LONGEST_FIRST[1]}::first',
    f'{conftest.LONGEST_FIRST[1]}::second',
    'test_embed.py::x',
    'test_a.py::one',
    'test_a.py::two',
  ]
  assert items[3].marks[0].args == ('digits_run',)


def test_a_training_command_on_a_tfds_dataset_says_its_prepare_step_and_extra():
  """Each README training command whose config reads a TFDS dataset (from the files
  `prepare` writes, which needs TensorFlow) has before it, in its code block, that
  dataset's prepare command and the install of an extra that holds TensorFlow."""
  import importlib

  import requirements

  from hscl_jax import data

  sys.path.insert(0, str(REPO))  # configs/<name>.py imports configs.default
  extras = requirements.setup_arguments()['extras_require']
  checked = []
  for block in re.findall(r'```bash\n(.*?)```', (REPO / 'README.md').read_text(), re.S):
    for command in re.finditer(r'python -m hscl_jax\.main --config=configs/(\w+)\.py', block):
      dataset = importlib.import_module(f'configs.{command.group(1)}').get_config().dataset
      if dataset not in data.TFDS_DATASETS:
        continue
      before = block[: command.start()]
      assert f'python -m hscl_jax.prepare --dataset={dataset}' in before, block
      extra = re.search(r"pip install -e '\.\[(\w+)\]'", before)
      assert extra and any(r.startswith('tensorflow') for r in extras[extra.group(1)]), block
      checked.append(dataset)
  assert checked == ['cifar10']
