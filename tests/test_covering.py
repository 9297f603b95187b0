"""tests/covering.py: the default run's covering subsets of parametrised tests."""

from __future__ import annotations

import doctest
import itertools

from absl.testing import parameterized
import chex
import covering
from hypothesis import given
from hypothesis import strategies as st
import pytest

THIS = 'tests/test_covering.py'


def _pairs(cases):
  return {pair for case in cases for pair in case.items()}


@given(st.lists(st.integers(1, 6), min_size=1, max_size=4))
def test_a_product_is_covered_by_as_many_cases_as_its_longest_axis(sizes):
  axes = [f'axis{i}' for i in range(len(sizes))]
  cases = [dict(zip(axes, values)) for values in itertools.product(*map(range, sizes))]
  chosen = covering.each_value_once(cases)
  assert chosen == sorted(set(chosen))
  assert len(chosen) == max(sizes)
  assert _pairs([cases[i] for i in chosen]) == _pairs(cases)


@given(st.lists(st.dictionaries(st.sampled_from('abc'), st.integers(0, 3)), max_size=12))
def test_any_list_of_cases_is_covered(cases):
  chosen = covering.each_value_once(cases)
  assert _pairs([cases[i] for i in chosen]) == _pairs(cases)
  # Each pick added a pair: no more cases than pairs.
  assert len(chosen) <= len(_pairs(cases))


def test_the_docstring_example_runs():
  assert doctest.testmod(covering).failed == 0
  assert doctest.testmod(covering).attempted >= 1


def test_the_shorter_axes_rotate_instead_of_repeating_their_first_value():
  cases = [dict(name=n, option=o, jit=j) for n in range(6) for o in 'xyz' for j in (0, 1)]
  chosen = [cases[i] for i in covering.each_value_once(cases)]
  assert [c['name'] for c in chosen] == list(range(6))
  assert [c['option'] for c in chosen] == list('xyzxyz')
  assert [c['jit'] for c in chosen] == [0, 1, 0, 1, 0, 1]


# Collected by this file's own run: a pytest-parametrised and a chex/absl covering test.
@pytest.mark.parametrize('size', [0, 3])
@pytest.mark.parametrize('name', ['x', 'y', 'z'])
@pytest.mark.covering
def test_pytest_cases_outside_the_cover_are_left_to_the_slow_run(name, size, request):
  assert covering.case_values(request.node) == {'name': repr(name), 'size': repr(size)}
  # This case runs by default only if the cover kept it; `-m slow` runs the others.
  assert (request.node.get_closest_marker('slow') is None) == _is_kept(request.node)


class AbslCases(chex.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.product(name=['x', 'y', 'z'], size=[0, 3])
  @pytest.mark.covering
  def test_chex_variants_of_absl_products(self, name, size):
    self.assertEqual(self.variant(lambda x: x * 2)(size), 2 * size)
    self.assertIn(name, 'xyz')


def test_absl_and_chex_cases_are_read_from_their_names():
  cases = covering.COLLECTED[(THIS, 'AbslCases.test_chex_variants_of_absl_products')]
  values = [v for v, _ in cases]
  expected = [
    {'variant': variant, 'name': repr(name), 'size': repr(size)}
    for name in 'xyz'
    for size in (0, 3)
    for variant in ('with_jit', 'without_jit')
  ]
  assert sorted(values, key=repr) == sorted(expected, key=repr)
  kept = [v for v, k in cases if k]
  assert len(kept) == 3 and _pairs(kept) == _pairs(values)


def test_every_covering_test_collected_keeps_each_value_and_marks_the_rest_slow(request):
  assert covering.COLLECTED, 'no covering test was collected'
  for key, cases in covering.COLLECTED.items():
    kept = [v for v, k in cases if k]
    assert _pairs(kept) == _pairs([v for v, _ in cases]), key
    assert len(kept) < len(cases) or len(cases) == 1, key
  for item in request.session.items:
    if item.get_closest_marker('covering') is not None:
      assert (item.get_closest_marker('slow') is None) == _is_kept(item), item.nodeid


def _is_kept(item):
  values = covering.case_values(item)
  return any(v == values and k for v, k in covering.COLLECTED[covering.group_key(item)])


def test_covering_only_covers_every_parametrised_test():
  """`--covering-only` (tests/conftest.py, .ci/run's version steps): unmarked tests too."""

  def test_fake(name, size):
    del name, size

  class Item:
    def __init__(self, name, size):
      self.nodeid, self.function = f'tests/test_fake.py::test_fake[{name}-{size}]', test_fake
      self.callspec = type('CallSpec', (), {'params': dict(name=name, size=size)})()
      self.marks = []

    def get_closest_marker(self, name):
      del name  # not marked `covering`

    def add_marker(self, mark):
      self.marks.append(mark.name)

  items = [Item(name, size) for name in 'xyz' for size in (0, 3)]
  try:
    covering.mark_beyond_the_cover(items)
    assert all(item.marks == [] for item in items)
    covering.mark_beyond_the_cover(items, every_test=True)
    kept = [item.callspec.params for item in items if not item.marks]
    assert kept == [dict(name='x', size=0), dict(name='y', size=3), dict(name='z', size=0)]
    assert all(item.marks in ([], ['slow']) for item in items)
  finally:
    covering.COLLECTED.pop(('tests/test_fake.py', test_fake.__qualname__), None)


def test_reverse_within_files_reverses_each_files_tests_and_keeps_the_files_order():
  """`--reverse-within-files` (tests/conftest.py): finds tests that depend on their order
  (a test that changed its file's shared config failed the tests after it)."""
  import conftest

  names = ['b.py::t1', 'b.py::t2[x]', 'b.py::t2[y]', 'a.py::t1', 'a.py::t2', 'c.py::t']
  items = [type('Item', (), {'nodeid': f'tests/{name}'})() for name in names]
  reversed_ids = [item.nodeid for item in conftest.reversed_within_files(items)]
  assert reversed_ids == [
    f'tests/{name}'
    for name in ['b.py::t2[y]', 'b.py::t2[x]', 'b.py::t1', 'a.py::t2', 'a.py::t1', 'c.py::t']
  ]
