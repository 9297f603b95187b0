"""The float64 reference of the sigmoid (SigLIP) losses, written from the definition
(docs/method.md) with explicit sets: tests/losses/test_sigmoid.py and the transformation
matrix (tests/losses/test_transforms.py) check the losses against it."""

from __future__ import annotations

import numpy as np


def reference_pairs(anchors, keys, positive, negative, *, t, b, eta=None, frozen=None):
  """(1/n) Σ_i [Σ_{P(i)} softplus(-l_ip) + Σ_{N(i)} w_ij softplus(l_ij)], l = t·s + b,
  w_ij = |N(i)| η(t·s_ij) / Σ_{k∈N(i)} η(t·s_ik) (no weights where Σ η = 0); ``frozen``:
  (t, anchors, keys) the weights are computed from instead (detached weights)."""
  a, k = np.asarray(anchors, np.float64), np.asarray(keys, np.float64)
  s = a @ k.T
  g = t * s if frozen is None else frozen[0] * np.asarray(frozen[1]) @ np.asarray(frozen[2]).T
  softplus = lambda v: np.logaddexp(0.0, v)
  total = 0.0
  for i in range(len(a)):
    pos, neg = np.flatnonzero(positive[i]), np.flatnonzero(negative[i])
    total += softplus(-(t * s[i, pos] + b)).sum()
    eta_i = np.ones(len(neg)) if eta is None else eta(g[i, neg])
    if eta_i.sum() > 0:
      w = len(neg) * eta_i / eta_i.sum()
      total += (w * softplus(t * s[i, neg] + b)).sum()
  return total / len(a)


def reference_siglip(x, y, *, t, b, labels_x=None, labels_y=None, eta=None, frozen=None):
  n, m = len(x), len(y)
  if labels_x is None:
    positive = np.eye(n, m, dtype=bool)
  else:
    positive = np.asarray(labels_x)[:, None] == np.asarray(labels_y)[None, :]
  return reference_pairs(x, y, positive, ~positive, t=t, b=b, eta=eta, frozen=frozen)


def reference_one_tower(z, labels=None, *, t, b, eta=None):
  z = np.asarray(z, np.float64)
  batch, views, dim = z.shape
  sample = np.arange(batch * views) // views
  group = sample if labels is None else np.asarray(labels)[sample]
  same = group[:, None] == group[None, :]
  other = ~np.eye(batch * views, dtype=bool)
  rows = z.reshape(-1, dim)
  return reference_pairs(rows, rows, same & other, ~same, t=t, b=b, eta=eta)


def siglip_dense_formula(x, y, t, b):
  """SigLIP's paper: -(1/n) Σ_ij log σ(z_ij (t x_i·y_j + b)), z = 2I - 1 (float64)."""
  logits = t * np.asarray(x, np.float64) @ np.asarray(y, np.float64).T + b
  signs = 2 * np.eye(len(x)) - 1
  return -np.sum(-np.logaddexp(0.0, -signs * logits)) / len(x)
