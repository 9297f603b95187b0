"""The losses composed as users compose them, beyond tests/losses/test_transforms.py's
matrix: many devices (shard_map, pmap), eval_shape, forward mode, jax.export, half
precision, gradients with respect to every traced option, and the graph losses,
diagnostics and schedules under the same transformations."""

from __future__ import annotations

import jax
from jax import export
import jax.numpy as jnp
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P
import numpy as np
import pytest

from hscl_jax import losses
from losses.test_kernel import normalized
from losses.test_kernel import random_batch
from losses.test_transforms import FEATURES
from losses.test_transforms import LABELS
from losses.test_transforms import LOSSES
from losses.test_transforms import PARAMS
from losses.test_transforms import SIGMOID
from losses.test_transforms import applies
from losses.test_transforms import eager
from losses.test_transforms import loss_fn
from losses.test_transforms import params
from losses.test_transforms import value_and_grads

DIRECTION = np.random.default_rng(1).normal(size=FEATURES.shape).astype(np.float32)


def reference_of(name, option_set='dense'):
  """The float64 reference of a loss as a function of (z, p), labels fixed."""
  _, reference = LOSSES[name]
  p_m = dict(M=None) if option_set == 'M_none' else {}
  return lambda z, p: reference(z, np.asarray(LABELS), dict(p, **p_m))


def central_difference(fn, x, step, eps=1e-5):
  return (fn(x + eps * step) - fn(x - eps * step)) / (2 * eps)


def pairs(*option_sets):
  """(loss, option set) of every loss with each of ``option_sets`` it has."""
  return [(n, o) for o in option_sets for n in sorted(LOSSES) if applies(n, o)]


@pytest.mark.parametrize('name,option_set', pairs('dense', 'blockwise', 'M_none'))
@pytest.mark.covering  # tests/covering.py
def test_gradient_with_respect_to_every_traced_option_matches_reference(name, option_set):
  """∂/∂temperature, β, τ⁺, M, t and b of grad∘jit against central differences of the
  float64 reference (τ's is 0: a threshold is flat between the similarities)."""
  _, _, d_p = eager(name, option_set)
  jitted = jax.grad(jax.jit(loss_fn(name, option_set)), argnums=2)(FEATURES, LABELS, params())
  reference = reference_of(name, option_set)
  z64 = np.asarray(FEATURES, np.float64)
  for key, value in PARAMS.items():
    expected = central_difference(lambda v: reference(z64, dict(PARAMS, **{key: v})), value, 1.0)
    np.testing.assert_allclose(d_p[key], expected, rtol=1e-3, atol=1e-5, err_msg=key)
    np.testing.assert_allclose(jitted[key], d_p[key], rtol=1e-4, atol=1e-6, err_msg=key)


def _mesh():
  return Mesh(np.array(jax.devices()[:4]), ('data',))


@pytest.mark.parametrize('name,option_set', pairs('dense', 'blockwise', 'queue'))
@pytest.mark.covering  # tests/covering.py
def test_shard_map_value_and_gradients_equal_the_global_batch(name, option_set):
  """Inside jit(shard_map) with axis_name: the value, each shard's feature gradient and
  the gradient of the replicated, traced options are the global batch's."""
  if jax.device_count() < 4:
    pytest.skip('needs 4 devices (tests/conftest.py sets them)')
  sharded = jax.jit(
    jax.shard_map(
      value_and_grads(loss_fn(name, option_set, axis_name='data')),
      mesh=_mesh(),
      in_specs=(P('data'), P('data'), P()),
      out_specs=(P(), (P('data'), P())),
    )
  )
  value, (d_z, d_p) = sharded(FEATURES, LABELS, params())
  expected_value, expected_d_z, expected_d_p = eager(name, option_set)
  np.testing.assert_allclose(value, expected_value, rtol=1e-5)
  np.testing.assert_allclose(d_z, expected_d_z, rtol=1e-4, atol=1e-6)
  for key in expected_d_p:
    np.testing.assert_allclose(d_p[key], expected_d_p[key], rtol=1e-4, atol=1e-6, err_msg=key)


@pytest.mark.parametrize('name', sorted(LOSSES))
def test_pmap_value_and_feature_gradient_equal_the_global_batch(name):
  if jax.device_count() < 4:
    pytest.skip('needs 4 devices (tests/conftest.py sets them)')
  f = loss_fn(name, 'dense', axis_name='i')
  mapped = jax.pmap(value_and_grads(f), axis_name='i', in_axes=(0, 0, None))
  value, (d_z, _) = mapped(FEATURES.reshape(4, 2, 2, 8), LABELS.reshape(4, 2), params())
  expected_value, expected_d_z, _ = eager(name, 'dense')
  np.testing.assert_allclose(value, np.full(4, expected_value), rtol=1e-5)
  # pmap transposes the loss's psum to a psum: every device's copy of the global loss
  # sends its gradient, so a shard's gradient is the global one times the device count
  # (shard_map's does not: its psum transposes to a copy).
  d_z = d_z.reshape(FEATURES.shape) / 4
  np.testing.assert_allclose(d_z, expected_d_z, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize('name', sorted(LOSSES))
def test_eval_shape_gives_the_shapes_and_dtypes_without_computing(name):
  shapes = jax.eval_shape(value_and_grads(loss_fn(name, 'blockwise')), FEATURES, LABELS, params())
  value, (d_z, d_p) = shapes
  assert (value.shape, value.dtype) == ((), jnp.float32)
  assert (d_z.shape, d_z.dtype) == (FEATURES.shape, jnp.float32)
  assert {key: (v.shape, v.dtype) for key, v in d_p.items()} == {
    key: ((), jnp.float32) for key in PARAMS
  }


@pytest.mark.parametrize('name', sorted(LOSSES))
@pytest.mark.parametrize('option_set', ['dense', 'blockwise'])
@pytest.mark.covering  # tests/covering.py
def test_forward_mode_matches_the_reference_and_reverse_mode(name, option_set):
  """jvp (in the features and a traced option at once), linearize and jacfwd: the
  directional derivative of the float64 reference, and jacfwd equals grad."""
  f = jax.jit(loss_fn(name, option_set))
  p = params()
  traced = 't' if name in SIGMOID else 'temperature'  # an option the loss reads
  p_tangent = {key: jnp.float32(key == traced) for key in p}
  value, tangent = jax.jvp(lambda z, p: f(z, LABELS, p), (FEATURES, p), (DIRECTION, p_tangent))
  reference = reference_of(name, option_set)
  z64 = np.asarray(FEATURES, np.float64)
  expected = central_difference(
    lambda t: reference(z64 + t * DIRECTION, dict(PARAMS, **{traced: PARAMS[traced] + t})), 0.0, 1.0
  )
  np.testing.assert_allclose(tangent, expected, rtol=1e-3, atol=1e-5)
  _, linear = jax.linearize(lambda z: f(z, LABELS, p), FEATURES)
  _, d_z, _ = eager(name, option_set)
  np.testing.assert_allclose(linear(DIRECTION), jnp.vdot(d_z, DIRECTION), rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(jax.jacfwd(f)(FEATURES, LABELS, p), d_z, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize('name', ['ucl', 'hscl_exp'])
def test_hessian_vector_product_matches_differences_of_the_gradient(name):
  """Second order works (the gradient formula is itself differentiable): H·u against
  central differences of the gradient."""
  grad = jax.jit(jax.grad(lambda z: loss_fn(name, 'dense')(z, LABELS, params())))
  hvp = jax.jvp(grad, (FEATURES,), (DIRECTION,))[1]
  eps = 1e-3
  expected = (grad(FEATURES + eps * DIRECTION) - grad(FEATURES - eps * DIRECTION)) / (2 * eps)
  np.testing.assert_allclose(hvp, expected, rtol=2e-2, atol=2e-4)


@pytest.mark.parametrize('name', sorted(LOSSES))
def test_jax_export_round_trip_gives_the_value_and_gradient(name):
  """A jitted loss, exported with its options as arguments, serialised with its VJP and
  deserialised: the same value and gradients (jax.export carries reverse mode only)."""
  pytest.importorskip('flatbuffers', reason="jax.export's serialisation needs flatbuffers")
  exported = export.export(jax.jit(loss_fn(name, 'dense')))(FEATURES, LABELS, params())
  restored = export.deserialize(exported.serialize(vjp_order=1))
  value, (d_z, d_p) = value_and_grads(restored.call)(FEATURES, LABELS, params())
  expected_value, expected_d_z, expected_d_p = eager(name, 'dense')
  np.testing.assert_allclose(value, expected_value, rtol=1e-5)
  np.testing.assert_allclose(d_z, expected_d_z, rtol=1e-4, atol=1e-6)
  for key in expected_d_p:
    np.testing.assert_allclose(d_p[key], expected_d_p[key], rtol=1e-4, atol=1e-6, err_msg=key)


@pytest.mark.parametrize('dtype', [jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize('name', sorted(LOSSES))
@pytest.mark.covering  # tests/covering.py
def test_half_precision_inputs_give_a_float32_value_and_gradients_of_their_dtype(name, dtype):
  """At temperature 0.05 (similarities up to 20): a float32 value equal to the loss of
  the rounded inputs in float32, and a finite gradient of the inputs' dtype."""
  p = dict(params(), temperature=jnp.float32(0.05))
  f = jax.jit(value_and_grads(loss_fn(name, 'dense')))
  half = FEATURES.astype(dtype)
  value, (d_z, _) = f(half, LABELS, p)
  expected_value, (expected_d_z, _) = f(half.astype(jnp.float32), LABELS, p)
  assert value.dtype == jnp.float32 and d_z.dtype == dtype
  assert np.isfinite(value) and np.all(np.isfinite(np.asarray(d_z, np.float32)))
  np.testing.assert_allclose(value, expected_value, rtol=1e-6)
  np.testing.assert_allclose(np.asarray(d_z, np.float32), expected_d_z, rtol=1e-2, atol=1e-3)


# --------------------------------------------------------------------------------------
# The graph losses, the diagnostics, the schedules and l2_normalize.


def graph_batch():
  nodes, graphs, dim = 10, 4, 6
  k1, k2 = jax.random.split(jax.random.key(60))
  local = jax.random.normal(k1, (nodes, dim))
  graph = jax.random.normal(k2, (graphs, dim))
  node_graph = jnp.array([0, 0, 0, 1, 1, 2, 2, 2, 3, 3])
  return local, graph, node_graph, jnp.array([0, 1, 0, 1])


GRAPH_LOSSES = {
  'jsd_hscl': lambda nodes, g, n, y, b: losses.local_global_jsd(
    nodes, g, n, graph_labels=y, hardening=losses.exponential(b)
  ),
  'infonce_hucl': lambda nodes, g, n, y, b: losses.local_global_infonce(
    nodes, g, n, hardening=losses.exponential(b)
  ),
}


@pytest.mark.parametrize('name', sorted(GRAPH_LOSSES))
def test_graph_losses_compose(name):
  """Value and gradient (node features, graph features, β) of grad∘jit, checkpoint, scan
  and vmap equal the eager call's."""
  local, graph, node_graph, labels = graph_batch()
  f = lambda nodes, g, b: GRAPH_LOSSES[name](nodes, g, node_graph, labels, b)
  grads = lambda f: jax.value_and_grad(f, argnums=(0, 1, 2))
  expected = grads(f)(local, graph, jnp.float32(1.0))

  def over_scan(nodes, g, b):
    return jax.lax.scan(lambda c, _: (c + f(nodes, g, b), None), 0.0, None, length=2)[0] / 2

  vmapped = jax.vmap(grads(jax.jit(f)), in_axes=(0, None, None))
  results = {
    'grad_of_jit': grads(jax.jit(f))(local, graph, 1.0),
    'grad_of_checkpoint': grads(jax.checkpoint(f))(local, graph, 1.0),
    'grad_of_scan_of_jit': grads(over_scan)(local, graph, 1.0),
    'vmap_of_grad_of_jit': jax.tree.map(
      lambda x: x[1], vmapped(jnp.stack([-local, local]), graph, 1.0)
    ),
  }
  for transform, got in results.items():
    jax.tree.map(
      lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=transform),
      got,
      expected,
    )


def test_diagnostics_compose_with_jit_vmap_scan_and_eval_shape():
  """batch_diagnostics, assumption1 and log_alphas with a traced β: jit, vmap over a
  batch of batches, scan and eval_shape equal the eager values."""
  diagnostics = {
    'batch_diagnostics': lambda z, y, b: losses.batch_diagnostics(
      z, y, hardening=losses.exponential(b)
    ),
    'assumption1': lambda z, y, b: losses.assumption1(z, y, hardening=losses.exponential(b)),
    'log_alphas': lambda z, y, b: losses.log_alphas(z, y, hardening=losses.exponential(b)),
  }
  other, other_labels = random_batch(61, batch=8, views=2, dim=8, num_classes=3)
  batches = (jnp.stack([FEATURES, other]), jnp.stack([LABELS, other_labels]))
  for name, f in diagnostics.items():
    expected = [f(FEATURES, LABELS, 1.0), f(other, other_labels, 1.0)]
    close = lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=name)
    jax.tree.map(close, jax.jit(f)(FEATURES, LABELS, jnp.float32(1.0)), expected[0])
    mapped = jax.vmap(f, in_axes=(0, 0, None))(*batches, 1.0)
    for i in range(2):
      jax.tree.map(close, jax.tree.map(lambda x: x[i], mapped), expected[i])
    scanned = jax.lax.scan(lambda c, zy: (c, f(*zy, 1.0)), 0.0, batches)[1]
    jax.tree.map(close, jax.tree.map(lambda x: x[1], scanned), expected[1])
    shapes = jax.eval_shape(f, FEATURES, LABELS, jnp.float32(1.0))
    jax.tree.map(lambda s, e: (s.shape, s.dtype) == (e.shape, e.dtype), shapes, expected[0])


def test_schedules_and_l2_normalize_compose():
  """tau_schedule and beta_schedule of a traced epoch (jit, vmap) equal their host values;
  l2_normalize's gradient under grad∘jit and vmap equals the eager one."""
  epochs = jnp.arange(1, 9)
  tau = jax.jit(jax.vmap(lambda e: losses.tau_schedule(e, start=-0.5, end=0.1, num_epochs=8)))
  beta = jax.jit(jax.vmap(lambda e: losses.beta_schedule(e, beta=2.0, num_epochs=8, num_steps=4)))
  host_tau = [losses.tau_schedule(int(e), start=-0.5, end=0.1, num_epochs=8) for e in epochs]
  host_beta = [losses.beta_schedule(int(e), beta=2.0, num_epochs=8, num_steps=4) for e in epochs]
  np.testing.assert_allclose(tau(epochs), host_tau, rtol=1e-6)
  np.testing.assert_allclose(beta(epochs), host_beta, rtol=1e-6)
  x = jax.random.normal(jax.random.key(62), (3, 5))
  f = lambda x: jnp.sum(losses.l2_normalize(x) * jnp.arange(5.0))
  # float32 rounding: jitted, XLA fuses the normalisation's operations (5e-6 apart here).
  np.testing.assert_allclose(jax.grad(jax.jit(f))(x), jax.grad(f)(x), rtol=1e-5)
  np.testing.assert_allclose(jax.vmap(jax.grad(f))(x[None])[0], jax.grad(f)(x), rtol=1e-5)
  np.testing.assert_allclose(normalized(x), losses.l2_normalize(x), rtol=1e-6)
