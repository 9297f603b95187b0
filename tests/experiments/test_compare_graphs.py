"""`python -m hscl_jax.experiments.compare_graphs`, the program: its flags reach the report
(Table II from experiments/graph_grid, whose tests are the graphs' own), written with
--report_only from no finished run, without a dataset or a run."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # `from configs import ...`, as from the repo root

from configs import graphs as graphs_config  # noqa: E402
from hscl_jax.experiments import graph_grid  # noqa: E402


def test_the_report_only_is_table_ii_of_the_flags_datasets_betas_repeats_and_config(tmp_path):
  root = tmp_path / 'root'
  out = subprocess.run(
    [
      sys.executable,
      '-m',
      'hscl_jax.experiments.compare_graphs',
      f'--data_dir={tmp_path}',
      f'--workdir={root}',
      '--report_only',
      '--datasets=PTC,MUTAG',
      '--repeats=2',
      '--betas=1,0.5',
      '--config.batch_size=64',
    ],
    cwd=REPO,
    env={**os.environ, 'PYTHONPATH': str(REPO), 'JAX_PLATFORMS': 'cpu'},
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert out.returncode == 0, out.stderr[-3000:]
  config = graphs_config.get_config()
  config.batch_size = 64
  expected = graph_grid.markdown_report([], ['PTC', 'MUTAG'], [1.0, 0.5], 2, config)
  assert (root / 'report.md').read_text() == expected
  assert '| method | PTC | MUTAG |' in expected and 'batch 64' in expected
  assert 'up to 2 repeats' in expected and 'hucl_beta0.5' in expected
