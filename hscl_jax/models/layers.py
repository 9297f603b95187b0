"""What every backbone and the head are built of: the normalisation layers, activations and
the strided convolutions' padding, their choices and the check of a choice."""

from __future__ import annotations

from collections.abc import Callable
import functools
import math
from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from hscl_jax import errors

ModuleDef = Any


# He initialisation on fan-out, as torchvision's ResNet.
conv_kernel_init = nn.initializers.variance_scaling(2.0, 'fan_out', 'normal')


STEMS = ('cifar', 'imagenet')


NORMS = ('batch', 'group', 'layer')


MAX_GROUPS = 32


# ReLU is the paper's. SiLU and GELU are smooth: the gradient is then a continuous function
# of the input, so two programs that round differently (e.g. 1 device and 4) cannot land
# on opposite sides of a kink (docs/testing.md).
ACTIVATIONS = {'relu': nn.relu, 'silu': nn.silu, 'gelu': nn.gelu}


# How the ResNets' stride-2 3x3 convolutions pad (Flax's padding argument): `symmetric`,
# one pixel on every side, is torchvision's (the paper's model); `same` is Flax's 'SAME',
# which on an even size pads nothing before and one after (every run stored before
# config.model.strided_padding existed), so the two sample different pixels.
STRIDED_PADDINGS = {'symmetric': ((1, 1), (1, 1)), 'same': 'SAME'}


class GroupNorm(nn.Module):
  """GroupNorm with gcd(MAX_GROUPS, channels) groups, so every width is accepted."""

  epsilon: float = 1e-5
  dtype: Any = jnp.float32
  scale_init: Callable = nn.initializers.ones_init()

  @nn.compact
  def __call__(self, x):
    groups = math.gcd(MAX_GROUPS, x.shape[-1])
    return nn.GroupNorm(
      num_groups=groups,
      epsilon=self.epsilon,
      dtype=self.dtype,
      scale_init=self.scale_init,
      name='norm',
    )(x)


def norm_layer(kind: str, train: bool, momentum: float, axis_name: str | None, dtype) -> ModuleDef:
  if kind == 'group':
    return functools.partial(GroupNorm, epsilon=1e-5, dtype=dtype)
  if kind == 'layer':
    return functools.partial(nn.LayerNorm, epsilon=1e-5, dtype=dtype)
  if kind != 'batch':
    check_choice('norm', kind, NORMS)  # raises: an unknown norm
  return functools.partial(
    nn.BatchNorm,
    use_running_average=not train,
    momentum=momentum,
    epsilon=1e-5,
    dtype=dtype,
    axis_name=axis_name,
  )


def check_choice(field: str, value, choices) -> None:
  """config.model.<field> is one of `choices` (ConfigError, one line, otherwise)."""
  if value not in choices:
    errors.fail(
      f'model.{field}',
      f'unknown value {value!r}',
      f'use one of the valid {field}s: {", ".join(sorted(choices))}',
    )


def activation_fn(name: str) -> Callable:
  check_choice('activation', name, ACTIVATIONS)
  return ACTIVATIONS[name]
