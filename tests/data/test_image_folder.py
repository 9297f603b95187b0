"""data/image_folder: image folders as users have them: class folders with a seeded
split or train/ + test/, mixed formats and modes cropped to their centre square, bad paths
and unreadable images named; Tiny-ImageNet's official layout, train/ + val/, unknown layouts
refused; a folder's split decoded into memory (the lazy path's pixels, within its cap);
configs/tiny_imagenet.py end to end; the whole split from the command line."""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys
import zipfile

from acceptance import accepted
from acceptance import refused
import numpy as np
from PIL import Image
import pytest

from data.test_arrays import _pixels
from hscl_jax import data
from hscl_jax.data import image_folder

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
