"""Image folders as users have them: Tiny-ImageNet's official layout, train/ + val/, unknown
layouts refused; configs/tiny_imagenet.py end to end; the whole split from the command line."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import zipfile

import numpy as np
from PIL import Image
import pytest

from hscl_jax import data

REPO = pathlib.Path(__file__).resolve().parents[2]
SHARED_ZIP = REPO.parent / 'shared' / 'data' / 'tiny_imagenet' / 'tiny-imagenet-200.zip'

# Not in sorted order: the classes must follow wnids.txt, not the folder names.
WNIDS = ('n02', 'n01', 'n03')
WORDS = {'n01': 'goldfish, Carassius auratus', 'n02': 'tabby, tabby cat', 'n03': 'reel'}


def _image(path: pathlib.Path, value: int, size: int = 12) -> None:
  path.parent.mkdir(parents=True, exist_ok=True)
  Image.new('RGB', (size, size), (value, 255 - value, 7)).save(path)


def make_tiny_imagenet(root: pathlib.Path, train_per_class: int = 4) -> dict[str, int]:
  """The official layout, small: returns each val file's class index (wnids.txt order).
  Pixel value 10·class + i tells an image's class and number apart when decoded."""
  root.mkdir(parents=True)
  (root / 'wnids.txt').write_text('\n'.join(WNIDS) + '\n')
  words = ['n00\tentity'] + [f'{w}\t{WORDS[w]}' for w in sorted(WORDS)]
  (root / 'words.txt').write_text('\n'.join(words) + '\n')
  for label, wnid in enumerate(WNIDS):
    for i in range(train_per_class):
      _image(root / 'train' / wnid / 'images' / f'{wnid}_{i}.JPEG', 10 * label + i)
    (root / 'train' / wnid / f'{wnid}_boxes.txt').write_text('')
  val_labels, annotations = {}, []
  for i, label in enumerate([2, 0, 1, 1, 0, 2]):
    name = f'val_{i}.JPEG'
    _image(root / 'val' / 'images' / name, 100 + i)
    annotations.append(f'{name}\t{WNIDS[label]}\t0\t0\t11\t11')
    val_labels[name] = label
  (root / 'val' / 'val_annotations.txt').write_text('\n'.join(annotations) + '\n')
  return val_labels


@pytest.fixture
def tiny(tmp_path):
  root = tmp_path / 'tiny-imagenet-200'
  return root, make_tiny_imagenet(root)


@pytest.mark.parametrize('cache_bytes', [0, 2**30], ids=['lazy', 'decoded cache'])
def test_official_layout_reads_with_the_right_labels(tiny, cache_bytes):
  root, val_labels = tiny
  kwargs = dict(folder=str(root), folder_image_size=12, cache_bytes=cache_bytes)
  train = data.get_source('image_folder', 'train', **kwargs)
  test = data.get_source('image_folder', 'test', **kwargs)
  assert train.num_classes == test.num_classes == 3
  assert train.class_names == ['tabby', 'goldfish', 'reel']  # wnids.txt order, words.txt names
  assert (len(train), len(test)) == (12, 6)
  for i in range(len(train)):
    wnid = os.path.basename(train.paths[i]).split('_')[0]
    assert train.labels()[i] == WNIDS.index(wnid) == train[i]['label']
    # The decoded pixels are that file's (JPEG: within a few levels).
    number = int(os.path.basename(train.paths[i]).split('_')[1].split('.')[0])
    assert abs(int(train[i]['image'][6, 6, 0]) - (10 * WNIDS.index(wnid) + number)) <= 3
  for i in range(len(test)):
    name = os.path.basename(test.paths[i])
    assert test.labels()[i] == val_labels[name] == test[i]['label']
    assert abs(int(test[i]['image'][6, 6, 0]) - (100 + int(name[4:-5]))) <= 3


def test_train_and_val_class_folders_without_test(tmp_path):
  """ImageNet's convention: val/ stands for a missing test/ (classes in sorted order)."""
  for split, count in (('train', 3), ('val', 2)):
    for name in ('b', 'a'):
      for i in range(count):
        _image(tmp_path / split / name / f'{i}.png', i)
  test = data.get_source('image_folder', 'test', folder=str(tmp_path), folder_image_size=8)
  np.testing.assert_array_equal(test.labels(), [0, 0, 1, 1])
  assert all(f'{os.sep}val{os.sep}' in p for p in test.paths)
  assert test.class_names == ['a', 'b']


def test_test_split_wins_over_val(tmp_path):
  """With both test/ and val/, test/ is the test split (val/ only stands for a missing one)."""
  for split, count in (('train', 2), ('test', 3), ('val', 1)):
    for name in ('a', 'b'):
      for i in range(count):
        _image(tmp_path / split / name / f'{i}.png', i)
  test = data.get_source('image_folder', 'test', folder=str(tmp_path), folder_image_size=8)
  assert len(test) == 6 and all(f'{os.sep}test{os.sep}' in p for p in test.paths)


def _refusal(folder) -> str:
  with pytest.raises(data.ImageFolderError) as error:
    data.get_source('image_folder', 'train', folder=str(folder), folder_image_size=8)
  message = str(error.value)
  assert '\n' not in message and 'known layouts: root/train/<class>/<image>' in message
  assert 'Tiny-ImageNet (root/wnids.txt' in message and 'root/<class>/<image>' in message
  return message


def test_unknown_layouts_are_refused_in_one_line_naming_what_was_found(tmp_path):
  _image(tmp_path / 'only_train' / 'train' / 'a' / '0.png', 1)
  assert 'a train/ sub-folder but neither test/ nor val/' in _refusal(tmp_path / 'only_train')
  _image(tmp_path / 'nested' / 'a' / 'deeper' / 'more' / '0.png', 1)
  message = _refusal(tmp_path / 'nested')
  assert 'class folder' in message and 'has no image files' in message
  assert 'sub-folders deeper' in message
  (tmp_path / 'files_only').mkdir()
  (tmp_path / 'files_only' / 'readme.txt').write_text('')
  assert 'files readme.txt' in _refusal(tmp_path / 'files_only')


def test_annotations_naming_an_unknown_class_are_refused(tiny):
  root, _ = tiny
  with open(root / 'val' / 'val_annotations.txt', 'a') as f:
    f.write('val_0.JPEG\tn99\t0\t0\t1\t1\n')
  with pytest.raises(
    data.ImageFolderError, match=r"val_annotations.txt line 7: .*'val_0.JPEG\\tn99"
  ):
    data.get_source('image_folder', 'test', folder=str(root), folder_image_size=8)


def test_annotations_naming_missing_files_name_the_first_of_them(tiny):
  """Two annotated images gone: the refusal names the first, in the annotations' order."""
  root, _ = tiny
  for name in ('val_1.JPEG', 'val_4.JPEG'):
    (root / 'val' / 'images' / name).unlink()
  with pytest.raises(data.ImageFolderError, match=r'names missing image files: .*/val_1\.JPEG$'):
    data.get_source('image_folder', 'test', folder=str(root), folder_image_size=8)


def _main(workdir, *overrides, config='configs/tiny_imagenet.py'):
  command = [sys.executable, '-m', 'hscl_jax.main', f'--config={config}', f'--workdir={workdir}']
  out = subprocess.run(
    command + list(overrides), cwd=REPO, capture_output=True, text=True, timeout=600
  )
  assert out.returncode == 0, out.stderr[-3000:]
  return [json.loads(line) for line in (workdir / 'metrics.jsonl').read_text().splitlines()]


def test_config_trains_one_short_epoch_on_the_official_layout(tmp_path):
  """configs/tiny_imagenet.py (its CPU budget), the whole split from the command line
  (`--config.train_examples=0`): every training image in the kNN bank."""
  root = tmp_path / 'tiny-imagenet-200'
  make_tiny_imagenet(root, train_per_class=8)
  history = _main(
    tmp_path / 'run',
    f'--config.folder={root}',
    '--config.train_examples=0',
    '--config.batch_size=8',
    '--config.num_epochs=1',
    '--config.knn.k=5',
    '--config.knn.batch_size=8',
    config='configs/tiny_imagenet.py:cpu',
  )
  assert history[-1]['epoch'] == 1 and history[-1]['step'] == 3  # 24 images / batch 8
  assert 0.0 <= history[-1]['knn_top1'] <= 1.0
  stored = json.loads((tmp_path / 'run' / 'config.json').read_text())
  assert stored['train_examples'] == 0 and stored['augment']['image_size'] == 32


@pytest.mark.slow  # 40 s idle, 130 s under load: unzips 60,000 files and reads 10,000
@pytest.mark.skipif(not SHARED_ZIP.exists(), reason=f'no {SHARED_ZIP} (a clone without shared/)')
def test_the_real_tiny_imagenet_reads_in_its_official_layout(tmp_path):
  """The released folder: 200 classes in wnids.txt order, val labels from the annotations
  (checked against the file itself for every image), a short run on 1 image per class."""
  with zipfile.ZipFile(SHARED_ZIP) as archive:
    archive.extractall(tmp_path)
  root = tmp_path / 'tiny-imagenet-200'
  wnids = (root / 'wnids.txt').read_text().split()
  test = data.get_source(
    'image_folder', 'test', folder=str(root), folder_image_size=32, cache_bytes=0
  )
  assert test.class_ids == wnids and len(test) == 10_000
  assert np.bincount(test.labels(), minlength=200).tolist() == [50] * 200
  label_of = dict(zip(test.paths, test.labels().tolist()))
  for line in (root / 'val' / 'val_annotations.txt').read_text().splitlines():
    name, wnid = line.split('\t')[:2]
    assert label_of[str(root / 'val' / 'images' / name)] == wnids.index(wnid)
  assert test.class_names[wnids.index('n01443537')] == 'goldfish'
  history = _main(
    tmp_path / 'run',
    f'--config.folder={root}',
    '--config.train_examples=200',
    '--config.batch_size=100',
    '--config.num_epochs=1',
    config='configs/tiny_imagenet.py:cpu',
  )
  assert history[-1]['step'] == 2 and 0.0 <= history[-1]['knn_top1'] <= 1.0
