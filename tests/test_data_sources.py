"""Digits and image-folder sources, the stratified split, and error messages."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
from PIL import Image
import pytest

from hscl_jax import data


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


def test_image_folder_errors_name_the_bad_path(tmp_path):
  with pytest.raises(data.ImageFolderError, match='does not exist'):
    data.get_source('image_folder', 'train', folder=str(tmp_path / 'missing'))
  with pytest.raises(
    data.ImageFolderError, match=f'no class sub-folders in image folder {tmp_path}'
  ):
    data.get_source('image_folder', 'train', folder=str(tmp_path))
  (tmp_path / 'empty_class').mkdir()
  with pytest.raises(data.ImageFolderError, match='empty_class has no image files'):
    data.get_source('image_folder', 'train', folder=str(tmp_path))
  with pytest.raises(data.ImageFolderError, match='needs folder='):
    data.get_source('image_folder', 'train')


def test_unreadable_images_are_named(tmp_path):
  """A file that is not an image stops the split from opening; one whose header reads but
  whose data is cut is named when the loader reaches it."""
  for i in range(4):
    save_image(str(tmp_path / 'train' / 'only' / f'{i}.png'), 'RGB', (8, 8), (1, 2, 3))
  save_image(str(tmp_path / 'test' / 'only' / '0.png'), 'RGB', (8, 8), (1, 2, 3))
  broken = tmp_path / 'train' / 'only' / '9_broken.png'
  broken.write_bytes(b'definitely not a png')
  with pytest.raises(data.ImageFolderError, match='cannot read image file .*9_broken.png'):
    data.get_source('image_folder', 'train', folder=str(tmp_path), folder_image_size=8)
  save_image(str(broken), 'RGB', (64, 64), (1, 2, 3))
  broken.write_bytes(broken.read_bytes()[:60])  # header intact, pixel data cut
  source = data.get_source('image_folder', 'train', folder=str(tmp_path), folder_image_size=8)
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
