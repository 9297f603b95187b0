"""Shared defaults: the paper's protocol (docs/method.md), which the dataset configs override.

Every field, its default and what it means is declared once, in `hscl_jax/config/fields.py`
(with its check and whether a resumed run may change it); `get_config()` is those
defaults. Override any field on the command line, e.g.
`--config.method=scl --config.num_epochs=50`.
"""

from __future__ import annotations

import ml_collections

from hscl_jax.config import fields

# Per-channel (mean, std) of each training split: config.augment.mean/std of
# configs/<dataset>.py.
NORMALIZATION = fields.NORMALIZATION


def get_config() -> ml_collections.ConfigDict:
  """Paper defaults for a 32-pixel dataset (CIFAR-10 statistics)."""
  return fields.default_config()


def cpu_budget(config: ml_collections.ConfigDict, *, train_examples: int, num_epochs: int):
  """The CPU-budget comparison's settings (docs/results/cifar10/, configs/cifar10_folder.py
  says why each): small_cnn, a class-balanced subset, batch 128, Adam 3e-3 with warm-up
  and a cosine schedule, crops of at least 20 %, the kNN every epoch, the linear
  evaluation at batch 128 and Adam 1e-2, one checkpoint kept."""
  config.model.name = 'small_cnn'
  config.augment.crop_scale = (0.2, 1.0)
  config.train_examples = train_examples
  config.batch_size = 128
  config.num_epochs = num_epochs
  config.optimizer.learning_rate = 3e-3
  config.optimizer.schedule = 'cosine'
  config.optimizer.warmup_epochs = 0.5
  config.knn.every_epochs = 1
  config.linear_eval.batch_size = 128
  config.linear_eval.learning_rate = 1e-2
  config.checkpoint_every_epochs = 1
  config.keep_checkpoints = 1
  config.log_every_steps = 10
  return config
