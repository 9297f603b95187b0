"""The reports' paired differences: per seed, one method's run minus another's, their
rows (cells and differences, as data), their tables and their tests of significance.

Each comparison report (the image comparison, its sweeps, graph_grid) pairs two methods' runs by
seed and shows, per pair, the differences' n, mean ± std (ddof 1), the seeds in which the
difference is positive, a 95 % confidence interval of the mean difference (t), the paired
t-test's and the exact sign test's two-sided p, and the t-test's p adjusted by Holm's
method over every test of the report (one family per report). The distributions are
scipy's; only Holm's step-down adjustment, plain arithmetic, is written here.
"""

from __future__ import annotations

from collections.abc import Sequence
import dataclasses
import math

import numpy as np
from scipy import stats

from hscl_jax.config import methods

PAIRS = methods.PAIRS  # the pairs of the paper's claims, by the methods' paper labels
# The per-run figures a paired difference is taken of, as the tables name them.
MEASURES = (('top1', 'linear'), ('knn', 'kNN'))
CONFIDENCE = 0.95
HEADER = 'n | Δ mean ± std | positive in | 95 % CI | p (t) | p (sign) | p (Holm)'
ALIGN = '---|---|---|---|---|---|---'


@dataclasses.dataclass(frozen=True)
class PairedTest:
  """The tests of one set of paired differences (first − second, one per seed).

  `std`, the CI and `t_p` are nan below two differences or when they do not vary (the
  t statistic is then undefined); `holm_p` is nan until `with_holm` sets it.
  """

  n: int
  mean: float
  std: float  # sample std, ddof 1
  positive: int
  ci_low: float
  ci_high: float
  t_p: float  # paired t-test, two-sided
  sign_p: float  # exact sign test, two-sided, zero differences dropped
  holm_p: float = math.nan


def sign_test_p(differences: Sequence[float]) -> float:
  """The exact sign test's two-sided p: positives among the non-zero differences against
  Binomial(n, 1/2) (1.0 when every difference is zero)."""
  values = np.asarray(differences, np.float64)
  nonzero = values[values != 0]
  if not len(nonzero):
    return 1.0
  return float(stats.binomtest(int((nonzero > 0).sum()), len(nonzero), 0.5).pvalue)


def smallest_sign_p(n: int) -> float:
  """The smallest two-sided p the sign test can give with n non-zero differences (all of
  one sign): 2 / 2**n, e.g. 0.25 at n = 3, 0.0625 at n = 5."""
  return min(1.0, 2.0 * 0.5**n)


def paired_test(differences: Sequence[float], confidence: float = CONFIDENCE) -> PairedTest:
  """The tests of per-seed differences first − second (a paired t-test is the one-sample
  t-test of the differences against 0)."""
  values = np.asarray(differences, np.float64)
  n = len(values)
  if n == 0:
    raise ValueError('paired_test needs at least one difference (got none)')
  mean = float(values.mean())
  std = float(values.std(ddof=1)) if n > 1 else math.nan
  # Differences equal to rounding (e.g. 0.47 − 0.42 and 0.45 − 0.40) have no spread either:
  # scipy would warn of the cancellation and give a meaningless p.
  if n > 1 and std > 1e-9 * abs(mean):
    t_p = float(stats.ttest_1samp(values, 0.0).pvalue)
    half = float(stats.t.ppf(0.5 + confidence / 2, n - 1)) * std / math.sqrt(n)
  else:
    t_p = half = math.nan  # no spread: the t statistic is undefined
  return PairedTest(
    n=n,
    mean=mean,
    std=std,
    positive=int((values > 0).sum()),
    ci_low=mean - half,
    ci_high=mean + half,
    t_p=t_p,
    sign_p=sign_test_p(values),
  )


def holm(p_values: Sequence[float]) -> list[float]:
  """Holm's step-down adjustment over the family `p_values` (nan: not tested, left out of
  the family and returned as nan). The i-th smallest of m gets max over j <= i of
  min(1, (m - j + 1) p_(j)), in the input's order."""
  finite = [i for i, p in enumerate(p_values) if not math.isnan(p)]
  order = sorted(finite, key=lambda i: p_values[i])
  adjusted = [math.nan] * len(p_values)
  running = 0.0
  for rank, index in enumerate(order):
    running = max(running, min(1.0, (len(order) - rank) * p_values[index]))
    adjusted[index] = running
  return adjusted


def with_holm(tests: Sequence[PairedTest]) -> list[PairedTest]:
  """The tests with `holm_p`: their t-test p adjusted over all of them (one family)."""
  adjusted = holm([t.t_p for t in tests])
  return [dataclasses.replace(t, holm_p=p) for t, p in zip(tests, adjusted)]


def tests_of(families: Sequence[Sequence[float]]) -> list[PairedTest]:
  """paired_test of each set of differences, Holm-adjusted over all of them."""
  return with_holm([paired_test(d) for d in families])


def _p(p: float) -> str:
  if math.isnan(p):
    return '—'
  return f'{p:.3g}'  # 3 significant digits: the sign test's 0.0625 whole


def cells(test: PairedTest, scale: float = 100.0) -> str:
  """The HEADER's cells of one test; differences in points (`scale` times the values)."""
  mean = f'{scale * test.mean:+.2f}'
  spread = f'{mean} ± {scale * test.std:.2f}' if test.n > 1 else mean
  ci = (
    '—' if math.isnan(test.ci_low) else f'[{scale * test.ci_low:+.2f}, {scale * test.ci_high:+.2f}]'
  )
  return (
    f'{test.n} | {spread} | {test.positive} of {test.n} | {ci} | {_p(test.t_p)} | '
    f'{_p(test.sign_p)} | {_p(test.holm_p)}'
  )


def how_to_read(tests: Sequence[PairedTest]) -> str:
  """The report's sentence on reading its tests, with the smallest sign-test p its n allow."""
  sizes = sorted({t.n for t in tests})
  floors = ', '.join(f'{smallest_sign_p(n):.3g} at n = {n}' for n in sizes)
  family = sum(not math.isnan(t.t_p) for t in tests)
  if not family:  # one seed a pair: no spread to test against
    return (
      'How to read the differences: each pair has one seed, which allows no test (the '
      't-test needs two, and the sign test cannot go below 1 at n = 1), so every '
      'difference here is only a direction.'
    )
  return (
    'How to read the tests: p (t) is the paired t-test over the seeds (two-sided) and the '
    '95 % CI its t interval of the mean difference; p (sign) is the exact two-sided sign test '
    f'(zero differences dropped), which cannot go below {floors}, so below 6 seeds it can '
    "never reach 0.05 and only the t-test can; p (Holm) is p (t) adjusted by Holm's method "
    f'over the {family} t-tests of this report. A difference is supported where p (t) < 0.05 '
    '(and survives Holm where p (Holm) < 0.05); otherwise it is only a direction.'
  )


def table_lines(rows: Sequence[tuple[str, Sequence[float]]], scale: float = 100.0):
  """Markdown rows '| PREFIX | <HEADER's cells> |' for (prefix cells, differences) rows,
  Holm-adjusted over all of them; returns (lines, tests)."""
  tests = tests_of([differences for _, differences in rows])
  lines = [f'| {prefix} | {cells(test, scale)} |' for (prefix, _), test in zip(rows, tests)]
  return lines, tests


def seed_values(stats, key: str) -> dict[int, float]:
  """Seed -> a per-run figure (`key`) of one setting's reports.summarise() entry."""
  return {run['seed']: value for run, value in zip(stats['runs'], stats[key])}


def seed_differences(first: dict[int, float], second: dict[int, float]) -> dict[int, float]:
  """Seed -> first − second, over the seeds both have."""
  return {seed: first[seed] - second[seed] for seed in sorted(set(first) & set(second))}


def paired_differences(summary, best, key: str, first: str, second: str) -> dict[int, float]:
  """Seed -> `first` − `second` of a per-run figure (`key`: 'top1' or 'knn' of
  reports.summarise), over the seeds both methods' Table I settings finished: the
  seeds of a comparison share the subset and the data order, so a per-seed difference
  cancels what they share."""
  return seed_differences(
    seed_values(summary[best[first]], key), seed_values(summary[best[second]], key)
  )


def row(cells: Sequence[str], differences: dict[int, float], measure: str):
  """One row: ('CELLS | seeds | measure', the differences in seed order)."""
  seeds = ', '.join(map(str, differences))
  return ' | '.join([*cells, seeds, measure]), list(differences.values())


def pair_rows(points, pairs=PAIRS) -> list[tuple[str, list[float]]]:
  """The per-seed differences of `pairs` (paper labels; the paper's PAIRS by default) at
  each point of `points`, (cells, summary, best) with `best` a comparison's Table I setting
  per method: for each pair, each point where both methods finished, linear then kNN, a
  row ('PAIR | CELLS | seeds | measure', differences)."""
  rows = []
  for first, second in pairs:
    for cells, summary, best in points:
      if first not in best or second not in best:
        continue
      for key, measure in MEASURES:
        differences = paired_differences(summary, best, key, first, second)
        if differences:
          rows.append(row([f'{first} − {second}', *cells], differences, measure))
  return rows


def table(columns: Sequence[str], lines: Sequence[str]) -> list[str]:
  """A table of rows' lines under COLUMNS, then seeds, top-1 and the HEADER's cells."""
  head = [*columns, 'seeds', 'top-1']
  return [f'| {" | ".join(head)} | {HEADER} |', '|' + '---|' * len(head) + f'{ALIGN}|', *lines]


def tables(parts) -> tuple[list[list[str]], list[PairedTest]]:
  """Each (columns, rows) part's table, the tests Holm-adjusted over the rows of every
  part (one family: every test of a report); and the tests."""
  lines, tests = table_lines([r for _, rows in parts for r in rows])
  out, start = [], 0
  for columns, rows in parts:
    out.append(table(columns, lines[start : start + len(rows)]))
    start += len(rows)
  return out, tests
