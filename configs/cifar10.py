"""CIFAR-10, the paper's protocol: ResNet-50 (CIFAR stem), batch 512, 200 epochs, H-SCL(beta=1)."""

from __future__ import annotations

from configs import default


def get_config():
  config = default.get_config()
  config.dataset = 'cifar10'
  config.augment.mean, config.augment.std = default.NORMALIZATION['cifar10']
  return config
