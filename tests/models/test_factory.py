"""Backbones, projection head, BatchNorm behaviour (incl. cross-device sync)."""

from __future__ import annotations

import functools

from flax import linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P
from jaxprs import equations
import ml_collections
import numpy as np
import pytest

from hscl_jax import models
from hscl_jax.models import backbones
from hscl_jax.models import layers
from hscl_jax.rundir import versions


def model_config(**overrides):
  config = ml_collections.ConfigDict(
    dict(
      name='small_cnn',
      stem='cifar',
      norm='batch',
      activation='relu',
      strided_padding='symmetric',
      head_hidden=32,
      head_out=16,
      dtype='float32',
      bn_momentum=0.9,
    )
  )
  config.update(overrides)
  return config


def abstract_apply(model, image_shape, batch=2, train=True):
  """Output and variable shapes/dtypes without compiling (jax.eval_shape)."""
  x = jax.ShapeDtypeStruct((batch, *image_shape), jnp.float32)
  variables = jax.eval_shape(lambda x: model.init(jax.random.key(0), x, train=False), x)
  outputs = jax.eval_shape(
    lambda v, x: model.apply(v, x, train=train, mutable=['batch_stats']), variables, x
  )
  return variables, outputs


@pytest.mark.parametrize(
  'name, stem, image_shape',
  [
    ('resnet18', 'cifar', (32, 32, 3)),
    ('resnet34', 'cifar', (32, 32, 3)),
    ('resnet50', 'cifar', (32, 32, 3)),
    ('resnet18', 'imagenet', (96, 96, 3)),
    ('resnet50', 'imagenet', (96, 96, 3)),
    ('small_cnn', 'cifar', (8, 8, 3)),
    ('small_cnn', 'cifar', (32, 32, 3)),
  ],
)
def test_output_shapes(name, stem, image_shape):
  model = models.create_model(model_config(name=name, stem=stem, head_hidden=512, head_out=128))
  variables, ((h, z), updates) = abstract_apply(model, image_shape)
  assert h.shape == (2, models.feature_dim(name)) and h.dtype == jnp.float32
  assert z.shape == (2, 128) and z.dtype == jnp.float32
  assert set(variables) == {'params', 'batch_stats'}
  assert set(updates) == {'batch_stats'}


def test_the_models_own_defaults_are_the_default_configs():
  """ContrastiveModel() built directly (library use) is the model configs/default.py builds:
  the paper's ResNet-50, CIFAR stem, 512 -> 128 head, BatchNorm at 0.9, ReLU."""
  from configs import default

  built = models.create_model(default.get_config().model)
  bare = models.ContrastiveModel()
  fields = ('backbone', 'stem', 'head_hidden', 'head_out', 'dtype', 'norm', 'activation')
  for field in (*fields, 'strided_padding', 'bn_axis_name', 'bn_momentum'):
    assert getattr(bare, field) == getattr(built, field), field
  assert (bare.backbone, bare.head_hidden, bare.head_out) == ('resnet50', 512, 128)
  head = models.heads.ProjectionHead()
  assert (head.hidden, head.out, head.norm, head.activation, head.bn_momentum) == (
    built.head_hidden,
    built.head_out,
    built.norm,
    built.activation,
    built.bn_momentum,
  )


def test_feature_dims():
  assert models.feature_dim('resnet18') == 512
  assert models.feature_dim('resnet34') == 512
  assert models.feature_dim('resnet50') == 2048
  assert models.feature_dim('small_cnn') == 128


def test_initialize():
  """The compiled flax initialiser (slow to compile on CPU: threefry; other tests avoid it)."""
  model = models.create_model(model_config())
  variables = models.initialize(model, jax.random.key(0), (8, 8, 3))
  shapes, _ = abstract_apply(model, (8, 8, 3))
  assert jax.tree.structure(variables) == jax.tree.structure(shapes)
  assert {x.dtype for x in jax.tree.leaves(variables)} == {jnp.dtype(jnp.float32)}
  stats = variables['batch_stats']['head']['BatchNorm_0']
  np.testing.assert_array_equal(stats['mean'], 0.0)
  np.testing.assert_array_equal(stats['var'], 1.0)
  kernel = variables['params']['encoder']['Conv_0']['kernel']
  assert kernel.shape == (3, 3, 3, 32) and 0.0 < float(jnp.std(kernel)) < 1.0


def test_parameter_counts():
  """Standard sizes: ResNet-18 11.17M, ResNet-34 21.28M and ResNet-50 23.51M backbone
  parameters with the CIFAR stem; with the ImageNet stem, torchvision's less its classifier."""
  counts = {}
  for name, stem in (
    ('resnet18', 'cifar'),
    ('resnet34', 'cifar'),
    ('resnet50', 'cifar'),
    ('resnet18', 'imagenet'),
  ):
    model = backbones.make_backbone(name, stem=stem)
    x = jax.ShapeDtypeStruct((1, 32, 32, 3), jnp.float32)
    params = jax.eval_shape(lambda x: model.init(jax.random.key(0), x, train=False), x)['params']
    counts[name, stem] = sum(p.size for p in jax.tree.leaves(params))
  # torchvision's ImageNet counts minus the 1000-way classifier; the CIFAR stem's 3x3
  # convolution has 64 * 3 * (49 - 9) weights fewer than the 7x7 one.
  cifar_stem = 64 * 3 * (49 - 9)
  assert counts['resnet18', 'imagenet'] == 11_689_512 - 513_000
  assert counts['resnet18', 'cifar'] == 11_689_512 - 513_000 - cifar_stem
  assert counts['resnet34', 'cifar'] == 21_797_672 - 513_000 - cifar_stem
  assert counts['resnet50', 'cifar'] == 25_557_032 - 2_049_000 - cifar_stem


@pytest.mark.parametrize('side, sides', [(8, [8, 4, 4, 2]), (32, [32, 16, 16, 8])])
def test_small_cnn_halves_the_side_at_its_strided_layers(side, sides):
  """Strides (1, 2, 1, 2): an 8x8 digit is 8, 4, 4 and 2 pixels wide after the four
  convolutions (the class docstring's 2x2 before pooling), a 32x32 image 32, 16, 16, 8."""
  model = backbones.make_backbone('small_cnn')
  x = jax.ShapeDtypeStruct((1, side, side, 3), jnp.float32)

  def convolved(x):
    variables = model.init(jax.random.key(0), x, train=False)
    is_conv = lambda module, _: isinstance(module, nn.Conv)
    return model.apply(variables, x, train=False, capture_intermediates=is_conv)[1]

  outputs = jax.eval_shape(convolved, x)['intermediates']
  got = [outputs[f'Conv_{i}']['__call__'][0].shape[1:3] for i in range(4)]
  assert got == [(s, s) for s in sides]


def host_variables(model, image_shape, seed=0, *, random_norms=False):
  """Random variables built on the host from the abstract shapes (no compiled init); the
  normalisation layers' scales and variances 1, biases and means 0, or (random_norms)
  drawn away from those, so that each one matters.

  Compiling ResNet-50's random initialiser costs more than its training step.
  """
  rng = np.random.default_rng(seed)
  shapes, _ = abstract_apply(model, image_shape)

  def fill(path, leaf):
    name = path[-1].key
    # Filled in NumPy: a jnp.broadcast_to per leaf shape is a program to compile (ResNet-50
    # has ~140 shapes: 20 s).
    if name in ('scale', 'var'):
      value = rng.uniform(0.5, 1.5, leaf.shape) if random_norms else 1.0
    elif name in ('bias', 'mean'):
      value = rng.normal(0.0, 0.2, leaf.shape) if random_norms else 0.0
    else:
      value = rng.normal(scale=np.sqrt(1.0 / int(np.prod(leaf.shape[:-1]))), size=leaf.shape)
    return jnp.asarray(np.broadcast_to(value, leaf.shape).astype(leaf.dtype))

  return jax.tree_util.tree_map_with_path(fill, shapes)


def test_resnet50_forward_and_grad_step():
  """The paper's network: one training forward + gradient, batch 2 at 32x32."""
  model = models.create_model(model_config(name='resnet50', head_hidden=512, head_out=128))
  variables = host_variables(model, (32, 32, 3))
  x = jax.random.normal(jax.random.key(1), (2, 32, 32, 3))

  @jax.jit
  def step(variables, x):
    def loss_fn(params):
      (h, z), updates = model.apply(
        {'params': params, 'batch_stats': variables['batch_stats']},
        x,
        train=True,
        mutable=['batch_stats'],
      )
      z = z / jnp.linalg.norm(z, axis=-1, keepdims=True)
      return -jnp.sum(z[0] * z[1]), (h, z, updates)

    (loss, (h, z, updates)), grads = jax.value_and_grad(loss_fn, has_aux=True)(variables['params'])
    return loss, h, z, updates, grads

  loss, h, z, updates, grads = step(variables, x)
  assert h.shape == (2, 2048) and z.shape == (2, 128)
  assert h.dtype == jnp.float32 and z.dtype == jnp.float32
  assert np.isfinite(float(loss))
  leaves = [np.asarray(g) for g in jax.tree.leaves(grads)]  # NumPy: no program per shape
  assert all(np.all(np.isfinite(g)) for g in leaves)
  assert sum(float(np.sum(np.abs(g))) for g in leaves) > 0
  assert jax.tree.structure(updates['batch_stats']) == jax.tree.structure(variables['batch_stats'])


def jit_apply(model, **kwargs):
  """model.apply(variables, x, **kwargs), compiled (eager flax runs op by op: slow)."""
  return jax.jit(functools.partial(model.apply, **kwargs))


def test_bfloat16_compute_float32_params():
  model = models.create_model(model_config(dtype='bfloat16'))
  variables = host_variables(model, (8, 8, 3))
  assert {x.dtype for x in jax.tree.leaves(variables)} == {jnp.dtype(jnp.float32)}
  x = jax.random.normal(jax.random.key(1), (4, 8, 8, 3))
  ((h, z), state) = jit_apply(
    model, train=True, mutable=['batch_stats', 'intermediates'], capture_intermediates=True
  )(variables, x)
  assert h.dtype == jnp.float32 and z.dtype == jnp.float32
  conv_out = state['intermediates']['encoder']['Conv_0']['__call__'][0]
  assert conv_out.dtype == jnp.bfloat16
  assert {x.dtype for x in jax.tree.leaves(state['batch_stats'])} == {jnp.dtype(jnp.float32)}
  # bf16 is close to the float32 model with the same weights.
  (h32, _), _ = jit_apply(models.create_model(model_config()), train=True, mutable=['batch_stats'])(
    variables, x
  )
  np.testing.assert_allclose(h, h32, atol=0.1, rtol=0.1)
  # Abstractly, the same holds for the ResNet-50.
  model = models.create_model(model_config(name='resnet50', dtype='bfloat16'))
  variables, ((h, z), _) = abstract_apply(model, (32, 32, 3))
  assert {x.dtype for x in jax.tree.leaves(variables)} == {jnp.dtype(jnp.float32)}
  assert h.dtype == jnp.float32 and z.dtype == jnp.float32


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


def test_create_model_fields():
  model = models.create_model(
    model_config(
      name='resnet34',
      stem='imagenet',
      head_hidden=64,
      head_out=8,
      dtype='bfloat16',
      bn_momentum=0.99,
    ),
    bn_axis_name='batch',
  )
  assert model.backbone == 'resnet34' and model.stem == 'imagenet'
  assert (model.head_hidden, model.head_out) == (64, 8)
  assert model.dtype == jnp.bfloat16 and model.bn_momentum == 0.99
  assert model.bn_axis_name == 'batch'
  # A ResNet's config.json of format 0 (the padding shapes only the ResNets), as read.
  stored_before_the_fields = model_config(name='resnet18').to_dict()
  del stored_before_the_fields['activation'], stored_before_the_fields['strided_padding']
  migrated = versions.migrate_config({'model': stored_before_the_fields})['model']
  stored = models.create_model(ml_collections.ConfigDict(migrated))
  assert (stored.activation, stored.strided_padding) == ('relu', 'same')


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


@pytest.mark.parametrize(
  'overrides, match',
  [
    (dict(name='resnet101'), 'resnet18, resnet34, resnet50, small_cnn'),
    (dict(stem='tiny'), 'model.stem'),
    (dict(norm='instance'), 'model.norm'),
    (dict(activation='tanh'), 'model.activation'),
    (dict(strided_padding='valid'), 'model.strided_padding'),
    (dict(dtype='float16'), 'model.dtype'),
    (dict(bn_momentum=1.0), 'model.bn_momentum'),
    (dict(head_out=0), 'model.head_out'),
  ],
)
def test_create_model_rejects_bad_config(overrides, match):
  with pytest.raises(ValueError, match=match):
    models.create_model(model_config(**overrides))
  if 'name' in overrides:
    with pytest.raises(ValueError, match='valid names'):
      models.feature_dim(overrides['name'])


# ----------------------------------------------------------------------------------------
# The ResNets' padding, against a float64 NumPy ResNet written from torchvision's definition.


def _reference_conv(x, kernel, stride, pads):
  """x NHWC, kernel HWIO, pads ((top, bottom), (left, right)) of zeros, in float64."""
  x = np.pad(x, ((0, 0), *pads, (0, 0)))
  kh, kw = kernel.shape[:2]
  out_h, out_w = (x.shape[1] - kh) // stride + 1, (x.shape[2] - kw) // stride + 1
  out = np.zeros((x.shape[0], out_h, out_w, kernel.shape[3]))
  for i in range(kh):
    for j in range(kw):
      rows = x[
        :, i : i + stride * (out_h - 1) + 1 : stride, j : j + stride * (out_w - 1) + 1 : stride
      ]
      out += rows @ kernel[i, j]
  return out


def _reference_bn(x, params, stats):
  return (x - stats['mean']) / np.sqrt(stats['var'] + 1e-5) * params['scale'] + params['bias']


def _reference_block(x, params, stats, stride, strided_pads):
  """torchvision's BasicBlock / Bottleneck (v1.5: the stride on the 3x3 convolution)."""
  convs = sorted((k for k in params if k.startswith('Conv_')), key=lambda k: int(k[5:]))
  strided = next(i for i, k in enumerate(convs) if params[k]['kernel'].shape[0] == 3)
  y = x
  for i, conv in enumerate(convs):
    kernel = params[conv]['kernel']
    k = kernel.shape[0]
    if i == strided and stride == 2:
      pads = strided_pads(y.shape[1:3])
    else:
      pads = ((k // 2, k // 2),) * 2
    y = _reference_conv(y, kernel, stride if i == strided else 1, pads)
    y = _reference_bn(y, params[f'BatchNorm_{i}'], stats[f'BatchNorm_{i}'])
    if i < len(convs) - 1:
      y = np.maximum(y, 0)
  if 'conv_proj' in params:
    x = _reference_conv(x, params['conv_proj']['kernel'], stride, ((0, 0), (0, 0)))
    x = _reference_bn(x, params['norm_proj'], stats['norm_proj'])
  return np.maximum(x + y, 0)


def _reference_resnet(variables, x, stem, stage_sizes, strided_pads):
  """Pooled features; `strided_pads(size)` pads the stride-2 3x3 convolutions."""
  params = jax.tree.map(lambda a: np.asarray(a, np.float64), variables['params']['encoder'])
  stats = jax.tree.map(lambda a: np.asarray(a, np.float64), variables['batch_stats']['encoder'])
  kernel = params['conv_init']['kernel']
  pads = ((kernel.shape[0] // 2,) * 2,) * 2  # torchvision: 3x3 pads 1, 7x7 pads 3
  y = _reference_conv(np.asarray(x, np.float64), kernel, 1 if stem == 'cifar' else 2, pads)
  y = np.maximum(_reference_bn(y, params['bn_init'], stats['bn_init']), 0)
  if stem == 'imagenet':  # max-pool 3x3, stride 2, padding 1
    y = np.pad(y, ((0, 0), (1, 1), (1, 1), (0, 0)), constant_values=-np.inf)
    h, w = (y.shape[1] - 3) // 2 + 1, (y.shape[2] - 3) // 2 + 1
    windows = [
      y[:, i : i + 2 * h - 1 : 2, j : j + 2 * w - 1 : 2] for i in range(3) for j in range(3)
    ]
    y = np.max(windows, axis=0)
  blocks = [k for k in params if k.startswith(('BasicBlock_', 'Bottleneck_'))]
  blocks.sort(key=lambda k: int(k.rsplit('_', 1)[1]))
  strides = [
    2 if stage > 0 and j == 0 else 1 for stage, n in enumerate(stage_sizes) for j in range(n)
  ]
  for name, stride in zip(blocks, strides, strict=True):
    y = _reference_block(y, params[name], stats[name], stride, strided_pads)
  return y.mean(axis=(1, 2))


def _torchvision_pads(size):
  return ((1, 1), (1, 1))


def _flax_same_pads(size):
  """Flax's 'SAME' for a 3x3 stride-2 convolution: one after, one before if odd."""
  return tuple((n % 2, 1) for n in size)


@pytest.mark.parametrize(
  'name, stem, size', [('resnet18', 'cifar', 8), ('resnet50', 'imagenet', 32)]
)
def test_strided_convolutions_pad_as_torchvision(name, stem, size):
  """strided_padding='symmetric' pads the stride-2 3x3 convolutions one pixel on each side
  (torchvision's, the paper's model), 'same' as Flax's 'SAME' (runs stored before the
  field). Every strided convolution sees an even size (8, 4, 2), where the two differ."""
  stage_sizes = backbones.BACKBONES[name][0].keywords['stage_sizes']
  x = np.random.default_rng(1).normal(size=(2, size, size, 3)).astype(np.float32)
  pads = {'symmetric': _torchvision_pads, 'same': _flax_same_pads}
  for padding, other in (('symmetric', 'same'), ('same', 'symmetric')):
    model = models.create_model(model_config(name=name, stem=stem, strided_padding=padding))
    variables = host_variables(model, (size, size, 3), random_norms=True)
    features = jit_apply(model, train=False, method='features')(variables, x)
    expected = _reference_resnet(variables, x, stem, stage_sizes, pads[padding])
    tolerance = 1e-5 * float(np.max(np.abs(expected)))
    np.testing.assert_allclose(np.asarray(features, np.float64), expected, rtol=0, atol=tolerance)
    wrong = _reference_resnet(variables, x, stem, stage_sizes, pads[other])
    assert np.max(np.abs(wrong - expected)) > 100 * tolerance, padding


def test_small_cnn_ignores_strided_padding():
  """Only the ResNets have torchvision's counterpart; small_cnn keeps Flax's 'SAME'."""
  outputs = []
  for padding in layers.STRIDED_PADDINGS:
    model = models.create_model(model_config(strided_padding=padding))
    variables = host_variables(model, (8, 8, 3), random_norms=True)
    x = np.random.default_rng(1).normal(size=(2, 8, 8, 3)).astype(np.float32)
    outputs.append(np.asarray(jit_apply(model, train=False, method='features')(variables, x)))
  np.testing.assert_array_equal(*outputs)
