"""losses/diagnostics: the α's of Proposition 2 and Lemma 1, Assumption 1 per anchor, and
the batch diagnostics, against float64 sums written from the definitions, the public
losses, and across devices."""

from __future__ import annotations

from absl.testing import parameterized
from acceptance import accepted
import chex
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P
import numpy as np

from hscl_jax import losses
from losses.test_kernel import _mesh
from losses.test_kernel import normalized
from losses.test_kernel import random_batch


class DiagnosticsTest(parameterized.TestCase):
  def test_proposition_2(self):
    """α_HUCL = α_HSCL + α_Hcol per anchor, for any hardening."""
    features, labels = random_batch(7, batch=10)
    for hardening in (losses.exponential(1.3), losses.threshold(np.exp(-0.3))):
      alphas = losses.log_alphas(features, labels, hardening=hardening)
      np.testing.assert_allclose(
        jnp.logaddexp(alphas['hscl'], alphas['hcol']), alphas['hucl'], rtol=1e-5
      )

  def test_alphas_match_reference(self):
    features, labels = random_batch(8)
    z = np.asarray(features, np.float64).reshape(12, -1)
    g = z @ z.T / 0.5
    sample, label = np.arange(12) // 2, np.asarray(labels)[np.arange(12) // 2]
    alphas = losses.log_alphas(features, labels, hardening=losses.exponential(1.0))
    for i in range(12):
      others = sample != sample[i]
      hscl = (np.exp(g[i]) * (others & (label != label[i]))).sum() / others.sum()
      np.testing.assert_allclose(np.exp(alphas['hscl'][i]), hscl, rtol=1e-5)

  @parameterized.parameters(0, 1, 2, 3)
  def test_lemma_1(self, seed):
    """Where Assumption 1 holds for every anchor, L_HSCL <= L_HUCL with the same positives."""
    key_centres, key_noise, key_labels = jax.random.split(jax.random.key(seed), 3)
    labels = jax.random.randint(key_labels, (16,), 0, 4)
    centres = jax.random.normal(key_centres, (4, 1, 16)) * 3.0
    features = normalized(centres[labels] + jax.random.normal(key_noise, (16, 2, 16)))
    for hardening in (losses.exponential(1.0), losses.threshold(np.exp(-0.5))):
      diag = losses.batch_diagnostics(features, labels, hardening=hardening)
      satisfied = losses.assumption1(features, labels, hardening=hardening)
      self.assertEqual(float(diag['assumption1_fraction']), 1.0)
      self.assertTrue(bool(satisfied.all()))
      self.assertLessEqual(float(diag['loss_hscl']), float(diag['loss_hucl']) + 1e-6)

  def test_lemma_1_per_anchor_whenever_assumption_holds(self):
    """On random (unclustered) features: every anchor satisfying Assumption 1 has
    E_HSCL <= E_HUCL, checked through single-anchor losses."""
    features, labels = random_batch(9, batch=12, num_classes=3)
    hardening = losses.exponential(1.0)
    satisfied = np.asarray(losses.assumption1(features, labels, hardening=hardening))
    self.assertTrue(0 < satisfied.mean() < 1)  # the test must see both cases
    z = np.asarray(features, np.float64).reshape(24, -1)
    g = z @ z.T / 0.5
    sample, label = np.arange(24) // 2, np.asarray(labels)[np.arange(24) // 2]
    for i in np.flatnonzero(satisfied):
      ucl_neg = sample != sample[i]
      hscl_neg = label != label[i]
      w = np.exp(g[i])
      e_hucl = (w * np.exp(g[i]) * ucl_neg).sum() / (w * ucl_neg).sum()
      e_hscl = (w * np.exp(g[i]) * hscl_neg).sum() / (w * hscl_neg).sum()
      self.assertGreaterEqual(e_hucl, e_hscl * (1 - 1e-9))

  def test_diagnostics_match_public_losses(self):
    """With their defaults (the temperature's is the paper's 0.5 in both)."""
    features, labels = random_batch(10)
    hardening = losses.exponential(1.0)
    with accepted('batch_diagnostics with its default temperature'):
      diag = losses.batch_diagnostics(features, labels, hardening=hardening)
    np.testing.assert_allclose(diag['loss_ucl'], losses.ucl(features), rtol=1e-6)
    np.testing.assert_allclose(diag['loss_hucl'], losses.hucl(features, beta=1.0), rtol=1e-6)
    by_label = losses.batch_diagnostics(features, labels, hardening=hardening, positives='label')
    np.testing.assert_allclose(by_label['loss_scl'], losses.scl(features, labels), rtol=1e-6)
    np.testing.assert_allclose(
      by_label['loss_hscl'], losses.hscl(features, labels, hardening=hardening), rtol=1e-6
    )


class DiagnosticsAcrossDevicesTest(parameterized.TestCase):
  def setUp(self):
    super().setUp()
    if jax.device_count() < 4:
      self.skipTest('needs 4 devices (tests/conftest.py sets them)')
    self.x = jax.random.normal(jax.random.key(31), (8, 2, 8))
    self.labels = jax.random.randint(jax.random.key(32), (8,), 0, 3)

  def test_diagnostics_across_devices(self):
    features = normalized(self.x)
    hardening = losses.exponential(1.0)
    sharded = jax.jit(
      jax.shard_map(
        lambda f, y: losses.batch_diagnostics(f, y, hardening=hardening, axis_name='data'),
        mesh=_mesh(),
        in_specs=(P('data'), P('data')),
        out_specs=P(),
      )
    )
    got = sharded(features, self.labels)
    expected = losses.batch_diagnostics(features, self.labels, hardening=hardening)
    chex.assert_trees_all_close(got, expected, rtol=1e-5)
