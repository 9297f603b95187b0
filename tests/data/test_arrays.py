"""data/arrays: in-memory sources (uint8 RGB, one label each), the stratified split, the
class-balanced subsets of a training split, and a split decoded into memory (its size, its
threads, its chunks and its progress lines)."""

from __future__ import annotations

import logging
import re
import types

from acceptance import accepted
from acceptance import refused
import numpy as np
from progress_lines import progress_lines
import pytest

from hscl_jax import data
from hscl_jax import progress
from hscl_jax.data import arrays as data_arrays


def test_stratified_split_is_seeded_disjoint_and_proportional():
  labels = np.repeat(np.arange(4), [10, 20, 30, 40])
  split = data.stratified_split(labels, seed=0)
  assert not set(split['train']) & set(split['test'])
  assert len(split['train']) + len(split['test']) == len(labels)
  np.testing.assert_array_equal(np.bincount(labels[split['test']]), [2, 4, 6, 8])
  np.testing.assert_array_equal(split['test'], data.stratified_split(labels, seed=0)['test'])
  assert not np.array_equal(split['test'], data.stratified_split(labels, seed=1)['test'])


@pytest.mark.parametrize(
  'images, reason',
  [
    (np.zeros((4, 5, 5), np.uint8), 'no channel axis'),
    (np.zeros((4, 5, 5, 1), np.uint8), 'grey'),
    (np.zeros((4, 5, 5, 4), np.uint8), 'RGBA'),
    (np.zeros((4, 5, 5, 3), np.float32), 'float pixels'),
  ],
)
def test_array_source_refuses_anything_but_uint8_rgb(images, reason):
  with refused(re.escape(f'images must be uint8 [N, H, W, 3], got {images.dtype} {images.shape}')):
    data.ArraySource(images, np.zeros(4, np.int32), 2)


def test_array_source_accepts_uint8_rgb_with_one_label_each():
  images = np.arange(4 * 2 * 2 * 3, dtype=np.uint8).reshape(4, 2, 2, 3)
  with accepted('uint8 [4, 2, 2, 3]'):
    source = data.ArraySource(images, [1, 0, 1, 1], 2)
  assert len(source) == 4 and source.image_shape == (2, 2, 3)
  np.testing.assert_array_equal(source[2]['image'], images[2])
  assert source[1]['label'] == 0 and source.labels().dtype == np.int32
  with refused('4 images but 3 labels'):
    data.ArraySource(images, [1, 0, 1], 2)


@pytest.mark.parametrize('bad', [3, 7, -2])
def test_array_source_refuses_a_label_outside_its_classes_naming_it(bad):
  """Labels 0 to C - 1, and -1 for an unlabelled example (both bounds accepted); one past
  either refused, the label named wherever it sits."""
  images = np.zeros((4, 2, 2, 3), np.uint8)
  with accepted('labels -1 to 2 of 3 classes'):
    data.ArraySource(images, [2, -1, 0, 1], 3)
  with refused(f'label {bad} is out of range for 3 classes: a label is 0 to 2, or -1 for an'):
    data.ArraySource(images, [0, 1, bad, 2], 3)


def _pixels(source):
  return np.stack([source[i]['image'] for i in range(len(source))])


class _BlankSource:
  """11 uniform 256x341 RGB images: 2.747 MiB decoded (256 * 341 * 3 * 11 = 2,880,768 B)."""

  image_shape = (256, 341, 3)
  num_classes = 3

  def __len__(self):
    return 11

  def __getitem__(self, i):
    return {'image': np.full(self.image_shape, i, np.uint8), 'label': i % 3}


def test_decoding_into_memory_logs_its_size_in_mib(caplog):
  with caplog.at_level(logging.INFO):
    cached = data_arrays.load_into_memory(_BlankSource(), name='blank train', num_threads=2)
  np.testing.assert_array_equal(cached.labels(), np.arange(11) % 3)
  assert int(_pixels(cached)[7].max()) == 7
  # 2.747 MiB, rounded to the nearest MiB (3, not 2).
  assert re.search(r'Decoded blank train into memory: 11 images, 3 MiB, in [\d.]+ s\.', caplog.text)


class _IndexSource:
  """`size` 1x1 images whose pixel holds the index mod 256, labels the index mod 7."""

  image_shape = (1, 1, 3)
  num_classes = 7

  def __init__(self, size):
    self.size = size

  def __len__(self):
    return self.size

  def __getitem__(self, i):
    return {'image': np.full(self.image_shape, i % 256, np.uint8), 'label': i % 7}


@pytest.mark.parametrize('size', [1, 255, 257])
def test_decoding_a_split_smaller_than_a_chunk(size):
  """Splits of fewer than 256 images are one chunk, not zero."""
  with accepted(f'a split of {size} images'):
    cached = data_arrays.load_into_memory(_IndexSource(size), num_threads=2)
  np.testing.assert_array_equal(_pixels(cached)[:, 0, 0, 0], np.arange(size) % 256)
  np.testing.assert_array_equal(cached.labels(), np.arange(size) % 7)


@pytest.mark.parametrize('cpus, threads', [(40, 32), (5, 7), (None, 3)])
def test_decoding_threads_default_to_the_cpus_plus_two_at_most_32(monkeypatch, cpus, threads):
  made = []
  real_pool = data_arrays.futures.ThreadPoolExecutor

  def recording_pool(max_workers):
    made.append(max_workers)
    return real_pool(max_workers)

  monkeypatch.setattr(data_arrays.futures, 'ThreadPoolExecutor', recording_pool)
  monkeypatch.setattr(data_arrays, 'os', types.SimpleNamespace(cpu_count=lambda: cpus))
  data_arrays.load_into_memory(_IndexSource(3))
  assert made == [threads]


def test_decoding_progress_lines_report_the_rate_from_the_clock(monkeypatch, caplog):
  """A clock that starts at 7 s and advances 6 s per reading: 4 chunks of 256 images read
  at 13, 19, 25, 31 s. One progress line, at 19 s (12 s after the start, 512 images:
  43/s, 512 left: 12 s); none at 31 s (12 s after the last line, but the split is done);
  30 s in all."""
  readings = iter(range(7, 100, 6))
  clock = types.SimpleNamespace(perf_counter=lambda: float(next(readings)))
  monkeypatch.setattr(progress, 'time', clock)
  with caplog.at_level(logging.INFO):
    data_arrays.load_into_memory(_IndexSource(1024), name='clocked', num_threads=1)
  lines = [r.getMessage() for r in caplog.records if 'clocked' in r.getMessage()]
  assert lines == [
    'decoding clocked into memory  image 512/1024 (50%)  43 images/s  ETA 12s',
    'Decoded clocked into memory: 1024 images, 0 MiB, in 30.0 s.',
  ]
  assert progress_lines(caplog) == lines[:1]


def test_balanced_subset_is_balanced_reproducible_and_seeded():
  labels = np.repeat(np.arange(5), 40)
  subset = data.balanced_subset(labels, 23, seed=3)
  assert len(subset) == len(set(subset)) == 23 and np.all(np.diff(subset) > 0)
  counts = np.bincount(labels[subset], minlength=5)
  assert counts.max() - counts.min() <= 1 and counts.sum() == 23
  np.testing.assert_array_equal(subset, data.balanced_subset(labels, 23, seed=3))
  assert not np.array_equal(subset, data.balanced_subset(labels, 23, seed=4))


def test_balanced_subset_gives_small_classes_all_they_have():
  labels = np.repeat(np.arange(3), [2, 50, 50])
  counts = np.bincount(labels[data.balanced_subset(labels, 30, seed=0)])
  np.testing.assert_array_equal(counts, [2, 14, 14])


def test_balanced_subset_accepts_its_bounds_and_refuses_one_past():
  """From one example per class (3) to every example (101), not 2 or 102."""
  labels = np.repeat(np.arange(3), [2, 50, 49])
  with accepted('one example per class'):
    fewest = data.balanced_subset(labels, 3, seed=0)
  np.testing.assert_array_equal(np.bincount(labels[fewest]), [1, 1, 1])
  with accepted('every example'):
    everything = data.balanced_subset(labels, 101, seed=0)
  np.testing.assert_array_equal(everything, np.arange(101))
  for num_examples in (2, 102):
    with refused(f'cannot draw {num_examples} examples spread over 3 classes from 101 examples'):
      data.balanced_subset(labels, num_examples, seed=0)
