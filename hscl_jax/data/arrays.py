"""In-memory sources and the seeded stratified split shared by digits and image folders."""

from __future__ import annotations

import numpy as np

# Fraction of each class held out when a dataset ships without a test split.
TEST_FRACTION = 0.2


class ArraySource:
  """Random-access source over in-memory uint8 images [N, H, W, 3] and int labels [N]."""

  def __init__(self, images: np.ndarray, labels: np.ndarray, num_classes: int):
    if images.ndim != 4 or images.shape[-1] != 3 or images.dtype != np.uint8:
      raise ValueError(f'images must be uint8 [N, H, W, 3], got {images.dtype} {images.shape}')
    if len(images) != len(labels):
      raise ValueError(f'{len(images)} images but {len(labels)} labels')
    self._images = images
    self._labels = np.asarray(labels, np.int32)
    self.num_classes = num_classes
    self.image_shape = tuple(images.shape[1:])

  def __len__(self) -> int:
    return len(self._labels)

  def __getitem__(self, index: int) -> dict:
    return {'image': self._images[index], 'label': int(self._labels[index])}

  def labels(self) -> np.ndarray:
    """All labels, int32 [N] (cheap: they are in memory)."""
    return self._labels


def stratified_split(
  labels: np.ndarray, seed: int, test_fraction: float = TEST_FRACTION
) -> dict[str, np.ndarray]:
  """Seeded per-class split; returns sorted example indices for 'train' and 'test'.

  Each class keeps round(test_fraction * count) examples for test, so class
  proportions match in both splits. The split depends only on (labels, seed).
  """
  rng = np.random.default_rng(seed)
  train, test = [], []
  for label in np.unique(labels):
    members = rng.permutation(np.flatnonzero(labels == label))
    num_test = int(round(test_fraction * len(members)))
    test.append(members[:num_test])
    train.append(members[num_test:])
  return {'train': np.sort(np.concatenate(train)), 'test': np.sort(np.concatenate(test))}


def digits_source(split: str, seed: int = 0) -> ArraySource:
  """scikit-learn's bundled 8x8 digits as uint8 RGB (grey replicated), seeded 80/20 split."""
  from sklearn.datasets import load_digits  # Local import: sklearn is slow to import.

  digits = load_digits()
  # Pixel values are 0..16; stretch to the full uint8 range.
  grey = np.round(digits.images * (255.0 / 16.0)).astype(np.uint8)
  images = np.repeat(grey[..., None], 3, axis=-1)
  labels = digits.target.astype(np.int32)
  indices = stratified_split(labels, seed)[split]
  return ArraySource(images[indices], labels[indices], num_classes=10)
