"""The sigmoid (SigLIP) family against an independent float64 reference and its identities."""

from __future__ import annotations

import importlib
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from sigmoid_reference import reference_one_tower
from sigmoid_reference import reference_siglip
from sigmoid_reference import siglip_dense_formula

from hscl_jax import losses


def normalized(x):
  return x / jnp.linalg.norm(x, axis=-1, keepdims=True)


def towers(seed, n=6, m=6, dim=8):
  kx, ky = jax.random.split(jax.random.key(seed))
  return normalized(jax.random.normal(kx, (n, dim))), normalized(jax.random.normal(ky, (m, dim)))


X, Y = towers(0)
LABELS_X = jnp.array([0, 1, 2, 0, 1, 1])
LABELS_Y = jnp.array([1, 0, 0, 2, 1, 3])
Z = normalized(jax.random.normal(jax.random.key(1), (4, 2, 8)))
LABELS_Z = jnp.array([0, 1, 0, 2])
T, B, BETA, TAU = 4.0, -2.0, 1.5, 1.3


def exponential_eta(beta):
  return lambda g: np.exp(beta * g)


def threshold_eta(tau):
  return lambda g: (np.exp(g) >= tau) * 1.0


def user_hardening(beta):
  """A hardening of the user's own, with an array: log η = log(1 + e^{βg})."""
  return lambda g: jnp.logaddexp(0.0, beta * g)


def user_eta(beta):
  return lambda g: 1.0 + np.exp(beta * g)


# name -> (loss(p), float64 reference(p)) of the parameters p = {x, y, t, b, beta} (z as x
# for one tower); the inputs the losses differentiate in are the entries of p.
CASES = {
  'siglip': (
    lambda p: losses.siglip(p['x'], p['y'], t=p['t'], b=p['b']),
    lambda p: reference_siglip(p['x'], p['y'], t=p['t'], b=p['b']),
  ),
  'siglip_labels': (
    lambda p: losses.siglip(
      p['x'], p['y'], t=p['t'], b=p['b'], labels_x=LABELS_X, labels_y=LABELS_Y
    ),
    lambda p: reference_siglip(
      p['x'], p['y'], t=p['t'], b=p['b'], labels_x=LABELS_X, labels_y=LABELS_Y
    ),
  ),
  'siglip_exponential': (
    lambda p: losses.siglip(
      p['x'], p['y'], t=p['t'], b=p['b'], hardening=losses.exponential(p['beta'])
    ),
    lambda p: reference_siglip(p['x'], p['y'], t=p['t'], b=p['b'], eta=exponential_eta(p['beta'])),
  ),
  'siglip_labels_exponential': (
    lambda p: losses.siglip(
      p['x'],
      p['y'],
      t=p['t'],
      b=p['b'],
      labels_x=LABELS_X,
      labels_y=LABELS_Y,
      hardening=losses.exponential(p['beta']),
    ),
    lambda p: reference_siglip(
      p['x'],
      p['y'],
      t=p['t'],
      b=p['b'],
      labels_x=LABELS_X,
      labels_y=LABELS_Y,
      eta=exponential_eta(p['beta']),
    ),
  ),
  'siglip_threshold': (
    lambda p: losses.siglip(p['x'], p['y'], t=p['t'], b=p['b'], hardening=losses.threshold(TAU)),
    lambda p: reference_siglip(p['x'], p['y'], t=p['t'], b=p['b'], eta=threshold_eta(TAU)),
  ),
  'siglip_user_hardening': (
    lambda p: losses.siglip(
      p['x'], p['y'], t=p['t'], b=p['b'], hardening=user_hardening(p['beta'])
    ),
    lambda p: reference_siglip(p['x'], p['y'], t=p['t'], b=p['b'], eta=user_eta(p['beta'])),
  ),
  'one_tower': (
    lambda p: losses.sigmoid_contrastive(p['z'], t=p['t'], b=p['b']),
    lambda p: reference_one_tower(p['z'], t=p['t'], b=p['b']),
  ),
  'one_tower_labels': (
    lambda p: losses.sigmoid_contrastive(p['z'], LABELS_Z, t=p['t'], b=p['b']),
    lambda p: reference_one_tower(p['z'], LABELS_Z, t=p['t'], b=p['b']),
  ),
  'one_tower_exponential': (
    lambda p: losses.sigmoid_contrastive(
      p['z'], t=p['t'], b=p['b'], hardening=losses.exponential(p['beta'])
    ),
    lambda p: reference_one_tower(p['z'], t=p['t'], b=p['b'], eta=exponential_eta(p['beta'])),
  ),
  'one_tower_labels_exponential': (
    lambda p: losses.sigmoid_contrastive(
      p['z'], LABELS_Z, t=p['t'], b=p['b'], hardening=losses.exponential(p['beta'])
    ),
    lambda p: reference_one_tower(
      p['z'], LABELS_Z, t=p['t'], b=p['b'], eta=exponential_eta(p['beta'])
    ),
  ),
  'one_tower_labels_threshold': (
    lambda p: losses.sigmoid_contrastive(
      p['z'], LABELS_Z, t=p['t'], b=p['b'], hardening=losses.threshold(TAU)
    ),
    lambda p: reference_one_tower(p['z'], LABELS_Z, t=p['t'], b=p['b'], eta=threshold_eta(TAU)),
  ),
}
PARAMS = dict(x=X, y=Y, z=Z, t=T, b=B, beta=BETA)


def params(**changes):
  return {key: jnp.asarray(value, jnp.float32) for key, value in dict(PARAMS, **changes).items()}


def float64(p):
  return {
    key: np.asarray(value, np.float64) if np.ndim(value) else float(value)
    for key, value in p.items()
  }


def central_difference(fn, p, key, direction, eps=1e-6):
  plus = dict(p, **{key: p[key] + eps * direction})
  minus = dict(p, **{key: p[key] - eps * direction})
  return (fn(plus) - fn(minus)) / (2 * eps)


def assert_matches_reference(name, p, rtol=1e-6, case=None):
  """Value and the gradient in every entry of p (arrays along random directions)."""
  loss, reference = case or CASES[name]
  value, grads = jax.value_and_grad(loss)(p)
  p64 = float64(p)
  np.testing.assert_allclose(value, reference(p64), rtol=rtol)
  rng = np.random.default_rng(0)
  for key in p:
    direction = rng.normal(size=np.shape(p[key])) if np.ndim(p[key]) else 1.0
    expected = central_difference(reference, p64, key, direction)
    got = np.vdot(np.asarray(grads[key], np.float64), direction)
    np.testing.assert_allclose(got, expected, rtol=rtol, atol=1e-6, err_msg=key)


@pytest.mark.parametrize('name', sorted(CASES))
def test_value_and_gradients_match_the_float64_reference(name):
  assert_matches_reference(name, params())


# --------------------------------------------------------------------------------------
# Edge cases: each against the reference (value and every gradient).

Z_TIES = jnp.stack([Z[0], Z[0], Z[1], Z[1]])  # duplicated samples: tied similarities
EDGE_CASES = {
  # name -> (kind, labels (one tower) or (labels_x, labels_y), hardening's name, inputs)
  'ties_exponential': ('one', LABELS_Z, 'exponential', dict(z=Z_TIES)),
  'ties_threshold': ('one', jnp.array([0, 1, 1, 0]), 'threshold', dict(z=Z_TIES)),
  'one_tower_class_of_one': ('one', jnp.array([0, 1, 0, 0]), 'exponential', {}),
  'one_tower_all_labels_equal': ('one', jnp.zeros(4, jnp.int32), 'exponential', {}),
  'one_tower_all_labels_distinct': ('one', jnp.arange(4), 'exponential', {}),
  'one_tower_threshold_above_every_negative': ('one', LABELS_Z, 'threshold_high', {}),
  # x's label 3 has no y row: an anchor without positives; y all 0: anchors of label 0
  # without negatives.
  'two_towers_anchor_without_positives': (
    'two',
    (jnp.array([3, 1, 2, 0, 1, 1]), LABELS_Y),
    'exponential',
    {},
  ),
  'two_towers_anchors_without_negatives': (
    'two',
    (jnp.array([0, 1, 0, 0, 2, 0]), jnp.zeros(6, jnp.int32)),
    'exponential',
    {},
  ),
  'two_towers_all_labels_equal': (
    'two',
    (jnp.zeros(6, jnp.int32), jnp.zeros(6, jnp.int32)),
    'exponential',
    {},
  ),
  'two_towers_all_labels_distinct': ('two', (jnp.arange(6), jnp.arange(10, 16)), 'exponential', {}),
  'two_towers_more_keys_than_anchors': (
    'two',
    (LABELS_X[:4], LABELS_Y),
    'exponential',
    dict(x=X[:4]),
  ),
}
HARDENINGS = {
  'exponential': (lambda p: losses.exponential(p['beta']), lambda p: exponential_eta(p['beta'])),
  'threshold': (lambda p: losses.threshold(TAU), lambda p: threshold_eta(TAU)),
  # τ above e^{t}: no negative has η > 0.
  'threshold_high': (
    lambda p: losses.threshold(np.exp(T) * 1.01),
    lambda p: threshold_eta(np.exp(T) * 1.01),
  ),
}


def edge_case(kind, labels, hardening_name):
  hardening, eta = HARDENINGS[hardening_name]
  if kind == 'one':
    return (
      lambda p: losses.sigmoid_contrastive(
        p['z'], labels, t=p['t'], b=p['b'], hardening=hardening(p)
      ),
      lambda p: reference_one_tower(p['z'], labels, t=p['t'], b=p['b'], eta=eta(p)),
    )
  labels_x, labels_y = labels
  return (
    lambda p: losses.siglip(
      p['x'],
      p['y'],
      t=p['t'],
      b=p['b'],
      labels_x=labels_x,
      labels_y=labels_y,
      hardening=hardening(p),
    ),
    lambda p: reference_siglip(
      p['x'], p['y'], t=p['t'], b=p['b'], labels_x=labels_x, labels_y=labels_y, eta=eta(p)
    ),
  )


@pytest.mark.parametrize('name', sorted(EDGE_CASES))
def test_edge_cases_match_the_float64_reference(name):
  kind, labels, hardening_name, inputs = EDGE_CASES[name]
  p = params(**inputs)
  keys = ('z', 't', 'b', 'beta') if kind == 'one' else ('x', 'y', 't', 'b', 'beta')
  p = {key: value for key, value in p.items() if key in keys}
  assert_matches_reference(name, p, case=edge_case(kind, labels, hardening_name))


def test_all_labels_equal_leaves_the_positive_terms_alone():
  """No negatives at all: L = (1/n) Σ_i Σ_{p≠i} softplus(-l_ip), finite, with any hardening."""
  labels = jnp.zeros(4, jnp.int32)
  rows = np.asarray(Z, np.float64).reshape(8, -1)
  logits = T * rows @ rows.T + B
  expected = np.sum(np.logaddexp(0.0, -logits)[~np.eye(8, dtype=bool)]) / 8
  for hardening in (None, losses.exponential(BETA), losses.threshold(TAU)):
    got = losses.sigmoid_contrastive(Z, labels, t=T, b=B, hardening=hardening)
    np.testing.assert_allclose(got, expected, rtol=1e-6)


# --------------------------------------------------------------------------------------
# Identities.


def test_two_towers_without_labels_equal_siglips_dense_formula():
  for hardening in (None, losses.exponential(0.0)):
    got = losses.siglip(X, Y, t=T, b=B, hardening=hardening)
    np.testing.assert_allclose(got, siglip_dense_formula(X, Y, T, B), rtol=1e-6)
  # SigLIP's initial t and b too.
  got = losses.siglip(X, Y, t=losses.SIGLIP_T, b=losses.SIGLIP_B)
  np.testing.assert_allclose(got, siglip_dense_formula(X, Y, 10.0, -10.0), rtol=1e-6)


@pytest.mark.parametrize('stop_gradient_weights', [False, True])
def test_beta_zero_equals_the_unhardened_loss(stop_gradient_weights):
  """β = 0: value and the gradients in the features, t and b to float32 rounding."""
  hard = dict(hardening=losses.exponential(0.0), stop_gradient_weights=stop_gradient_weights)
  pairs = [
    (lambda p, **h: losses.siglip(p['x'], p['y'], t=p['t'], b=p['b'], **h), ('x', 'y', 't', 'b')),
    (
      lambda p, **h: losses.siglip(
        p['x'], p['y'], t=p['t'], b=p['b'], labels_x=LABELS_X, labels_y=LABELS_Y, **h
      ),
      ('x', 'y', 't', 'b'),
    ),
    (lambda p, **h: losses.sigmoid_contrastive(p['z'], t=p['t'], b=p['b'], **h), ('z', 't', 'b')),
    (
      lambda p, **h: losses.sigmoid_contrastive(p['z'], LABELS_Z, t=p['t'], b=p['b'], **h),
      ('z', 't', 'b'),
    ),
  ]
  for loss, keys in pairs:
    p = {k: v for k, v in params().items() if k in keys}
    plain, d_plain = jax.value_and_grad(loss)(p)
    hardened, d_hardened = jax.value_and_grad(lambda p: loss(p, **hard))(p)
    np.testing.assert_allclose(hardened, plain, rtol=1e-6)
    for key in keys:
      np.testing.assert_allclose(d_hardened[key], d_plain[key], rtol=1e-5, atol=1e-7, err_msg=key)


def test_labels_all_distinct_equal_the_unsupervised_forms():
  np.testing.assert_allclose(
    losses.sigmoid_contrastive(Z, jnp.arange(4), t=T, b=B, hardening=losses.exponential(BETA)),
    losses.sigmoid_contrastive(Z, t=T, b=B, hardening=losses.exponential(BETA)),
    rtol=1e-6,
  )
  np.testing.assert_allclose(
    losses.siglip(X, Y, t=T, b=B, labels_x=jnp.arange(6), labels_y=jnp.arange(6)),
    losses.siglip(X, Y, t=T, b=B),
    rtol=1e-6,
  )


def test_detached_weights_give_the_same_value_and_the_frozen_weights_gradient():
  """stop_gradient_weights: the value is the same; the gradient is the reference's with
  the weights computed from the point itself and held fixed; β gets none."""
  hardening = losses.exponential(BETA)
  loss = lambda p, **o: losses.siglip(p['x'], p['y'], t=p['t'], b=p['b'], hardening=hardening, **o)
  p = {k: v for k, v in params().items() if k in ('x', 'y', 't', 'b')}
  value, grads = jax.value_and_grad(lambda p: loss(p, stop_gradient_weights=True))(p)
  np.testing.assert_allclose(value, loss(p), rtol=1e-6)
  p64 = float64(p)
  frozen = (p64['t'], p64['x'], p64['y'])
  reference = lambda q: reference_siglip(
    q['x'], q['y'], t=q['t'], b=q['b'], eta=exponential_eta(BETA), frozen=frozen
  )
  rng = np.random.default_rng(1)
  for key in p:
    direction = rng.normal(size=np.shape(p[key])) if np.ndim(p[key]) else 1.0
    expected = central_difference(reference, p64, key, direction)
    np.testing.assert_allclose(
      np.vdot(grads[key], direction), expected, rtol=1e-6, atol=1e-6, err_msg=key
    )
  d_beta = jax.grad(
    lambda beta: losses.siglip(
      X, Y, t=T, b=B, hardening=losses.exponential(beta), stop_gradient_weights=True
    )
  )(jnp.float32(BETA))
  assert d_beta == 0.0


def test_docstring_examples_run():
  import doctest

  from hscl_jax.losses import sigmoid

  results = doctest.testmod(sigmoid, verbose=False)
  assert results.failed == 0 and results.attempted >= 2 * 3
  for loss in (losses.siglip, losses.sigmoid_contrastive):
    for section in ('Args:', 'Returns:', 'Example:'):
      assert section in loss.__doc__, (loss.__name__, section)


# --------------------------------------------------------------------------------------
# Errors: one line, naming the bad value and the fix.


@pytest.mark.parametrize(
  'call, message',
  [
    (lambda: losses.siglip(X, Y, t=0.0, b=B), 't must be positive and finite'),
    (lambda: losses.siglip(X, Y, t=T, b=float('nan')), 'b must be finite, got nan'),
    (
      lambda: losses.siglip(X, Y[:5], t=T, b=B),
      'x and y need as many rows, got 6 and 5; pass labels_x',
    ),
    (lambda: losses.siglip(X, Y, t=T, b=B, labels_x=LABELS_X), 'labels_x and labels_y go together'),
    (lambda: losses.siglip(X, Y[:, :4], t=T, b=B), 'x and y must have the same dim'),
    (lambda: losses.siglip(X[0], Y, t=T, b=B), 'x must have shape [rows, dim], got shape (8,)'),
    (
      lambda: losses.siglip(X, Y, t=T, b=B, labels_x=LABELS_X, labels_y=LABELS_Y[:5]),
      'labels_y must have shape [6]',
    ),
    (
      lambda: losses.siglip(X, Y, t=T, b=B, collective='tree'),
      "collective must be one of ('all_gather', 'ring'), got 'tree'",
    ),
    (lambda: losses.sigmoid_contrastive(Z, t=-1.0, b=B), 't must be positive and finite'),
    (
      lambda: losses.sigmoid_contrastive(Z, t=T, b=B, hardening=1.0),
      'hardening= takes a function g -> log η(g), e.g. losses.exponential(1.0), got the number',
    ),
    (
      lambda: losses.siglip(X, Y, t=T, b=B, hardening=losses.threshold),
      'hardening=losses.threshold is the factory: call it',
    ),
    (lambda: losses.siglip(X, Y, t=T, b=B, stop_gradient_weights='no'), 'stop_gradient_weights'),
  ],
)
def test_bad_input_is_refused_in_one_line(call, message):
  with pytest.raises((ValueError, TypeError)) as error:
    call()
  assert message in str(error.value) and '\n' not in str(error.value)


# --------------------------------------------------------------------------------------
# Blocks and devices: each setting of the family, blockwise and across 4 devices, against
# the reference (value and every gradient) and the single-device dense loss.

# name -> (tower kind, labelled, hardening's name or None)
SETTINGS = {
  'siglip': ('two', False, None),
  'siglip_threshold': ('two', False, 'threshold'),
  'siglip_labels_exponential': ('two', True, 'exponential'),
  'one_tower': ('one', False, None),
  'one_tower_labels_exponential': ('one', True, 'exponential'),
}
X8, Y8 = towers(2, n=8, m=8)
Z8 = normalized(jax.random.normal(jax.random.key(3), (8, 2, 8)))
LABELS_8 = (jnp.array([0, 1, 2, 0, 1, 1, 3, 2]), jnp.array([1, 0, 0, 2, 1, 3, 3, 0]))


def setting_inputs(name):
  """(p, labels) of a setting: the differentiable inputs and the label arrays."""
  kind, labelled, hardening_name = SETTINGS[name]
  p = dict(t=jnp.float32(T), b=jnp.float32(B))
  p.update(dict(x=X8, y=Y8) if kind == 'two' else dict(z=Z8))
  if hardening_name == 'exponential':
    p['beta'] = jnp.float32(BETA)
  labels = () if not labelled else LABELS_8 if kind == 'two' else LABELS_8[:1]
  return p, labels


def setting_loss(name, **options):
  """loss(p, *labels) of a setting, with the sigmoid losses' options."""
  kind, labelled, hardening_name = SETTINGS[name]

  def loss(p, *labels):
    hardening = None if hardening_name is None else HARDENINGS[hardening_name][0](p)
    common = dict(t=p['t'], b=p['b'], hardening=hardening, **options)
    if kind == 'one':
      return losses.sigmoid_contrastive(p['z'], *labels, **common)
    named = dict(zip(('labels_x', 'labels_y'), labels))
    return losses.siglip(p['x'], p['y'], **named, **common)

  return loss


def setting_reference(name):
  kind, labelled, hardening_name = SETTINGS[name]
  _, labels = setting_inputs(name)
  labels = [np.asarray(y) for y in labels]

  def reference(p):
    eta = None if hardening_name is None else HARDENINGS[hardening_name][1](p)
    if kind == 'one':
      return reference_one_tower(p['z'], *labels, t=p['t'], b=p['b'], eta=eta)
    named = dict(zip(('labels_x', 'labels_y'), labels))
    return reference_siglip(p['x'], p['y'], t=p['t'], b=p['b'], eta=eta, **named)

  return reference


@pytest.mark.parametrize('block_size', [3, 8])
@pytest.mark.parametrize('name', sorted(SETTINGS))
def test_blockwise_matches_the_float64_reference(name, block_size):
  """Blocks of 3 rows (the last padded) and of 8 (one block, the rows' count)."""
  p, labels = setting_inputs(name)
  loss = setting_loss(name, block_size=block_size)
  case = (lambda p: loss(p, *labels), setting_reference(name))
  assert_matches_reference(name, p, case=case)


def _mesh():
  return jax.sharding.Mesh(np.array(jax.devices()[:4]), ('data',))


@pytest.mark.parametrize('block_size', [None, 3])
@pytest.mark.parametrize('collective', ['all_gather', 'ring'])
@pytest.mark.parametrize('name', sorted(SETTINGS))
def test_four_devices_equal_one(name, collective, block_size):
  """Inside jit(shard_map) over 4 devices: the value and the gradient in every input (each
  shard's rows, t, b, β) are the single-device loss's of the global batch."""
  if jax.device_count() < 4:
    pytest.skip('needs 4 devices (tests/conftest.py sets them)')
  P = jax.sharding.PartitionSpec
  p, labels = setting_inputs(name)
  specs = {key: P('data') if np.ndim(value) else P() for key, value in p.items()}
  loss = setting_loss(name, axis_name='data', collective=collective, block_size=block_size)
  sharded = jax.jit(
    jax.shard_map(
      jax.value_and_grad(loss),
      mesh=_mesh(),
      in_specs=(specs, *[P('data')] * len(labels)),
      out_specs=(P(), specs),
    )
  )
  value, grads = sharded(p, *labels)
  expected_value, expected_grads = jax.value_and_grad(setting_loss(name))(p, *labels)
  np.testing.assert_allclose(value, expected_value, rtol=1e-6)
  for key in p:
    np.testing.assert_allclose(grads[key], expected_grads[key], rtol=1e-5, atol=1e-7, err_msg=key)


@pytest.mark.parametrize('collective', ['all_gather', 'ring'])
def test_pmap_value_equals_one_device(collective):
  if jax.device_count() < 4:
    pytest.skip('needs 4 devices (tests/conftest.py sets them)')
  p, labels = setting_inputs('siglip_labels_exponential')
  loss = setting_loss('siglip_labels_exponential', axis_name='i', collective=collective)
  shards = lambda a: a.reshape(4, -1, *a.shape[1:])
  p_sharded = {key: shards(v) if np.ndim(v) else jnp.full(4, v) for key, v in p.items()}
  values = jax.pmap(loss, axis_name='i')(p_sharded, *map(shards, labels))
  expected = setting_loss('siglip_labels_exponential')(p, *labels)
  np.testing.assert_allclose(values, jnp.full(4, expected), rtol=1e-6)


# --------------------------------------------------------------------------------------
# Memory: never the n×m logits above the dense bound; the ring's per-device memory does
# not grow with the devices (benchmarks/bench_sigmoid.py measures both at full size).

BENCHMARKS = pathlib.Path(__file__).resolve().parents[2] / 'benchmarks'


def test_above_the_dense_bound_the_compiled_gradient_never_holds_the_logits():
  """n = m = 65536 (2^32 logits > DENSE_MAX_ENTRIES; compiled, not run): block_size=None
  streams blocks of 2048, and XLA's temporary memory of value_and_grad stays under 256 MiB,
  1/64 of the n×m float32 logits (16 GiB)."""
  rows, dim = 65536, 16
  assert rows * rows > losses.DENSE_MAX_ENTRIES
  tower = jax.ShapeDtypeStruct((rows, dim), jnp.float32)
  scalar = jax.ShapeDtypeStruct((), jnp.float32)
  for hardening in (None, losses.exponential(1.0)):
    step = jax.jit(
      jax.value_and_grad(
        lambda x, y, t, b: losses.siglip(x, y, t=t, b=b, hardening=hardening), argnums=(0, 1, 2, 3)
      )
    )
    temp = step.lower(tower, tower, scalar, scalar).compile().memory_analysis().temp_size_in_bytes
    assert temp < rows * rows * 4 / 64, temp


def test_the_rings_memory_per_device_does_not_grow_with_the_devices():
  """XLA's temporary memory per device of jit(shard_map(grad)) at 256 rows per device, on
  2, 4 and 8 fake devices (a process each): the ring's stays within 5 % of its 2-device
  figure while the all-gather's grows with the gathered keys (the check can see growth)."""
  sys.path.insert(0, str(BENCHMARKS))
  bench_sigmoid = importlib.import_module('bench_sigmoid')  # a script, found on that path

  results = bench_sigmoid.ring_memory([2, 4, 8], rows=256, block_size=64, dim=16)
  temp = {(row['devices'], row['collective']): row['temp_bytes'] for row in results}
  assert temp[8, 'ring'] <= 1.05 * temp[2, 'ring'], temp
  assert temp[4, 'ring'] <= 1.05 * temp[2, 'ring'], temp
  assert temp[8, 'all_gather'] > 2 * temp[2, 'all_gather'], temp


def test_the_ring_on_one_device_is_the_plain_loss():
  """Without axis_name there is one shard: collective='ring' runs, and gives the value and
  gradients of the default, so one set of options serves one device and many."""
  for loss in (
    lambda x, y, t, b, c: losses.siglip(x, y, t=t, b=b, collective=c),
    lambda x, y, t, b, c: losses.sigmoid_contrastive(jnp.stack([x, y], 1), t=t, b=b, collective=c),
  ):
    ring = jax.value_and_grad(loss, argnums=(0, 1, 2, 3))(X, Y, T, B, 'ring')
    gather = jax.value_and_grad(loss, argnums=(0, 1, 2, 3))(X, Y, T, B, 'all_gather')
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6), ring, gather)
