"""`python -m hscl_jax.retrieval`, the program: in its own process, on a copy of the stored
run, the library's figures printed and written (what it computes:
tests/evaluation/test_retrieval_evaluation.py, whose stored run and features it reads)."""

from __future__ import annotations

import json
import pathlib
import shutil
import subprocess
import sys

from evaluation.test_retrieval_evaluation import FIXTURE
from evaluation.test_retrieval_evaluation import stored_run
import pytest

from hscl_jax.evaluation import retrieval_metrics

REPO = pathlib.Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(not FIXTURE.is_dir(), reason=f'no {FIXTURE}')


@pytest.fixture(scope='module')
def run(tmp_path_factory):
  return stored_run(tmp_path_factory)


def test_the_program_prints_and_writes_the_figures(run, tmp_path):
  """In its own process, on the session's devices: the library's figures, printed."""
  workdir, (test_x, test_y), _ = run
  copy = pathlib.Path(shutil.copytree(workdir, tmp_path / 'copy'))
  out = subprocess.run(
    [sys.executable, '-m', 'hscl_jax.retrieval', f'--workdir={copy}', '--reference=test'],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert out.returncode == 0, out.stderr[-3000:]
  stored = json.loads((copy / 'retrieval_test.json').read_text())
  expected = retrieval_metrics.retrieval_metrics(test_x, test_y)
  assert {name: stored[name] for name in expected} == expected
  assert f'precision_at_1 {stored["precision_at_1"]:.4f}' in out.stdout
  assert str(copy / 'retrieval_test.json') in out.stdout
