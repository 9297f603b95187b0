"""Property-based tests of the loss kernels, and each option on every loss that takes it.

Hypothesis draws the batch (n, views, d), the labels (all equal, all distinct or random),
γ, β, τ⁺ and the block size; every example is checked against the float64 reference of
tests/losses/test_kernel.py: finite, equal to it, and invariant to the order of the samples.
Derandomised (the same examples on every run) and small, so CI stays deterministic.
"""

from __future__ import annotations

from hypothesis import HealthCheck
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hscl_jax import losses
from losses.test_kernel import reference_hucl
from losses.test_kernel import reference_loss

PROPERTY_SETTINGS = settings(
  max_examples=4,
  deadline=None,
  derandomize=True,
  database=None,
  suppress_health_check=[HealthCheck.too_slow],  # a loaded CI machine
)


@st.composite
def batches(draw):
  """(features [b, v, d] unit-norm float32, labels [b] int32) with varied label patterns."""
  batch = draw(st.integers(2, 6))
  views = draw(st.integers(2, 3))
  dim = draw(st.integers(2, 6))
  seed = draw(st.integers(0, 2**16))
  pattern = draw(st.sampled_from(['equal', 'distinct', 'random']))
  rng = np.random.default_rng(seed)
  z = rng.normal(size=(batch, views, dim))
  features = (z / np.linalg.norm(z, axis=-1, keepdims=True)).astype(np.float32)
  if pattern == 'equal':
    labels = np.zeros(batch, np.int32)
  elif pattern == 'distinct':
    labels = rng.permutation(batch).astype(np.int32)
  else:
    labels = rng.integers(0, 3, size=batch).astype(np.int32)
  return features, labels


temperatures = st.sampled_from([0.1, 0.3, 0.5, 1.0, 2.0])
betas = st.sampled_from([0.0, 0.5, 1.0, 3.0])
block_sizes = st.sampled_from([0, 1, 3, 4, 7])


def _reference(name, features, labels, temperature, beta, tau_plus):
  if name == 'ucl':
    return reference_loss(features, method='sample', temperature=temperature)
  if name == 'hucl':
    return reference_hucl(features, beta=beta, tau_plus=tau_plus, temperature=temperature)
  if name == 'scl':
    return reference_loss(features, labels, method='label', temperature=temperature)
  return reference_loss(
    features, labels, method='label', temperature=temperature, eta=lambda g: np.exp(beta * g)
  )


def _loss(name, features, labels, temperature, beta, tau_plus, block_size):
  common = dict(temperature=temperature, block_size=block_size)
  if name == 'ucl':
    return losses.ucl(features, **common)
  if name == 'hucl':
    return losses.hucl(features, beta=beta, tau_plus=tau_plus, **common)
  if name == 'scl':
    return losses.scl(features, labels, **common)
  return losses.hscl(features, labels, hardening=losses.exponential(beta), **common)


@pytest.mark.parametrize('name', ['ucl', 'hucl', 'scl', 'hscl'])
@PROPERTY_SETTINGS
@given(
  batch=batches(),
  temperature=temperatures,
  beta=betas,
  tau_plus=st.sampled_from([0.0, 0.1]),
  block_size=block_sizes,
)
def test_property_matches_float64_reference_and_is_order_invariant(
  name, batch, temperature, beta, tau_plus, block_size
):
  features, labels = batch
  args = (temperature, beta, tau_plus)
  got = _loss(name, features, labels, *args, block_size)
  assert np.isfinite(got)
  expected = _reference(name, features, labels, *args)
  np.testing.assert_allclose(got, expected, rtol=5e-5, atol=1e-6)
  order = np.random.default_rng(len(labels)).permutation(len(labels))[::-1]
  permuted = _loss(name, features[order], labels[order], *args, block_size)
  np.testing.assert_allclose(permuted, got, rtol=2e-5, atol=1e-6)


# --------------------------------------------------------------------------------------
# stop_gradient_weights, on every loss that takes it.


def _two_class_batch(seed=3):
  rng = np.random.default_rng(seed)
  z = rng.normal(size=(6, 2, 5))
  features = jnp.asarray(z / np.linalg.norm(z, axis=-1, keepdims=True), jnp.float32)
  return features, jnp.array([0, 1, 2, 0, 1, 2])


STOP_GRADIENT_LOSSES = {
  'hucl': lambda f, y, detach: losses.hucl(f, beta=2.0, stop_gradient_weights=detach),
  'hucl_debiased': lambda f, y, detach: losses.hucl(
    f, beta=2.0, tau_plus=0.1, stop_gradient_weights=detach
  ),
  'hscl': lambda f, y, detach: losses.hscl(
    f, y, hardening=losses.exponential(2.0), stop_gradient_weights=detach
  ),
}


@pytest.mark.parametrize('name', sorted(STOP_GRADIENT_LOSSES))
@pytest.mark.parametrize('block_size', [0, 4])
def test_stop_gradient_weights_same_value_other_gradient_on_every_loss(name, block_size):
  fn = STOP_GRADIENT_LOSSES[name]
  features, labels = _two_class_batch()
  value = {d: fn(features, labels, d) for d in (False, True)}
  np.testing.assert_allclose(value[True], value[False], rtol=1e-6)
  grads = {d: jax.grad(lambda f, d=d: fn(f, labels, d))(features) for d in (False, True)}
  assert float(jnp.abs(grads[True] - grads[False]).max()) > 1e-4


def test_stop_gradient_weights_is_a_hardening_with_detached_input():
  """H-SCL(β) detached = the hardening g -> β·stop_gradient(g), built by the caller: the
  weights enter the value but not the gradient (dense and blockwise)."""
  features, labels = _two_class_batch(4)
  detached_hardening = lambda g: 2.0 * jax.lax.stop_gradient(g)
  for block_size in (0, 4):
    got = jax.value_and_grad(
      lambda f: losses.hscl(
        f,
        labels,
        hardening=losses.exponential(2.0),
        stop_gradient_weights=True,
        block_size=block_size,
      )
    )(features)
    expected = jax.value_and_grad(
      lambda f: losses.hscl(f, labels, hardening=detached_hardening, block_size=block_size)
    )(features)
    np.testing.assert_allclose(got[0], expected[0], rtol=1e-6)
    np.testing.assert_allclose(got[1], expected[1], atol=1e-6)


# --------------------------------------------------------------------------------------
# H-SCL(τ): a negative exactly at the threshold is kept (η = 1(e^g >= τ)).


def test_threshold_keeps_a_negative_exactly_at_tau():
  """Anchors of class 0 (views e1) have one negative class at g = 0 exactly (e2, orthogonal)
  and one at g = -2 (views -e1). With τ = 1 (log τ = 0 exactly) the e2 negatives sit on
  the threshold: kept by >=, and they are then the only ones, so log E_i = 0 for the
  class-0 anchors; a strict > would leave them without negatives (loss 0)."""
  e1, e2 = np.eye(3, dtype=np.float32)[:2]
  features = jnp.asarray(np.stack([[e1, e1], [e2, e2], [-e1, -e1]]))
  labels = jnp.array([0, 1, 1])
  got = losses.hscl(features, labels, hardening=losses.threshold(1.0), temperature=0.5)
  expected = reference_loss(
    features, labels, method='label', temperature=0.5, eta=lambda g: (g >= 0.0) * 1.0
  )
  np.testing.assert_allclose(got, expected, rtol=1e-6)
  # The class-0 anchors' pairs: log(1 + M e^{-g_ip} · e^0) with g_ip = 2, M = 4.
  assert float(got) > 0.25 * np.log1p(4 * np.exp(-2.0))
  # Just above τ the e2 negatives drop out too (a check that the threshold binds here).
  above = losses.hscl(features, labels, hardening=losses.threshold(1.01), temperature=0.5)
  assert float(above) < float(got)
