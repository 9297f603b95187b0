"""graphs/evaluate: the outer folds of the SVM protocol, by their seed."""

from __future__ import annotations

import numpy as np

from hscl_jax.graphs import evaluate

LABELS = np.array([0] * 12 + [1] * 8 + [2] * 4)


def _test_parts(seed):
  return [tuple(test) for _, test in evaluate.outer_folds(LABELS, 4, seed)]


def test_each_graph_is_tested_once_in_folds_stratified_by_class():
  folds = evaluate.outer_folds(LABELS, 4, seed=3)
  tested = np.sort(np.concatenate([test for _, test in folds]))
  np.testing.assert_array_equal(tested, np.arange(len(LABELS)))
  for train, test in folds:
    assert not set(train) & set(test) and len(train) + len(test) == len(LABELS)
    assert np.bincount(LABELS[test], minlength=3).tolist() == [3, 2, 1]


def test_the_folds_are_the_seeds():
  assert _test_parts(0) == _test_parts(0)
  parts = {seed: _test_parts(seed) for seed in range(4)}
  assert len({tuple(p) for p in parts.values()}) == 4  # every seed its own folds
