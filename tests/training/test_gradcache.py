"""Gradient caching: chunked value and gradient equal the one-pass ones."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P
from jaxprs import equations
import numpy as np
import pytest

from hscl_jax import losses
from hscl_jax.training import gradcache

BATCH, VIEWS, DIM = 16, 2, 6


def make_inputs(seed=0):
  kx, kw, kl = jax.random.split(jax.random.key(seed), 3)
  x = jax.random.normal(kx, (BATCH, VIEWS, 5))
  params = {'w': jax.random.normal(kw, (5, DIM)), 'b': jnp.linspace(-1.0, 1.0, DIM)}
  labels = jax.random.randint(kl, (BATCH,), 0, 3)
  return params, x, labels


def encode(params, x):
  """Per-sample encoder (no sample mixing): projections [batch, views, DIM], normalised."""
  return _normalize(jnp.tanh(x @ params['w'] + params['b']))


def _normalize(z):
  return z / jnp.linalg.norm(z, axis=-1, keepdims=True)


def batch_mixing_encode(params, state, x):
  """Subtracts the batch mean of the pre-activations (a BatchNorm stand-in) and keeps a
  running count and mean, as BatchNorm's running statistics."""
  h = x @ params['w']
  mean = jnp.mean(h, axis=(0, 1))
  new_state = {'mean': 0.5 * state['mean'] + 0.5 * mean, 'count': state['count'] + 1}
  return _normalize(jnp.tanh(h - mean + params['b'])), new_state


def scl(z, labels, axis_name=None):
  return losses.scl(z, labels, axis_name=axis_name)


@pytest.mark.parametrize('num_chunks,unroll', [(1, False), (4, False), (4, True)])
def test_equals_unchunked_gradient(num_chunks, unroll):
  params, x, labels = make_inputs()
  expected = jax.value_and_grad(lambda p: scl(encode(p, x), labels))(params)

  def forward(p, state, chunk):
    return encode(p, chunk), state

  loss_fn = lambda z: (scl(z, labels), z.shape[0])
  (loss, aux, z, state), grads = jax.jit(
    lambda p: gradcache.value_and_grad(
      forward, loss_fn, p, {}, gradcache.split(x, num_chunks), unroll=unroll
    )
  )(params)
  assert aux == BATCH and state == {}
  np.testing.assert_allclose(z, encode(params, x), rtol=1e-6, atol=1e-7)
  np.testing.assert_allclose(loss, expected[0], rtol=1e-6)
  jax.tree.map(
    lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), grads, expected[1]
  )


@pytest.mark.parametrize('unroll', [False, True])
def test_batch_mixing_layer_sees_one_chunk(unroll):
  """With a layer that mixes samples: each chunk normalised on its own (the same chunk in
  the forward and the recomputed pass), the state updated once per chunk."""
  params, x, labels = make_inputs(1)
  num_chunks = 4
  state0 = {'mean': jnp.zeros(DIM), 'count': jnp.zeros((), jnp.int32)}

  def reference(p):
    outputs, state = [], state0
    for chunk in gradcache.split(x, num_chunks):
      z, state = batch_mixing_encode(p, state, chunk)
      outputs.append(z)
    return scl(jnp.concatenate(outputs), labels), state

  (expected_loss, expected_state), expected_grads = jax.value_and_grad(reference, has_aux=True)(
    params
  )
  loss_fn = lambda z: (scl(z, labels), None)
  (loss, _, _, state), grads = jax.jit(
    lambda p: gradcache.value_and_grad(
      batch_mixing_encode, loss_fn, p, state0, gradcache.split(x, num_chunks), unroll=unroll
    )
  )(params)
  np.testing.assert_allclose(loss, expected_loss, rtol=1e-6)
  assert int(state['count']) == num_chunks
  np.testing.assert_allclose(state['mean'], expected_state['mean'], rtol=1e-5, atol=1e-7)
  jax.tree.map(
    lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), grads, expected_grads
  )
  # Not the whole-batch statistics: the chunking is visible with a mixing layer.
  whole = jax.grad(lambda p: scl(batch_mixing_encode(p, state0, x)[0], labels))(params)
  assert not np.allclose(grads['w'], whole['w'], rtol=1e-3)


def test_four_devices_equal_one():
  """Inside shard_map: global negatives, one all-reduce of the gradient, = 1 device."""
  params, x, labels = make_inputs(2)
  mesh = Mesh(np.array(jax.devices()[:4]), ('data',))
  expected = jax.value_and_grad(lambda p: scl(encode(p, x), labels))(params)

  def per_device(p, x, labels):
    forward = lambda p, state, chunk: (encode(p, chunk), state)
    loss_fn = lambda z: (scl(z, labels, axis_name='data'), None)
    (loss, _, _, _), grads = gradcache.value_and_grad(
      forward, loss_fn, p, {}, gradcache.split(x, 2), axis_name='data'
    )
    return loss, grads

  loss, grads = jax.jit(
    jax.shard_map(per_device, mesh=mesh, in_specs=(P(), P('data'), P('data')), out_specs=(P(), P()))
  )(params, x, labels)
  np.testing.assert_allclose(loss, expected[0], rtol=1e-6)
  jax.tree.map(
    lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), grads, expected[1]
  )


def test_recomputation_sees_each_chunks_own_state():
  """A forward whose outputs depend on the state it is given (its inputs scaled by a
  counter): the pull-back must recompute each chunk with the state that chunk saw in
  the first pass, so the gradient is that of the sequential unchunked computation."""
  params, x, labels = make_inputs(3)
  chunks = gradcache.split(x, 4)

  def forward(p, state, chunk):
    return encode(p, chunk * (1.0 + 0.3 * state['count'])), {'count': state['count'] + 1.0}

  def sequential(p):
    state, outputs = {'count': jnp.float32(0.0)}, []
    for chunk in chunks:
      out, state = forward(p, state, chunk)
      outputs.append(out)
    return scl(_normalize(jnp.concatenate(outputs)) * 1.3, labels), state

  (expected, expected_state), expected_grads = jax.value_and_grad(sequential, has_aux=True)(params)
  loss_fn = lambda z: (scl(_normalize(z) * 1.3, labels), None)
  (loss, _, _, state), grads = jax.jit(
    lambda p: gradcache.value_and_grad(forward, loss_fn, p, {'count': jnp.float32(0.0)}, chunks)
  )(params)
  np.testing.assert_allclose(loss, expected, rtol=1e-6)
  np.testing.assert_allclose(state['count'], expected_state['count'])
  for name in params:
    np.testing.assert_allclose(grads[name], expected_grads[name], rtol=1e-4, atol=1e-6)


def _scan_unrolls(jaxpr) -> list:
  """The `unroll` of every scan in a jaxpr, nested ones (a jit's, a scan body's) included."""
  return [eqn.params['unroll'] for eqn in equations(jaxpr) if eqn.primitive.name == 'scan']


def test_the_default_is_a_scan_whose_memory_is_flat_in_the_chunks():
  """Unrolling is opt-in (for XLA:CPU): by default both passes are scans over the chunks
  one at a time (unroll 1), as the docstring promises for GPUs and TPUs."""
  params, x, labels = make_inputs(4)
  forward = lambda p, state, chunk: (encode(p, chunk), state)
  loss_fn = lambda z: (scl(z, labels), None)
  chunks = gradcache.split(x, 4)
  default = jax.make_jaxpr(lambda p: gradcache.value_and_grad(forward, loss_fn, p, {}, chunks))
  unrolled = jax.make_jaxpr(
    lambda p: gradcache.value_and_grad(forward, loss_fn, p, {}, chunks, unroll=True)
  )
  assert _scan_unrolls(default(params).jaxpr) == [1, 1]
  assert _scan_unrolls(unrolled(params).jaxpr) == [4, 4]
  # The key encoder's pass (1) alone has the same default.
  alone = lambda **kw: jax.make_jaxpr(
    lambda p: gradcache.forward_only(forward, p, {}, chunks, **kw)
  )(params)
  assert (_scan_unrolls(alone().jaxpr), _scan_unrolls(alone(unroll=True).jaxpr)) == ([1], [4])


@pytest.mark.parametrize('num_chunks', [1, 4])
def test_forward_only_equals_the_unchunked_forward(num_chunks):
  """Pass (1) alone: the whole batch's outputs in order, and the state after every chunk."""
  params, x, _ = make_inputs(5)

  def forward(p, state, chunk):
    return encode(p, chunk), {'count': state['count'] + 1}

  outputs, state = gradcache.forward_only(
    forward, params, {'count': 0}, gradcache.split(x, num_chunks)
  )
  np.testing.assert_allclose(outputs, encode(params, x), rtol=1e-6, atol=1e-7)
  assert int(state['count']) == num_chunks
