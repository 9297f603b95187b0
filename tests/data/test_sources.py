"""Digits and image-folder sources, the stratified split, and error messages."""

from __future__ import annotations

import inspect
import logging
import os
import re
import subprocess
import sys
import types

from acceptance import accepted
from acceptance import refused
import ml_collections
import numpy as np
from PIL import Image
from progress_lines import progress_lines
import pytest

from hscl_jax import data
from hscl_jax import errors
from hscl_jax import progress
from hscl_jax.data import arrays as data_arrays
from hscl_jax.data import image_folder
from hscl_jax.data import sources as data_sources


def test_unknown_dataset_lists_valid_names():
  with pytest.raises(data.UnknownDatasetError) as error:
    data.get_source('imagenet', 'train')
  for name in data.DATASETS:
    assert name in str(error.value)


def test_unknown_split():
  with pytest.raises(ValueError, match="valid: \\['train', 'test'\\]"):
    data.get_source('digits', 'unlabelled')


def test_stratified_split_is_seeded_disjoint_and_proportional():
  labels = np.repeat(np.arange(4), [10, 20, 30, 40])
  split = data.stratified_split(labels, seed=0)
  assert not set(split['train']) & set(split['test'])
  assert len(split['train']) + len(split['test']) == len(labels)
  np.testing.assert_array_equal(np.bincount(labels[split['test']]), [2, 4, 6, 8])
  np.testing.assert_array_equal(split['test'], data.stratified_split(labels, seed=0)['test'])
  assert not np.array_equal(split['test'], data.stratified_split(labels, seed=1)['test'])


def test_digits_source():
  train, test = data.get_source('digits', 'train'), data.get_source('digits', 'test')
  assert (len(train), len(test)) == (1438, 359)
  example = train[0]
  assert example['image'].shape == (8, 8, 3) and example['image'].dtype == np.uint8
  assert np.all(example['image'] == example['image'][..., :1])  # Grey replicated to RGB.
  assert max(train[i]['image'].max() for i in range(50)) == 255  # 16 -> 255.
  assert set(np.unique(test.labels())) == set(range(10))
  np.testing.assert_array_equal(test.labels(), data.get_source('digits', 'test').labels())
  info = data.dataset_info('digits')
  assert info.num_classes == 10 and info.image_shape == (8, 8, 3)
  assert info.split_sizes == {'train': 1438, 'test': 359}


def test_the_default_seed_is_0_and_the_seed_picks_the_split():
  """get_source's documented default seed (0) is accepted and gives seed 0's split."""
  assert inspect.signature(data.get_source).parameters['seed'].default == 0
  with accepted('get_source without a seed'):
    default = data.get_source('digits', 'train')
  seeded = lambda seed: data.get_source('digits', 'train', seed=seed)
  np.testing.assert_array_equal(default.labels(), seeded(0).labels())
  assert not np.array_equal(default.labels(), seeded(1).labels())


def save_image(path, mode, size, color):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  Image.new(mode, size, color).save(path)


@pytest.fixture
def folder(tmp_path):
  """Two classes, mixed formats and modes, non-square sizes, plus a stray text file."""
  root = tmp_path / 'images'
  for i in range(5):
    save_image(str(root / 'cat' / f'{i}.png'), 'RGB', (20, 14), (200, 10, 10))
    save_image(str(root / 'dog' / f'{i}.jpg'), 'L', (9, 12), 90)
  save_image(str(root / 'dog' / 'alpha.PNG'), 'RGBA', (16, 16), (0, 0, 255, 128))
  save_image(str(root / 'cat' / 'palette.gif'), 'P', (16, 16), 3)
  (root / 'cat' / 'notes.txt').write_text('not an image')
  return str(root)


def test_image_folder_with_seeded_split(folder):
  train = data.get_source('image_folder', 'train', folder=folder, folder_image_size=10)
  test = data.get_source('image_folder', 'test', folder=folder, folder_image_size=10)
  assert (len(train), len(test)) == (10, 2)  # 6 cats + 6 dogs, one of each held out.
  assert train.class_names == ['cat', 'dog'] and train.num_classes == 2
  assert not set(train.paths) & set(test.paths)
  assert all(path.endswith(('.png', '.jpg', '.PNG', '.gif')) for path in train.paths)
  for i in range(len(train)):
    example = train[i]
    assert example['image'].shape == (10, 10, 3) and example['image'].dtype == np.uint8
  for path, example in ((p, train[i]) for i, p in enumerate(train.paths)):
    image = example['image']
    if path.endswith('.jpg'):  # Grayscale JPEG -> 3 equal channels.
      assert np.all(image == image[..., :1]) and example['label'] == 1
    if path.endswith('.png'):
      np.testing.assert_allclose(image.reshape(-1, 3).mean(0), [200, 10, 10], atol=1)
    if path.endswith('.PNG'):  # RGBA: alpha dropped.
      np.testing.assert_allclose(image.reshape(-1, 3).mean(0), [0, 0, 255], atol=1)
  info = data.dataset_info('image_folder', folder=folder, folder_image_size=10)
  assert info.split_sizes == {'train': 10, 'test': 2} and info.image_shape == (10, 10, 3)


def test_image_folder_with_train_and_test_subfolders(tmp_path):
  for split, count in [('train', 3), ('test', 2)]:
    for name in ('a', 'b'):
      for i in range(count):
        save_image(str(tmp_path / split / name / f'{i}.bmp'), 'RGB', (8, 8), (i, 0, 0))
  train = data.get_source('image_folder', 'train', folder=str(tmp_path), folder_image_size=8)
  test = data.get_source('image_folder', 'test', folder=str(tmp_path), folder_image_size=8)
  assert (len(train), len(test)) == (6, 4)
  np.testing.assert_array_equal(test.labels(), [0, 0, 1, 1])
  batch = next(
    data.TrainLoader(
      train, global_batch_size=4, seed=0, shard_index=0, shard_count=1, positive_mode='label'
    )
  )
  assert batch['image'].shape == (4, 2, 8, 8, 3)


def test_a_test_split_missing_a_middle_class_keeps_the_train_splits_labels(tmp_path):
  """The test split lacks class b (not the last): its c images keep label 2, the train
  split's index of c, and not 1, their position among the test split's folders."""
  for split, names in [('train', 'abc'), ('test', 'ac')]:
    for name in names:
      save_image(str(tmp_path / split / name / '0.bmp'), 'RGB', (8, 8), (ord(name), 0, 0))
  with accepted('a test split missing one of the training classes'):
    test = data.get_source('image_folder', 'test', folder=str(tmp_path), folder_image_size=8)
  np.testing.assert_array_equal(test.labels(), [0, 2])
  assert [int(test[i]['image'][0, 0, 0]) for i in range(2)] == [ord('a'), ord('c')]
  # The other way round, a test class the training split lacks has no label: refused.
  save_image(str(tmp_path / 'test' / 'd' / '0.bmp'), 'RGB', (8, 8), (ord('d'), 0, 0))
  with refused(r"test has classes missing from .*train: \['d'\]", data.ImageFolderError):
    data.get_source('image_folder', 'test', folder=str(tmp_path), folder_image_size=8)


def test_wide_and_tall_images_keep_their_centre_square(tmp_path):
  """Without resizing (the square's side is already the size), the crop offset alone:
  a 9 x 4 image keeps columns 2-5 ((9 - 4) // 2 = 2), a 4 x 7 one rows 1-4."""
  wide = np.zeros((4, 9, 3), np.uint8)
  wide[..., 0] = np.arange(9) * 20  # each column its own red
  # 10 rows: (10 - 4) // 2 = 3 differs from what other operators give (10 ^ 4 = 14, ...).
  tall = np.zeros((10, 4, 3), np.uint8)
  tall[..., 1] = np.arange(10)[:, None] * 20  # each row its own green
  for name, pixels in (('wide', wide), ('tall', tall)):
    Image.fromarray(pixels).save(tmp_path / f'{name}.png')
  np.testing.assert_array_equal(image_folder.load_rgb(str(tmp_path / 'wide.png'), 4), wide[:, 2:6])
  np.testing.assert_array_equal(image_folder.load_rgb(str(tmp_path / 'tall.png'), 4), tall[3:7])


def test_long_lists_in_errors_say_how_many_more(tmp_path):
  """Five names, then 'and N more' (sub-folders and files alike); one unreadable file
  named, then '(and N more)'."""
  class_dir = tmp_path / 'layout' / 'a'  # a class folder without images
  for i in range(7):
    (class_dir / f'sub{i}').mkdir(parents=True)
  for i in range(6):
    (class_dir / f'note{i}.txt').write_text('')
  with pytest.raises(data.ImageFolderError) as error:
    data.get_source('image_folder', 'train', folder=str(tmp_path / 'layout'))
  message = str(error.value)
  for stem, suffix, total in (('sub', '', 7), ('note', '.txt', 6)):
    listed = re.search(rf'((?:{stem}\d{suffix}, ){{4}}{stem}\d{suffix}) and (\d) more', message)
    assert listed and int(listed[2]) == total - 5, message  # five named, the rest counted
  short = tmp_path / 'short' / 'a'  # five or fewer: all named, no 'more'
  for i in range(3):
    (short / f'sub{i}').mkdir(parents=True)
  with pytest.raises(data.ImageFolderError) as error:
    data.get_source('image_folder', 'train', folder=str(tmp_path / 'short'))
  assert 'sub-folders sub0, sub1, sub2' in str(error.value) and 'more' not in str(error.value)
  for i in range(4):
    broken = tmp_path / 'broken' / 'train' / 'only' / f'{i}.png'
    broken.parent.mkdir(parents=True, exist_ok=True)
    broken.write_bytes(b'not a png')
  save_image(str(tmp_path / 'broken' / 'test' / 'only' / '0.png'), 'RGB', (8, 8), (1, 2, 3))
  with pytest.raises(data.ImageFolderError, match=r'only/\d\.png: .* \(and 3 more\); remove or'):
    data.get_source('image_folder', 'train', folder=str(tmp_path / 'broken'))


def test_image_folder_errors_name_the_bad_path(tmp_path):
  with pytest.raises(data.ImageFolderError, match='does not exist'):
    data.get_source('image_folder', 'train', folder=str(tmp_path / 'missing'))
  with pytest.raises(
    data.ImageFolderError, match=f'^image folder {tmp_path} has a layout .*no class sub-folders'
  ):
    data.get_source('image_folder', 'train', folder=str(tmp_path))
  (tmp_path / 'empty_class').mkdir()
  with pytest.raises(data.ImageFolderError, match='empty_class has no image files'):
    data.get_source('image_folder', 'train', folder=str(tmp_path))
  with pytest.raises(data.ImageFolderError, match='needs folder='):
    data.get_source('image_folder', 'train')


def test_unreadable_images_are_named(tmp_path):
  """A file that is not an image stops the split from opening; one whose header reads but
  whose data is cut is named when the split is decoded into memory, or, read lazily, when
  the loader reaches it."""
  for i in range(4):
    save_image(str(tmp_path / 'train' / 'only' / f'{i}.png'), 'RGB', (8, 8), (1, 2, 3))
  save_image(str(tmp_path / 'test' / 'only' / '0.png'), 'RGB', (8, 8), (1, 2, 3))
  broken = tmp_path / 'train' / 'only' / '9_broken.png'
  broken.write_bytes(b'definitely not a png')
  with pytest.raises(data.ImageFolderError, match='cannot read image file .*9_broken.png'):
    data.get_source('image_folder', 'train', folder=str(tmp_path), folder_image_size=8)
  save_image(str(broken), 'RGB', (64, 64), (1, 2, 3))
  broken.write_bytes(broken.read_bytes()[:60])  # header intact, pixel data cut
  with pytest.raises(data.ImageFolderError, match='cannot read image file .*9_broken.png'):
    data.get_source('image_folder', 'train', folder=str(tmp_path), folder_image_size=8)
  source = data.get_source(
    'image_folder', 'train', folder=str(tmp_path), folder_image_size=8, cache_bytes=0
  )
  with pytest.raises(data.ImageFolderError, match='9_broken.png'):
    source[4]
  everything = data.EvalLoader(
    source, global_batch_size=5, shard_index=0, shard_count=1, num_threads=1
  )
  with pytest.raises(data.ImageFolderError, match='9_broken.png'):
    list(everything)


def test_elongated_image_is_cropped_before_resizing(tmp_path):
  """A 1 x 40000 image becomes its centre pixel without scaling the whole strip up
  (which took GBs): the process's peak memory grows by far less than that."""
  strip = np.zeros((40000, 1, 3), np.uint8)
  strip[19990:20010] = (10, 200, 30)  # the centre (resampling reads a neighbour or two)
  path = tmp_path / 'strip.png'
  Image.fromarray(strip).save(path)
  script = (
    'import resource, sys\n'
    'from hscl_jax.data.image_folder import load_rgb\n'
    'before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n'
    'image = load_rgb(sys.argv[1], 64)\n'
    'grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before\n'
    'print(grown, *image.reshape(-1, 3).mean(0), image.shape)\n'
  )
  result = subprocess.run(
    [sys.executable, '-c', script, str(path)], capture_output=True, text=True, check=True
  )
  grown_kib, *mean, shape = result.stdout.split(maxsplit=4)
  assert int(grown_kib) < 100_000, result.stdout  # 64 x 40000 x 64 px would be ~500 MB
  np.testing.assert_allclose([float(m) for m in mean], [10, 200, 30], atol=1)
  assert shape.strip() == '(64, 64, 3)'


# In-memory sources.


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


# The decoded cache: an image folder's split read once into memory.


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


def test_decoded_cache_returns_the_lazy_pixels_and_reads_from_memory(folder):
  """Grayscale, palette, RGBA and odd-sized images: the same pixels and labels as the lazy
  path, and the cached source no longer touches the files."""
  lazy = data.get_source('image_folder', 'train', folder=folder, folder_image_size=7, cache_bytes=0)
  cached = data.get_source('image_folder', 'train', folder=folder, folder_image_size=7)
  assert isinstance(cached, data.ArraySource) and not isinstance(lazy, data.ArraySource)
  np.testing.assert_array_equal(_pixels(cached), _pixels(lazy))
  np.testing.assert_array_equal(cached.labels(), lazy.labels())
  assert [cached[i]['label'] for i in range(len(cached))] == list(lazy.labels())
  assert cached.paths == lazy.paths and cached.class_names == lazy.class_names
  expected = _pixels(lazy)
  for path in lazy.paths:
    os.remove(path)
  np.testing.assert_array_equal(_pixels(cached), expected)


def test_decoded_cache_respects_its_cap(folder):
  size = 10 * 6 * 6 * 3  # the 10 training images of the fixture at 6 x 6 RGB
  at_cap = data.get_source(
    'image_folder', 'train', folder=folder, folder_image_size=6, cache_bytes=size
  )
  assert isinstance(at_cap, data.ArraySource)
  over_cap = data.get_source(
    'image_folder', 'train', folder=folder, folder_image_size=6, cache_bytes=size - 1
  )
  assert isinstance(over_cap, data.ImageFolderSource)


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


# Class-balanced subsets of a training split (config.train_examples).


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


def _digits_config(**overrides):
  config = ml_collections.ConfigDict(
    {
      'dataset': 'digits',
      'data_dir': None,
      'folder': None,
      'split_seed': 0,
      'train_split': 'train',
      'test_split': 'test',
      'augment': {'image_size': 8},
      'train_examples': None,
      'decode_cache_gib': 2.0,
    }
  )
  config.update(overrides)
  return config


def test_run_sources_subset_the_training_split_only():
  train, test = data.run_sources(_digits_config(train_examples=100))
  full_train, full_test = data.run_sources(_digits_config())
  assert len(train) == 100 and len(test) == len(full_test) == 359
  np.testing.assert_array_equal(np.bincount(train.labels()), [10] * 10)
  expected = data.balanced_subset(full_train.labels(), 100, seed=0)
  np.testing.assert_array_equal(_pixels(train), _pixels(full_train)[expected])
  again, _ = data.run_sources(_digits_config(train_examples=100))
  np.testing.assert_array_equal(_pixels(again), _pixels(train))
  other_split_seed, _ = data.run_sources(_digits_config(train_examples=100, split_seed=1))
  assert not np.array_equal(_pixels(other_split_seed), _pixels(train))


@pytest.mark.parametrize('gib,budget', [(0.5, 2**29), (None, 2 * 2**30)])
def test_run_sources_cache_budget_is_the_configs_or_the_default(monkeypatch, gib, budget):
  # None: a config.json written before decode_cache_gib existed gets the 2 GiB default.
  budgets = []
  subset_and_cache, get_source = data_sources._subset_and_cache, data_sources.get_source
  monkeypatch.setattr(
    data_sources, '_subset_and_cache', lambda *a: budgets.append(a[3]) or subset_and_cache(*a)
  )
  monkeypatch.setattr(
    data_sources,
    'get_source',
    lambda *a, **k: budgets.append(k['cache_bytes']) or get_source(*a, **k),
  )
  config = _digits_config(decode_cache_gib=gib)
  if gib is None:
    del config['decode_cache_gib']
  data.run_sources(config)
  assert len(budgets) >= 2 and set(budgets) == {budget}  # the train split's and the test's


@pytest.mark.parametrize('num_examples', [10, 1438])
def test_run_sources_accept_train_examples_at_their_bounds(num_examples):
  """One example per class (10), and the whole training split (1438: equal to its size,
  the same as 0 or None)."""
  with accepted(f'train_examples={num_examples}'):
    train, _ = data.run_sources(_digits_config(train_examples=num_examples))
  full_train, _ = data.run_sources(_digits_config())
  expected = [1] * 10 if num_examples == 10 else np.bincount(full_train.labels())
  np.testing.assert_array_equal(np.bincount(train.labels()), expected)
  if num_examples == 1438:
    np.testing.assert_array_equal(_pixels(train), _pixels(full_train))


@pytest.mark.parametrize('num_examples', [9, 1439])
def test_run_sources_refuse_impossible_train_examples(num_examples):
  with pytest.raises(
    errors.ConfigError,
    match=rf'^config\.train_examples: {num_examples} is not between the 10 classes and the '
    r'1438 examples of the digits train split\. Fix: use a value in \[10, 1438\]',
  ):
    data.run_sources(_digits_config(train_examples=num_examples))


def test_listed_image_files_are_labelled_by_class_folder_only_in_that_layout(tmp_path):
  """root/<class>/ images: labels are the sorted class folders' indices; images at the root
  or deeper than one folder: every label -1, no class names; no image: refused."""
  for name in ('b/1.png', 'a/2.png', 'a/0.jpg'):
    save_image(str(tmp_path / 'classes' / name), 'RGB', (4, 4), (1, 2, 3))
  paths, labels, names = data.list_image_files(str(tmp_path / 'classes'))
  assert [os.path.relpath(p, tmp_path / 'classes') for p in paths] == [
    'a/0.jpg',
    'a/2.png',
    'b/1.png',
  ]
  assert (labels.tolist(), names) == ([0, 0, 1], ['a', 'b'])
  for layout in ('flat/0.png', 'deep/x/y/0.png'):
    save_image(str(tmp_path / layout), 'RGB', (4, 4), (1, 2, 3))
    save_image(str(tmp_path / layout.replace('0.png', '1.png')), 'RGB', (4, 4), (1, 2, 3))
    paths, labels, names = data.list_image_files(str(tmp_path / layout.split('/')[0]))
    assert (len(paths), labels.tolist(), names) == (2, [-1, -1], []), layout


def test_a_folder_without_image_files_is_refused(tmp_path):
  (tmp_path / 'empty' / 'a').mkdir(parents=True)
  (tmp_path / 'empty' / 'a' / 'notes.txt').write_text('')
  with pytest.raises(data.ImageFolderError, match='^no image files under .*empty$'):
    data.list_image_files(str(tmp_path / 'empty'))


def test_the_package_lists_its_lazy_names_before_they_are_loaded():
  """`dir(hscl_jax.data)` (what completion and `help` read): every name of `__all__`, loaded
  or not, beside the module's own globals."""
  names = set(dir(data))
  assert set(data.__all__) <= names and {'__all__', '__getattr__', '__doc__'} <= names
  assert dir(data) == sorted(names)
