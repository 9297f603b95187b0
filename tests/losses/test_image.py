"""losses/image: eq. (4)'s τ schedule and the β annealing (1-based epochs, host and device
paths), and the gradients with respect to the options (β, a user's hardening's arrays) with
the hardening weights detached or not, against the central difference of eq. (3)'s float64
reference (tests/losses/test_kernel.py). Detaching changes the gradient with respect to the
features only: the value as a function of the options is the same."""

from __future__ import annotations

import functools
import re

from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hscl_jax import losses
from losses.test_kernel import reference_loss

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


class ScheduleTest(parameterized.TestCase):
  def test_tau_schedule_eq_4(self):
    taus = [
      float(losses.tau_schedule(e, start=-0.5, end=0.1, num_epochs=200, temperature=0.5))
      for e in (1, 100, 200)
    ]
    np.testing.assert_allclose(
      taus, np.exp(np.array([-0.5, -0.5 + 99 / 199 * 0.6, 0.1]) / 0.5), rtol=1e-6
    )
    np.testing.assert_allclose(
      losses.tau_schedule(1, start=-0.3, end=0.0, num_epochs=1), np.exp(-0.6), rtol=1e-6
    )

  def test_host_epochs_give_numpy_without_device_work(self):
    """The training loop's path: a Python epoch gives a NumPy float32 computed on the host
    (under the transfer guard), equal to the JAX path's value within float32 rounding."""
    for epoch in (1, 2, 5):
      with jax.transfer_guard('disallow'):
        tau = losses.tau_schedule(epoch, start=-0.5, end=0.1, num_epochs=5, temperature=0.1)
        beta = losses.beta_schedule(epoch, beta=2.0, num_epochs=5, num_steps=2)
      self.assertIsInstance(tau, np.float32)
      self.assertIsInstance(beta, np.float32)
      # The precision claimed: float64 arithmetic, rounded once to float32 (bit for bit).
      level = -0.5 + (epoch - 1) / 4 * (0.1 - -0.5)
      self.assertEqual(tau, np.float32(np.exp(np.float64(level) / 0.1)))
      self.assertEqual(beta, np.float32(2.0 * (1.0 - np.floor(epoch * 2 / 5) / 2)))
      on_device = jnp.int32(epoch)
      self.assertIsInstance(
        losses.tau_schedule(on_device, start=-0.5, end=0.1, num_epochs=5), jax.Array
      )
      np.testing.assert_allclose(
        tau,
        losses.tau_schedule(on_device, start=-0.5, end=0.1, num_epochs=5, temperature=0.1),
        rtol=1e-6,
      )
      np.testing.assert_allclose(
        beta, losses.beta_schedule(on_device, beta=2.0, num_epochs=5, num_steps=2), rtol=1e-6
      )

  def test_schedules_take_1_based_epochs_up_to_num_epochs(self):
    """Epoch 1 is start's level and epoch num_epochs end's (eq. (4)); a concrete epoch
    outside [1, num_epochs] (Python, NumPy or a non-traced JAX number) is refused in one
    line, a traced one is not checked (jit computes the formula); num_epochs is an int
    >= 1. The issue's example: τ at epoch 10 of 200 lies between e^{start/γ} and
    e^{end/γ}, not between start and end."""
    tau = functools.partial(losses.tau_schedule, start=-0.5, end=0.1, num_epochs=200)
    beta = functools.partial(losses.beta_schedule, beta=2.0, num_epochs=200, num_steps=4)
    np.testing.assert_allclose(
      [tau(1), tau(10), tau(200)], np.exp(np.array([-0.5, -0.5 + 9 / 199 * 0.6, 0.1]) / 0.5)
    )
    self.assertAlmostEqual(float(tau(10)), 0.388, places=3)
    range_message = re.escape(
      'epoch must be 1-based, in [1, num_epochs = 200] (epoch 1 is the first), got'
    )
    for bad in (0, 201, np.int64(0), jnp.int32(201), -1.5):
      for schedule in (tau, beta):
        with self.assertRaisesRegex(ValueError, f'^{range_message} {bad}.$'):
          schedule(bad)
    traced = jax.jit(lambda e: tau(e))(jnp.int32(0))
    np.testing.assert_allclose(traced, np.exp((-0.5 - 0.6 / 199) / 0.5), rtol=1e-6)
    for schedule in (losses.tau_schedule, losses.beta_schedule):
      kwargs = (
        dict(start=0.0, end=0.1) if schedule is losses.tau_schedule else dict(beta=1.0, num_steps=2)
      )
      with self.assertRaisesRegex(
        ValueError, "^num_epochs must be >= 1 \\(the run's epochs\\), got 0.$"
      ):
        schedule(1, num_epochs=0, **kwargs)
      for bad in (2.5, True):
        with self.assertRaisesRegex(TypeError, f'^num_epochs must be an int .*got {bad}.$'):
          schedule(1, num_epochs=bad, **kwargs)

  def test_beta_annealing(self):
    betas = [
      float(losses.beta_schedule(e, beta=2.0, num_epochs=8, num_steps=4)) for e in range(1, 9)
    ]
    # switch from β_i to β_{i+1} at epoch i·e/ℓ = 2, 4, 6, 8
    np.testing.assert_allclose(betas, [2.0, 1.5, 1.5, 1.0, 1.0, 0.5, 0.5, 0.0], atol=1e-6)
