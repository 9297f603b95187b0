"""training/step: one step of the tiny config on 4 devices against the same step computed
directly (the views by `augment_batch`, the model on the whole batch on one device, the
loss of `losses`, SGD by hand) and against eq. (3)'s float64 reference; no training loop."""

from __future__ import annotations

import pathlib
import sys

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P
from losses.test_kernel import reference_loss
import numpy as np
import optax
import pytest

from hscl_jax import losses
from hscl_jax import models
from hscl_jax import optimizers
from hscl_jax import parallel
from hscl_jax.data import augment
from hscl_jax.training import plan as plan_lib
from hscl_jax.training import state as state_lib
from hscl_jax.training import step as step_lib

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # `from configs import ...`, as from the repo root

from configs import digits  # noqa: E402

LEARNING_RATE = 0.5
BATCH = 16


def _batch(seed=0):
  """16 random images of 4 classes, class 0 among them."""
  rng = np.random.default_rng(seed)
  return {
    'image': rng.integers(0, 256, (BATCH, 2, 8, 8, 3), dtype=np.uint8),
    'label': np.arange(BATCH, dtype=np.int32) % 4,
  }


@pytest.fixture(scope='module')
def setup(tiny_config):
  """(config, model, augmentations, the state before a step, the step on 4 devices):
  plain SGD (no momentum, no decay) at a constant rate, so that an update is -lr·grad;
  SiLU, so that two programs' gradients agree to rounding (docs/testing.md)."""
  config = tiny_config()
  config.diagnostics = False
  config.model.activation = 'silu'
  config.optimizer.name, config.optimizer.momentum = 'sgd', 0.0
  config.optimizer.weight_decay = 0.0
  mesh = parallel.make_mesh(jax.devices()[:4])
  model = models.create_model(config.model, bn_axis_name=parallel.AXIS)
  optimizer = optimizers.create_optimizer(config.optimizer, optax.constant_schedule(LEARNING_RATE))
  params = augment.AugmentParams.from_config(config.augment)
  state = state_lib.create_train_state(config, model, optimizer, params.image_size, mesh)
  step = step_lib.make_train_step(config, model, optimizer, params, mesh)
  # On the host, in checkpoint form: the step donates the state it is given.
  before = state_lib.state_from_checkpoint(jax.device_get(state_lib.state_to_checkpoint(state)))
  return config, params, before, step, mesh


def _on_mesh(host_state, mesh):
  """A fresh copy of `host_state` for the step to take, replicated over `mesh`."""
  tree = jax.device_get(state_lib.state_to_checkpoint(host_state))
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  return state_lib.state_from_checkpoint(jax.device_put(tree, replicated))


@pytest.fixture(scope='module')
def direct(setup):
  """direct(state, batch, beta) -> (loss, its gradient, the updated BatchNorm statistics,
  the projections): the step written directly on one device, the model on the whole batch
  (BatchNorm over all of it, as synced over devices); compiled once, β an argument."""
  config, augment_params, *_ = setup
  model = models.create_model(config.model)

  def loss_of(params, batch_stats, rng, step, images, labels, beta):
    views = step_lib.augment_batch(rng, step, images, jnp.arange(BATCH), augment_params)
    x = views.reshape((-1,) + views.shape[2:])
    (_, projections), updates = model.apply(
      {'params': params, 'batch_stats': batch_stats}, x, train=True, mutable=['batch_stats']
    )
    z = losses.l2_normalize(projections).reshape(BATCH, 2, -1)
    loss = losses.hscl(
      z, labels, hardening=losses.exponential(beta), temperature=config.temperature
    )
    return loss, (updates['batch_stats'], z)

  loss_and_grad = jax.jit(jax.value_and_grad(loss_of, has_aux=True))

  def run(state, batch, beta):
    args = (state.params, state.batch_stats, state.rng, state.step, batch['image'], batch['label'])
    (loss, (batch_stats, z)), grads = loss_and_grad(*args, np.float32(beta))
    return float(loss), jax.device_get(grads), jax.device_get(batch_stats), np.asarray(z)

  return run


def _global_norm(tree):
  return np.sqrt(sum(np.sum(np.asarray(x, np.float64) ** 2) for x in jax.tree.leaves(tree)))


def _assert_close(a, b, **tolerance):
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), **tolerance)


def test_a_step_is_the_loss_its_gradient_and_the_update_of_the_whole_batch(setup, direct):
  config, _, before, step, mesh = setup
  batch = _batch()
  hyper = plan_lib.loss_hyperparameters(config, 1)
  after, scalars = step(
    _on_mesh(before, mesh), parallel.global_batch(batch, mesh, ('image', 'label')), hyper
  )
  after, scalars = jax.device_get((after, scalars))
  loss, grads, batch_stats, z = direct(before, batch, config.beta)

  assert set(scalars) == set(step_lib.STEP_SCALARS)
  assert float(scalars['train_loss']) == pytest.approx(loss, rel=1e-5)
  reference = reference_loss(
    z,
    batch['label'],
    method='label',
    eta=lambda g: np.exp(config.beta * g),
    temperature=config.temperature,
  )
  assert float(scalars['train_loss']) == pytest.approx(reference, rel=1e-5)
  assert float(scalars['grad_norm']) == pytest.approx(_global_norm(grads), rel=1e-4)
  expected = jax.tree.map(lambda p, g: p - LEARNING_RATE * g, before.params, grads)
  _assert_close(after.params, expected, rtol=1e-4, atol=1e-6)
  _assert_close(after.batch_stats, batch_stats, rtol=1e-5, atol=1e-6)
  assert int(after.step) == 1
  np.testing.assert_array_equal(jax.random.key_data(after.rng), jax.random.key_data(before.rng))
  assert {k: float(v) for k, v in after.metric_sums.items()} == {
    k: float(v) for k, v in scalars.items()
  }


def test_the_epoch_sums_add_each_steps_scalars(setup):
  config, _, before, step, mesh = setup
  hyper = plan_lib.loss_hyperparameters(config, 1)
  state, sums = _on_mesh(before, mesh), {name: 0.0 for name in step_lib.STEP_SCALARS}
  for seed in (1, 2):
    state, scalars = step(
      state, parallel.global_batch(_batch(seed), mesh, ('image', 'label')), hyper
    )
    sums = {k: sums[k] + float(scalars[k]) for k in sums}
  assert int(state.step) == 2
  for name, total in sums.items():
    assert float(state.metric_sums[name]) == pytest.approx(total, rel=1e-6)


def test_the_loss_hyperparameters_change_the_loss_without_compiling_again(setup, direct):
  """β enters as an array: another β is another loss, from the same program."""
  config, _, before, step, mesh = setup
  batch = _batch()
  losses_at, compiled = {}, []
  for beta in (0.0, 2.0):
    hyper = {**plan_lib.loss_hyperparameters(config, 1), 'beta': np.float32(beta)}
    _, scalars = step(
      _on_mesh(before, mesh), parallel.global_batch(batch, mesh, ('image', 'label')), hyper
    )
    losses_at[beta] = float(scalars['train_loss'])
    compiled.append(step._cache_size())
  assert compiled[0] == compiled[1]
  assert losses_at[0.0] == pytest.approx(direct(before, batch, 0.0)[0], rel=1e-5)
  assert losses_at[2.0] == pytest.approx(direct(before, batch, 2.0)[0], rel=1e-5)
  assert losses_at[0.0] != pytest.approx(losses_at[2.0], rel=1e-3)


def test_an_examples_views_depend_on_the_key_step_and_its_global_index_only(setup):
  _, augment_params, before, *_ = setup
  images = jnp.asarray(_batch()['image'])
  index = jnp.arange(BATCH)
  augment = jax.jit(lambda rng, s, x, i: step_lib.augment_batch(rng, s, x, i, augment_params))
  views = np.asarray(augment(before.rng, 0, images, index))
  # The batch in another order (as split over other devices) with its global indices:
  # the same views, in that order.
  order = np.random.default_rng(0).permutation(BATCH)
  np.testing.assert_array_equal(
    np.asarray(augment(before.rng, 0, images[order], index[order])), views[order]
  )
  # Another step, or another index for the same image: other views.
  assert not np.array_equal(np.asarray(augment(before.rng, 1, images, index)), views)
  shifted = np.asarray(augment(before.rng, 0, images, index + BATCH))
  assert not np.array_equal(shifted, views)
  assert views.shape == (BATCH, 2, 8, 8, 3) and not np.array_equal(views[:, 0], views[:, 1])


def _features(seed=0, batch=8, views=2, dim=6):
  z = np.random.default_rng(seed).normal(size=(batch, views, dim))
  return jnp.asarray(z / np.linalg.norm(z, axis=-1, keepdims=True), jnp.float32)


def _program_loss(config, z, labels, hyper):
  """The training step's loss function, on one device (its axis is the mesh's)."""
  loss_fn, _ = step_lib.make_loss_fn(config)
  mesh = parallel.make_mesh(jax.devices()[:1])
  shard = jax.shard_map(
    lambda z, y: loss_fn(z, y, hyper), mesh=mesh, in_specs=(P(parallel.AXIS),) * 2, out_specs=P()
  )
  return jax.jit(jax.value_and_grad(shard))(z, labels)


@pytest.mark.parametrize(
  'method,hardening',
  [('ucl', 'exp'), ('hucl', 'exp'), ('scl', 'exp'), ('hscl', 'exp'), ('hscl', 'threshold')],
)
def test_wiring_loss_is_the_configured_loss_with_every_option(method, hardening):
  """Non-default γ, M, τ⁺, stop_gradient_weights and β/τ reach the loss."""
  config = digits.get_config()
  config.method, config.hardening = method, hardening
  config.temperature, config.M, config.tau_plus = 0.3, 9, 0.1
  config.stop_gradient_weights = True
  hyper = {'beta': np.float32(1.5), 'tau': np.float32(np.exp(-0.4))}
  z, labels = _features(), jnp.array([0, 1, 2, 0, 1, 2, 0, 1])
  common = dict(temperature=0.3, M=9)
  direct = {
    'ucl': lambda f: losses.ucl(f, **common),
    'hucl': lambda f: losses.hucl(f, beta=1.5, tau_plus=0.1, stop_gradient_weights=True, **common),
    'scl': lambda f: losses.scl(f, labels, **common),
    'hscl': lambda f: losses.hscl(
      f,
      labels,
      hardening=losses.exponential(1.5) if hardening == 'exp' else losses.threshold(np.exp(-0.4)),
      stop_gradient_weights=True,
      **common,
    ),
  }[method]
  value, grad = _program_loss(config, z, labels, hyper)
  expected_value, expected_grad = jax.jit(jax.value_and_grad(direct))(z)
  np.testing.assert_allclose(value, expected_value, rtol=1e-6)
  np.testing.assert_allclose(grad, expected_grad, rtol=1e-5, atol=1e-7)
