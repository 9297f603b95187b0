"""graphs/__main__, the graph program: a bad config is one line, no traceback."""

from __future__ import annotations

import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_program_reports_a_bad_config_in_one_line(toy_dir):
  env = {**os.environ, 'PYTHONPATH': REPO, 'JAX_PLATFORMS': 'cpu'}
  proc = subprocess.run(
    [
      sys.executable,
      '-m',
      'hscl_jax.graphs',
      '--config=configs/graphs.py',
      f'--workdir={toy_dir}/w',
      '--config.dataset=NOPE',
      f'--config.data_dir={toy_dir}',
    ],
    cwd=REPO,
    env=env,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert proc.returncode == 1
  errors = [line for line in proc.stderr.splitlines() if line.startswith('E')]
  assert len(errors) == 1 and 'NOPE_A.txt: file not found' in errors[0]
  assert 'Traceback' not in proc.stderr
