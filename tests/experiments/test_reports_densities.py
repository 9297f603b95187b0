"""The label-density report: every figure it prints recomputed by hand from records
written here, on data where pairing by position instead of by seed, or counting one seed's
batches instead of every seed's, would change the answer."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from configs import digits  # noqa: E402
from hscl_jax import data  # noqa: E402
from hscl_jax.evaluation import inspection  # noqa: E402
from hscl_jax.evaluation import linear_evaluation  # noqa: E402
from hscl_jax.experiments import grid as image_grid  # noqa: E402
from hscl_jax.experiments import grid as image_runs  # noqa: E402
from hscl_jax.experiments import paired as image_pairs  # noqa: E402
from hscl_jax.experiments import plots  # noqa: E402
from hscl_jax.experiments import reports as density_grid  # noqa: E402
from hscl_jax.experiments import run_records  # noqa: E402
from hscl_jax.rundir import layout  # noqa: E402
from hscl_jax.rundir import metrics  # noqa: E402

sys.path.insert(0, str(REPO / 'tests'))
from acceptance import accepted  # noqa: E402
from acceptance import refused  # noqa: E402

from experiments.test_paired import expected_rows  # noqa: E402
from experiments.test_reports import counted_in_loader  # noqa: E402

PROTOCOL = 'features'

# (linear top-1, kNN top-1) per density, method and seed. Seeds are missing where a
# position != seed: uniform H-UCL has 0, 1, 2 but class-aware H-UCL only 1, 2.
UNIFORM = {
  'UCL': {0: (0.40, 0.30), 1: (0.42, 0.31), 2: (0.41, 0.29)},
  'H-UCL': {0: (0.44, 0.33), 1: (0.43, 0.32), 2: (0.45, 0.35)},
  'SCL': {0: (0.41, 0.32), 1: (0.44, 0.30), 2: (0.42, 0.33)},
  'H-SCL(β)': {0: (0.43, 0.34), 1: (0.45, 0.31), 2: (0.42, 0.36)},
}
FOUR = {
  'H-UCL': {1: (0.46, 0.30), 2: (0.47, 0.37)},
  'H-SCL(β)': {0: (0.50, 0.40), 1: (0.49, 0.36), 2: (0.52, 0.41)},
}


def base_config():
  config = digits.get_config()
  config.batch_size, config.num_epochs = 32, 2
  return config


def write_record(records, config, setting, seed, top1, knn):
  run = image_grid.run_config(config, setting, seed, PROTOCOL)
  directory = run_records.record_dir(records, setting.slug, seed)
  os.makedirs(directory)
  with open(os.path.join(directory, layout.CONFIG_FILE), 'w') as f:
    json.dump(metrics.config_as_json(run), f)
  with open(os.path.join(directory, layout.METRICS_FILE), 'w') as f:
    for epoch in range(1, run.num_epochs + 1):
      f.write(
        json.dumps(
          {'step': 10 * epoch, 'epoch': epoch, 'knn_top1': knn - 0.1 * (run.num_epochs - epoch)}
        )
      )
      f.write('\n')
  linear = {k: run.linear_eval[k] for k in image_runs.LINEAR_EVAL_KEYS}
  linear.update(top1=top1, top5=1.0, checkpoint_step=10 * run.num_epochs)
  with open(os.path.join(directory, linear_evaluation.RESULT_FILE), 'w') as f:
    json.dump(linear, f)


def write_density(records, samples_per_class, grid):
  write_grid(records, grid, samples_per_class=samples_per_class)


def write_grid(records, grid, **fields):
  """Records of `grid` (method -> seed -> (linear, kNN)) for base_config() with `fields`."""
  config = base_config()
  config.update(fields)
  by_method = {s.method: s for s in image_grid.settings(config, set())}
  for method, seeds in grid.items():
    for seed, values in seeds.items():
      write_record(records, config, by_method[method], seed, *values)


def loader_same_class(samples_per_class, seeds):
  config = base_config()
  labels = data.run_sources(config)[0].labels()
  return counted_in_loader(labels, 32, seeds, config.num_epochs, samples_per_class)[0]


def seed_rows(first, second, prefix):
  """(prefix | seeds | measure, per-seed first − second) rows, linear then kNN, over the
  seeds both grids have."""
  seeds = sorted(set(first) & set(second))
  return [
    (
      f'{prefix} | {", ".join(map(str, seeds))} | {measure}',
      [first[s][i] - second[s][i] for s in seeds],
    )
    for i, measure in ((0, 'linear'), (1, 'kNN'))
  ]


def report_rows():
  """Every paired row of the report by hand (both tables: one Holm family of 14)."""
  same = {'uniform': loader_same_class(0, [0, 1, 2]), '4 per class': 3.0}
  grids = {'uniform': UNIFORM, '4 per class': FOUR}
  rows = []
  for first, second in (
    ('H-SCL(β)', 'SCL'),
    ('H-SCL(β)', 'H-UCL'),
    ('SCL', 'UCL'),
    ('H-UCL', 'UCL'),
  ):
    for label, grid in grids.items():
      if first in grid and second in grid:
        prefix = f'{first} − {second} | {label} | {same[label]:.2f}'
        rows += seed_rows(grid[first], grid[second], prefix)
  for method in ('H-UCL', 'H-SCL(β)'):  # at 4 per class, against uniform
    rows += seed_rows(FOUR[method], UNIFORM[method], f'{method} | 4 per class')
  return rows


@pytest.fixture(scope='module')
def report(tmp_path_factory):
  root = tmp_path_factory.mktemp('densities')
  write_density(str(root / 'uniform'), 0, UNIFORM)
  write_density(str(root / 'm4'), 4, FOUR)
  statistic = {
    'k': 8,
    'hucl_false_negative_fraction': 0.137,
    'hucl_same_class_fraction_of_all_negatives': 0.0891,
  }
  # On the second density only: a density without it is skipped, not the end of the table.
  folder = root / 'm4' / image_grid.INSPECT_DIR / 'hucl_beta1.0_seed0'
  os.makedirs(folder)
  (folder / inspection.STATISTIC_FILE).write_text(json.dumps(statistic))
  densities = density_grid.parse_densities([f'4={root / "m4"}', f'0={root / "uniform"}'])
  text = density_grid.write_density_report(base_config(), densities, PROTOCOL, str(root / 'report'))
  return root, text


def test_same_class_counts_are_those_of_each_densitys_batches(report):
  _, text = report
  uniform = loader_same_class(0, [0, 1, 2])
  assert uniform != pytest.approx(loader_same_class(0, [0]), abs=0.005)  # every seed counts
  assert f'| uniform ({uniform:.2f}) | 4 per class (3.00) |' in text


def test_pairs_within_a_density_are_by_seed_with_their_tests(report):
  """Both tables' rows with their tests, Holm over all 14 (pairing by position, e.g. the
  4-per-class H-UCL's seeds 1, 2 with 0, 1, would change the differences)."""
  _, text = report
  rows = report_rows()
  want = expected_rows(rows)
  lines = text.splitlines()
  tested = [line for line in lines if ' | linear | ' in line or ' | kNN | ' in line]
  assert tested == [want[prefix] for prefix, _ in rows]
  # e.g. 4 per class: H-SCL(β) − H-UCL over seeds 1, 2: linear +3, +5; kNN +6, +4.
  assert '| H-SCL(β) − H-UCL | 4 per class | 3.00 | 1, 2 | linear | 2 | +4.00 ± 1.41 |' in text
  assert '| SCL − UCL | 4 per class' not in text  # neither method ran at 4 per class
  assert 'over the 14 t-tests of this report' in text


def test_each_class_aware_run_is_paired_with_the_uniform_run_of_its_seed(report):
  _, text = report
  # H-UCL at 4 per class minus uniform, seeds 1 and 2: linear +3, +2; kNN −2, +2.
  assert '| H-UCL | 4 per class | 1, 2 | linear | 2 | +2.50 ± 0.71 | 2 of 2 |' in text
  assert '| H-UCL | 4 per class | 1, 2 | kNN | 2 | +0.00 ± 2.83 | 1 of 2 |' in text
  # H-SCL(β): seeds 0-2: linear +7, +4, +10.
  assert '| H-SCL(β) | 4 per class | 0, 1, 2 | linear | 3 | +7.00 ± 3.00 | 3 of 3 |' in text


def test_table_one_per_density_and_the_inspect_fraction(report):
  root, text = report
  assert '| H-UCL | 44.00 ± 1.00 (n=3) | 46.50 ± 0.71 (n=2) |' in text
  assert '| UCL | 41.00 ± 1.00 (n=3) |  |' in text
  # kNN is the last epoch's: 0.35 and 0.37 at 4 per class.
  assert '| H-UCL | 33.33 ± 1.53 (n=3) | 33.50 ± 4.95 (n=2) |' in text
  assert '| 4 per class | 3.00 | 13.70 % (k = 8) | 8.91 % |' in text
  uniform = loader_same_class(0, [0, 1, 2])
  no_row = f'| uniform | {uniform:.2f} | '  # no statistic recorded there
  assert not any(line.startswith(no_row) for line in text.splitlines())
  assert (root / 'report' / plots.PAIRS_PLOT_FILE).stat().st_size > 10_000
  assert (root / 'report' / density_grid.REPORT_FILE).read_text() == text


def test_every_seed_below_the_cap_is_read_and_none_past_it(tmp_path):
  """A density recorded at every seed of every method up to MAX_SEEDS: seeds 0 to
  MAX_SEEDS - 1 are read, seed MAX_SEEDS is not (the cap on the seeds looked for)."""
  cap, config = density_grid.MAX_SEEDS, base_config()
  settings = image_grid.settings(config, set())
  write_density(
    str(tmp_path), 0, {s.method: dict.fromkeys(range(cap + 1), (0.4, 0.3)) for s in settings}
  )
  runs = density_grid.density_runs(config, density_grid.Density(0, str(tmp_path)), PROTOCOL)
  got = sorted((run['setting'].method, run['seed']) for run in runs)
  assert got == sorted((s.method, seed) for s in settings for seed in range(cap))


def test_densities_are_parsed_or_refused_naming_the_item():
  with accepted('two densities'):
    parsed = density_grid.parse_densities(['16=b', '0=a'])
  assert [(d.samples_per_class, d.records) for d in parsed] == [(0, 'a'), (16, 'b')]
  for bad in (['4'], ['x=a'], ['4='], ['=a']):
    with refused(f"'{bad[0]}' is not M=REPORT_DIR"):
      density_grid.parse_densities(bad)
  with refused('each samples_per_class may be given once'):
    density_grid.parse_densities(['4=a', '8=c', '4=b'])
  out = subprocess.run(
    [sys.executable, '-m', 'hscl_jax.experiments.compare', '--sweep=samples_per_class']
    + ['--config=configs/digits.py', '--points=4', '--report_dir=/tmp/unused'],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert out.returncode != 0 and "--points: '4' is not M=REPORT_DIR" in out.stderr


def test_the_plot_draws_each_pairs_mean_and_spread_at_the_measured_densities(tmp_path, monkeypatch):
  """The plotted points recomputed from the grids above: x the density's measured
  same-class count, y the mean per-seed difference (points), the bar its std (ddof 1)."""
  from matplotlib import axes

  drawn = []
  original = axes.Axes.errorbar

  def record(ax, x, y, *args, yerr=None, label=None, **kwargs):
    drawn.append((ax, label, list(x), list(y), list(yerr)))  # ax: titled after drawing
    return original(ax, range(len(y)), y, *args, yerr=yerr, label=label, **kwargs)

  monkeypatch.setattr(axes.Axes, 'errorbar', record)
  write_density(str(tmp_path / 'uniform'), 0, UNIFORM)  # not the fixture's: its report
  write_density(str(tmp_path / 'm4'), 4, FOUR)  # plots before this test could record
  densities = density_grid.parse_densities([f'4={tmp_path / "m4"}', f'0={tmp_path / "uniform"}'])
  density_grid.write_density_report(base_config(), densities, PROTOCOL, str(tmp_path / 'report'))
  uniform_x = loader_same_class(0, [0, 1, 2])
  expected = []
  for column, name in ((0, 'linear top-1'), (1, 'kNN top-1')):
    for first, second in image_pairs.PAIRS:
      points = []
      for x, grid in ((uniform_x, UNIFORM), (3.0, FOUR)):
        if first in grid and second in grid:
          seeds = sorted(set(grid[first]) & set(grid[second]))
          d = [100 * (grid[first][s][column] - grid[second][s][column]) for s in seeds]
          points.append((x, np.mean(d), np.std(d, ddof=1) if len(d) > 1 else 0.0))
      if points:
        x, y, spread = zip(*points)
        expected.append((f'Paired differences, {name}', f'{first} − {second}', x, y, spread))
  assert len(drawn) == len(expected) >= 5
  for got, want in zip(drawn, expected):
    assert (got[0].get_title(), got[1]) == want[:2]
    assert all(np.ndim(v) == 0 for values in got[2:] for v in values), got  # one number each
    np.testing.assert_allclose(got[2:], want[2:], rtol=1e-9, atol=1e-9, err_msg=str(want[:2]))


def test_the_plot_is_1210_by_440_px_with_capped_bars_and_a_thin_grey_zero_line(
  tmp_path, monkeypatch
):
  """The figure as the reports show it: two 5.5 x 4 inch panels at 110 dpi, each with a
  thin (0.8 pt) grey line at zero difference and error bars capped 3 pt wide each side."""
  from matplotlib import figure
  from PIL import Image

  saved = []
  original = figure.Figure.savefig
  monkeypatch.setattr(
    figure.Figure, 'savefig', lambda fig, *a, **kw: (saved.append(fig), original(fig, *a, **kw))[1]
  )
  write_density(str(tmp_path / 'uniform'), 0, UNIFORM)
  write_density(str(tmp_path / 'm4'), 4, FOUR)
  densities = density_grid.parse_densities([f'4={tmp_path / "m4"}', f'0={tmp_path / "uniform"}'])
  density_grid.write_density_report(base_config(), densities, PROTOCOL, str(tmp_path / 'report'))
  with Image.open(tmp_path / 'report' / plots.PAIRS_PLOT_FILE) as png:
    assert png.size == (1210, 440)
  (fig,) = saved
  assert len(fig.axes) == 2
  for ax in fig.axes:
    zero_lines = [line for line in ax.get_lines() if list(line.get_ydata()) == [0, 0]]
    assert len(zero_lines) == 1, ax.get_title()
    assert zero_lines[0].get_color() == 'grey' and zero_lines[0].get_linewidth() == 0.8
    assert ax.containers, ax.get_title()
    for bars in ax.containers:
      (caps,) = {cap.get_markersize() for cap in bars.lines[1]}
      assert caps == 2 * 3  # matplotlib draws a cap of capsize points each side
