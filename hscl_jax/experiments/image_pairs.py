"""The paired differences of the paper's claims, seed by seed, and their tests."""

from __future__ import annotations

from hscl_jax.config import methods
from hscl_jax.experiments import paired

PAIRS = methods.PAIRS  # the pairs of the paper's claims, by the methods' paper labels


def paired_differences(summary, best, key: str, first: str, second: str) -> dict[int, float]:
  """Seed -> `first` − `second` of a per-run figure (`key`: 'top1' or 'knn' of
  reports.summarise), over the seeds both methods' Table I settings finished: the
  seeds of a comparison share the subset and the data order, so a per-seed difference
  cancels what they share."""
  return seed_differences(
    seed_values(summary[best[first]], key), seed_values(summary[best[second]], key)
  )


def seed_values(stats, key: str) -> dict[int, float]:
  """Seed -> a per-run figure (`key`) of one setting's reports.summarise() entry."""
  return {run['seed']: value for run, value in zip(stats['runs'], stats[key])}


def seed_differences(first: dict[int, float], second: dict[int, float]) -> dict[int, float]:
  """Seed -> first − second, over the seeds both have."""
  return {seed: first[seed] - second[seed] for seed in sorted(set(first) & set(second))}


# The per-run figures a paired difference is taken of, as the tables name them.
MEASURES = (('top1', 'linear'), ('knn', 'kNN'))


def paired_rows(summary, best) -> list[tuple[str, list[float]]]:
  """('pair | seeds | measure' cells, per-seed differences) of PAIRS, linear then kNN."""
  rows = []
  for first, second in [(a, b) for a, b in PAIRS if a in best and b in best]:
    for key, measure in MEASURES:
      differences = paired_differences(summary, best, key, first, second)
      if differences:
        seeds = ', '.join(map(str, differences))
        rows.append((f'{first} − {second} | {seeds} | {measure}', list(differences.values())))
  return rows


def paired_table(summary, best) -> list[str]:
  """Per-seed paired differences of linear and kNN top-1 for PAIRS with their tests of
  significance (hscl_jax.experiments.paired; Holm over this table's rows)."""
  rows = paired_rows(summary, best)
  if not rows:
    return []
  lines, tests = paired.table_lines(rows)
  return [
    '## Paired differences (same seed: same subset, same data order)',
    '',
    'Per seed, the first method minus the second (points of top-1), over the seeds both '
    'finished: their mean ± std, the seeds in which the difference is positive, and the '
    'tests of significance.',
    '',
    f'| pair | seeds | top-1 | {paired.HEADER} |',
    f'|---|---|---|{paired.ALIGN}|',
    *lines,
    '',
    paired.how_to_read(tests),
    '',
  ]
