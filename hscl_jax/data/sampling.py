"""The order in which an epoch visits the training examples, and so its global batches.

Two orders, both a function of (seed, epoch) alone:

* **uniform** (``samples_per_class = 0``, the paper's): a permutation of all examples,
  cut into global batches of ``global_batch_size`` (the remainder is dropped);
* **class-aware** (``samples_per_class = m >= 1``; pytorch-metric-learning's
  ``MPerClassSampler``): every global batch holds m examples of each of
  ``global_batch_size / m`` distinct classes, so an anchor meets exactly m - 1 other
  samples of its class. Each class's examples are shuffled and cut into groups of m (a
  class's last ``n_c mod m`` examples sit the epoch out); each batch takes one group from
  each of the ``G = global_batch_size / m`` classes with the most groups left (ties broken
  at random), which packs the most batches possible; the batches, and the classes within
  a batch, are then shuffled. A class-balanced subset whose class sizes are multiples of
  m, and whose group count is a multiple of G, is visited whole.

An epoch visits each example at most once. Processes read contiguous slices of each global
batch (:class:`hscl_jax.data.TrainLoader`), so the global batches do not depend on the
number of processes; with class-aware batches m divides a process's slice, so each process
holds whole classes.
"""

from __future__ import annotations

import functools

import numpy as np

from hscl_jax import errors

# Keeps the class-aware stream apart from the uniform permutation's [seed, epoch] stream.
_CLASS_AWARE_STREAM = 1


def steps_per_epoch(num_examples: int, global_batch_size: int) -> int:
  """Uniform batches: training steps in one epoch (the remainder is dropped)."""
  if global_batch_size < 1:
    raise ValueError(f'global_batch_size must be positive, got {global_batch_size}')
  steps = num_examples // global_batch_size
  if steps == 0:
    raise ValueError(
      f'global batch size {global_batch_size} is larger than the '
      f'{num_examples} training examples: no full batch per epoch'
    )
  return steps


@functools.lru_cache(maxsize=8)
def epoch_permutation(seed: int, epoch: int, num_examples: int) -> np.ndarray:
  """The uniform visiting order of epoch ``epoch`` (cached: every element of an epoch needs it)."""
  return np.random.default_rng([seed, epoch]).permutation(num_examples)


def check_samples_per_class(samples_per_class, *, global_batch_size: int, num_processes: int):
  """The checks that need no data: m >= 0, and m divides each process's slice of a batch."""
  m = samples_per_class
  if not isinstance(m, (int, np.integer)) or isinstance(m, bool) or m < 0:
    errors.fail(
      'samples_per_class',
      f'must be a whole number >= 0, got {m!r}',
      'use 0 (uniform batches, the paper) or e.g. 4 (4 samples of each of batch_size / 4 classes)',
    )
  local = global_batch_size // num_processes
  if m and local % m:
    divisors = [d for d in range(1, local + 1) if local % d == 0]
    errors.fail(
      'samples_per_class',
      f"{m} does not divide the {local} samples of a process's batch (batch_size "
      f'{global_batch_size} over {num_processes} process{"es" if num_processes > 1 else ""})',
      f'use 0 or a divisor of {local}: {", ".join(map(str, divisors))}',
    )


def _class_members(labels: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
  """(classes, the example indices of each), classes in increasing order."""
  order = np.argsort(labels, kind='stable')
  classes, starts = np.unique(labels[order], return_index=True)
  return classes, np.split(order, starts[1:])


def _check_classes(labels: np.ndarray, global_batch_size: int, m: int) -> None:
  """The checks that need the training subset's labels."""
  if len(labels) and labels.min() < 0:
    errors.fail(
      'samples_per_class',
      f'{m} needs labelled training data; this split has unlabelled examples (label -1)',
      'use 0 (uniform batches) on unlabelled data',
    )
  classes, members = _class_members(labels)
  sizes = np.array([len(c) for c in members])
  per_batch = global_batch_size // m
  if per_batch > len(classes):
    fits = [d for d in range(1, global_batch_size + 1) if global_batch_size % d == 0]
    fits = [d for d in fits if global_batch_size // d <= len(classes) and d <= sizes.min()]
    errors.fail(
      'samples_per_class',
      f'batch_size {global_batch_size} / {m} = {per_batch} classes per batch, but the '
      f'training subset has {len(classes)} classes',
      f'use samples_per_class in {fits} (a divisor of batch_size >= '
      f'{-(-global_batch_size // len(classes))}), or a batch_size of at most {m * len(classes)}'
      if fits
      else f'use a batch_size of at most {m * len(classes)}',
    )
  smallest = int(np.argmin(sizes))
  if m > sizes[smallest]:
    errors.fail(
      'samples_per_class',
      f'{m} exceeds the {sizes[smallest]} training examples of class {classes[smallest]} '
      f'(the smallest class in the training subset)',
      f'use at most {sizes[smallest]}, or more train_examples (0: the whole split)',
    )


def max_batches(groups_per_class: np.ndarray, classes_per_batch: int) -> int:
  """The most batches of `classes_per_batch` distinct classes that the groups make: the
  largest T with sum_c min(g_c, T) >= classes_per_batch * T (a class gives at most one
  group to a batch). The feasible T form an interval from 0, so bisect."""
  low, high = 0, int(groups_per_class.sum()) // classes_per_batch
  while low < high:
    t = (low + high + 1) // 2
    if np.minimum(groups_per_class, t).sum() >= classes_per_batch * t:
      low = t
    else:
      high = t - 1
  return low


class EpochOrder:
  """The visiting order of each epoch of one run: uniform or class-aware (module docstring).

  Args:
    num_examples: the training examples' count.
    labels: their int [N] labels (needed, and read, only with ``samples_per_class``).
    global_batch_size: samples per step over all processes.
    seed: epoch e's order is a function of (seed, e).
    samples_per_class: 0 (uniform) or m >= 1 (class-aware batches).
    num_processes: the processes that split each batch (m must divide a process's slice).

  Raises:
    ConfigError: one line naming ``samples_per_class`` and the fix, for a value the data
      cannot meet.

  Example:
    >>> labels = np.repeat(np.arange(4), 6)  # 4 classes of 6
    >>> order = EpochOrder(24, labels=labels, global_batch_size=8, seed=0, samples_per_class=2)
    >>> order.steps_per_epoch, order(0).shape
    (3, (24,))
  """

  def __init__(
    self,
    num_examples: int,
    *,
    labels=None,
    global_batch_size: int,
    seed: int,
    samples_per_class: int = 0,
    num_processes: int = 1,
  ):
    self.num_examples = num_examples
    self.global_batch_size = global_batch_size
    self.seed = seed
    self.samples_per_class = samples_per_class
    if not samples_per_class:
      self.steps_per_epoch = steps_per_epoch(self.num_examples, global_batch_size)
      return
    check_samples_per_class(
      samples_per_class, global_batch_size=global_batch_size, num_processes=num_processes
    )
    labels = np.asarray(labels)
    if labels.shape != (num_examples,):
      raise ValueError(f'labels must have shape ({num_examples},), got {labels.shape}')
    _check_classes(labels, global_batch_size, samples_per_class)
    self._cache: dict[int, np.ndarray] = {}
    self._classes, self._members = _class_members(labels)
    self._groups = np.array([len(c) // samples_per_class for c in self._members])
    self.steps_per_epoch = max_batches(self._groups, global_batch_size // samples_per_class)
    if self.steps_per_epoch == 0:
      raise ValueError(f'no full class-aware batch of {global_batch_size} per epoch')

  def __call__(self, epoch: int) -> np.ndarray:
    """Example indices, int [steps_per_epoch * global_batch_size]: batch k is the k-th block."""
    if not self.samples_per_class:
      permutation = epoch_permutation(self.seed, epoch, self.num_examples)
      return permutation[: self.steps_per_epoch * self.global_batch_size]
    return self._class_aware(epoch)

  def _class_aware(self, epoch: int) -> np.ndarray:
    cached = self._cache.get(epoch)
    if cached is not None:
      return cached
    m = self.samples_per_class
    rng = np.random.default_rng([self.seed, epoch, _CLASS_AWARE_STREAM])
    shuffled = [rng.permutation(members) for members in self._members]
    batch_classes = self._pack(rng)
    positions = rng.permutation(self.steps_per_epoch)  # the packed batches, shuffled
    used = np.zeros(len(self._classes), np.int64)  # groups of each class taken so far
    order = np.empty((self.steps_per_epoch, batch_classes.shape[1], m), np.int64)
    for packed, classes in enumerate(batch_classes):
      for slot, c in enumerate(rng.permutation(classes)):
        order[positions[packed], slot] = shuffled[c][used[c] * m : (used[c] + 1) * m]
        used[c] += 1
    order = order.reshape(-1)
    # The loader's threads ask for the epoch of each sample: keep the current and next.
    self._cache = {**{e: o for e, o in self._cache.items() if e == epoch - 1}, epoch: order}
    return order

  def _pack(self, rng: np.random.Generator) -> np.ndarray:
    """[steps, G] class positions: each batch takes the G classes with the most groups left."""
    per_batch = self.global_batch_size // self.samples_per_class
    remaining = self._groups.copy()
    chosen = np.empty((self.steps_per_epoch, per_batch), np.int64)
    for step in range(self.steps_per_epoch):
      ties = rng.random(len(remaining))
      chosen[step] = np.lexsort((ties, -remaining))[:per_batch]
      if remaining[chosen[step]].min() < 1:  # max_batches promised these batches
        raise AssertionError('class-aware packing ran out of groups')
      remaining[chosen[step]] -= 1
    return chosen
