"""Training and evaluation batches, sharded per process, built on grain.

Index arithmetic (the whole design):
  * Epoch e visits the examples in the order ``EpochOrder(...)(e)``
    (:mod:`hscl_jax.data.sampling`: a seeded permutation, or class-aware batches), which
    holds ``steps_per_epoch * global_batch_size`` of them.
  * Global batch k of an epoch is the k-th block of ``global_batch_size`` positions;
    process p reads its contiguous ``local_batch_size`` slice of that block. So
    the global batches do not depend on the number of processes, and each
    process reads only its own examples.
  * The loader is a grain MapDataset indexed by the local step, so the iterator
    state is one integer (the next step) and resuming from it replays exactly
    the batches an uninterrupted run would see.
"""

from __future__ import annotations

from typing import Any

import grain
import jax
import numpy as np

from hscl_jax.config.choices import POSITIVE_MODES
from hscl_jax.data import sampling

# Data reading threads and prefetched batches per process (grain ReadOptions).
DEFAULT_NUM_THREADS = 4
DEFAULT_PREFETCH_BATCHES = 4


def _local_batch_size(global_batch_size: int, shard_count: int) -> int:
  if global_batch_size % shard_count:
    raise ValueError(
      f'global batch size {global_batch_size} is not divisible by the {shard_count} processes'
    )
  return global_batch_size // shard_count


def _resolve_shard(shard_index: int | None, shard_count: int | None) -> tuple[int, int]:
  shard_index = jax.process_index() if shard_index is None else shard_index
  shard_count = jax.process_count() if shard_count is None else shard_count
  if not 0 <= shard_index < shard_count:
    raise ValueError(f'shard_index {shard_index} is not in [0, {shard_count})')
  return shard_index, shard_count


class SameClassPartners:
  """Picks, deterministically from (seed, epoch, example), another example of the same class."""

  def __init__(self, labels: np.ndarray, seed: int):
    if len(labels) and labels.min() < 0:
      raise ValueError(
        "positive_mode='label' needs labelled data; this split has "
        'unlabelled examples (label -1). Use the augmentation mode.'
      )
    self._labels = labels
    self._seed = seed
    order = np.argsort(labels, kind='stable')
    classes, starts = np.unique(labels[order], return_index=True)
    self._members = dict(zip(classes.tolist(), np.split(order, starts[1:])))

  def __call__(self, index: int, epoch: int) -> int:
    members = self._members[int(self._labels[index])]
    if len(members) == 1:
      return index  # A singleton class: the only positive is the image itself.
    rng = np.random.default_rng([self._seed, epoch, index])
    pick = int(rng.integers(len(members) - 1))
    # Skip the anchor itself: members are sorted, so shift picks at/after it by one.
    pick += pick >= np.searchsorted(members, index)
    return int(members[pick])


class TrainLoader:
  """Infinite iterator of two-view training batches with exact save/restore.

  Batches: ``{'image': uint8 [local_batch, 2, H, W, 3], 'label': int32 [local_batch],
  'index': int32 [local_batch]}`` (index = the example of the first view).

  Args:
    source: a random-access source (``hscl_jax.data.get_source``).
    global_batch_size: samples per step over all processes (each seen in 2 views).
    seed: shuffling seed; epoch e is shuffled by (seed, e).
    positive_mode: 'augmentation' (second view = the same image) or 'label'
      (second view = another image of the same class, the Lemma 1 experiment).
    samples_per_class: 0 (uniform batches) or m >= 1: every global batch holds m
      examples of each of ``global_batch_size / m`` classes
      (:class:`hscl_jax.data.sampling.EpochOrder`).
    shard_index, shard_count: this process and the number of processes
      (default: jax.process_index() / jax.process_count()).
    num_classes: optional check of the labels in 'label' mode.
    batch_multiple, min_classes_per_batch: what a batch must meet (`EpochOrder`'s).
    num_threads, prefetch_batches: grain reading threads and prefetch depth.
  """

  def __init__(
    self,
    source,
    *,
    global_batch_size: int,
    seed: int,
    positive_mode: str = 'augmentation',
    samples_per_class: int = 0,
    shard_index: int | None = None,
    shard_count: int | None = None,
    num_classes: int | None = None,
    batch_multiple: int | None = None,
    min_classes_per_batch: int = 1,
    num_threads: int = DEFAULT_NUM_THREADS,
    prefetch_batches: int = DEFAULT_PREFETCH_BATCHES,
  ):
    if positive_mode not in POSITIVE_MODES:
      raise ValueError(f"positive_mode must be one of {POSITIVE_MODES}, got '{positive_mode}'")
    if seed < 0:
      raise ValueError(f'seed must be non-negative, got {seed}')
    self.shard_index, self.shard_count = _resolve_shard(shard_index, shard_count)
    self.source = source
    self.seed = seed
    self.positive_mode = positive_mode
    self.global_batch_size = global_batch_size
    self.local_batch_size = _local_batch_size(global_batch_size, self.shard_count)
    self.num_examples = len(source)
    labels = np.asarray(source.labels(), np.int32) if samples_per_class else None
    self.order = sampling.EpochOrder(
      self.num_examples,
      labels=labels,
      global_batch_size=global_batch_size,
      seed=seed,
      samples_per_class=samples_per_class,
      num_processes=self.shard_count,
      batch_multiple=batch_multiple,
      min_classes_per_batch=min_classes_per_batch,
    )
    self.steps_per_epoch = self.order.steps_per_epoch
    self._partners = None
    if positive_mode == 'label':
      labels = np.asarray(source.labels(), np.int32) if labels is None else labels
      if num_classes is not None and len(labels) and labels.max() >= num_classes:
        raise ValueError(f'label {labels.max()} is out of range for {num_classes} classes')
      self._partners = SameClassPartners(labels, seed)
    self._read_options = grain.ReadOptions(
      num_threads=num_threads, prefetch_buffer_size=prefetch_batches
    )
    self._batches = self._build_batches()
    self._step = 0
    self._iterator = None

  def _build_batches(self) -> grain.MapDataset:
    local_per_epoch = self.steps_per_epoch * self.local_batch_size
    return (
      grain.MapDataset.range(local_per_epoch)
      .repeat(None)
      .map_with_index(lambda position, _: self._element(position))
      .batch(self.local_batch_size, drop_remainder=True)
    )

  def example_index(self, position: int) -> tuple[int, int]:
    """(epoch, example index) of this process's ``position``-th training sample."""
    local_per_epoch = self.steps_per_epoch * self.local_batch_size
    epoch, within_epoch = divmod(position, local_per_epoch)
    step, offset = divmod(within_epoch, self.local_batch_size)
    global_position = (
      step * self.global_batch_size + self.shard_index * self.local_batch_size + offset
    )
    return epoch, int(self.order(epoch)[global_position])

  def _element(self, position: int) -> dict[str, Any]:
    epoch, index = self.example_index(position)
    example = self.source[index]
    if self._partners is None:
      second = example['image']
    else:
      second = self.source[self._partners(index, epoch)]['image']
    return {
      'image': np.stack([example['image'], second]),
      'label': np.int32(example['label']),
      'index': np.int32(index),
    }

  # Iterator protocol with exact resume.

  def __iter__(self):
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    if self._iterator is None:
      self._iterator = iter(self._batches[self._step :].to_iter_dataset(self._read_options))
    batch = next(self._iterator)
    self._step += 1
    return batch

  def get_state(self) -> dict[str, int]:
    """JSON-serialisable state: the number of batches already returned."""
    return {'step': self._step}

  def set_state(self, state: dict[str, int]) -> None:
    """Continues after ``state['step']`` batches (any process count: global batches
    do not depend on it)."""
    self._step = int(state['step'])
    self._iterator = None  # Rebuilt lazily from the new step; drops stale prefetches.


class EvalLoader:
  """Finite, re-iterable evaluation batches (no augmentation) covering every example once.

  Batches: ``{'image': uint8 [local_batch, H, W, 3], 'label': int32, 'mask': bool,
  'index': int32}``; padding rows (beyond the last example) have mask False,
  zero images, label 0 and index -1. Every process gets ``len(loader)`` batches.
  """

  def __init__(
    self,
    source,
    *,
    global_batch_size: int,
    shard_index: int | None = None,
    shard_count: int | None = None,
    num_threads: int = DEFAULT_NUM_THREADS,
    prefetch_batches: int = DEFAULT_PREFETCH_BATCHES,
  ):
    self.shard_index, self.shard_count = _resolve_shard(shard_index, shard_count)
    self.source = source
    self.global_batch_size = global_batch_size
    self.local_batch_size = _local_batch_size(global_batch_size, self.shard_count)
    self.num_examples = len(source)
    self.num_batches = -(-self.num_examples // global_batch_size)
    self._pad_image = np.zeros(source.image_shape, np.uint8)
    self._read_options = grain.ReadOptions(
      num_threads=num_threads, prefetch_buffer_size=prefetch_batches
    )
    self._batches = (
      grain.MapDataset.range(self.num_batches * self.local_batch_size)
      .map(self._element)
      .batch(self.local_batch_size)
    )

  def _element(self, position: int) -> dict[str, Any]:
    step, offset = divmod(position, self.local_batch_size)
    index = step * self.global_batch_size + self.shard_index * self.local_batch_size + offset
    if index >= self.num_examples:
      return {
        'image': self._pad_image,
        'label': np.int32(0),
        'mask': np.bool_(False),
        'index': np.int32(-1),
      }
    example = self.source[index]
    return {
      'image': example['image'],
      'label': np.int32(example['label']),
      'mask': np.bool_(True),
      'index': np.int32(index),
    }

  def __len__(self) -> int:
    return self.num_batches

  def __iter__(self):
    return iter(self._batches.to_iter_dataset(self._read_options))
