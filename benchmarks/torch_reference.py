"""The same contrastive training step in PyTorch: the CPU reference of bench_train_step.

Our own PyTorch versions of the project's models (hscl_jax.models: the CIFAR-stem
ResNet-18/34/50 and the small CNN, each with the 2-layer projection head, BatchNorm with
the same momentum and epsilon), H-SCL with exponential hardening (eq. (3), M = n - 2,
weights not detached, as configs/default.py) written densely, and torch.optim.Adam with
coupled L2 (optax's adam + add_decayed_weights before it, as hscl_jax.optim). No input
pipeline and no augmentation: random float images stay in memory (the JAX step times its
on-device augmentation too; bench_train_step prints that part alone).

torch is a benchmark dependency only (`pip install -e '.[bench]'`), never one of the package.
"""

from __future__ import annotations

import math
import time

import torch
from torch import nn
from torch.nn import functional as F

BN = dict(momentum=0.1, eps=1e-5)  # flax's momentum 0.9 is torch's 0.1


def conv_bn(in_channels, out_channels, kernel, stride):
  return nn.Sequential(
    nn.Conv2d(in_channels, out_channels, kernel, stride, padding=kernel // 2, bias=False),
    nn.BatchNorm2d(out_channels, **BN),
  )


class BasicBlock(nn.Module):
  expansion = 1

  def __init__(self, in_channels, filters, stride):
    super().__init__()
    self.a = conv_bn(in_channels, filters, 3, stride)
    self.b = conv_bn(filters, filters, 3, 1)
    out = filters * self.expansion
    self.proj = conv_bn(in_channels, out, 1, stride) if (stride, in_channels) != (1, out) else None

  def forward(self, x):
    y = self.b(F.relu(self.a(x)))
    return F.relu(y + (x if self.proj is None else self.proj(x)))


class Bottleneck(nn.Module):
  expansion = 4

  def __init__(self, in_channels, filters, stride):
    super().__init__()
    out = filters * self.expansion
    self.a = conv_bn(in_channels, filters, 1, 1)
    self.b = conv_bn(filters, filters, 3, stride)
    self.c = conv_bn(filters, out, 1, 1)
    self.proj = conv_bn(in_channels, out, 1, stride) if (stride, in_channels) != (1, out) else None

  def forward(self, x):
    y = self.c(F.relu(self.b(F.relu(self.a(x)))))
    return F.relu(y + (x if self.proj is None else self.proj(x)))


def resnet(stage_sizes, block):
  layers, channels = [conv_bn(3, 64, 3, 1), nn.ReLU()], 64
  for i, size in enumerate(stage_sizes):
    for j in range(size):
      layers.append(block(channels, 64 * 2**i, 2 if i > 0 and j == 0 else 1))
      channels = 64 * 2**i * block.expansion
  return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten()), channels


def small_cnn(widths=(32, 64, 128, 128), strides=(1, 2, 1, 2)):
  layers, channels = [], 3
  for width, stride in zip(widths, strides, strict=True):
    layers += [conv_bn(channels, width, 3, stride), nn.ReLU()]
    channels = width
  return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten()), channels


BACKBONES = {
  'resnet18': lambda: resnet((2, 2, 2, 2), BasicBlock),
  'resnet34': lambda: resnet((3, 4, 6, 3), BasicBlock),
  'resnet50': lambda: resnet((3, 4, 6, 3), Bottleneck),
  'small_cnn': small_cnn,
}


def contrastive_model(name, hidden=512, out=128):
  backbone, width = BACKBONES[name]()
  head = nn.Sequential(
    nn.Linear(width, hidden, bias=False),
    nn.BatchNorm1d(hidden, **BN),
    nn.ReLU(),
    nn.Linear(hidden, out),
  )
  return nn.Sequential(backbone, head)


def hscl_loss(z, labels, *, beta=1.0, temperature=0.5):
  """H-SCL, eq. (3): mean over positive pairs of softplus(log M - g_ip + log E_i), with
  E_i the e^{β g}-weighted mean of e^{g} over the anchor's other-label rows."""
  n = z.shape[0]
  g = z @ z.T / temperature
  same = labels[:, None] == labels[None, :]
  positives = same & ~torch.eye(n, dtype=torch.bool)
  negatives = ~same
  minus_inf = torch.full_like(g, -math.inf)
  log_w = torch.where(negatives, beta * g, minus_inf)
  log_e = torch.logsumexp(log_w + g, dim=1) - torch.logsumexp(log_w, dim=1)
  pair = F.softplus(math.log(n - 2) - g + log_e[:, None])
  return pair[positives].mean()


def step_images_per_second(name: str, batch_size: int, image_size: int, steps: int, threads: int):
  """(best images/s over `steps` timed steps after two warm-up steps, last loss)."""
  torch.manual_seed(0)
  torch.set_num_threads(threads)
  model = contrastive_model(name).train()
  optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, weight_decay=1e-6)
  images = torch.randn(2 * batch_size, 3, image_size, image_size)
  labels = (torch.arange(batch_size) % 10).repeat_interleave(2)  # sample-major views

  def step():
    optimizer.zero_grad(set_to_none=True)
    loss = hscl_loss(F.normalize(model(images), dim=1), labels)
    loss.backward()
    optimizer.step()
    return float(loss)

  for _ in range(2):
    step()
  best = math.inf
  for _ in range(steps):
    start = time.perf_counter()
    loss = step()
    best = min(best, time.perf_counter() - start)
  return 2 * batch_size / best, loss
