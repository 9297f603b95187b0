"""The model a config names: `create_model` (the one validation of config.model) and the
initial variables."""

from __future__ import annotations

from collections.abc import Sequence
import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp

from hscl_jax import errors
from hscl_jax.models import backbones
from hscl_jax.models import heads
from hscl_jax.models import layers

DTYPES = {'float32': jnp.float32, 'bfloat16': jnp.bfloat16}


_CHOICES = {'activation': layers.ACTIVATIONS, 'strided_padding': layers.STRIDED_PADDINGS}


def configured(model_config, field: str) -> str:
  """config.model.<field> (activation or strided_padding), validated. A config.model without
  it builds what ContrastiveModel() builds: a stored small_cnn run of format 0 lacks
  strided_padding (rundir/versions), which small_cnn's convolutions do not read."""
  default = {f.name: f.default for f in dataclasses.fields(heads.ContrastiveModel)}[field]
  value = model_config.get(field, default)
  layers.check_choice(field, value, _CHOICES[field])
  return value


def create_model(model_config, *, bn_axis_name: str | None = None) -> heads.ContrastiveModel:
  """ContrastiveModel from `config.model` (name, stem, norm, activation, strided_padding,
  head_hidden, head_out, dtype, bn_momentum).

  The one validation of config.model: raises ConfigError (a ValueError) naming the field
  and the fix.
  """
  name = model_config.name
  backbones.check_name(name)
  norm = model_config.norm
  layers.check_choice('norm', norm, layers.NORMS)
  layers.check_choice('stem', model_config.stem, layers.STEMS)
  layers.check_choice('dtype', model_config.dtype, DTYPES)
  activation = configured(model_config, 'activation')
  strided_padding = configured(model_config, 'strided_padding')
  if not 0.0 <= model_config.bn_momentum < 1.0:
    errors.fail(
      'model.bn_momentum', f'must be in [0, 1), got {model_config.bn_momentum}', 'use e.g. 0.9'
    )
  for field in ('head_hidden', 'head_out'):
    if int(model_config[field]) <= 0:
      errors.fail(f'model.{field}', f'must be positive, got {model_config[field]}', 'use e.g. 128')
  return heads.ContrastiveModel(
    backbone=name,
    stem=model_config.stem,
    head_hidden=int(model_config.head_hidden),
    head_out=int(model_config.head_out),
    dtype=DTYPES[model_config.dtype],
    norm=norm,
    activation=activation,
    strided_padding=strided_padding,
    bn_axis_name=bn_axis_name,
    bn_momentum=float(model_config.bn_momentum),
  )


def initialize(model: nn.Module, key: jax.Array, image_shape: Sequence[int]) -> dict:
  """Initial variables {'params', 'batch_stats'} for images of shape `image_shape` (H, W, C).

  ``batch_stats`` is empty ({}) for a model without BatchNorm.
  """

  @jax.jit
  def init(key):
    return model.init(key, jnp.zeros((1, *image_shape), jnp.float32), train=False)

  variables = init(key)
  return {'params': variables['params'], 'batch_stats': variables.get('batch_stats', {})}
