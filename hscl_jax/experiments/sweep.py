"""Several comparisons of one base config that differ in one field, read back together.

A sweep's point is one comparison (`python -m hscl_jax.experiments.compare`) run with one
value of a config field (`samples_per_class` in the density report, `num_epochs` in the
budget report), its finished runs recorded in its report directory (REPORT/runs/). This
parses the points ('VALUE=REPORT_DIR'), reads each point's runs back from its records
alone and writes Table I per point; density_grid and budget_grid build on it.
"""

from __future__ import annotations

import os

import ml_collections

from hscl_jax.experiments import grid
from hscl_jax.experiments import image_runs
from hscl_jax.experiments import reports

MAX_SEEDS = 20  # seeds looked for in a point's records


def parse_points(values: list[str], field: str, letter: str, example: str):
  """['VALUE=DIR', ...] -> [(VALUE, DIR)] sorted by value; a ValueError names a malformed
  item ('LETTER=REPORT_DIR', e.g. `example`) or a value given twice."""
  points = []
  for item in values:
    value, sep, records = item.partition('=')
    if not sep or not value.strip().isdigit() or not records:
      raise ValueError(f"'{item}' is not {letter}=REPORT_DIR (e.g. {example})")
    points.append((int(value), records))
  if len({value for value, _ in points}) != len(points):
    raise ValueError(f'each {field} may be given once')
  return sorted(points)


def point_config(base: ml_collections.ConfigDict, field: str, value: int):
  """A copy of `base` with `field` set to the point's value."""
  config = ml_collections.ConfigDict(base.to_dict())
  config[field] = value
  return config


def recorded_runs(config, records: str, protocol: str) -> list[dict]:
  """The finished runs of a comparison of `config` recorded in RECORDS/runs/, every
  method at seeds 0 to MAX_SEEDS - 1, read from the records alone."""
  no_workdir = os.path.join(records, 'runs', 'no-workdir')  # records only
  runs = []
  for setting in grid.settings(config, set()):
    for seed in range(MAX_SEEDS):
      run = image_runs.completed_run(config, setting, seed, no_workdir, protocol, records)
      if run is not None:
        runs.append(run)
  return runs


def method_tables(columns, what: str) -> list[str]:
  """Table I per point: linear and kNN top-1 of each method (mean ± std, seeds), one
  column per (header, summary, best) of `columns`; `what` names the columns' quantity."""
  lines = []
  for key, name in (('top1', 'Linear top-1'), ('knn', 'kNN top-1')):
    lines += [
      f'### {name} (%), per {what}',
      '',
      f'| method | {" | ".join(header for header, _, _ in columns)} |',
      '|---|' + '---|' * len(columns),
    ]
    for method in grid.METHODS:
      cells = []
      for _, summary, best in columns:
        stats = summary.get(best.get(method))
        cells.append(
          '' if stats is None else f'{reports.mean_std(stats[key])} (n={len(stats[key])})'
        )
      if any(cells):
        lines.append(f'| {method} | {" | ".join(cells)} |')
    lines.append('')
  return lines
