"""In-memory sources, subsets of sources, and the seeded splits shared by every dataset."""

from __future__ import annotations

from concurrent import futures
import os

from absl import logging
import numpy as np

from hscl_jax import progress

# Fraction of each class held out when a dataset ships without a test split.
TEST_FRACTION = 0.2


class ArraySource:
  """Random-access source over in-memory uint8 images [N, H, W, 3] and int labels [N]
  (each 0 to num_classes - 1, or -1 for an unlabelled example; others are refused).

  `class_names` and `paths` (the files the images were decoded from), when given, are
  kept as attributes, as an image folder's source has them.
  """

  def __init__(
    self,
    images: np.ndarray,
    labels: np.ndarray,
    num_classes: int,
    *,
    class_names: list[str] | None = None,
    paths: list[str] | None = None,
  ):
    if images.ndim != 4 or images.shape[-1] != 3 or images.dtype != np.uint8:
      raise ValueError(f'images must be uint8 [N, H, W, 3], got {images.dtype} {images.shape}')
    if len(images) != len(labels):
      raise ValueError(f'{len(images)} images but {len(labels)} labels')
    self._images = images
    self._labels = np.asarray(labels, np.int32)
    # A label past the classes would be read as no class by the kNN monitor and the probe's
    # one-hot (all zeros), not as an error: refused here, where the source is made.
    outside = self._labels[(self._labels < -1) | (self._labels >= num_classes)]
    if len(outside):
      raise ValueError(
        f'label {outside[0]} is out of range for {num_classes} classes: a label is 0 to '
        f'{num_classes - 1}, or -1 for an unlabelled example'
      )
    self.num_classes = num_classes
    self.image_shape = tuple(images.shape[1:])
    self.class_names, self.paths = class_names, paths

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


def balanced_subset(labels: np.ndarray, num_examples: int, seed: int) -> np.ndarray:
  """Sorted indices of `num_examples` examples, as evenly spread over the classes as
  their sizes allow, drawn by `seed` (the same subset for every run with that seed).

  Each class gets num_examples // C examples (C = number of classes present), the first
  num_examples % C classes of a seeded order one more; a class smaller than its share
  gives all it has and the rest goes, by the same rule, to the classes with more.
  """
  labels = np.asarray(labels)
  classes = np.unique(labels)
  if not len(classes) <= num_examples <= len(labels):
    raise ValueError(
      f'cannot draw {num_examples} examples spread over {len(classes)} classes from '
      f'{len(labels)} examples'
    )
  rng = np.random.default_rng(seed)
  members = {c: rng.permutation(np.flatnonzero(labels == c)) for c in classes}
  order = rng.permutation(classes)
  quota = dict.fromkeys(classes.tolist(), 0)
  remaining = num_examples
  while remaining:
    open_classes = [c for c in order.tolist() if quota[c] < len(members[c])]
    share, extra = divmod(remaining, len(open_classes))
    for rank, c in enumerate(open_classes):
      take = min(share + (rank < extra), len(members[c]) - quota[c])
      quota[c] += take
      remaining -= take
  return np.sort(np.concatenate([members[c][: quota[c]] for c in classes]))


class SubsetSource:
  """The examples `indices` of another source, in that order (same item format)."""

  def __init__(self, source, indices: np.ndarray):
    self._source = source
    self._indices = np.asarray(indices, np.int64)
    self.num_classes = source.num_classes
    self.image_shape = source.image_shape
    self.class_names = getattr(source, 'class_names', None)
    paths = getattr(source, 'paths', None)
    self.paths = None if paths is None else [paths[i] for i in self._indices]

  def __len__(self) -> int:
    return len(self._indices)

  def __getitem__(self, index: int) -> dict:
    return self._source[int(self._indices[index])]

  def labels(self) -> np.ndarray:
    return np.asarray(self._source.labels(), np.int32)[self._indices]


def decoded_bytes(source) -> int:
  """Bytes of the whole split as uint8 arrays in memory."""
  return len(source) * int(np.prod(source.image_shape))


def load_into_memory(source, *, name: str = 'split', num_threads: int | None = None):
  """An ArraySource holding every image of `source`, decoded once by a thread pool
  (PIL and TFDS decode outside the GIL), with a progress line every ~10 s."""
  images = np.empty((len(source), *source.image_shape), np.uint8)
  labels = np.empty(len(source), np.int32)
  num_threads = num_threads or min(32, (os.cpu_count() or 1) + 2)
  chunks = np.array_split(np.arange(len(source)), max(1, len(source) // 256))

  def decode(chunk):
    for i in chunk:
      example = source[int(i)]
      images[i], labels[i] = example['image'], example['label']
    return len(chunk)

  line = progress.ProgressLine(len(source), unit='image', every_seconds=progress.EVERY_SECONDS)
  done = 0
  with futures.ThreadPoolExecutor(num_threads) as pool:
    for count in pool.map(decode, chunks):
      done += count
      line.update(done, head=f'decoding {name} into memory')
  seconds = line.elapsed()
  logging.info(
    'Decoded %s into memory: %d images, %.0f MiB, in %.1f s.',
    name,
    len(source),
    images.nbytes / 2**20,
    seconds,
  )
  return ArraySource(
    images,
    labels,
    source.num_classes,
    class_names=getattr(source, 'class_names', None),
    paths=getattr(source, 'paths', None),
  )
