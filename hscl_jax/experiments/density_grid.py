"""The comparison swept over how many same-class samples an anchor meets in a batch.

The library behind `python -m hscl_jax.experiments.compare_densities`. Each density is one
comparison (`python -m hscl_jax.experiments.compare`) of the same base config with its own
`samples_per_class` (0: uniform batches), whose finished runs are recorded in its report
directory (REPORT/runs/). From those records alone this writes one report: Table I per
density; the paired differences of PAIRS per density against the same-class samples an
anchor measurably met (a table and a plot); every class-aware run paired with the
uniform run of its method and seed (every paired difference with its tests of
significance, Holm-adjusted over all of them); and the false-negative fraction that
`inspect` measured on each density's H-UCL encoder (REPORT/inspect/, copied there by the
comparison).
"""

from __future__ import annotations

import dataclasses
import json
import os

import ml_collections
import numpy as np

from hscl_jax.evaluation import figures
from hscl_jax.evaluation import inspection
from hscl_jax.experiments import grid
from hscl_jax.experiments import image_batches
from hscl_jax.experiments import image_pairs
from hscl_jax.experiments import paired
from hscl_jax.experiments import reports
from hscl_jax.experiments import sweep
from hscl_jax.rundir import atomic

REPORT_FILE = 'report.md'
PLOT_FILE = 'paired_differences.png'
MAX_SEEDS = sweep.MAX_SEEDS  # seeds looked for in a density's records


@dataclasses.dataclass(frozen=True)
class Density:
  """One comparison of the sweep: its samples_per_class and its report directory."""

  samples_per_class: int
  records: str

  @property
  def label(self) -> str:
    m = self.samples_per_class
    return 'uniform' if not m else f'{m} per class'


def parse_densities(values: list[str]) -> list[Density]:
  """['0=DIR', '4=DIR', ...] -> Densities (a ValueError names a malformed item)."""
  points = sweep.parse_points(values, 'samples_per_class', 'M', '4=docs/results/x/m4')
  return [Density(m, records) for m, records in points]


def density_config(base: ml_collections.ConfigDict, density: Density):
  return sweep.point_config(base, 'samples_per_class', density.samples_per_class)


def recorded_runs(base, density: Density, protocol: str) -> list[dict]:
  """The density's finished runs, read from its records alone (every method, seeds
  0 to MAX_SEEDS - 1)."""
  return sweep.recorded_runs(density_config(base, density), density.records, protocol)


@dataclasses.dataclass
class Measured:
  """One density's finished runs and what its batches held."""

  density: Density
  summary: dict  # reports.summarise
  best: dict  # reports.best_per_method
  same_class: float  # other samples of an anchor's class per batch, mean over its seeds
  seeds: list[int]


def measure(base, density: Density, protocol: str, labels: np.ndarray) -> Measured | None:
  """The density's runs (None while none has finished) and its measured same-class count,
  counted in the batches its runs' seeds trained on (`labels`: the training subset's)."""
  runs = recorded_runs(base, density, protocol)
  if not runs:
    return None
  config = density_config(base, density)
  seeds = sorted({run['seed'] for run in runs})
  counts = [
    image_batches.same_class_per_anchor(
      labels, config.batch_size, seed, config.num_epochs, density.samples_per_class
    )[0]
    for seed in seeds
  ]
  summary = reports.summarise(runs)
  best = reports.best_per_method(summary)
  return Measured(density, summary, best, float(np.mean(counts)), seeds)


def method_tables(measured: list[Measured]) -> list[str]:
  """Table I per density: linear and kNN top-1 of each method (mean ± std, seeds)."""
  columns = [(f'{m.density.label} ({m.same_class:.2f})', m.summary, m.best) for m in measured]
  return sweep.method_tables(columns, 'density (same-class samples per anchor)')


def pair_differences(m: Measured, first: str, second: str) -> dict[str, dict[int, float]]:
  """{'top1' | 'knn': seed -> first − second} within one density ({} if a method is missing)."""
  if first not in m.best or second not in m.best:
    return {}
  out = {
    key: image_pairs.paired_differences(m.summary, m.best, key, first, second)
    for key in ('top1', 'knn')
  }
  return out if out['top1'] else {}


def paired_rows(measured: list[Measured]) -> list[tuple[str, list[float]]]:
  """PAIRS' per-seed differences at each density, against its same-class count:
  ('pair | batches | same-class | seeds | measure' cells, differences) rows."""
  rows = []
  for first, second in image_pairs.PAIRS:
    for m in measured:
      diff = pair_differences(m, first, second)
      for key, measure in image_pairs.MEASURES if diff else ():
        prefix = f'{first} − {second} | {m.density.label} | {m.same_class:.2f}'
        seeds = ', '.join(map(str, diff[key]))
        rows.append((f'{prefix} | {seeds} | {measure}', list(diff[key].values())))
  return rows


def uniform_rows(measured: list[Measured]) -> list[tuple[str, list[float]]]:
  """Each class-aware run minus the uniform run of its method and seed:
  ('method | batches | seeds | measure' cells, differences) rows."""
  uniform = next((m for m in measured if not m.density.samples_per_class), None)
  rows = []
  for m in measured if uniform is not None else []:
    for method in grid.METHODS:
      if m is uniform or method not in m.best or method not in uniform.best:
        continue
      for key, measure in image_pairs.MEASURES:
        diff = image_pairs.seed_differences(
          image_pairs.seed_values(m.summary[m.best[method]], key),
          image_pairs.seed_values(uniform.summary[uniform.best[method]], key),
        )
        if diff:
          seeds = ', '.join(map(str, diff))
          prefix = f'{method} | {m.density.label} | {seeds} | {measure}'
          rows.append((prefix, list(diff.values())))
  return rows


def paired_tables(measured: list[Measured]) -> tuple[list[str], list[str], str]:
  """The pairs' table, the against-uniform table and the sentence on reading their tests,
  Holm-adjusted over the rows of both (one family: every test of the report)."""
  pairs, uniform = paired_rows(measured), uniform_rows(measured)
  lines, tests = paired.table_lines(pairs + uniform)
  reading = paired.how_to_read(tests) if tests else ''
  pair_table = [
    f'| pair | batches | same-class per anchor | seeds | top-1 | {paired.HEADER} |',
    f'|---|---|---|---|---|{paired.ALIGN}|',
    *lines[: len(pairs)],
    '',
  ]
  uniform_table = [
    f'| method | batches | seeds | top-1 | {paired.HEADER} |',
    f'|---|---|---|---|{paired.ALIGN}|',
    *lines[len(pairs) :],
    '',
  ]
  if not uniform:
    uniform_table = ['No class-aware run has a uniform run of its method and seed yet.', '']
  return pair_table, uniform_table, reading


def false_negatives(measured: list[Measured]) -> list[str]:
  """inspect's false-negative fraction on each density's H-UCL encoder (seed 0), where the
  comparison copied it into REPORT/inspect/."""
  rows = []
  for m in measured:
    if 'H-UCL' not in m.best:
      continue
    folder = f'{m.best["H-UCL"].slug}_seed0'
    path = os.path.join(m.density.records, grid.INSPECT_DIR, folder, inspection.STATISTIC_FILE)
    if not os.path.isfile(path):
      continue
    with open(path) as f:
      statistic = json.load(f)
    rows.append(
      f'| {m.density.label} | {m.same_class:.2f} | '
      f'{100 * statistic["hucl_false_negative_fraction"]:.2f} % (k = {statistic["k"]}) | '
      f'{100 * statistic["hucl_same_class_fraction_of_all_negatives"]:.2f} % |'
    )
  if not rows:
    return []
  return [
    "| batches (training) | same-class per anchor | H-UCL's top-k negatives that are same-class "
    '| same-class share of all negatives |',
    '|---|---|---|---|',
    *rows,
    '',
  ]


def plot_pairs(measured: list[Measured], out_dir: str) -> str:
  """PAIRS' mean difference (± std over seeds) against the same-class samples per anchor,
  linear and kNN side by side; returns the file name."""
  plt = figures.pyplot('python -m hscl_jax.experiments.compare_densities')

  fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharex=True)
  for ax, (key, name) in zip(axes, (('top1', 'linear top-1'), ('knn', 'kNN top-1'))):
    for first, second in image_pairs.PAIRS:
      points = [(m.same_class, pair_differences(m, first, second)) for m in measured]
      points = [(x, 100 * np.array(list(d[key].values()))) for x, d in points if d]
      if points:
        x = [p[0] for p in points]
        mean = [p[1].mean() for p in points]
        std = [p[1].std(ddof=1) if len(p[1]) > 1 else 0.0 for p in points]
        ax.errorbar(x, mean, yerr=std, marker='o', capsize=3, label=f'{first} − {second}')
    ax.axhline(0, color='grey', lw=0.8)
    ax.set(xscale='log', xlabel='same-class samples per anchor per batch (measured)')
    ax.set(ylabel=f'paired Δ {name} (points)', title=f'Paired differences, {name}')
    ax.legend(fontsize=7)
  fig.tight_layout()
  atomic.write_figure(os.path.join(out_dir, PLOT_FILE), fig, dpi=110)
  plt.close(fig)
  return PLOT_FILE


def write_report(base, densities: list[Density], protocol: str, report_dir: str) -> str | None:
  """REPORT_DIR/report.md and its plot from the densities' records; returns the text
  (None while no density has a finished run)."""
  labels = image_batches.training_labels(base)
  measured = [m for d in densities if (m := measure(base, d, protocol, labels)) is not None]
  if not measured:
    return None
  os.makedirs(report_dir, exist_ok=True)
  plot = plot_pairs(measured, report_dir)
  pair_table, uniform_table, reading = paired_tables(measured)
  lines = [
    f'# The comparison against label density: {grid.dataset_label(base)}',
    '',
    f'Batch {base.batch_size}, {base.num_epochs} epochs, model {base.model.name}, linear '
    f'evaluation protocol {protocol}. Each density is one comparison (its report: '
    + ', '.join(
      f'[{m.density.label}]({os.path.relpath(m.density.records, report_dir)}/report.md)'
      for m in measured
    )
    + "); a density's same-class count is measured in the batches its runs trained on.",
    '',
    *method_tables(measured),
    '## Paired differences against the density (points; same seed: same subset)',
    '',
    reading,
    '',
    *pair_table,
    f'![paired differences]({plot})',
    '',
    '## Each class-aware run against the uniform run of its method and seed',
    '',
    *uniform_table,
  ]
  fn = false_negatives(measured)
  if fn:
    lines += ["## H-UCL's hardest negatives (`python -m hscl_jax.inspect`, seed 0)", '', *fn]
  report = '\n'.join(lines) + '\n'
  atomic.write_text(os.path.join(report_dir, REPORT_FILE), report)
  return report
