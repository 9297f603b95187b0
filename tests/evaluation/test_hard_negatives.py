"""evaluation/hard_negatives: each anchor's hardening weights over its negatives (H-UCL's
set or H-SCL's), its top-k, and the fraction of them that share its class, against NumPy
written from the definitions, one anchor at a time."""

from __future__ import annotations

import numpy as np
import pytest

from hscl_jax import losses
from hscl_jax.evaluation import hard_negatives


def _batch(n=18, dim=4, num_classes=3, seed=0):
  """Unit vectors clustered by class (so same-class samples are often, not always, the
  most similar) and their labels."""
  rng = np.random.default_rng(seed)
  labels = np.arange(n) % num_classes
  centres = rng.normal(size=(num_classes, dim))
  z = centres[labels] + 1.2 * rng.normal(size=(n, dim))
  return (z / np.linalg.norm(z, axis=1, keepdims=True)).astype(np.float32), labels


def _numpy_fractions(z, labels, weight_of, k):
  """Per anchor: among the k other samples of largest weight_of(g) > 0 (ties: larger g),
  the fraction of the anchor's class; written from the definition, one anchor at a time."""
  z = np.asarray(z, np.float64)
  fractions = []
  for i in range(len(z)):
    candidates = []
    for j in range(len(z)):
      g = z[i] @ z[j] / 0.5
      if j != i and weight_of(g) > 0:
        candidates.append((weight_of(g), g, j))
    top = [j for _, _, j in sorted(candidates, reverse=True)[:k]]
    if top:
      fractions.append(np.mean([labels[j] == labels[i] for j in top]))
  return np.asarray(fractions)


def test_exponential_hardening_fraction_equals_numpy():
  z, labels = _batch()
  beta = 2.0
  expected = _numpy_fractions(z, labels, lambda g: np.exp(beta * g), k=4)
  result = hard_negatives.false_negative_fraction(
    [(z, labels)], losses.exponential(beta), temperature=0.5, k=4
  )
  assert 0.2 < expected.mean() < 0.9  # neither trivially 0 nor 1
  assert result['fraction'] == pytest.approx(expected.mean(), abs=1e-12)
  assert result['num_anchors'] == 18
  assert result['unweighted'] == pytest.approx(5 / 17)  # 5 of the 17 others share the class


def test_threshold_hardening_counts_only_weighted_negatives_over_batches():
  """Under a threshold some anchors weight fewer than k negatives, some none (not
  counted); two batches are averaged over their anchors."""
  (z1, y1), (z2, y2) = _batch(seed=1), _batch(n=12, seed=2)
  tau = np.exp(1.2)  # e^g >= tau  <=>  g >= 1.2, i.e. z.z' >= 0.6
  weight_of = lambda g: float(g >= np.log(np.float32(tau)))  # noqa: E731
  per_anchor = np.concatenate(
    [_numpy_fractions(z, y, weight_of, k=3) for z, y in ((z1, y1), (z2, y2))]
  )
  result = hard_negatives.false_negative_fraction(
    [(z1, y1), (z2, y2)], losses.threshold(tau), temperature=0.5, k=3
  )
  assert 0 < len(per_anchor) < 30  # some anchors have no weighted negative
  top, _ = hard_negatives.top_negatives(z1, y1, losses.threshold(tau), 0.5, 'hucl', 3)
  _, chosen = hard_negatives.false_negative_counts(top, y1)
  assert chosen.min() == 0 and 0 < np.mean(chosen < 3) < 1 and chosen.max() == 3
  assert result['num_anchors'] == len(per_anchor)
  assert result['fraction'] == pytest.approx(per_anchor.mean(), abs=1e-12)


def test_weights_are_the_normalised_hardening_and_hscl_never_picks_the_same_class():
  z, labels = _batch()
  hardening = losses.exponential(1.5)
  q, g = hard_negatives.hardening_weights(z, labels, hardening, 0.5, 'hscl')
  z64 = np.asarray(z, np.float64)
  eta = np.exp(1.5 * (z64 @ z64.T) / 0.5) * (labels[:, None] != labels[None, :])
  np.testing.assert_allclose(q, eta / eta.sum(axis=1, keepdims=True), rtol=1e-6)
  indices, weights = hard_negatives.top_negatives(z, labels, hardening, 0.5, 'hscl', 8)
  assert np.all(indices >= 0) and np.all(np.diff(weights, axis=1) <= 0)
  assert not np.any(labels[indices] == labels[:, None])
  same, chosen = hard_negatives.false_negative_counts(indices, labels)
  assert np.all(same == 0) and np.all(chosen == 8)
  assert hard_negatives.false_negative_fraction([(z, labels)], hardening, 0.5, 8, 'hscl') == {
    'fraction': 0.0,
    'unweighted': 0.0,
    'num_anchors': 18,
  }


def test_weights_stay_finite_where_the_hardening_overflows_float64():
  """β = 50 at τ = 0.05: β·z·z′/τ reaches 1000, past float64's exp (709). The weights are
  still each row's softmax over its negatives (shifted by the row's largest), here
  from scipy's logsumexp."""
  from scipy import special

  z, labels = _batch()
  q, g = hard_negatives.hardening_weights(z, labels, losses.exponential(50.0), 0.05, 'hscl')
  log_eta = np.where(labels[:, None] != labels[None, :], 50.0 * g, -np.inf)
  assert log_eta.max() > 709
  expected = np.exp(log_eta - special.logsumexp(log_eta, axis=1, keepdims=True))
  assert np.all(np.isfinite(q))
  np.testing.assert_allclose(q, expected, rtol=1e-3, atol=1e-12)


def test_negative_sets_are_the_definitions_and_an_unknown_one_is_refused():
  labels = np.array([0, 1, 0, 2, 1])
  others = ~np.eye(5, dtype=bool)
  np.testing.assert_array_equal(hard_negatives.negative_mask(labels, 'hucl'), others)
  np.testing.assert_array_equal(
    hard_negatives.negative_mask(labels, 'hscl'), others & (labels[:, None] != labels)
  )
  fresh = lambda text: ''.join(list(text))  # as parsed from a flag: no interned literal
  for name in ('hucl', 'hscl'):
    np.testing.assert_array_equal(
      hard_negatives.negative_mask(labels, fresh(name)), hard_negatives.negative_mask(labels, name)
    )
  # One class: H-SCL's anchors have no negative at all; their weights are 0, not 0/0.
  z, _ = _batch()
  q, _ = hard_negatives.hardening_weights(
    z, np.zeros(len(z), int), losses.exponential(1.0), 0.5, 'hscl'
  )
  np.testing.assert_array_equal(q, np.zeros_like(q))
  for name in ('scl', 'HSCL', ''):
    with pytest.raises(ValueError, match=r"negatives must be one of \('hucl', 'hscl'\), got"):
      hard_negatives.negative_mask(labels, name)
    with pytest.raises(ValueError, match='negatives must be one of'):
      hard_negatives.false_negative_fraction([_batch()], losses.exponential(1.0), 0.5, 3, name)
