"""The raw-pixel baseline of the image comparison: the weighted kNN of the pixels."""

from __future__ import annotations

import json
import os

import numpy as np

from hscl_jax import data
from hscl_jax.evaluation import knn
from hscl_jax.experiments import grid
from hscl_jax.rundir import atomic

RAW_PIXELS_FILE = 'raw_pixel_knn.json'


def raw_pixel_knn(config, root: str) -> dict:
  """Weighted kNN (config.knn's k and temperature) on raw pixels, train split (the run's
  subset) as the bank, test split as queries: pixels in [0, 1], centred by the bank's
  mean image, L2-normalised. Cached in ROOT/raw_pixel_knn.json per split definition."""
  key = {
    'dataset': grid.dataset_label(config),
    'train_examples': config.train_examples or None,
    'split_seed': config.split_seed,
    'image_size': config.augment.image_size,
    'k': config.knn.k,
    'temperature': config.knn.temperature,
  }
  path = os.path.join(root, RAW_PIXELS_FILE)
  if os.path.exists(path):
    with open(path) as f:
      cached = json.load(f)
    if cached['key'] == key:
      return cached
  bank, queries = data.run_sources(config)
  pixels = lambda source: (
    np.stack([source[i]['image'] for i in range(len(source))])
    .reshape(len(source), -1)
    .astype(np.float32)
    / 255.0
  )
  bank_x, query_x = pixels(bank), pixels(queries)
  mean = bank_x.mean(axis=0)
  top1 = knn.weighted_knn_accuracy(
    bank_x - mean,
    bank.labels(),
    query_x - mean,
    queries.labels(),
    num_classes=bank.num_classes,
    k=config.knn.k,
    temperature=config.knn.temperature,
  )
  result = {'key': key, 'top1': float(top1), 'bank': len(bank), 'queries': len(queries)}
  atomic.write_json(path, result)
  return result
