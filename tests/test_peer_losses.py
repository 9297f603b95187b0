"""The losses against the libraries people port from (docs/method.md, "Porting from other
libraries"): pytorch-metric-learning's NTXentLoss and SupConLoss and lightly's NTXentLoss,
on the same random embeddings, values and gradients. Skipped visibly without torch and
the two packages (the [peers] extra; CI installs it)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hscl_jax import losses

torch = pytest.importorskip('torch', reason='the peer comparisons need torch ([peers] extra)')
pml_losses = pytest.importorskip(
  'pytorch_metric_learning.losses', reason='needs pytorch-metric-learning ([peers] extra)'
)
pml_reducers = pytest.importorskip('pytorch_metric_learning.reducers')
lightly_loss = pytest.importorskip('lightly.loss', reason='needs lightly ([peers] extra)')

# (batch, views, temperature) compared. PML builds a [positive pairs, negative pairs] matrix:
# at batch 512 with class labels that is tens of GB, so the largest batch here is 128.
SHAPES = [(4, 2, 0.05), (64, 3, 0.5), (128, 2, 1.0), (33, 4, 0.2)]


def embeddings(batch, views, seed, dim=16):
  """Raw (unnormalised) embeddings [batch, views, dim]: the peers normalise inside."""
  return np.random.default_rng(seed).normal(size=(batch, views, dim)).astype(np.float32)


def class_labels(batch, pattern, seed):
  """Labels with duplicates and a single-sample class, all the same, or all distinct."""
  if pattern == 'same':
    return np.zeros(batch, np.int64)
  if pattern == 'distinct':
    return np.arange(batch)
  labels = np.random.default_rng(seed).integers(0, max(batch // 4, 2), batch)
  labels[0] = labels.max() + 1  # a class with one sample (its views are its positives)
  return labels


def ours(loss, x):
  """(value, gradient) of ``loss(l2_normalize(x))`` with respect to the raw x."""
  value, grad = jax.value_and_grad(lambda x: loss(losses.l2_normalize(x)))(jnp.asarray(x))
  return float(value), np.asarray(grad)


def theirs(loss, x, *args):
  """(value, gradient) of a torch loss of the rows [n, d] (sample-major, as ours)."""
  rows = torch.tensor(x.reshape(-1, x.shape[-1]), requires_grad=True)
  value = loss(rows, *args)
  value.backward()
  return float(value.detach()), rows.grad.numpy().reshape(x.shape)


def assert_same(got, expected):
  np.testing.assert_allclose(got[0], expected[0], rtol=2e-5, atol=1e-6)
  scale = np.abs(expected[1]).max()
  np.testing.assert_allclose(got[1], expected[1], rtol=1e-4, atol=1e-5 * max(scale, 1e-3))


@pytest.mark.parametrize('batch,views,temperature', SHAPES)
def test_ucl_with_m_n_minus_views_is_pml_ntxent(batch, views, temperature):
  """UCL with M = n − v (the other samples' rows) is PML's NTXentLoss with sample ids as
  labels: its denominator holds one positive and every row of another sample."""
  x = embeddings(batch, views, seed=batch)
  n = batch * views
  sample_ids = torch.tensor(np.repeat(np.arange(batch), views))
  expected = theirs(pml_losses.NTXentLoss(temperature=temperature), x, sample_ids)
  got = ours(lambda z: losses.ucl(z, temperature=temperature, M=n - views), x)
  assert_same(got, expected)


@pytest.mark.parametrize('batch,views,temperature', SHAPES)
def test_ucl_default_m_is_pml_ntxent_for_two_views_only(batch, views, temperature):
  """M = None (n − 2) is NT-Xent's count for two views; with more views it is not."""
  x = embeddings(batch, views, seed=batch + 1)
  sample_ids = torch.tensor(np.repeat(np.arange(batch), views))
  expected = theirs(pml_losses.NTXentLoss(temperature=temperature), x, sample_ids)
  got = ours(lambda z: losses.ucl(z, temperature=temperature), x)
  if views == 2:
    assert_same(got, expected)
  else:  # not within assert_same's tolerance
    assert not np.isclose(got[0], expected[0], rtol=2e-5, atol=1e-6)


@pytest.mark.parametrize('batch,views,temperature', [s for s in SHAPES if s[1] == 2])
def test_ucl_is_lightly_ntxent_for_two_views(batch, views, temperature):
  x = embeddings(batch, views, seed=batch + 2)
  loss = lightly_loss.NTXentLoss(temperature=temperature)
  views_of = lambda rows: loss(rows.reshape(batch, 2, -1)[:, 0], rows.reshape(batch, 2, -1)[:, 1])
  assert_same(ours(lambda z: losses.ucl(z, temperature=temperature), x), theirs(views_of, x))


def pml_pair_losses(rows, labels, temperature):
  """PML's NTXentLoss per positive pair: (losses, anchor index) with no reduction."""
  loss = pml_losses.NTXentLoss(temperature=temperature, reducer=pml_reducers.DoNothingReducer())
  out = loss(rows, labels)['loss']
  if out['indices'] is None:  # no positive pair with a negative: PML's zero loss
    return None, None
  return out['losses'], out['indices'][0]


@pytest.mark.parametrize('pattern', ['mixed', 'same', 'distinct'])
@pytest.mark.parametrize('batch,views,temperature', SHAPES[:3])
@pytest.mark.covering  # tests/covering.py
def test_scl_is_pml_ntxent_with_class_labels_after_the_pair_conversion(
  batch, views, temperature, pattern
):
  """PML's per-pair NT-Xent with class labels is log(1 + |N(i)|·x), ours log(1 + M·x):
  ℓ = log1p((M/|N(i)|)·expm1(ℓ_PML)), then the flat mean over the pairs."""
  x = embeddings(batch, views, seed=batch + 3)
  labels = class_labels(batch, pattern, seed=batch)
  n, M = batch * views, batch * views - 2
  row_labels = np.repeat(labels, views)
  negatives = (row_labels[:, None] != row_labels[None, :]).sum(1)

  def converted(rows, row_labels_t):
    pair_losses, anchors = pml_pair_losses(rows, row_labels_t, temperature)
    if pair_losses is None:
      return rows.sum() * 0.0  # no positive pair, or no negative: both losses are 0
    ratio = torch.tensor(M / np.maximum(negatives, 1), dtype=rows.dtype)[anchors]
    return torch.log1p(ratio * torch.expm1(pair_losses)).mean()

  expected = theirs(converted, x, torch.tensor(row_labels))
  got = ours(lambda z: losses.scl(z, jnp.asarray(labels), temperature=temperature, M=M), x)
  assert n == len(row_labels)
  assert_same(got, expected)


@pytest.mark.parametrize('batch,views,temperature', [s for s in SHAPES if s[1] == 2])
def test_scl_with_distinct_labels_is_pml_supcon(batch, views, temperature):
  """With every label distinct (two views: one positive per anchor), SupCon's per-anchor
  mean and its positive in the denominator agree with SCL; with shared labels they do
  not (SupCon keeps the other positives in the denominator)."""
  x = embeddings(batch, views, seed=batch + 4)
  row_labels = torch.tensor(np.repeat(np.arange(batch), views))
  supcon = pml_losses.SupConLoss(temperature=temperature)
  distinct = ours(lambda z: losses.scl(z, jnp.arange(batch), temperature=temperature), x)
  assert_same(distinct, theirs(supcon, x, row_labels))
  shared = np.repeat(np.arange(batch) % 2, views)
  got = ours(lambda z: losses.scl(z, jnp.arange(batch) % 2, temperature=temperature), x)
  assert not np.isclose(got[0], theirs(supcon, x, torch.tensor(shared))[0], rtol=2e-5, atol=1e-6)
