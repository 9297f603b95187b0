"""models/factory: create_model's output shapes and fields (a stored run's format-0 config
migrated), its one-line refusals, initialize's variables, and bfloat16 compute with float32
parameters; the helpers the model tests share (abstract shapes, host-built variables, a
compiled apply)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from hscl_jax import models
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
