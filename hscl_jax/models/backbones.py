"""The backbones by name (`BACKBONES`), their feature widths, and building one."""

from __future__ import annotations

from collections.abc import Callable
import functools
from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from hscl_jax.models import layers
from hscl_jax.models import resnet
from hscl_jax.models import small_cnn

# name -> (constructor keyword arguments, feature width)
BACKBONES: dict[str, tuple[Callable[..., nn.Module], int]] = {
  'resnet18': (
    functools.partial(resnet.ResNet, stage_sizes=(2, 2, 2, 2), block_cls=resnet.BasicBlock),
    512,
  ),
  'resnet34': (
    functools.partial(resnet.ResNet, stage_sizes=(3, 4, 6, 3), block_cls=resnet.BasicBlock),
    512,
  ),
  'resnet50': (
    functools.partial(resnet.ResNet, stage_sizes=(3, 4, 6, 3), block_cls=resnet.Bottleneck),
    2048,
  ),
  'small_cnn': (small_cnn.SmallCNN, small_cnn.SmallCNN.widths[-1]),
}


def check_name(name: str) -> None:
  layers.check_choice('name', name, BACKBONES)


def feature_dim(name: str) -> int:
  """Width of the backbone's output features (e.g. 2048 for 'resnet50')."""
  check_name(name)
  return BACKBONES[name][1]


def make_backbone(
  name: str,
  *,
  stem: str = 'cifar',
  dtype: Any = jnp.float32,
  norm: str = 'batch',
  activation: str = 'relu',
  strided_padding: str = 'symmetric',
  bn_momentum: float = 0.9,
  bn_axis_name: str | None = None,
) -> nn.Module:
  """Builds the backbone `name` (see BACKBONES); `stem` and `strided_padding` only apply
  to ResNets."""
  check_name(name)
  build = BACKBONES[name][0]
  kwargs = dict(
    dtype=dtype,
    norm=norm,
    activation=activation,
    bn_momentum=bn_momentum,
    bn_axis_name=bn_axis_name,
  )
  if name.startswith('resnet'):
    kwargs.update(stem=stem, strided_padding=strided_padding)
  return build(**kwargs)
