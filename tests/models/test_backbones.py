"""models/backbones: each backbone's feature width, and the names it knows."""

from __future__ import annotations

import re

from acceptance import refused

from hscl_jax import errors
from hscl_jax import models
from hscl_jax.models import backbones
from hscl_jax.models import resnet
from hscl_jax.models import small_cnn


def test_feature_dims():
  assert models.feature_dim('resnet18') == 512
  assert models.feature_dim('resnet34') == 512
  assert models.feature_dim('resnet50') == 2048
  assert models.feature_dim('small_cnn') == 128


def test_make_backbone_builds_each_names_trunk_and_refuses_others_in_one_line():
  """The ResNets get the stem and the strided padding; small_cnn takes neither."""
  for name in backbones.BACKBONES:
    model = backbones.make_backbone(name, stem='imagenet', strided_padding='same', norm='group')
    assert model.norm == 'group'
    if name.startswith('resnet'):
      assert type(model) is resnet.ResNet
      assert (model.stem, model.strided_padding) == ('imagenet', 'same')
    else:
      assert type(model) is small_cnn.SmallCNN
  assert backbones.make_backbone('resnet50').block_cls is resnet.Bottleneck
  assert backbones.make_backbone('resnet34').stage_sizes == (3, 4, 6, 3)
  line = (
    "config.model.name: unknown value 'resnet101'. "
    'Fix: use one of the valid names: resnet18, resnet34, resnet50, small_cnn.'
  )
  with refused(f'^{re.escape(line)}$', errors.ConfigError):
    backbones.make_backbone('resnet101')
