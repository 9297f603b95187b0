"""A covering subset of a parametrised test's cases for the default run.

A test marked `@pytest.mark.covering` (beneath its parametrisation: pytest's, absl's or
chex's variants) runs by default only the cases that give each parameter every one of its
values at least once, the values rotating between the cases; tests/conftest.py marks the
rest slow, and `-m slow` runs them. For a product of a loss name (6 values) and a block
size (2 values) that is 6 cases of 12: every loss, and each block size on three losses.

Used where a case is mostly compilation and the cases differ by a product of options
whose interactions other tests cover (docs/testing.md lists them). `--covering-only`
(tests/conftest.py) applies it to every parametrised test: .ci/run's runs on other
versions of the dependencies, which check that every test's code runs there.
"""

from __future__ import annotations

import ast
import collections
from collections.abc import Hashable, Mapping, Sequence
import inspect
import re

import pytest

# Every group of covering cases of this process's collection: (file, test) -> [(values,
# kept)], for the test that checks the cover (the slow cases are deselected afterwards).
COLLECTED: dict[tuple[str, str], list[tuple[dict[str, str], bool]]] = {}

_CHEX_VARIANT = re.compile(r'__(with_\w+|without_\w+)$')
_ABSL_PARAMS = re.compile(r'_(\(.*\))$')


def each_value_once(cases: Sequence[Mapping[str, Hashable]]) -> list[int]:
  """Indices (ascending) of a subset of `cases` in which every (parameter, value) of
  `cases` occurs.

  Greedy: each pick is the case with the most pairs not yet taken; ties go to the case
  whose values were taken least often (so a product's shorter axes rotate instead of
  repeating their first value), then to the earliest. On a full product this takes as
  many cases as the longest axis has values.

  Args:
    cases: each case's values by parameter name.

  Returns:
    The indices of the chosen cases, in their order in `cases`.

  >>> each_value_once([dict(a=1, b=0), dict(a=1, b=1), dict(a=2, b=0), dict(a=2, b=1)])
  [0, 3]
  """
  pairs = [set(case.items()) for case in cases]
  uncovered = set().union(*pairs) if pairs else set()
  taken = collections.Counter()
  chosen = []
  while uncovered:
    best = min(
      range(len(cases)),
      key=lambda i: (-len(pairs[i] & uncovered), sum(taken[p] for p in pairs[i]), i),
    )
    chosen.append(best)
    uncovered -= pairs[best]
    taken.update(pairs[best])
  return sorted(chosen)


def case_values(item) -> dict[str, str]:
  """A collected case's values by parameter (as source text or repr: compared, not used):
  pytest's parametrize, absl's parameters/product, and chex's variant as `variant`."""
  callspec = getattr(item, 'callspec', None)
  if callspec is not None:
    return {name: repr(value) for name, value in callspec.params.items()}
  name, values = item.name, {}
  variant = _CHEX_VARIANT.search(name)
  if variant:
    values['variant'] = variant.group(1)
    name = name[: variant.start()]
  text = getattr(item.obj, '__x_params_repr__', None) or None  # chex's copies: ''
  if text is None:
    match = _ABSL_PARAMS.search(name)
    text = match.group(1) if match else '()'
  try:
    call = ast.parse('f' + text, mode='eval').body
  except SyntaxError:  # a name this does not read: a case of its own, always kept
    return {'case': item.name}
  values.update({f'arg{i}': ast.unparse(arg) for i, arg in enumerate(call.args)})
  values.update({kw.arg: ast.unparse(kw.value) for kw in call.keywords})
  return values


def group_key(item) -> tuple[str, str]:
  """(file, test): the same for every case of a test, whatever parametrised it."""
  return item.nodeid.split('::')[0], inspect.unwrap(item.function).__qualname__


def mark_beyond_the_cover(items, *, every_test: bool = False) -> None:
  """Marks slow every case of a `covering` test (with `every_test`, of any parametrised
  test: `--covering-only`) outside its cover (see each_value_once)."""
  groups = collections.defaultdict(list)
  for item in items:
    if not hasattr(item, 'function'):  # a doctest, say: no parameters
      continue
    if every_test or item.get_closest_marker('covering') is not None:
      groups[group_key(item)].append(item)
  for key, group in groups.items():
    values = [case_values(item) for item in group]
    kept = set(each_value_once(values))
    for i, item in enumerate(group):
      if i not in kept:
        item.add_marker(pytest.mark.slow)
    COLLECTED[key] = [(v, i in kept) for i, v in enumerate(values)]
