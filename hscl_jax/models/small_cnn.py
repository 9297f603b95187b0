"""A small CNN backbone (the digits runs and the tests)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from hscl_jax.models import layers


class SmallCNN(nn.Module):
  """A few 3x3 conv + BatchNorm + ReLU layers and global average pooling.

  With the default strides (1, 2, 1, 2) an 8x8 digit becomes 2x2 before pooling; any
  input of at least 4x4 pixels works.
  """

  widths: Sequence[int] = (32, 64, 128, 128)
  strides: Sequence[int] = (1, 2, 1, 2)
  dtype: Any = jnp.float32
  norm: str = 'batch'
  activation: str = 'relu'
  bn_momentum: float = 0.9
  bn_axis_name: str | None = None

  @nn.compact
  def __call__(self, x, *, train: bool):
    norm = layers.norm_layer(self.norm, train, self.bn_momentum, self.bn_axis_name, self.dtype)
    act = layers.activation_fn(self.activation)
    x = jnp.asarray(x, self.dtype)
    for width, stride in zip(self.widths, self.strides, strict=True):
      x = nn.Conv(
        width, (3, 3), stride, use_bias=False, dtype=self.dtype, kernel_init=layers.conv_kernel_init
      )(x)
      x = act(norm()(x))
    return jnp.mean(x, axis=(1, 2))
