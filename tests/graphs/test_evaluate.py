"""graphs/evaluate: the SVM protocol: separable embeddings classified, noise not, one
embedding per fold; its outer folds, by their seed."""

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


def test_svm_protocol_separates_separable_embeddings_and_not_noise():
  rng = np.random.default_rng(0)
  labels = np.repeat([0, 1, 2], 30)
  separable = rng.normal(size=(90, 8)) + 6.0 * np.eye(8)[labels]
  folds = evaluate.outer_folds(labels, 10, seed=0)
  assert all(np.bincount(labels[test], minlength=3).tolist() == [3, 3, 3] for _, test in folds)
  good = evaluate.cross_validate(separable, labels, folds)
  assert good['accuracy'] == 1.0 and len(good['fold_accuracies']) == 10
  noise = evaluate.cross_validate(rng.normal(size=(90, 8)), labels, folds)
  assert noise['accuracy'] < 0.6
  per_fold = [separable if k % 2 else rng.normal(size=(90, 8)) for k in range(10)]
  mixed = evaluate.cross_validate(per_fold, labels, folds)  # one embedding per fold is used
  np.testing.assert_array_equal(np.array(mixed['fold_accuracies'])[1::2], 1.0)
