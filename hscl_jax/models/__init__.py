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

from hscl_jax.models.backbones import feature_dim
from hscl_jax.models.factory import create_model
from hscl_jax.models.factory import initialize
from hscl_jax.models.heads import ContrastiveModel

# What the rest of the package builds and reads a model by; the parts are in the modules
# (layers, resnet, small_cnn, backbones, heads, factory).
__all__ = ['ContrastiveModel', 'create_model', 'feature_dim', 'initialize']
