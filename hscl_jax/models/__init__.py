"""Backbones (ResNet-18/34/50, a small CNN) and the contrastive model.

The paper's encoder is a ResNet-50 with the CIFAR stem (3x3 convolution, stride 1,
no max-pool; its stride-2 3x3 convolutions pad one pixel on every side, torchvision's
`strided_padding`) followed by a projection head 2048 -> 512 (BatchNorm, ReLU) -> 128.
The loss uses the (normalised) projections; the kNN monitor and the linear
evaluation use the (normalised) backbone features.

All modules compute in ``dtype`` (float32 or bfloat16) and keep their parameters and
BatchNorm statistics in float32. Normalisation layers (``norm``): ``batch`` (the paper's;
BatchNorm with ``axis_name``: inside ``jax.shard_map`` over that mesh axis,
training-mode statistics are those of the global batch), ``group`` (GroupNorm, 32
groups or fewer when the width is not a multiple of 32) or ``layer`` (LayerNorm over
the channels). Group and layer normalisation never mix samples, so a sample's output
does not depend on the rest of the batch (what exact gradient caching needs) and the
model has no ``batch_stats``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
import functools
import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

ModuleDef = Any

# He initialisation on fan-out, as torchvision's ResNet.
conv_kernel_init = nn.initializers.variance_scaling(2.0, 'fan_out', 'normal')

# The fields of config.model, which `create_model` reads (and validates).
CONFIG_FIELDS = (
  'name',
  'stem',
  'norm',
  'activation',
  'strided_padding',
  'head_hidden',
  'head_out',
  'dtype',
  'bn_momentum',
)
STEMS = ('cifar', 'imagenet')
NORMS = ('batch', 'group', 'layer')
MAX_GROUPS = 32
DTYPES = {'float32': jnp.float32, 'bfloat16': jnp.bfloat16}
# ReLU is the paper's. SiLU and GELU are smooth: the gradient is then a continuous function
# of the input, so two programs that round differently (e.g. 1 device and 4) cannot land
# on opposite sides of a kink (docs/testing.md).
ACTIVATIONS = {'relu': nn.relu, 'silu': nn.silu, 'gelu': nn.gelu}
# How the ResNets' stride-2 3x3 convolutions pad (Flax's padding argument): `symmetric`,
# one pixel on every side, is torchvision's (the paper's model); `same` is Flax's 'SAME',
# which on an even size pads nothing before and one after (every run stored before
# config.model.strided_padding existed), so the two sample different pixels.
STRIDED_PADDINGS = {'symmetric': ((1, 1), (1, 1)), 'same': 'SAME'}
# What a run stored before a field existed trained with (its config.json lacks the field).
STORED_WITHOUT = {'activation': 'relu', 'strided_padding': 'same'}
_CHOICES = {'activation': ACTIVATIONS, 'strided_padding': STRIDED_PADDINGS}


class BasicBlock(nn.Module):
  """Two 3x3 convolutions with a residual connection (ResNet-18/34)."""

  filters: int
  conv: ModuleDef
  norm: ModuleDef
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
  conv: ModuleDef
  norm: ModuleDef
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


def _norm(kind: str, train: bool, momentum: float, axis_name: str | None, dtype) -> ModuleDef:
  if kind == 'group':
    return functools.partial(GroupNorm, epsilon=1e-5, dtype=dtype)
  if kind == 'layer':
    return functools.partial(nn.LayerNorm, epsilon=1e-5, dtype=dtype)
  if kind != 'batch':
    _check_choice('norm', kind, NORMS)  # raises: an unknown norm
  return functools.partial(
    nn.BatchNorm,
    use_running_average=not train,
    momentum=momentum,
    epsilon=1e-5,
    dtype=dtype,
    axis_name=axis_name,
  )


class ResNet(nn.Module):
  """ResNet trunk; returns globally average-pooled features [batch, width]."""

  stage_sizes: Sequence[int]
  block_cls: ModuleDef
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
      nn.Conv, use_bias=False, dtype=self.dtype, kernel_init=conv_kernel_init
    )
    norm = _norm(self.norm, train, self.bn_momentum, self.bn_axis_name, self.dtype)
    act = _activation(self.activation)
    _check_choice('strided_padding', self.strided_padding, STRIDED_PADDINGS)
    padding = STRIDED_PADDINGS[self.strided_padding]

    x = jnp.asarray(x, self.dtype)
    if self.stem == 'cifar':
      x = conv(self.num_filters, (3, 3), name='conv_init')(x)
      x = act(norm(name='bn_init')(x))
    elif self.stem == 'imagenet':
      x = conv(self.num_filters, (7, 7), (2, 2), padding=[(3, 3), (3, 3)], name='conv_init')(x)
      x = act(norm(name='bn_init')(x))
      x = nn.max_pool(x, (3, 3), strides=(2, 2), padding=((1, 1), (1, 1)))
    else:
      _check_choice('stem', self.stem, STEMS)  # raises: an unknown stem

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
    norm = _norm(self.norm, train, self.bn_momentum, self.bn_axis_name, self.dtype)
    act = _activation(self.activation)
    x = jnp.asarray(x, self.dtype)
    for width, stride in zip(self.widths, self.strides, strict=True):
      x = nn.Conv(
        width, (3, 3), stride, use_bias=False, dtype=self.dtype, kernel_init=conv_kernel_init
      )(x)
      x = act(norm()(x))
    return jnp.mean(x, axis=(1, 2))


# name -> (constructor keyword arguments, feature width)
BACKBONES: dict[str, tuple[Callable[..., nn.Module], int]] = {
  'resnet18': (functools.partial(ResNet, stage_sizes=(2, 2, 2, 2), block_cls=BasicBlock), 512),
  'resnet34': (functools.partial(ResNet, stage_sizes=(3, 4, 6, 3), block_cls=BasicBlock), 512),
  'resnet50': (functools.partial(ResNet, stage_sizes=(3, 4, 6, 3), block_cls=Bottleneck), 2048),
  'small_cnn': (SmallCNN, SmallCNN.widths[-1]),
}


def _invalid(field: str, problem: str, fix: str):
  """The config-error format (hscl_jax.config.schema prefixes 'config.')."""
  raise ValueError(f'model.{field}: {problem}. Fix: {fix}.')


def _check_choice(field: str, value, choices) -> None:
  if value not in choices:
    _invalid(
      field,
      f'unknown value {value!r}',
      f'use one of the valid {field}s: {", ".join(sorted(choices))}',
    )


def _check_name(name: str) -> None:
  _check_choice('name', name, BACKBONES)


def configured(model_config, field: str) -> str:
  """config.model.<field> (activation or strided_padding), validated; a run stored
  before the field existed: what it trained with (STORED_WITHOUT)."""
  value = model_config.get(field, STORED_WITHOUT[field])
  _check_choice(field, value, _CHOICES[field])
  return value


def as_trained(stored_model: dict[str, Any]) -> dict[str, Any]:
  """A stored config.model (as DIR/config.json holds it) with the value its run trained
  with of each field it lacks that shapes its backbone (STORED_WITHOUT): resuming it with
  today's default would silently change the model."""
  shaped = set(STORED_WITHOUT)
  if not str(stored_model.get('name', '')).startswith('resnet'):
    shaped.discard('strided_padding')  # small_cnn's convolutions pad as Flax's 'SAME'
  return {**{f: STORED_WITHOUT[f] for f in shaped}, **stored_model}


def _activation(name: str) -> Callable:
  _check_choice('activation', name, ACTIVATIONS)
  return ACTIVATIONS[name]


def feature_dim(name: str) -> int:
  """Width of the backbone's output features (e.g. 2048 for 'resnet50')."""
  _check_name(name)
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
  _check_name(name)
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


class ProjectionHead(nn.Module):
  """Dense -> norm (BatchNorm by default) -> activation (ReLU by default) -> Dense, as in
  the paper (2048 -> 512 -> 128)."""

  hidden: int = 512
  out: int = 128
  dtype: Any = jnp.float32
  norm: str = 'batch'
  activation: str = 'relu'
  bn_momentum: float = 0.9
  bn_axis_name: str | None = None

  @nn.compact
  def __call__(self, x, *, train: bool):
    x = nn.Dense(self.hidden, use_bias=False, dtype=self.dtype)(x)
    x = _norm(self.norm, train, self.bn_momentum, self.bn_axis_name, self.dtype)()(x)
    x = _activation(self.activation)(x)
    return nn.Dense(self.out, dtype=self.dtype)(x)


class ContrastiveModel(nn.Module):
  """Backbone + projection head.

  Returns ``(features, projections)``: the backbone output [batch, feature_dim(backbone)]
  and the head output [batch, head_out], both float32 and un-normalised.
  """

  backbone: str = 'resnet50'
  stem: str = 'cifar'
  head_hidden: int = 512
  head_out: int = 128
  dtype: Any = jnp.float32
  norm: str = 'batch'
  activation: str = 'relu'
  strided_padding: str = 'symmetric'
  bn_axis_name: str | None = None
  bn_momentum: float = 0.9

  def setup(self):
    self.encoder = make_backbone(
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


def create_model(model_config, *, bn_axis_name: str | None = None) -> ContrastiveModel:
  """ContrastiveModel from `config.model` (name, stem, norm, activation, strided_padding,
  head_hidden, head_out, dtype, bn_momentum).

  The one validation of config.model: raises ValueError naming the field and the fix.
  """
  name = model_config.name
  _check_name(name)
  norm = model_config.norm
  _check_choice('norm', norm, NORMS)
  _check_choice('stem', model_config.stem, STEMS)
  _check_choice('dtype', model_config.dtype, DTYPES)
  activation = configured(model_config, 'activation')
  strided_padding = configured(model_config, 'strided_padding')
  if not 0.0 <= model_config.bn_momentum < 1.0:
    _invalid('bn_momentum', f'must be in [0, 1), got {model_config.bn_momentum}', 'use e.g. 0.9')
  for field in ('head_hidden', 'head_out'):
    if int(model_config[field]) <= 0:
      _invalid(field, f'must be positive, got {model_config[field]}', 'use e.g. 128')
  return ContrastiveModel(
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
