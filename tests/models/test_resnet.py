"""models/resnet: the standard parameter counts, the paper's ResNet-50 trained one step, and
the stride-2 convolutions' padding against a float64 NumPy ResNet written from torchvision's
definition."""

from __future__ import annotations

import functools

from flax import linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hscl_jax import models
from hscl_jax.models import backbones
from hscl_jax.models import resnet
from models.test_factory import host_variables
from models.test_factory import jit_apply
from models.test_factory import model_config


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


@pytest.mark.parametrize('block, expansion', [(resnet.BasicBlock, 1), (resnet.Bottleneck, 4)])
def test_a_block_starts_as_the_identity_and_projects_where_the_shape_changes(block, expansion):
  """Its last norm's scale starts at zero: at init a block whose input has its output's
  shape gives ReLU(x). Stride 2, or other channels, adds a 1x1 projection shortcut and
  halves the side."""
  conv = functools.partial(nn.Conv, use_bias=False)
  norm = functools.partial(nn.BatchNorm, use_running_average=True)
  width = 8 * expansion

  def built(strides, channels):
    module = block(filters=8, conv=conv, norm=norm, act=nn.relu, strides=strides)
    x = jax.ShapeDtypeStruct((2, 6, 6, channels), jnp.float32)
    variables = jax.eval_shape(module.init, jax.random.key(0), x)
    return module, jax.eval_shape(module.apply, variables, x).shape, variables['params']

  _, shape, params = built(1, width)
  assert shape == (2, 6, 6, width) and 'conv_proj' not in params
  for strides, channels, side in ((2, width, 3), (1, 3, 6)):
    _, shape, params = built(strides, channels)
    assert shape == (2, side, side, width) and 'conv_proj' in params
  module = block(filters=8, conv=conv, norm=norm, act=nn.relu)
  x = np.random.default_rng(0).normal(size=(2, 6, 6, width)).astype(np.float32)
  variables = jax.jit(module.init)(jax.random.key(0), x)
  np.testing.assert_allclose(jax.jit(module.apply)(variables, x), np.maximum(x, 0), atol=1e-6)
