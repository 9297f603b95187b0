"""The reports' tests of significance against values computed here without scipy: the
sign test from binomial counts, the t-test and its interval from Student's t written out
(closed forms at 1 and 2 degrees of freedom, a numerical integral otherwise), Holm by
hand; on data where a one-sided test, the population std, counting zero differences or
Bonferroni instead of Holm would change the figure."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from hscl_jax.experiments import paired as significance


def sign_p(positive: int, n: int) -> float:
  """Two-sided exact sign test: twice the smaller binomial tail, capped at 1."""
  tail = sum(math.comb(n, i) for i in range(min(positive, n - positive) + 1))
  return min(1.0, 2 * tail / 2**n)


def t_two_sided_p(t: float, df: int) -> float:
  """P(|T| >= |t|) for Student's t with `df` degrees of freedom: 1 − 2∫_0^|t| of its
  density (Simpson's rule; closed forms at df 1 and 2)."""
  t = abs(t)
  if df == 1:
    return 1 - 2 / math.pi * math.atan(t)
  if df == 2:
    return 1 - t / math.sqrt(2 + t * t)
  norm = math.gamma((df + 1) / 2) / (math.sqrt(df * math.pi) * math.gamma(df / 2))
  s = np.linspace(0.0, t, 4001)
  density = norm * (1 + s * s / df) ** (-(df + 1) / 2)
  weights = np.ones_like(s)
  weights[1:-1:2], weights[2:-1:2] = 4, 2
  return 1 - 2 * float((weights * density).sum() * (s[1] - s[0]) / 3)


def t_quantile_975(df: int) -> float:
  """Student's t 0.975 quantile: closed forms at df 1 and 2, bisection otherwise."""
  if df == 1:
    return math.tan(math.pi * 0.475)  # 12.706
  if df == 2:
    return 0.95 / math.sqrt(2 * 0.975 * 0.025)  # 4.303
  low, high = 0.0, 50.0
  for _ in range(60):
    middle = (low + high) / 2
    low, high = (middle, high) if t_two_sided_p(middle, df) > 0.05 else (low, middle)
  return (low + high) / 2


def expected(differences):
  """(mean, std ddof 1, CI low, CI high, t-test p, sign p) computed here."""
  d = np.asarray(differences, np.float64)
  n, mean = len(d), d.mean()
  std = math.sqrt(((d - mean) ** 2).sum() / (n - 1))
  half = t_quantile_975(n - 1) * std / math.sqrt(n)
  t = mean / (std / math.sqrt(n))
  nonzero = d[d != 0]
  sign = sign_p(int((nonzero > 0).sum()), len(nonzero))
  return mean, std, mean - half, mean + half, t_two_sided_p(t, n - 1), sign


def test_sign_test_drops_zero_differences_and_is_two_sided():
  # 5 of 6 non-zero differences positive, one zero: p = 2 (1 + 6) / 64 = 0.21875; counting
  # the zero as a loss (n = 7) gives 0.453, one-sided 0.109.
  d = [0.3, 0.1, 0.0, -0.2, 0.4, 0.5, 0.2]
  assert significance.sign_test_p(d) == pytest.approx(sign_p(5, 6)) == pytest.approx(0.21875)
  assert significance.sign_test_p([0.1, -0.1, 0.2, -0.3]) == 1.0  # 2 of 4: capped at 1
  assert significance.sign_test_p([0.0, 0.0]) == 1.0
  for n in (3, 5, 6):
    assert significance.sign_test_p([0.1] * n) == pytest.approx(sign_p(n, n))
    assert significance.smallest_sign_p(n) == pytest.approx(sign_p(n, n))
  assert significance.smallest_sign_p(3) == 0.25 and significance.smallest_sign_p(5) == 0.0625


@pytest.mark.parametrize(
  'differences',
  [
    [0.01, 0.02, 0.06],  # df 2: CI ± 4.303 s/√3, p = 1 − |t| / √(2 + t²)
    [0.05, -0.01],  # df 1: CI ± 12.706 s/√2
    [0.012, -0.004, 0.02, 0.009, 0.015, 0.0],  # df 5, with a zero for the sign test
  ],
)
def test_paired_test_matches_student_t_written_out(differences):
  """Sample std (ddof 1), the two-sided p and the 95 % t interval of the mean; with the
  population std, a one-sided p or a normal interval each figure would move."""
  got = significance.paired_test(differences)
  mean, std, low, high, t_p, s_p = expected(differences)
  assert got.n == len(differences)
  assert got.positive == sum(d > 0 for d in differences)
  assert got.mean == pytest.approx(mean) and got.std == pytest.approx(std)
  assert got.std != pytest.approx(np.std(differences), rel=1e-3)
  assert (got.ci_low, got.ci_high) == pytest.approx((low, high), rel=1e-6)
  assert got.t_p == pytest.approx(t_p, rel=1e-6)
  assert got.sign_p == pytest.approx(s_p)
  assert math.isnan(got.holm_p)


def test_t_interval_at_a_known_answer():
  # Differences 1, 2, 6: mean 3, std √7, t(0.975, 2) = 4.303: 3 ± 4.303 √7 / √3.
  got = significance.paired_test([1.0, 2.0, 6.0])
  assert (got.ci_low, got.ci_high) == pytest.approx((3 - 6.5724, 3 + 6.5724), abs=1e-3)
  assert got.t_p == pytest.approx(1 - 1.9640 / math.sqrt(2 + 1.9640**2), abs=1e-4)  # 0.1885


def test_no_spread_leaves_the_t_test_undefined_without_a_warning():
  with warnings.catch_warnings():
    warnings.simplefilter('error')
    one = significance.paired_test([0.02])
    flat = significance.paired_test([0.47 - 0.42, 0.45 - 0.40, 0.05])  # equal to rounding
  for test in (one, flat):
    assert math.isnan(test.t_p) and math.isnan(test.ci_low)
  assert one.sign_p == 1.0 and flat.sign_p == 0.25
  assert significance.cells(one) == '1 | +2.00 | 1 of 1 | — | — | 1 | —'
  with pytest.raises(ValueError, match='at least one difference'):
    significance.paired_test([])


def test_holm_by_hand():
  # Sorted 0.01, 0.03, 0.04, 0.5 of m = 4: 4·0.01, 3·0.03, max(0.09, 2·0.04), 0.5;
  # Bonferroni would give 0.04, 0.16, 0.12, 1.
  adjusted = significance.holm([0.01, 0.04, 0.03, 0.5, math.nan])
  assert adjusted[:4] == pytest.approx([0.04, 0.09, 0.09, 0.5])
  assert math.isnan(adjusted[4])  # not tested: outside the family
  assert significance.holm([0.6, 0.7, 0.01]) == pytest.approx([1.0, 1.0, 0.03])
  assert significance.holm([]) == []


def test_table_lines_adjust_over_every_row_and_format_points():
  rows = [('a', [0.01, 0.02, 0.06]), ('b', [0.05, -0.01]), ('c', [0.03])]
  lines, tests = significance.table_lines(rows)
  p_a, p_b = expected(rows[0][1])[4], expected(rows[1][1])[4]
  holm_a, holm_b = (min(1, 2 * p_a), min(1, 2 * p_b))  # two t-tests in the family
  if p_a < p_b:
    holm_b = max(holm_a, min(1, p_b))
  else:
    holm_a = max(holm_b, min(1, p_a))
  assert [t.holm_p for t in tests[:2]] == pytest.approx([holm_a, holm_b])
  mean, std, low, high, t_p, s_p = expected(rows[0][1])
  assert lines[0] == (
    f'| a | 3 | {100 * mean:+.2f} ± {100 * std:.2f} | 3 of 3 | '
    f'[{100 * low:+.2f}, {100 * high:+.2f}] | {t_p:.3g} | {s_p:.3g} | {holm_a:.3g} |'
  )
  assert lines[2] == '| c | 1 | +3.00 | 1 of 1 | — | — | 1 | — |'
  text = significance.how_to_read(tests)
  assert 'cannot go below 1 at n = 1, 0.5 at n = 2, 0.25 at n = 3,' in text
  assert 'over the 2 t-tests of this report' in text
  one_seed = significance.how_to_read(significance.tests_of([[0.01], [-0.02]]))
  assert 'allows no test' in one_seed and 'Holm' not in one_seed
  assert significance.cells(significance.paired_test([0.001, 0.00101, 0.00099])).endswith(
    f'| {expected([0.001, 0.00101, 0.00099])[4]:.3g} | 0.25 | —'
  )


def holm_by_hand(p_values):
  """Holm: each p's adjusted value is the largest min(1, (m − rank + 1) p) over the p's
  at or below it (ranks from 1, smallest first)."""
  ranked = sorted(p_values)
  m = len(ranked)
  return [
    max(min(1.0, (m - rank) * q) for rank, q in enumerate(ranked) if q <= p) for p in p_values
  ]


def p_text(p: float) -> str:
  return f'{p:.3g}'


def expected_cells(differences, holm_p: float) -> str:
  """A report row's test cells for per-seed differences (fractions; shown in points)."""
  mean, std, low, high, t_p, s_p = expected(differences)
  n, positive = len(differences), sum(d > 0 for d in differences)
  return (
    f'{n} | {100 * mean:+.2f} ± {100 * std:.2f} | {positive} of {n} | '
    f'[{100 * low:+.2f}, {100 * high:+.2f}] | {p_text(t_p)} | {p_text(s_p)} | {p_text(holm_p)}'
  )


def expected_rows(rows):
  """{prefix: '| prefix | cells |'} for (prefix, differences) rows, Holm over all of them."""
  adjusted = holm_by_hand([expected(d)[4] for _, d in rows])
  return {
    prefix: f'| {prefix} | {expected_cells(d, h)} |' for (prefix, d), h in zip(rows, adjusted)
  }


def _point(values: dict[str, dict[int, tuple[float, float]]]):
  """(summary, best) of a comparison whose methods' runs have these (top1, knn) per seed."""
  summary, best = {}, {}
  for method, by_seed in values.items():
    seeds = sorted(by_seed)
    summary[method] = {
      'top1': [by_seed[s][0] for s in seeds],
      'knn': [by_seed[s][1] for s in seeds],
      'runs': [{'seed': s} for s in seeds],
    }
    best[method] = method
  return summary, best


def test_pair_rows_are_the_papers_pairs_at_each_point_over_shared_seeds():
  """The one builder of the three reports' pair rows: for each pair (the paper's, written
  out), each point where both methods finished, linear then kNN, over the seeds both have."""
  full = _point(
    {
      'H-SCL(β)': {1: (0.50, 0.40), 2: (0.60, 0.45), 3: (0.55, 0.41)},
      'SCL': {0: (0.30, 0.20), 1: (0.45, 0.35), 2: (0.50, 0.47)},
      'H-UCL': {1: (0.20, 0.10), 2: (0.25, 0.30)},
      'UCL': {1: (0.10, 0.12), 2: (0.15, 0.05)},
    }
  )
  no_hucl = _point({'H-SCL(β)': {0: (0.7, 0.6)}, 'SCL': {0: (0.6, 0.65)}, 'UCL': {0: (0.1, 0.1)}})
  rows = significance.pair_rows([(['A', '1.00'], *full), (['B', '2.00'], *no_hucl)])
  expected_rows = [
    ('H-SCL(β) − SCL | A | 1.00 | 1, 2 | linear', [0.50 - 0.45, 0.60 - 0.50]),
    ('H-SCL(β) − SCL | A | 1.00 | 1, 2 | kNN', [0.40 - 0.35, 0.45 - 0.47]),
    ('H-SCL(β) − SCL | B | 2.00 | 0 | linear', [0.7 - 0.6]),
    ('H-SCL(β) − SCL | B | 2.00 | 0 | kNN', [0.6 - 0.65]),
    ('H-SCL(β) − H-UCL | A | 1.00 | 1, 2 | linear', [0.50 - 0.20, 0.60 - 0.25]),
    ('H-SCL(β) − H-UCL | A | 1.00 | 1, 2 | kNN', [0.40 - 0.10, 0.45 - 0.30]),
    ('SCL − UCL | A | 1.00 | 1, 2 | linear', [0.45 - 0.10, 0.50 - 0.15]),
    ('SCL − UCL | A | 1.00 | 1, 2 | kNN', [0.35 - 0.12, 0.47 - 0.05]),
    ('SCL − UCL | B | 2.00 | 0 | linear', [0.6 - 0.1]),
    ('SCL − UCL | B | 2.00 | 0 | kNN', [0.65 - 0.1]),
    ('H-UCL − UCL | A | 1.00 | 1, 2 | linear', [0.20 - 0.10, 0.25 - 0.15]),
    ('H-UCL − UCL | A | 1.00 | 1, 2 | kNN', [0.10 - 0.12, 0.30 - 0.05]),
  ]
  assert [prefix for prefix, _ in rows] == [prefix for prefix, _ in expected_rows]
  for (_, got), (prefix, want) in zip(rows, expected_rows):
    assert got == pytest.approx(want, abs=1e-12), prefix


def test_tables_split_one_holm_family_into_each_parts_table():
  """Each part's rows under its own columns, the tests adjusted over the rows of all parts."""
  first = [('a | x', [0.01, 0.03, 0.02]), ('b | x', [0.05, 0.04, 0.06])]
  second = [('c', [-0.02, 0.01, -0.01])]
  (one, two), tests = significance.tables([(['pair', 'point'], first), (['method'], second)])
  by_hand = expected_rows(first + second)
  header = 'n | Δ mean ± std | positive in | 95 % CI | p (t) | p (sign) | p (Holm)'
  assert one == [
    f'| pair | point | seeds | top-1 | {header} |',
    '|---|---|---|---|---|---|---|---|---|---|---|',
    by_hand['a | x'],
    by_hand['b | x'],
  ]
  assert two == [
    f'| method | seeds | top-1 | {header} |',
    '|---|---|---|---|---|---|---|---|---|---|',
    by_hand['c'],
  ]
  assert [t.n for t in tests] == [3, 3, 3]
