"""The projection head and the contrastive model (backbone + head)."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from hscl_jax.config import fields
from hscl_jax.models import backbones
from hscl_jax.models import layers


def _default(name: str):
  """config.model.<name>'s default: config/fields is the one source of the model's defaults,
  so a model built directly (library use) is the one the default config builds."""
  return fields.FIELDS[f'model.{name}'].default


class ProjectionHead(nn.Module):
  """Dense -> norm (BatchNorm by default) -> activation (ReLU by default) -> Dense, as in
  the paper (2048 -> 512 -> 128)."""

  hidden: int = _default('head_hidden')
  out: int = _default('head_out')
  dtype: Any = getattr(jnp, _default('dtype'))
  norm: str = _default('norm')
  activation: str = _default('activation')
  bn_momentum: float = _default('bn_momentum')
  bn_axis_name: str | None = None

  @nn.compact
  def __call__(self, x, *, train: bool):
    x = nn.Dense(self.hidden, use_bias=False, dtype=self.dtype)(x)
    x = layers.norm_layer(self.norm, train, self.bn_momentum, self.bn_axis_name, self.dtype)()(x)
    x = layers.activation_fn(self.activation)(x)
    return nn.Dense(self.out, dtype=self.dtype)(x)


class ContrastiveModel(nn.Module):
  """Backbone + projection head.

  Returns ``(features, projections)``: the backbone output [batch, feature_dim(backbone)]
  and the head output [batch, head_out], both float32 and un-normalised.
  """

  backbone: str = _default('name')
  stem: str = _default('stem')
  head_hidden: int = _default('head_hidden')
  head_out: int = _default('head_out')
  dtype: Any = getattr(jnp, _default('dtype'))
  norm: str = _default('norm')
  activation: str = _default('activation')
  strided_padding: str = _default('strided_padding')
  bn_axis_name: str | None = None
  bn_momentum: float = _default('bn_momentum')

  def setup(self):
    self.encoder = backbones.make_backbone(
      self.backbone,
      stem=self.stem,
      dtype=self.dtype,
      norm=self.norm,
      activation=self.activation,
      strided_padding=self.strided_padding,
      bn_momentum=self.bn_momentum,
      bn_axis_name=self.bn_axis_name,
    )
    self.head = ProjectionHead(
      hidden=self.head_hidden,
      out=self.head_out,
      dtype=self.dtype,
      norm=self.norm,
      activation=self.activation,
      bn_momentum=self.bn_momentum,
      bn_axis_name=self.bn_axis_name,
    )

  def __call__(self, x, *, train: bool):
    h = self.encoder(x, train=train)
    z = self.head(h, train=train)
    return h.astype(jnp.float32), z.astype(jnp.float32)

  def features(self, x, *, train: bool = False):
    """Backbone features only (float32, un-normalised): what the kNN monitor uses."""
    return self.encoder(x, train=train).astype(jnp.float32)
