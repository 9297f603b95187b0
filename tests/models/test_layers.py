"""models/layers: BatchNorm's statistics in train and eval mode and synced over 4 devices,
group and layer norm per sample, and the activation at every site of every backbone."""

from __future__ import annotations

import re

from acceptance import refused
import jax
import jax.numpy as jnp
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P
from jaxprs import equations
import numpy as np
import pytest

from hscl_jax import models
from hscl_jax.models import layers
from models.test_factory import abstract_apply
from models.test_factory import host_variables
from models.test_factory import jit_apply
from models.test_factory import model_config


def test_batchnorm_train_updates_stats_eval_does_not():
  momentum = 0.8
  model = models.create_model(model_config(bn_momentum=momentum))
  variables = host_variables(model, (8, 8, 3))
  x = 2.0 + jax.random.normal(jax.random.key(1), (8, 8, 8, 3))

  (_, z_train), state = jit_apply(
    model, train=True, mutable=['batch_stats', 'intermediates'], capture_intermediates=True
  )(variables, x)
  stats = state['batch_stats']['encoder']['BatchNorm_0']
  conv_out = state['intermediates']['encoder']['Conv_0']['__call__'][0]
  np.testing.assert_allclose(
    stats['mean'], (1 - momentum) * conv_out.mean(axis=(0, 1, 2)), rtol=1e-4, atol=1e-6
  )
  np.testing.assert_allclose(
    stats['var'], momentum + (1 - momentum) * conv_out.var(axis=(0, 1, 2)), rtol=1e-4
  )
  # Eval mode leaves the statistics alone and uses them instead of the batch's.
  (_, z_eval), eval_state = jit_apply(model, train=False, mutable=['batch_stats'])(variables, x)
  jax.tree.map(np.testing.assert_array_equal, eval_state['batch_stats'], variables['batch_stats'])
  assert not np.allclose(z_train, z_eval)
  # Eval mode needs no mutable collection and is per-example.
  updated = {'params': variables['params'], 'batch_stats': state['batch_stats']}
  eval_apply = jit_apply(model, train=False)
  h1, _ = eval_apply(updated, x)
  h2, _ = eval_apply(updated, x[:1])
  np.testing.assert_allclose(h1[:1], h2, rtol=1e-5, atol=1e-6)
  # `features` is the backbone output alone.
  h3 = jit_apply(model, method='features')(updated, x)
  np.testing.assert_allclose(h1, h3, rtol=1e-6)


def test_batchnorm_sync_across_devices():
  """shard_map on 4 devices with bn_axis_name: the same as 1 device on the global batch."""
  devices = jax.devices()
  assert len(devices) == 4, 'tests/conftest.py sets 4 fake CPU devices'
  mesh = Mesh(np.array(devices), ('data',))
  config = model_config()
  single = models.create_model(config)
  synced = models.create_model(config, bn_axis_name='data')
  variables = host_variables(single, (8, 8, 3))
  x = jax.random.normal(jax.random.key(1), (16, 8, 8, 3))
  # Per-device shards with very different statistics: unsynchronised BN would differ.
  x = x + jnp.repeat(jnp.arange(4.0), 4)[:, None, None, None]

  def loss_fn(params, batch_stats, x, model):
    (h, z), updates = model.apply(
      {'params': params, 'batch_stats': batch_stats}, x, train=True, mutable=['batch_stats']
    )
    return jnp.sum(z**2) / 16 + jnp.sum(h**2) / 16, (h, z, updates['batch_stats'])

  def single_step(params, batch_stats, x):
    return jax.value_and_grad(loss_fn, has_aux=True)(params, batch_stats, x, single)

  def local_step(params, batch_stats, x):
    # Local loss terms; the gradient w.r.t. the replicated params is summed over devices.
    (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, batch_stats, x, synced)
    return (jax.lax.psum(loss, 'data'), aux), grads

  sharded_step = jax.jit(
    jax.shard_map(
      local_step,
      mesh=mesh,
      in_specs=(P(), P(), P('data')),
      out_specs=((P(), (P('data'), P('data'), P())), P()),
    )
  )
  (loss1, (h1, z1, stats1)), grads1 = jax.jit(single_step)(
    variables['params'], variables['batch_stats'], x
  )
  (loss4, (h4, z4, stats4)), grads4 = sharded_step(variables['params'], variables['batch_stats'], x)
  tol = dict(rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(loss4, loss1, **tol)
  np.testing.assert_allclose(h4, h1, **tol)
  np.testing.assert_allclose(z4, z1, **tol)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, **tol), stats4, stats1)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-5), grads4, grads1)


@pytest.mark.parametrize('norm', ['group', 'layer'])
def test_group_and_layer_norm_are_per_sample(norm):
  """No batch statistics, each sample normalised on its own: its output ignores the batch."""
  for name in ('resnet18', 'resnet50'):  # shapes only: every width gets a valid group count
    variables, ((h, z), updates) = abstract_apply(
      models.create_model(model_config(name=name, norm=norm)), (32, 32, 3)
    )
    assert set(variables) == {'params'} and not updates
  model = models.create_model(model_config(norm=norm), bn_axis_name=None)
  variables = host_variables(model, (8, 8, 3))
  assert set(variables) == {'params'}
  x = 3.0 + 2.0 * jax.random.normal(jax.random.key(1), (4, 8, 8, 3))
  (h, z), state = jit_apply(
    model, train=True, mutable=['intermediates'], capture_intermediates=True
  )(variables, x)
  h1, z1 = jit_apply(model, train=True)(variables, x[1:2])
  np.testing.assert_allclose(h[1:2], h1, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(z[1:2], z1, rtol=1e-5, atol=1e-6)
  # The first norm layer (unit scale, zero bias) standardises each sample's channel groups:
  # 32 channels -> 32 groups of one channel over the pixels (group) or all channels per pixel.
  inner = state['intermediates']['encoder']
  layer = inner['GroupNorm_0']['norm'] if norm == 'group' else inner['LayerNorm_0']
  y = np.asarray(layer['__call__'][0], np.float64)
  axes = (1, 2) if norm == 'group' else (3,)
  np.testing.assert_allclose(y.mean(axis=axes), 0.0, atol=1e-4)
  np.testing.assert_allclose(y.var(axis=axes), 1.0, atol=2e-3)


def _primitive_counts(model, primitives):
  """How often each of `primitives` occurs in the jaxpr of an eval-mode forward (nested
  jaxprs included), traced from abstract variables: nothing compiles."""
  x = jax.ShapeDtypeStruct((2, 8, 8, 3), jnp.float32)
  variables = jax.eval_shape(lambda x: model.init(jax.random.key(0), x, train=False), x)
  found = dict.fromkeys(primitives, 0)
  jaxpr = jax.make_jaxpr(lambda v, x: model.apply(v, x, train=False))(variables, x).jaxpr
  for eqn in equations(jaxpr):
    if eqn.primitive.name in found:
      found[eqn.primitive.name] += 1
  return found


@pytest.mark.parametrize(
  'name, sites', [('small_cnn', 4 + 1), ('resnet18', 1 + 2 * 8 + 1), ('resnet50', 1 + 3 * 16 + 1)]
)
def test_activation_is_applied_at_every_site(name, sites):
  """The stem, every conv (and residual sum) of every block and the head use
  model.activation: relu's max, silu's logistic, gelu's tanh (the approximate form), each
  exactly once per site, and no other activation's primitive."""
  primitive = {'relu': 'max', 'silu': 'logistic', 'gelu': 'tanh'}
  assert set(primitive) == set(layers.ACTIVATIONS)
  for activation, own in primitive.items():
    model = models.create_model(model_config(name=name, activation=activation))
    counts = _primitive_counts(model, primitive.values())
    assert counts == {p: sites if p == own else 0 for p in primitive.values()}, activation


@pytest.mark.parametrize('channels, groups', [(48, 16), (12, 4), (64, 32)])
def test_group_norm_takes_gcd_of_32_and_the_channels_groups(channels, groups):
  """Against a float64 NumPy group norm: each sample's `groups` channel groups standardised
  over their pixels and channels (unit scale, zero bias at init)."""
  x = np.random.default_rng(channels).normal(2.0, 3.0, size=(2, 3, 3, channels))
  module = layers.GroupNorm()
  variables = jax.jit(module.init)(jax.random.key(0), x.astype(np.float32))
  got = jax.jit(module.apply)(variables, x.astype(np.float32))
  grouped = x.reshape(2, 3, 3, groups, channels // groups)
  mean = grouped.mean(axis=(1, 2, 4), keepdims=True)
  std = np.sqrt(grouped.var(axis=(1, 2, 4), keepdims=True) + 1e-5)
  np.testing.assert_allclose(got, ((grouped - mean) / std).reshape(x.shape), atol=1e-4)


def test_an_unknown_norm_or_activation_is_one_line_naming_the_choices():
  norms = 'Fix: use one of the valid norms: batch, group, layer.'
  with refused(f"^config\\.model\\.norm: unknown value 'instance'\\. {re.escape(norms)}$"):
    layers.norm_layer('instance', True, 0.9, None, jnp.float32)
  activations = 'Fix: use one of the valid activations: gelu, relu, silu.'
  with refused(f"^config\\.model\\.activation: unknown value 'tanh'\\. {re.escape(activations)}$"):
    layers.activation_fn('tanh')
