"""The comparison swept over the training budget: the same runs at several epoch counts.

The library behind `python -m hscl_jax.experiments.compare_budgets`. Each budget is one
comparison (`python -m hscl_jax.experiments.compare`) of the same base config with its own
`num_epochs`, whose finished runs are recorded in its report directory (REPORT/runs/). From
those records alone this writes one report, over the seeds each method finished at every
budget (so that a budget's figures and its pairs are those of the same seeds): Table I per
budget; the paired differences of image_pairs.PAIRS at each budget; each method's runs at a
longer budget against its runs of the same seeds at the shortest; how each pair's
difference moved with the budget (its per-seed difference at the longer budget minus that
at the shortest); every one of them with its tests of significance, Holm-adjusted over all
of them; and Fig. 1's measure per budget (the first epoch at which each method's kNN
reaches SCL's final kNN of that budget).
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from hscl_jax.experiments import grid
from hscl_jax.experiments import image_pairs
from hscl_jax.experiments import paired
from hscl_jax.experiments import reports
from hscl_jax.experiments import sweep
from hscl_jax.rundir import atomic

REPORT_FILE = 'report.md'


@dataclasses.dataclass(frozen=True)
class Budget:
  """One comparison of the sweep: its epoch count, its records and their summary."""

  epochs: int
  records: str
  summary: dict  # reports.summarise, over the seeds of every budget
  best: dict  # reports.best_per_method

  @property
  def label(self) -> str:
    return f'{self.epochs} epochs'


def parse_budgets(values: list[str]) -> list[tuple[int, str]]:
  """['3=DIR', '9=DIR', ...] -> [(epochs, DIR)] (a ValueError names a malformed item)."""
  budgets = sweep.parse_points(values, 'num_epochs', 'E', '9=docs/results/x/e9')
  if any(epochs < 1 for epochs, _ in budgets):
    raise ValueError('a budget needs at least 1 epoch')
  return budgets


def shared_seeds(runs_per_budget: list[list[dict]]) -> dict[str, set[int]]:
  """Method -> the seeds it finished at every budget (methods missing at one are left out)."""
  seeds = [{} for _ in runs_per_budget]
  for found, runs in zip(seeds, runs_per_budget):
    for run in runs:
      found.setdefault(run['setting'].method, set()).add(run['seed'])
  methods = set.intersection(*(set(found) for found in seeds))
  return {m: set.intersection(*(found[m] for found in seeds)) for m in methods}


def measure(base, budgets: list[tuple[int, str]], protocol: str) -> list[Budget]:
  """Each budget's recorded runs of the shared seeds, summarised ([] while none)."""
  runs_per_budget = [
    sweep.recorded_runs(sweep.point_config(base, 'num_epochs', epochs), records, protocol)
    for epochs, records in budgets
  ]
  seeds = shared_seeds(runs_per_budget)
  measured = []
  for (epochs, records), runs in zip(budgets, runs_per_budget):
    kept = [run for run in runs if run['seed'] in seeds.get(run['setting'].method, ())]
    if kept:
      summary = reports.summarise(kept)
      measured.append(Budget(epochs, records, summary, reports.best_per_method(summary)))
  return measured if len(measured) == len(budgets) else []


def pair_rows(measured: list[Budget]) -> list[tuple[str, list[float]]]:
  """PAIRS' per-seed differences at each budget: ('pair | budget | seeds | measure' cells,
  differences) rows."""
  rows = []
  for first, second in image_pairs.PAIRS:
    for b in measured:
      if first not in b.best or second not in b.best:
        continue
      for key, name in image_pairs.MEASURES:
        diff = image_pairs.paired_differences(b.summary, b.best, key, first, second)
        prefix = f'{first} − {second} | {b.label} | {", ".join(map(str, diff))} | {name}'
        rows.append((prefix, list(diff.values())))
  return rows


def _seed_values(b: Budget, method: str, key: str) -> dict[int, float]:
  return image_pairs.seed_values(b.summary[b.best[method]], key)


def longer_rows(measured: list[Budget]) -> list[tuple[str, list[float]]]:
  """Each method at a longer budget minus at the shortest, per seed."""
  shortest, rows = measured[0], []
  for method in grid.METHODS:
    for b in measured[1:]:
      if method not in b.best or method not in shortest.best:
        continue
      for key, name in image_pairs.MEASURES:
        diff = image_pairs.seed_differences(
          _seed_values(b, method, key), _seed_values(shortest, method, key)
        )
        prefix = f'{method} | {b.label} − {shortest.label} | {", ".join(map(str, diff))} | {name}'
        rows.append((prefix, list(diff.values())))
  return rows


def moved_rows(measured: list[Budget]) -> list[tuple[str, list[float]]]:
  """How each pair's per-seed difference moved: at a longer budget minus at the shortest."""
  shortest, rows = measured[0], []
  for first, second in image_pairs.PAIRS:
    for b in measured[1:]:
      both = (first in m.best and second in m.best for m in (shortest, b))
      if not all(both):
        continue
      for key, name in image_pairs.MEASURES:
        longer, short = (
          image_pairs.paired_differences(m.summary, m.best, key, first, second)
          for m in (b, shortest)
        )
        diff = image_pairs.seed_differences(longer, short)
        prefix = (
          f'{first} − {second} | {b.label} − {shortest.label} | '
          f'{", ".join(map(str, diff))} | {name}'
        )
        rows.append((prefix, list(diff.values())))
  return rows


def speed_rows(measured: list[Budget]) -> list[str]:
  """Fig. 1's measure per budget: the first epoch at which a method's kNN top-1 (mean over
  its seeds) reaches SCL's final kNN top-1 (mean) of the same budget."""
  if any('SCL' not in b.best for b in measured):
    return []
  targets = [float(np.mean(b.summary[b.best['SCL']]['knn'])) for b in measured]
  header = ' | '.join(f'{b.label} (SCL {100 * t:.2f} %)' for b, t in zip(measured, targets))
  lines = ['| method | ' + header + ' |', '|---|' + '---|' * len(measured)]
  for method in grid.METHODS:
    if not all(method in b.best for b in measured):
      continue
    cells = []
    for b, target in zip(measured, targets):
      epoch = reports.first_epoch_reaching(b.summary[b.best[method]]['runs'], target)
      cells.append('not reached' if epoch is None else f'{epoch} of {b.epochs}')
    lines.append(f'| {method} | {" | ".join(cells)} |')
  return lines + ['']


def tables(measured: list[Budget]) -> tuple[list[str], str]:
  """The three tables of paired differences (pairs per budget, each method against its
  shortest budget, each pair's move) with their tests, one Holm family; and the sentence
  on reading them."""
  parts = [
    (
      '## Paired differences at each budget (points; same seed: same subset, same order)',
      'pair | budget',
      pair_rows(measured),
    ),
    (
      '## Each method at a longer budget against its runs of the same seeds at the shortest',
      'method | budgets',
      longer_rows(measured),
    ),
    (
      "## How each pair's difference moved with the budget (its per-seed difference at the "
      'longer budget minus at the shortest)',
      'pair | budgets',
      moved_rows(measured),
    ),
  ]
  rows = [row for _, _, part in parts for row in part]
  if not rows:
    return [], ''
  lines, tests = paired.table_lines(rows)
  out, start = [], 0
  for title, columns, part in parts:
    if part:
      out += [title, '', f'| {columns} | seeds | top-1 | {paired.HEADER} |']
      out += [f'|---|---|---|---|{paired.ALIGN}|', *lines[start : start + len(part)], '']
    start += len(part)
  return out, paired.how_to_read(tests)


def write_report(base, budgets: list[tuple[int, str]], protocol: str, report_dir: str):
  """REPORT_DIR/report.md from the budgets' records; returns its text (None while a
  budget has no finished run of a seed that every budget finished)."""
  measured = measure(base, budgets, protocol)
  if not measured:
    return None
  os.makedirs(report_dir, exist_ok=True)
  links = ', '.join(
    f'[{b.label}]({os.path.relpath(b.records, report_dir)}/report.md)' for b in measured
  )
  seeds = {
    m: sorted({r['seed'] for r in measured[0].summary[s]['runs']})
    for m, s in measured[0].best.items()
  }
  table_lines, reading = tables(measured)
  lines = [
    f'# The comparison against the training budget: {grid.dataset_label(base)}',
    '',
    f'Batch {base.batch_size}, model {base.model.name}, samples per class '
    f'{base.samples_per_class or "0 (uniform batches)"}, linear evaluation protocol '
    f'{protocol}. Each budget is one comparison (its report: {links}); every figure here is '
    'over the seeds a method finished at every budget: '
    + '; '.join(f'{m} {", ".join(map(str, s))}' for m, s in seeds.items())
    + '.',
    '',
    *sweep.method_tables([(b.label, b.summary, b.best) for b in measured], 'budget'),
    reading,
    '',
    *table_lines,
  ]
  speed = speed_rows(measured)
  if speed:
    lines += [
      "## Fig. 1's measure: the first epoch reaching SCL's final kNN of the same budget",
      '',
      *speed,
    ]
  report = '\n'.join(lines) + '\n'
  atomic.write_text(os.path.join(report_dir, REPORT_FILE), report)
  return report
