"""STL-10 (96 px), the paper's protocol on the labelled train split (H-SCL needs labels).

The paper keeps the CIFAR stem at 96 px; `--config.model.stem=imagenet` (7x7/2 + max-pool)
is about 16x cheaper per image. Gaussian blur is on at this size, as in SimCLR.
"""

from __future__ import annotations

from configs import default


def get_config():
  config = default.get_config()
  config.dataset = 'stl10'
  config.augment.image_size = 96
  config.augment.blur_prob = 0.5
  config.augment.mean, config.augment.std = default.NORMALIZATION['stl10']
  return config
