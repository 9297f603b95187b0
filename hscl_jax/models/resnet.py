"""ResNet-18/34/50 trunks: basic and bottleneck blocks, the CIFAR or ImageNet stem."""

from __future__ import annotations

from collections.abc import Callable, Sequence
import functools
from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from hscl_jax.models import layers


class BasicBlock(nn.Module):
  """Two 3x3 convolutions with a residual connection (ResNet-18/34)."""

  filters: int
  conv: layers.ModuleDef
  norm: layers.ModuleDef
  act: Callable
  strides: int = 1
  strided_padding: Any = 'SAME'  # of the 3x3 convolution (a Flax padding)

  expansion = 1

  @nn.compact
  def __call__(self, x):
    residual = x
    y = self.conv(self.filters, (3, 3), self.strides, padding=self.strided_padding)(x)
    y = self.act(self.norm()(y))
    y = self.conv(self.filters, (3, 3))(y)
    # Zero-initialised last scale: each block starts as the identity.
    y = self.norm(scale_init=nn.initializers.zeros_init())(y)
    if residual.shape != y.shape:
      residual = self.conv(self.filters, (1, 1), self.strides, name='conv_proj')(residual)
      residual = self.norm(name='norm_proj')(residual)
    return self.act(residual + y)


class Bottleneck(nn.Module):
  """1x1 -> 3x3 (strided) -> 1x1 convolutions, 4x expansion (ResNet-50)."""

  filters: int
  conv: layers.ModuleDef
  norm: layers.ModuleDef
  act: Callable
  strides: int = 1
  strided_padding: Any = 'SAME'  # of the 3x3 convolution (a Flax padding)

  expansion = 4

  @nn.compact
  def __call__(self, x):
    residual = x
    y = self.conv(self.filters, (1, 1))(x)
    y = self.act(self.norm()(y))
    y = self.conv(self.filters, (3, 3), self.strides, padding=self.strided_padding)(y)
    y = self.act(self.norm()(y))
    y = self.conv(self.filters * self.expansion, (1, 1))(y)
    y = self.norm(scale_init=nn.initializers.zeros_init())(y)
    if residual.shape != y.shape:
      residual = self.conv(self.filters * self.expansion, (1, 1), self.strides, name='conv_proj')(
        residual
      )
      residual = self.norm(name='norm_proj')(residual)
    return self.act(residual + y)


class ResNet(nn.Module):
  """ResNet trunk; returns globally average-pooled features [batch, width]."""

  stage_sizes: Sequence[int]
  block_cls: layers.ModuleDef
  num_filters: int = 64
  stem: str = 'cifar'
  dtype: Any = jnp.float32
  norm: str = 'batch'
  activation: str = 'relu'
  strided_padding: str = 'symmetric'
  bn_momentum: float = 0.9
  bn_axis_name: str | None = None

  @nn.compact
  def __call__(self, x, *, train: bool):
    conv = functools.partial(
      nn.Conv, use_bias=False, dtype=self.dtype, kernel_init=layers.conv_kernel_init
    )
    norm = layers.norm_layer(self.norm, train, self.bn_momentum, self.bn_axis_name, self.dtype)
    act = layers.activation_fn(self.activation)
    layers.check_choice('strided_padding', self.strided_padding, layers.STRIDED_PADDINGS)
    padding = layers.STRIDED_PADDINGS[self.strided_padding]

    x = jnp.asarray(x, self.dtype)
    if self.stem == 'cifar':
      x = conv(self.num_filters, (3, 3), name='conv_init')(x)
      x = act(norm(name='bn_init')(x))
    elif self.stem == 'imagenet':
      x = conv(self.num_filters, (7, 7), (2, 2), padding=[(3, 3), (3, 3)], name='conv_init')(x)
      x = act(norm(name='bn_init')(x))
      x = nn.max_pool(x, (3, 3), strides=(2, 2), padding=((1, 1), (1, 1)))
    else:
      layers.check_choice('stem', self.stem, layers.STEMS)  # raises: an unknown stem

    for i, block_size in enumerate(self.stage_sizes):
      for j in range(block_size):
        strides = 2 if i > 0 and j == 0 else 1
        block = self.block_cls(
          self.num_filters * 2**i,
          conv=conv,
          norm=norm,
          act=act,
          strides=strides,
          strided_padding=padding,
        )
        x = block(x)
    return jnp.mean(x, axis=(1, 2))
