"""Optimizers: the paper's Adam (coupled L2) against an independent NumPy reference."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from hscl_jax import optimizers


def torch_adam_reference(
  params, grads, *, lr, weight_decay, b1=0.9, b2=0.999, eps=1e-8, decay_mask=None
):
  """torch.optim.Adam(weight_decay=...) in float64: L2 added to the gradient, then Adam."""
  params = {k: np.asarray(v, np.float64) for k, v in params.items()}
  m = {k: np.zeros_like(v) for k, v in params.items()}
  v = {k: np.zeros_like(p) for k, p in params.items()}
  for t, step_grads in enumerate(grads, start=1):
    for k in params:
      g = np.asarray(step_grads[k], np.float64)
      if decay_mask is None or decay_mask[k]:
        g = g + weight_decay * params[k]
      m[k] = b1 * m[k] + (1 - b1) * g
      v[k] = b2 * v[k] + (1 - b2) * g * g
      m_hat, v_hat = m[k] / (1 - b1**t), v[k] / (1 - b2**t)
      params[k] = params[k] - lr * m_hat / (np.sqrt(v_hat) + eps)
  return params


def _run(optimizer, params, grads):
  state = optimizer.init(params)
  for g in grads:
    updates, state = optimizer.update(g, state, params)
    params = jax.tree.map(jnp.add, params, updates)
  return params


def _problem():
  rng = np.random.default_rng(0)
  params = {
    'kernel': jnp.asarray(rng.normal(size=(3, 4)), jnp.float32),
    'bias': jnp.asarray(rng.normal(size=(4,)), jnp.float32),
  }
  grads = [
    {k: jnp.asarray(rng.normal(size=p.shape), jnp.float32) for k, p in params.items()}
    for _ in range(3)
  ]
  return params, grads


def test_adam_coupled_l2_is_torch_adam_with_weight_decay():
  """The one Adam of training (config.optimizer.name='adam') and of the linear classifier."""
  params, grads = _problem()
  got = _run(optimizers.adam_coupled_l2(1e-2, weight_decay=0.1), params, grads)
  want = torch_adam_reference(params, grads, lr=1e-2, weight_decay=0.1)
  for k in params:
    np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6)
  decoupled = _run(optimizers.create_optimizer(_config('adamw', False), 1e-2), params, grads)
  assert not np.allclose(decoupled['kernel'], got['kernel'], rtol=1e-5)  # AdamW differs


def _fresh(text: str) -> str:
  """`text` as a new string object, as read from config.json or a flag (literals are
  interned: `name is 'sgd'` would hold for them and fail for a user's config)."""
  return ''.join(list(text))


def _config(name, exclude_rank1):
  return ml_collections.ConfigDict(
    dict(
      name=_fresh(name),
      weight_decay=0.1,
      b1=0.9,
      b2=0.999,
      eps=1e-8,
      momentum=0.9,
      nesterov=False,
      trust_coefficient=0.001,
      exclude_rank1_from_decay=exclude_rank1,
    )
  )


@pytest.mark.parametrize('exclude_rank1', [False, True])
def test_create_optimizer_adam_and_the_rank1_mask(exclude_rank1):
  params, grads = _problem()
  got = _run(optimizers.create_optimizer(_config('adam', exclude_rank1), 1e-2), params, grads)
  want = torch_adam_reference(
    params, grads, lr=1e-2, weight_decay=0.1, decay_mask={'kernel': True, 'bias': not exclude_rank1}
  )
  for k in params:
    np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6)


def sgd_adamw_lars_reference(name, params, grads, *, lr, decay_mask, momentum=0.7):
  """SGD with momentum (L2 added to the gradient), AdamW (decoupled decay) and LARS (L2,
  then each masked leaf's update scaled by trust_coefficient ||p|| / ||g||, then momentum
  on the scaled steps), in float64, from their papers' formulas; _config's settings with
  a momentum of 0.7 and a trust coefficient of 0.02."""
  wd, b1, b2, eps, tc = 0.1, 0.9, 0.999, 1e-8, 0.02
  params = {k: np.asarray(v, np.float64) for k, v in params.items()}
  slots = {k: [np.zeros_like(v), np.zeros_like(v)] for k, v in params.items()}
  for t, step_grads in enumerate(grads, start=1):
    for k, p in params.items():
      g, (m, v) = np.asarray(step_grads[k], np.float64), slots[k]
      if name == 'adamw':
        m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
        step = m / (1 - b1**t) / (np.sqrt(v / (1 - b2**t)) + eps) + wd * p * decay_mask[k]
        params[k] = p - lr * step
      else:
        g = g + wd * p * decay_mask[k]
        if name == 'lars' and decay_mask[k]:
          g = g * tc * np.linalg.norm(p) / np.linalg.norm(g)
        m = momentum * m + lr * g
        params[k] = p - m
      slots[k] = [m, v]
  return params


@pytest.mark.parametrize('name', ['sgd', 'adamw', 'lars'])
def test_create_optimizer_sgd_adamw_lars_against_their_formulas(name):
  """Three steps of each optimizer config.optimizer.name selects, at a momentum of 0.7 (not
  0 or 0.9's default) and with the rank-1 mask (biases neither decayed nor trust-scaled):
  the name selects its own update rule (another optimizer's differs by far more)."""
  params, grads = _problem()
  config = _config(name, exclude_rank1=True)
  config.momentum, config.trust_coefficient = 0.7, 0.02
  got = _run(optimizers.create_optimizer(config, 0.05), params, grads)
  mask = {'kernel': True, 'bias': False}
  want = sgd_adamw_lars_reference(name, params, grads, lr=0.05, decay_mask=mask)
  for k in params:
    np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6)
  for other in {'sgd', 'adamw', 'lars'} - {name}:
    theirs = sgd_adamw_lars_reference(other, params, grads, lr=0.05, decay_mask=mask)
    assert np.abs(theirs['kernel'] - want['kernel']).max() > 1e-3


def _schedule_reference(step, *, learning_rate, warmup_steps, total_steps, cosine):
  """Linear warm-up from 0 over `warmup_steps`, then constant or a cosine to 0 at the end."""
  if step < warmup_steps:
    return learning_rate * step / warmup_steps
  if not cosine:
    return learning_rate
  progress = min((step - warmup_steps) / (total_steps - warmup_steps), 1.0)
  return learning_rate * 0.5 * (1 + np.cos(np.pi * progress))


@pytest.mark.parametrize('schedule', ['cosine', 'constant'])
def test_learning_rate_schedule_step_by_step(schedule):
  """Every step's rate against the formula, with 1.5 warm-up epochs of 5 steps: 7.5
  rounds to 8 warm-up steps (not 7), the cosine starts at step 8 and ends at step 40."""
  opt = ml_collections.ConfigDict(
    dict(learning_rate=0.3, warmup_epochs=1.5, schedule=_fresh(schedule))
  )
  lr = optimizers.create_learning_rate_schedule(opt, steps_per_epoch=5, total_steps=40)
  got = np.array([float(lr(step)) for step in range(41)])
  want = [
    _schedule_reference(
      s, learning_rate=0.3, warmup_steps=8, total_steps=40, cosine=schedule == 'cosine'
    )
    for s in range(41)
  ]
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)


def test_a_warm_up_over_the_whole_run_then_the_cosines_single_step():
  """warmup_epochs = num_epochs (the schema's upper bound): 10 warm-up steps of 10, then
  the cosine over max(0, 1) = 1 step: the full rate at step 10, 0 from step 11."""
  opt = ml_collections.ConfigDict(
    dict(learning_rate=0.3, warmup_epochs=2.0, schedule=_fresh('cosine'))
  )
  lr = optimizers.create_learning_rate_schedule(opt, steps_per_epoch=5, total_steps=10)
  got = [float(lr(step)) for step in range(13)]
  np.testing.assert_allclose(got, [0.03 * s for s in range(11)] + [0.0, 0.0], atol=1e-7)


def test_the_rank1_mask_decays_only_weights_of_two_or_more_dimensions():
  params = {'kernel': jnp.zeros((3, 3, 2, 4)), 'dense': jnp.zeros((2, 4))}
  params |= {'bias': jnp.zeros(4), 'scalar': jnp.zeros(())}
  assert optimizers._rank1_mask(params) == {
    'kernel': True,
    'dense': True,
    'bias': False,
    'scalar': False,
  }
