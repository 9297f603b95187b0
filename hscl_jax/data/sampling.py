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

import dataclasses
import functools

import numpy as np

from hscl_jax import errors
from hscl_jax.config.choices import check_samples_per_class

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


def _class_members(labels: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
  """(classes, the example indices of each), classes in increasing order."""
  order = np.argsort(labels, kind='stable')
  classes, starts = np.unique(labels[order], return_index=True)
  return classes, np.split(order, starts[1:])


@dataclasses.dataclass(frozen=True)
class BatchRule:
  """What a class-aware batch must meet besides the labels: the processes that split it,
  what a batch_size is a multiple of (a suggested one too), the fewest classes it holds."""

  num_processes: int = 1
  multiple: int = 1
  min_classes: int = 1


def passing_samples_per_class(
  class_sizes: np.ndarray, global_batch_size: int, num_processes: int = 1, min_classes: int = 1
) -> list[int]:
  """Every m >= 1 that passes every check on classes of these sizes: m divides a process's
  share of the batch, the batch's global_batch_size / m classes exist and are at least
  `min_classes` (2 where the negatives are another class's), and m is at most the smallest
  class (so every class fills a group and a batch can be packed)."""
  if global_batch_size % num_processes or len(class_sizes) == 0:
    return []
  local = global_batch_size // num_processes
  return [
    m
    for m in range(1, min(local, int(min(class_sizes))) + 1)
    if local % m == 0 and min_classes <= global_batch_size // m <= len(class_sizes)
  ]


def _values(passing: list[int]) -> str:
  if len(passing) == 1:
    return f'samples_per_class={passing[0]}'
  return f'samples_per_class = one of {", ".join(map(str, passing))}'


def _what_passes(sizes: np.ndarray, global_batch_size: int, rule: BatchRule):
  """The fix of a refused m: the values that pass here, else the largest batch_size (a
  multiple of `rule.multiple`, two samples at least) below this one that has some, else
  uniform batches."""
  num_processes, min_classes = rule.num_processes, rule.min_classes
  passing = passing_samples_per_class(sizes, global_batch_size, num_processes, min_classes)
  if passing:
    return (
      f'use {_values(passing)} (what passes every check on this training subset at '
      f'batch_size {global_batch_size}), or 0 (uniform batches)'
    )
  facts = f'{len(sizes)} classes, the smallest with {int(min(sizes))} examples'
  # A batch holds at most every class's smallest-class worth: start there.
  largest = min(global_batch_size - 1, len(sizes) * int(min(sizes)))
  for batch in range(largest - largest % rule.multiple, 1, -rule.multiple):
    passing = passing_samples_per_class(sizes, batch, num_processes, min_classes)
    if passing:
      return (
        f'no samples_per_class passes at batch_size {global_batch_size} on this training '
        f'subset ({facts}): use --config.batch_size={batch} with {_values(passing)}, or '
        'more train_examples (0: the whole split), or samples_per_class=0 (uniform batches)'
      )
  return (
    f'use samples_per_class=0 (uniform batches): no value passes on this training subset ({facts})'
  )


def _check_classes(labels: np.ndarray, global_batch_size: int, m: int, rule: BatchRule) -> None:
  """The checks that need the training subset's labels; a refusal names what passes."""
  num_processes = rule.num_processes
  if len(labels) and labels.min() < 0:
    errors.fail(
      'samples_per_class',
      f'{m} needs labelled training data; this split has unlabelled examples (label -1)',
      'use 0 (uniform batches) on unlabelled data',
    )
  classes, members = _class_members(labels)
  sizes = np.array([len(c) for c in members])
  local, per_batch = global_batch_size // num_processes, global_batch_size // m
  smallest = int(np.argmin(sizes))
  if local % m:
    process = 'process' if num_processes == 1 else 'processes'
    problem = (
      f"{m} does not divide the {local} samples of a process's batch (batch_size "
      f'{global_batch_size} over {num_processes} {process})'
    )
  elif per_batch > len(classes):
    problem = (
      f'batch_size {global_batch_size} / {m} = {per_batch} classes per batch, but the '
      f'training subset has {len(classes)} classes'
    )
  elif per_batch < rule.min_classes:
    problem = (
      f'batch_size {global_batch_size} / {m} = {per_batch} class per batch, fewer than the '
      f'{rule.min_classes} its negatives need'
    )
  elif m > sizes[smallest]:
    problem = (
      f'{m} exceeds the {sizes[smallest]} training examples of class {classes[smallest]} '
      '(the smallest class in the training subset)'
    )
  else:
    return
  errors.fail('samples_per_class', problem, _what_passes(sizes, global_batch_size, rule))


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
    batch_multiple: what a batch_size must be a multiple of (the devices and processes; a
      refusal may suggest one), num_processes if None.
    min_classes_per_batch: the fewest classes a batch may hold (2 where the negatives are
      another class's samples).

  Raises:
    ConfigError: one line naming ``samples_per_class`` and the fix, for a value the data
      cannot meet: the values that pass every check on these labels and batch, or the
      batch_size that has some.

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
    batch_multiple: int | None = None,
    min_classes_per_batch: int = 1,
  ):
    self.num_examples = num_examples
    self.global_batch_size = global_batch_size
    self.seed = seed
    self.samples_per_class = samples_per_class
    if not samples_per_class:
      self.steps_per_epoch = steps_per_epoch(self.num_examples, global_batch_size)
      return
    check_samples_per_class(samples_per_class)
    labels = np.asarray(labels)
    if labels.shape != (num_examples,):
      raise ValueError(f'labels must have shape ({num_examples},), got {labels.shape}')
    multiple = num_processes if batch_multiple is None else batch_multiple
    rule = BatchRule(num_processes, multiple, min_classes_per_batch)
    _check_classes(labels, global_batch_size, samples_per_class, rule)
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
