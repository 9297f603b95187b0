"""The README's Set-up says what its test command costs, and what it says holds."""

from __future__ import annotations

import os
import pathlib
import re
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
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

  selected = 'tests/test_readme_setup.py::test_the_test_command_says_it_runs_in_parallel'
  result = subprocess.run(
    [sys.executable, '-m', 'pytest', '-q', '-n', '2', selected + '_and_how_long_it_takes'],
    cwd=REPO,
    capture_output=True,
    text=True,
    check=False,
  )
  assert result.returncode == 0, result.stdout + result.stderr
  assert result.stdout.count('bringing up nodes') == 1, result.stdout
