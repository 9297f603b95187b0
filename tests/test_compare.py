"""The comparison report (hscl_jax.experiments.image_grid and its program `compare`): settings,
summary, table, plots."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # `from configs import ...`, as from the repo root

from configs import digits  # noqa: E402
from hscl_jax import schema  # noqa: E402
from hscl_jax.experiments import image_grid  # noqa: E402


def test_settings_cover_the_paper_grids():
  config = digits.get_config()
  plain = image_grid.settings(config, set())
  assert [s.method for s in plain] == list(image_grid.METHODS)
  grid = image_grid.settings(config, {'beta', 'tau'})
  by_method = {m: [s for s in grid if s.method == m] for m in image_grid.METHODS}
  assert len(by_method['H-SCL(β)']) == len(by_method['H-UCL']) == 5
  assert len(by_method['H-SCL(τ)']) == 9
  assert len({s.slug for s in grid}) == len(grid)  # one workdir per setting
  for setting in grid:  # every setting is a valid training config
    schema.validate_config(
      image_grid.run_config(config, setting, seed=1), num_devices=1, num_processes=1
    )


def test_queue_grid_adds_scl_and_hscl_with_a_queue():
  """--grid=queue: SCL and H-SCL(β) again with a queue (a multiple of a step's rows), in
  their own workdirs, valid configs, and never Table I's best setting."""
  config = digits.get_config()
  config.batch_size = 96  # 192 rows: 4096 is not a multiple; the grid rounds to 4032
  plain = image_grid.settings(config, set())
  grid = image_grid.settings(config, {'queue'})
  queued = [s for s in grid if s.queue_size]
  assert [s.method for s in queued] == ['SCL', 'H-SCL(β)']
  assert {s.queue_size for s in queued} == {4032}
  assert [s.without_queue() for s in queued] == [
    s for s in plain if s.method in ('SCL', 'H-SCL(β)')
  ]
  assert len({s.slug for s in grid}) == len(grid) == 7
  assert [s.slug for s in plain] == [s.slug for s in grid if not s.queue_size]  # unchanged dirs
  for setting in queued:
    schema.validate_config(image_grid.run_config(config, setting, 0), num_devices=1)
  runs = [_fake_run(s, seed, 0.9 if s.queue_size else 0.5) for s in grid for seed in (0, 1)]
  summary = image_grid.summarise(runs)
  best = image_grid.best_per_method(summary)
  assert not any(s.queue_size for s in best.values())
  table = '\n'.join(image_grid.queue_table(summary))
  assert '| SCL (queue 4032, m=0.99) | 0, 1 | 50.00 ± 0.00 | 90.00 ± 0.00 |' in table


def _fake_run(setting, seed, top1):
  history = [
    {
      'epoch': e,
      'knn_top1': 0.5 + 0.1 * e,
      'assumption1_fraction': 0.9,
      'loss_ucl': 3.0,
      'loss_hucl': 2.9,
      'loss_scl': 2.5,
      'loss_hscl': 2.4,
    }
    for e in (1, 2)
  ]
  return {
    'setting': setting,
    'seed': seed,
    'history': history,
    'linear': {'top1': top1, 'top5': 1.0},
  }


def test_report_table_and_plots(tmp_path):
  config = digits.get_config()
  plan = image_grid.settings(config, {'beta'})
  runs = [
    _fake_run(s, seed, 0.5 + 0.01 * i + 0.001 * seed) for i, s in enumerate(plan) for seed in (0, 1)
  ]
  summary = image_grid.summarise(runs)
  best = image_grid.best_per_method(summary)
  assert best['H-SCL(β)'].overrides[-1] == ('beta', 5.0)  # the highest top-1 of the grid
  plots = image_grid.plot_report(summary, best, str(tmp_path))
  assert all((tmp_path / p).stat().st_size > 1000 for p in plots)
  report = image_grid.markdown_report(summary, best, config, [0, 1], 'features', {'beta'}, plots)
  row = next(line for line in report.splitlines() if line.startswith('| UCL |'))
  values = 100 * np.array([0.5, 0.501])
  assert f'{values.mean():.2f} ± {values.std(ddof=1):.2f}' in row
  assert 'Ranking by mean linear top-1: H-SCL(τ) > H-SCL(β) > SCL > H-UCL > UCL.' in report


@pytest.mark.slow  # the fast tests above cover each piece; this runs them end to end
def test_compare_end_to_end(tmp_path):
  out = subprocess.run(
    [
      sys.executable,
      '-m',
      'hscl_jax.experiments.compare',
      '--config=configs/digits.py',
      '--config.num_epochs=1',
      '--config.optimizer.warmup_epochs=0',
      '--config.steps_per_epoch_limit=2',
      '--config.linear_eval.num_epochs=2',
      '--seeds=1',
      f'--workdir={tmp_path}',
    ],
    cwd=REPO,
    env={**os.environ, 'JAX_TRANSFER_GUARD': 'disallow'},  # every transfer explicit
    capture_output=True,
    text=True,
    timeout=900,
  )
  assert out.returncode == 0, out.stderr[-3000:]
  report = (tmp_path / 'report.md').read_text()
  for method in image_grid.METHODS:
    assert f'| {method} |' in report


def test_ranking_marks_ties():
  scores = {'UCL': 0.90, 'SCL': 0.95, 'H-UCL': 0.90}
  assert image_grid._ranking(list(scores), scores.get) == 'SCL > UCL = H-UCL'


def test_report_links_the_inspect_figures_of_runs_that_have_them(tmp_path):
  """The best H-SCL(β) run of seed 0 has every inspect figure: linked (relative to the
  report) with its false-negative fraction; UCL's has only one figure: not linked."""
  config = digits.get_config()
  plan = image_grid.settings(config, {'beta'})
  runs = [_fake_run(s, 0, 0.5 + 0.01 * i) for i, s in enumerate(plan)]
  best = image_grid.best_per_method(image_grid.summarise(runs))
  root, report_dir = tmp_path / 'root', tmp_path / 'report'
  hscl = pathlib.Path(image_grid.run_dir(str(root), best['H-SCL(β)'], 0)) / 'inspect'
  hscl.mkdir(parents=True)
  for name in ('tsne.png', 'neighbours.png', 'hardest_negatives.png'):
    (hscl / name).write_bytes(b'png')
  statistic = {'hucl_false_negative_fraction': 0.4567, 'k': 8}
  (hscl / 'false_negatives.json').write_text(json.dumps(statistic))
  ucl = pathlib.Path(image_grid.run_dir(str(root), best['UCL'], 0)) / 'inspect'
  ucl.mkdir(parents=True)
  (ucl / 'tsne.png').write_bytes(b'png')
  lines = image_grid.inspect_links(str(root), best, 0, str(report_dir))
  rows = [line for line in lines if line.startswith('| ') and 'setting' not in line]
  relative = f'../root/{best["H-SCL(β)"].slug}/seed0/inspect'
  assert rows == [
    f'| {best["H-SCL(β)"].label} | [tsne]({relative}/tsne.png) · '
    f'[neighbours]({relative}/neighbours.png) · '
    f'[hardest_negatives]({relative}/hardest_negatives.png) | 45.7 % (k = 8) |'
  ]
  report = image_grid.markdown_report(
    image_grid.summarise(runs), best, config, [0], 'features', {'beta'}, [], inspected=lines
  )
  assert rows[0] in report
  assert image_grid.inspect_links(str(tmp_path / 'empty'), best, 0, str(report_dir)) == []
