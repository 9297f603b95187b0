"""Which negatives a hardening weights most, as H-UCL and as H-SCL see them (the paper's
Fig. 2 on data), and how often H-UCL's most weighted negatives are false (same-class).

The weights are the loss kernels' own (docs/method.md): a hardening (`losses.exponential`,
`losses.threshold`) maps the temperature-scaled similarity g_ij = z_i·z_j / γ of two
L2-normalised projections to log η(g_ij), and anchor i weights its negatives N(i) by
q_i(j) = η(g_ij) / Σ_{k∈N(i)} η(g_ik). Here a batch holds one view per sample: H-UCL's
N(i) is every other sample, H-SCL's the samples of other classes. The top-k negatives of
an anchor are the k of largest q (ties, e.g. under a threshold hardening or β = 0, broken
by the larger similarity); a negative of weight 0 is never among them.
"""

from __future__ import annotations

from collections.abc import Iterable

import jax.numpy as jnp
import numpy as np

from hscl_jax import losses

NEGATIVE_SETS = ('hucl', 'hscl')  # every other sample; only samples of other classes
# Each set by the loss whose negatives it is, and what it holds (the figures' and the
# summary's words).
SET_LABELS = {'hucl': 'H-UCL', 'hscl': 'H-SCL'}
SET_MEMBERS = {'hucl': 'every other sample', 'hscl': 'only samples of other classes'}


def negative_mask(labels: np.ndarray, negatives: str) -> np.ndarray:
  """bool [n, n]: whether sample j is a negative of anchor i."""
  labels = np.asarray(labels)
  others = ~np.eye(len(labels), dtype=bool)
  if negatives == 'hucl':
    return others
  if negatives == 'hscl':
    return others & (labels[:, None] != labels[None, :])
  raise ValueError(f'negatives must be one of {NEGATIVE_SETS}, got {negatives!r}.')


def hardening_weights(
  z: np.ndarray, labels: np.ndarray, hardening: losses.Hardening, temperature: float, negatives: str
) -> tuple[np.ndarray, np.ndarray]:
  """(q [n, n], g [n, n]): each anchor's weights over its negatives (0 elsewhere; a row
  without a weighted negative is all 0) and the scaled similarities, in float64."""
  z = np.asarray(z, np.float64)
  g = z @ z.T / temperature
  log_eta = np.asarray(hardening(jnp.asarray(g, jnp.float32)), np.float64)
  log_eta = np.where(negative_mask(labels, negatives), log_eta, -np.inf)
  row_max = np.max(log_eta, axis=1, keepdims=True)
  shifted = np.exp(log_eta - np.where(np.isfinite(row_max), row_max, 0.0))
  total = shifted.sum(axis=1, keepdims=True)
  return np.divide(shifted, total, out=np.zeros_like(shifted), where=total > 0), g


def top_negatives(
  z: np.ndarray,
  labels: np.ndarray,
  hardening: losses.Hardening,
  temperature: float,
  negatives: str,
  k: int,
) -> tuple[np.ndarray, np.ndarray]:
  """(indices [n, k], weights [n, k]) of each anchor's k most weighted negatives, most
  weighted first; index -1 (weight 0) where an anchor has fewer than k weighted ones."""
  q, g = hardening_weights(z, labels, hardening, temperature, negatives)
  order = np.lexsort((-g, -q), axis=-1)[:, :k]  # by weight, then by similarity
  weights = np.take_along_axis(q, order, axis=1)
  return np.where(weights > 0, order, -1), weights


def false_negative_counts(indices: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """(same-class negatives, weighted negatives) among each anchor's top negatives
  (`top_negatives`' indices, -1 for none): int [n] each."""
  labels = np.asarray(labels)
  chosen = indices >= 0
  same_class = chosen & (labels[np.maximum(indices, 0)] == labels[:, None])
  return same_class.sum(axis=1), chosen.sum(axis=1)


def false_negative_fraction(
  batches: Iterable[tuple[np.ndarray, np.ndarray]],
  hardening: losses.Hardening,
  temperature: float,
  k: int,
  negatives: str = 'hucl',
) -> dict[str, float | int]:
  """Over (projections, labels) batches: the mean over anchors of the fraction of
  same-class samples among their top-k negatives (`fraction`), that fraction among all
  of the anchor's negatives, i.e. without hardening (`unweighted`), and the number of
  anchors counted (those with a weighted negative)."""
  fractions, unweighted = [], []
  for z, labels in batches:
    indices, _ = top_negatives(z, labels, hardening, temperature, negatives, k)
    same_class, chosen = false_negative_counts(indices, labels)
    mask = negative_mask(labels, negatives)
    all_same = (mask & (np.asarray(labels)[:, None] == np.asarray(labels)[None, :])).sum(axis=1)
    counted = chosen > 0
    fractions.append(same_class[counted] / chosen[counted])
    unweighted.append(all_same[counted] / mask.sum(axis=1)[counted])
  fractions, unweighted = np.concatenate(fractions), np.concatenate(unweighted)
  return {
    'fraction': float(fractions.mean()) if len(fractions) else float('nan'),
    'unweighted': float(unweighted.mean()) if len(unweighted) else float('nan'),
    'num_anchors': int(len(fractions)),
  }
