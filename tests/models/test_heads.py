"""models/heads: the projection head's and ContrastiveModel's own defaults are the default
config's (library use builds the paper's model)."""

from __future__ import annotations

import jax
import numpy as np

from hscl_jax import models
from hscl_jax.models import heads


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


def test_the_head_is_dense_norm_activation_dense():
  """At init, against NumPy from its parameters: x W1 (no bias), layer norm (unit scale, zero
  bias), ReLU, then W2 + b2: the order the paper's head applies them."""
  head = heads.ProjectionHead(hidden=6, out=3, norm='layer', activation='relu')
  x = np.random.default_rng(0).normal(1.0, 2.0, size=(4, 5)).astype(np.float32)
  variables = head.init(jax.random.key(0), x, train=False)
  params = jax.tree.map(lambda a: np.asarray(a, np.float64), variables['params'])
  assert 'bias' not in params['Dense_0']
  y = x.astype(np.float64) @ params['Dense_0']['kernel']
  y = (y - y.mean(-1, keepdims=True)) / np.sqrt(y.var(-1, keepdims=True) + 1e-5)
  expected = np.maximum(y, 0) @ params['Dense_1']['kernel'] + params['Dense_1']['bias']
  got = head.apply(variables, x, train=False)
  assert got.shape == (4, 3)
  np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
