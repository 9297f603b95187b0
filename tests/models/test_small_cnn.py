"""models/small_cnn: the side halved at its strided layers, and Flax's 'SAME' padding whatever
config.model.strided_padding says (it has no torchvision counterpart)."""

from __future__ import annotations

import functools

from flax import linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hscl_jax import models
from hscl_jax.models import backbones
from hscl_jax.models import layers
from hscl_jax.models import small_cnn
from models.test_factory import host_variables
from models.test_factory import jit_apply
from models.test_factory import model_config


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


def test_small_cnn_ignores_strided_padding():
  """Only the ResNets have torchvision's counterpart; small_cnn keeps Flax's 'SAME'."""
  outputs = []
  for padding in layers.STRIDED_PADDINGS:
    model = models.create_model(model_config(strided_padding=padding))
    variables = host_variables(model, (8, 8, 3), random_norms=True)
    x = np.random.default_rng(1).normal(size=(2, 8, 8, 3)).astype(np.float32)
    outputs.append(np.asarray(jit_apply(model, train=False, method='features')(variables, x)))
  np.testing.assert_array_equal(*outputs)


def test_its_features_are_the_last_widths_channels_pooled_over_the_pixels():
  """Any widths and strides: the output is [batch, widths[-1]], the mean over the last
  convolution's pixels (checked through its captured activation)."""
  model = small_cnn.SmallCNN(widths=(4, 6), strides=(2, 1))
  x = np.random.default_rng(0).normal(size=(3, 6, 6, 3)).astype(np.float32)
  variables = jax.jit(functools.partial(model.init, train=False))(jax.random.key(0), x)
  is_last_norm = lambda module, _: module.name == 'BatchNorm_1'
  apply = functools.partial(model.apply, train=False, capture_intermediates=is_last_norm)
  features, state = jax.jit(apply)(variables, x)
  (normed,) = state['intermediates']['BatchNorm_1']['__call__']
  assert features.shape == (3, 6) and normed.shape == (3, 3, 3, 6)
  np.testing.assert_allclose(features, np.maximum(normed, 0).mean(axis=(1, 2)), rtol=1e-6)
