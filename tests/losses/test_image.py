"""losses/image: the gradients with respect to the options (β, a user's hardening's arrays)
with the hardening weights detached or not, against the central difference of eq. (3)'s
float64 reference (tests/test_losses.py). Detaching changes the gradient with respect to
the features only: the value as a function of the options is the same."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_losses import reference_loss

from hscl_jax import losses

STEP = 1e-5
TEMPERATURE = 0.5


def _batch(seed=3):
  rng = np.random.default_rng(seed)
  z = rng.normal(size=(6, 2, 5))
  return z / np.linalg.norm(z, axis=-1, keepdims=True), np.array([0, 1, 2, 0, 1, 2])


def _central_difference(f, x):
  return (f(x + STEP) - f(x - STEP)) / (2 * STEP)


@pytest.mark.parametrize('block_size', [0, 4])
@pytest.mark.parametrize('detach', [False, True])
def test_the_beta_gradient_of_hscl_is_the_references(detach, block_size):
  z, labels = _batch()
  features = jnp.asarray(z, jnp.float32)
  got = jax.grad(
    lambda beta: losses.hscl(
      features,
      labels,
      hardening=losses.exponential(beta),
      temperature=TEMPERATURE,
      stop_gradient_weights=detach,
      block_size=block_size,
    )
  )(1.5)
  reference = lambda beta: reference_loss(
    z, labels, method='label', eta=lambda g: np.exp(beta * g), temperature=TEMPERATURE
  )
  assert float(got) == pytest.approx(_central_difference(reference, 1.5), rel=1e-4)


@pytest.mark.parametrize('detach', [False, True])
def test_the_beta_gradient_of_debiased_hucl_is_the_references(detach):
  z, _ = _batch(4)
  features = jnp.asarray(z, jnp.float32)
  got = jax.grad(
    lambda beta: losses.hucl(
      features, beta=beta, tau_plus=0.1, temperature=TEMPERATURE, stop_gradient_weights=detach
    )
  )(1.5)
  reference = lambda beta: reference_loss(
    z,
    method='sample',
    eta=lambda g: np.exp(beta * g),
    temperature=TEMPERATURE,
    hcl=True,
    tau_plus=0.1,
  )
  assert float(got) == pytest.approx(_central_difference(reference, 1.5), rel=1e-4)


@pytest.mark.parametrize('detach', [False, True])
def test_the_gradient_of_a_hardenings_arrays_is_the_references(detach):
  """A user's hardening log η = a·g + c·g² closing over the arrays (a, c)."""
  z, labels = _batch(5)
  features = jnp.asarray(z, jnp.float32)

  def loss(params):
    a, c = params
    return losses.hscl(
      features,
      labels,
      hardening=lambda g: a * g + c * g**2,
      temperature=TEMPERATURE,
      stop_gradient_weights=detach,
    )

  got = jax.grad(loss)(jnp.array([0.8, -0.3], jnp.float32))
  reference = lambda a, c: reference_loss(
    z, labels, method='label', eta=lambda g: np.exp(a * g + c * g**2), temperature=TEMPERATURE
  )
  expected = [
    _central_difference(lambda a: reference(a, -0.3), 0.8),
    _central_difference(lambda c: reference(0.8, c), -0.3),
  ]
  np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-4)


@pytest.mark.parametrize('block_size', [0, 4])
def test_queued_keys_of_class_0_are_negatives_of_the_other_classes_only(block_size):
  """Class 0 is a label like any other, never "unlabelled" (-1): its queued keys are
  negatives of the class-1 and class-2 anchors and not of the class-0 ones."""
  z, labels = _batch(6)
  rng = np.random.default_rng(7)
  queue = rng.normal(size=(5, 5))
  queue /= np.linalg.norm(queue, axis=-1, keepdims=True)
  queue_labels, filled = np.array([0, 0, 1, 2, -1]), np.array([True, True, True, True, False])
  got = losses.hscl(
    jnp.asarray(z, jnp.float32),
    labels,
    hardening=losses.exponential(1.0),
    temperature=TEMPERATURE,
    queue=jnp.asarray(queue, jnp.float32),
    queue_labels=jnp.asarray(queue_labels, jnp.int32),
    queue_filled=jnp.asarray(filled),
    block_size=block_size,
  )
  expected = reference_loss(
    z,
    labels,
    method='label',
    eta=np.exp,
    temperature=TEMPERATURE,
    queue=queue,
    queue_labels=queue_labels,
    queue_filled=filled,
  )
  assert float(got) == pytest.approx(expected, rel=1e-5)
