"""The losses under the JAX transformations a user wraps around them, as a matrix.

Each image loss × option set × transformation nesting gives the value and the gradient
(with respect to the features and to every option that may be traced: temperature, β, τ,
τ⁺, M) of the eager call, which is itself pinned to the float64 reference of
tests/losses/test_kernel.py (value, and gradient by central differences). The options are
arguments of the outermost function, so under jit they are traced. The graph losses and
the diagnostics get the transformations that apply to them (tests/losses/test_composition.py
has the rest: forward mode, jax.export, half precision, devices).
"""

from __future__ import annotations

import functools

import covering
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from sigmoid_reference import reference_one_tower
from sigmoid_reference import reference_siglip

from hscl_jax import losses
from losses.test_kernel import normalized
from losses.test_kernel import random_batch
from losses.test_kernel import reference_hucl
from losses.test_kernel import reference_loss

FEATURES, LABELS = random_batch(50, batch=8, views=2, dim=8, num_classes=3)
PERMUTATION = np.array([3, 0, 7, 5, 1, 6, 2, 4])  # the losses are invariant to it
# The options a user may trace; M also appears as None (n - 2) in OPTION_SETS.
# t and b: the sigmoid losses' scale and bias.
PARAMS = dict(temperature=0.5, beta=1.5, tau=0.8, tau_plus=0.1, M=9.0, t=4.0, b=-2.0)
QUEUE = dict(
  queue=normalized(jax.random.normal(jax.random.key(51), (6, 8))),
  queue_labels=jnp.array([0, 1, 2, -1, 1, 0]),
  queue_filled=jnp.array([True, True, True, True, False, True]),
)
KEY_SHIFT = 0.3 * jax.random.normal(jax.random.key(52), (8,))


def key_features(z):
  """A key encoder's features of the same rows: a row-wise map, so they follow a
  permutation of the batch."""
  return normalized(z + KEY_SHIFT)


# name -> (loss(z, y, p, **options), float64 reference(z, y, p, **options)).
LOSSES = {
  'ucl': (
    lambda z, y, p, **o: losses.ucl(z, temperature=p['temperature'], M=p['M'], **o),
    lambda z, y, p, **o: reference_loss(
      z, method='sample', temperature=p['temperature'], M=p['M'], **o
    ),
  ),
  'hucl': (
    lambda z, y, p, **o: losses.hucl(
      z, beta=p['beta'], tau_plus=p['tau_plus'], temperature=p['temperature'], M=p['M'], **o
    ),
    lambda z, y, p, **o: reference_hucl(
      z, beta=p['beta'], tau_plus=p['tau_plus'], temperature=p['temperature'], M=p['M'], **o
    ),
  ),
  'scl': (
    lambda z, y, p, **o: losses.scl(z, y, temperature=p['temperature'], M=p['M'], **o),
    lambda z, y, p, **o: reference_loss(
      z, y, method='label', temperature=p['temperature'], M=p['M'], **o
    ),
  ),
  'hscl_exp': (
    lambda z, y, p, **o: losses.hscl(
      z, y, hardening=losses.exponential(p['beta']), temperature=p['temperature'], M=p['M'], **o
    ),
    lambda z, y, p, **o: reference_loss(
      z,
      y,
      method='label',
      eta=lambda g: np.exp(p['beta'] * g),
      temperature=p['temperature'],
      M=p['M'],
      **o,
    ),
  ),
  'hscl_threshold': (
    lambda z, y, p, **o: losses.hscl(
      z, y, hardening=losses.threshold(p['tau']), temperature=p['temperature'], M=p['M'], **o
    ),
    lambda z, y, p, **o: reference_loss(
      z,
      y,
      method='label',
      eta=lambda g: (np.exp(g) >= p['tau']) * 1.0,
      temperature=p['temperature'],
      M=p['M'],
      **o,
    ),
  ),
  # The sigmoid family: one tower, and two towers of the views (x = view 0, y = view 1).
  'sigmoid': (
    lambda z, y, p, **o: losses.sigmoid_contrastive(z, t=p['t'], b=p['b'], **o),
    lambda z, y, p, **o: reference_one_tower(z, t=p['t'], b=p['b'], **o),
  ),
  'sigmoid_labels_exp': (
    lambda z, y, p, **o: losses.sigmoid_contrastive(
      z, y, t=p['t'], b=p['b'], hardening=losses.exponential(p['beta']), **o
    ),
    lambda z, y, p, **o: reference_one_tower(
      z, y, t=p['t'], b=p['b'], eta=lambda g: np.exp(p['beta'] * g), **o
    ),
  ),
  'siglip': (
    lambda z, y, p, **o: losses.siglip(z[:, 0], z[:, 1], t=p['t'], b=p['b'], **o),
    lambda z, y, p, **o: reference_siglip(z[:, 0], z[:, 1], t=p['t'], b=p['b'], **o),
  ),
  'siglip_labels_threshold': (
    lambda z, y, p, **o: losses.siglip(
      z[:, 0],
      z[:, 1],
      t=p['t'],
      b=p['b'],
      labels_x=y,
      labels_y=y,
      hardening=losses.threshold(p['tau']),
      **o,
    ),  # fmt: skip
    lambda z, y, p, **o: reference_siglip(
      z[:, 0],
      z[:, 1],
      t=p['t'],
      b=p['b'],
      labels_x=y,
      labels_y=y,
      eta=lambda g: (np.exp(g) >= p['tau']) * 1.0,
      **o,
    ),  # fmt: skip
  ),
}
SIGMOID = ('sigmoid', 'sigmoid_labels_exp', 'siglip', 'siglip_labels_threshold')

# name -> (the loss's keyword options, the reference's; None = no float64 reference).
OPTION_SETS = {
  'dense': (dict(block_size=0), {}),
  'blockwise': (dict(block_size=4), {}),
  'M_none': (dict(M=None), dict(M=None)),
  'queue': (QUEUE, QUEUE),
  'keys': (dict(keys=key_features), dict(keys=key_features(FEATURES))),
  'precision_default': (dict(precision='default'), {}),
  'stop_gradient_weights': (dict(stop_gradient_weights=True), None),
}
# The losses with stop_gradient_weights.
HARDENED = ('hucl', 'hscl_exp', 'hscl_threshold', 'sigmoid_labels_exp', 'siglip_labels_threshold')
SOFTMAX_ONLY = ('M_none', 'queue', 'keys')  # the options the sigmoid losses do not have


def applies(name, option_set):
  """Whether a loss has an option set's options."""
  if option_set == 'stop_gradient_weights' and name not in HARDENED:
    return False
  return name not in SIGMOID or option_set not in SOFTMAX_ONLY


def loss_fn(name, option_set, axis_name=None):
  """f(z, y, p) of one loss and option set; ``p['M']`` is overridden by M=None."""
  kernel, _ = LOSSES[name]
  options = dict(OPTION_SETS[option_set][0])
  m_none = 'M' in options and options.pop('M') is None

  def f(z, y, p):
    p = dict(p, M=None) if m_none else p
    extra = {} if axis_name is None else dict(axis_name=axis_name)
    if callable(options.get('keys')):
      extra['keys'] = options['keys'](z)
    return kernel(z, y, p, **{**options, **extra})

  return f


def params():
  return {key: jnp.float32(value) for key, value in PARAMS.items()}


# --------------------------------------------------------------------------------------
# Transformations: each maps f(z, y, p) to (value, ∂/∂z, ∂/∂p) at (z, y, p).


def value_and_grads(f):
  return jax.value_and_grad(f, argnums=(0, 2))


def unpack(value_grads):
  value, (d_z, d_p) = value_grads
  return value, d_z, d_p


def micro_batches(z, y):
  """Two micro-batches: the batch and its permutation (each with the loss of the batch)."""
  return jnp.stack([z, z[PERMUTATION]]), jnp.stack([y, y[PERMUTATION]])


def mean_over_scan(f):
  def g(z, y, p):
    zs, ys = micro_batches(z, y)
    total, _ = jax.lax.scan(lambda c, xy: (c + f(xy[0], xy[1], p), None), 0.0, (zs, ys))
    return total / 2

  return g


def mean_over_fori_loop(f):
  def g(z, y, p):
    zs, ys = micro_batches(z, y)
    return jax.lax.fori_loop(0, 2, lambda i, c: c + f(zs[i], ys[i], p), 0.0) / 2

  return g


def in_cond(f):
  """The loss in the branch a traced predicate takes."""
  return lambda z, y, p: jax.lax.cond(p['temperature'] > 0, f, lambda *_: 0.0, z, y, p)


def in_switch(f):
  index = lambda p: (p['temperature'] > 0).astype(jnp.int32) + 1
  branches = [lambda *_: 0.0, lambda *_: -1.0, f]
  return lambda z, y, p: jax.lax.switch(index(p), branches, z, y, p)


def vmapped(transform):
  """vmap over a leading batch-of-batches axis (the batch and its permutation); each
  entry must equal the unbatched result, so the first is returned after checking."""

  def run(f, z, y, p):
    zs, ys = micro_batches(z, y)
    values, d_zs, d_ps = unpack(jax.vmap(transform(f), in_axes=(0, 0, None))(zs, ys, p))
    inverse = np.argsort(PERMUTATION)
    np.testing.assert_allclose(values[1], values[0], rtol=1e-5)
    np.testing.assert_allclose(d_zs[1][inverse], d_zs[0], rtol=1e-4, atol=1e-6)
    jax.tree.map(lambda a: np.testing.assert_allclose(a[1], a[0], rtol=1e-4, atol=1e-6), d_ps)
    return values[0], d_zs[0], jax.tree.map(lambda a: a[0], d_ps)

  return run


def vjp_of_jit(f, z, y, p):
  value, pullback = jax.vjp(lambda z, p: jax.jit(f)(z, y, p), z, p)
  return (value, *pullback(jnp.ones_like(value)))


TRANSFORMS = {
  'jit': lambda f, *a: unpack(jax.jit(value_and_grads(f))(*a)),
  'grad_of_jit': lambda f, *a: unpack(value_and_grads(jax.jit(f))(*a)),
  'vjp_of_jit': vjp_of_jit,
  'checkpoint': lambda f, *a: unpack(value_and_grads(jax.checkpoint(f))(*a)),
  'checkpoint_dots_saveable': lambda f, *a: unpack(
    value_and_grads(jax.checkpoint(f, policy=jax.checkpoint_policies.dots_saveable))(*a)
  ),
  'grad_of_checkpoint_of_jit': lambda f, *a: unpack(
    value_and_grads(jax.checkpoint(jax.jit(f)))(*a)
  ),
  'grad_of_scan': lambda f, *a: unpack(value_and_grads(mean_over_scan(f))(*a)),
  'grad_of_scan_of_jit': lambda f, *a: unpack(value_and_grads(mean_over_scan(jax.jit(f)))(*a)),
  'jit_of_grad_of_scan': lambda f, *a: unpack(jax.jit(value_and_grads(mean_over_scan(f)))(*a)),
  'grad_of_fori_loop': lambda f, *a: unpack(value_and_grads(mean_over_fori_loop(f))(*a)),
  'grad_of_cond': lambda f, *a: unpack(jax.jit(value_and_grads(in_cond(f)))(*a)),
  'grad_of_switch': lambda f, *a: unpack(value_and_grads(jax.jit(in_switch(f)))(*a)),
  'vmap_of_grad_of_jit': vmapped(lambda f: value_and_grads(jax.jit(f))),
  'vmap_of_jit_of_grad': vmapped(lambda f: jax.jit(value_and_grads(f))),
}
# The nestings every option set runs; the rest run on the dense form.
CORE_TRANSFORMS = ('grad_of_jit', 'grad_of_scan_of_jit')


@functools.cache
def eager(name, option_set):
  """The eager value and gradients of one case, checked once against the reference."""
  f = loss_fn(name, option_set)
  value, d_z, d_p = unpack(value_and_grads(f)(FEATURES, LABELS, params()))
  reference_options = OPTION_SETS[option_set][1]
  if reference_options is not None:
    _, reference = LOSSES[name]
    p64 = dict(PARAMS, **{k: v for k, v in reference_options.items() if k == 'M'})
    other = {k: v for k, v in reference_options.items() if k != 'M'}
    ref = lambda z: reference(z, np.asarray(LABELS), p64, **other)
    np.testing.assert_allclose(value, ref(FEATURES), rtol=2e-5)
    direction = np.random.default_rng(0).normal(size=FEATURES.shape)
    eps = 1e-5
    z64 = np.asarray(FEATURES, np.float64)
    expected = (ref(z64 + eps * direction) - ref(z64 - eps * direction)) / (2 * eps)
    np.testing.assert_allclose(jnp.vdot(d_z, direction), expected, rtol=1e-3, atol=1e-5)
  return value, d_z, d_p


def assert_matches_eager(name, option_set, got):
  value, d_z, d_p = eager(name, option_set)
  np.testing.assert_allclose(got[0], value, rtol=1e-5)
  np.testing.assert_allclose(got[1], d_z, rtol=1e-4, atol=1e-6)
  for key in d_p:
    np.testing.assert_allclose(got[2][key], d_p[key], rtol=1e-4, atol=1e-6, err_msg=key)


def cases():
  """Every case of the matrix; those outside a covering subset are marked slow.

  The default run keeps each nesting on one of the losses (rotating: each loss meets two
  or three nestings) and each option set on every loss under one of the two core
  nestings (alternating): every nesting, loss and option set, and every (loss, option
  set) pair's eager value checked against the reference, at a third of the matrix's
  compilations (tests/covering.py's cover, of the nestings and of the pairs). `-m slow`
  runs the rest.
  """
  dense = [(name, 'dense', t) for t in TRANSFORMS for name in LOSSES]
  kept = covering.each_value_once([dict(name=n, transform=t) for n, _, t in dense])
  options = [
    (name, option_set, t)
    for option_set in OPTION_SETS
    if option_set != 'dense'
    for name in LOSSES
    if applies(name, option_set)
    for t in CORE_TRANSFORMS
  ]
  kept_options = covering.each_value_once([dict(pair=(n, o), transform=t) for n, o, t in options])
  for i, values in enumerate(dense):
    yield case(*values, default=i in kept)
  for i, values in enumerate(options):
    yield case(*values, default=i in kept_options)


def case(name, option_set, transform, *, default):
  marks = () if default else (pytest.mark.slow,)
  return pytest.param(name, option_set, transform, marks=marks)


@pytest.mark.parametrize('name,option_set,transform', list(cases()))
def test_transformation_matches_eager_and_reference(name, option_set, transform):
  got = TRANSFORMS[transform](loss_fn(name, option_set), FEATURES, LABELS, params())
  assert_matches_eager(name, option_set, got)


def test_the_default_run_covers_every_nesting_loss_and_option_set():
  default = [p.values for p in cases() if not p.marks]
  assert {t for _, _, t in default} == set(TRANSFORMS)
  assert {(n, o) for n, o, _ in default} == {(n, o) for n, o, _ in (p.values for p in cases())}
  dense = [(n, t) for n, o, t in default if o == 'dense']
  assert all(sum(t == u for _, u in dense) == 1 for t in TRANSFORMS)
  assert {n for n, _ in dense} == set(LOSSES)
  assert {t for n, o, t in default if o != 'dense'} == set(CORE_TRANSFORMS)
