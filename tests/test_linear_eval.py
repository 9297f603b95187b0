"""`python -m hscl_jax.linear_eval`, the program: a run trained over 4 devices, evaluated in
a 1-device process of its own under the transfer guard (what it computes:
tests/evaluation/test_linear_evaluation.py)."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys

import xla_flags

from hscl_jax.evaluation import linear_evaluation
from hscl_jax.rundir import checkpoints

REPO = pathlib.Path(__file__).resolve().parents[1]
RESULT_KEYS = ('protocol', 'top1', 'top5', 'checkpoint_step', 'num_train', 'num_test')


def _snapshot(directory):
  return {p: p.stat().st_mtime_ns for p in pathlib.Path(directory).rglob('*')}


def test_pipeline_from_another_process_on_one_device(digits_run, tmp_path):
  """Checkpoint written with 4 devices, read by `linear_eval` in a 1-device process (under
  the transfer guard: every transfer explicit). On a copy of the session's run: the program
  writes into the workdir it evaluates."""
  workdir = pathlib.Path(shutil.copytree(digits_run[0], tmp_path / 'run'))
  before = _snapshot(workdir)
  env = {**os.environ, 'XLA_FLAGS': xla_flags.with_devices(None)}
  env.update(JAX_PLATFORMS='cpu', JAX_TRANSFER_GUARD='disallow')
  out = subprocess.run(
    [sys.executable, '-m', 'hscl_jax.linear_eval', f'--workdir={workdir}', '--num_epochs=30'],
    cwd=REPO,
    env=env,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert out.returncode == 0, out.stderr[-3000:]
  assert 'features protocol' in out.stdout
  result = json.loads((workdir / linear_evaluation.RESULT_FILE).read_text())
  assert set(RESULT_KEYS) <= set(result)
  assert result['protocol'] == 'features'
  assert result['checkpoint_step'] == max(checkpoints.finished_steps(str(workdir)))
  assert result['num_train'] + result['num_test'] == 1797
  assert result['top1'] > 0.6, result  # chance is 0.1 on 10 classes
  assert result['top5'] >= result['top1']
  after = _snapshot(workdir)
  changed = {p for p in after if before.get(p) != after[p]}
  assert changed == {workdir / linear_evaluation.RESULT_FILE}
