"""A user's own images as they come: class sub-folders, ImageNet's train/val, Tiny-ImageNet.

Layouts (LAYOUTS names them in errors):
  root/train/<class>/* and root/test/<class>/*  (given splits; root/val/ stands for a
                                                  missing root/test/, as ImageNet ships);
  Tiny-ImageNet-200 as released: root/wnids.txt (the classes, in that order),
  root/train/<wnid>/images/*.JPEG, root/val/images/* labelled by root/val/val_annotations.txt,
  and root/words.txt for the classes' readable names;
  root/<class>/*                                  (a seeded stratified 80/20 split).
A class folder may keep its images in an images/ sub-folder (Tiny-ImageNet's train/).
Any format PIL reads is accepted; grayscale, palette and RGBA images become RGB
(alpha is dropped). Every image is centre-cropped to a square and resized to
``image_size`` so that batches stack. Every file's header is read when a split is opened,
so a file that is not an image stops the run before training, naming it.
`list_image_files` and `ImageFilesSource` read any folder of images (embedding a user's
own images: labelled by class folder when it has that layout).
"""

from __future__ import annotations

import collections
from concurrent import futures
import dataclasses
import functools
import os

import numpy as np
from PIL import Image

from hscl_jax.data.arrays import stratified_split
from hscl_jax.data.errors import ImageFolderError

DEFAULT_IMAGE_SIZE = 64
LAYOUTS = (
  'root/train/<class>/<image> + root/test/<class>/ (or root/val/<class>/)',
  'Tiny-ImageNet (root/wnids.txt, root/train/<wnid>/images/, root/val/val_annotations.txt)',
  'root/<class>/<image> (split 80/20 by split_seed)',
)
# Tiny-ImageNet's labels of its val/ split and its class list and names.
ANNOTATIONS_FILE = 'val_annotations.txt'
CLASS_LIST_FILE = 'wnids.txt'
CLASS_NAMES_FILE = 'words.txt'


@functools.cache
def image_extensions() -> frozenset[str]:
  """Lower-case file extensions PIL can open (e.g. '.png', '.jpg', '.webp')."""
  return frozenset(ext.lower() for ext in Image.registered_extensions())


def _visible_entries(path: str) -> list[os.DirEntry]:
  return sorted((e for e in os.scandir(path) if not e.name.startswith('.')), key=lambda e: e.name)


def _unknown_layout(root: str, found: str) -> ImageFolderError:
  return ImageFolderError(
    f'image folder {root} has a layout the reader does not know ({found}); '
    f'known layouts: {"; ".join(LAYOUTS)}'
  )


def _describe(path: str) -> str:
  """'sub-folders a, b; files x.txt' (a few of each) for an error message."""
  entries = _visible_entries(path)
  dirs = [e.name for e in entries if e.is_dir()]
  files = [e.name for e in entries if not e.is_dir()]
  few = lambda names: (
    ', '.join(names[:5]) + (f' and {len(names) - 5} more' if len(names) > 5 else '')
  )
  parts = ([f'sub-folders {few(dirs)}'] if dirs else []) + (
    [f'files {few(files)}'] if files else []
  )
  return f'found in {path}: ' + ('; '.join(parts) or 'nothing')


def _class_dirs(root: str) -> list[str]:
  classes = [e.name for e in _visible_entries(root) if e.is_dir()]
  if not classes:
    raise _unknown_layout(root, f'no class sub-folders; {_describe(root)}')
  return classes


def _image_files(folder: str) -> list[str]:
  extensions = image_extensions()
  return [
    e.path
    for e in _visible_entries(folder)
    if e.is_file() and os.path.splitext(e.name)[1].lower() in extensions
  ]


def _class_images(class_dir: str, root: str) -> list[str]:
  """The images of one class folder, directly in it or in its images/ sub-folder."""
  files = _image_files(class_dir)
  if not files and os.path.isdir(os.path.join(class_dir, 'images')):
    files = _image_files(os.path.join(class_dir, 'images'))
  if not files:
    raise _unknown_layout(
      root, f'class folder {class_dir} has no image files; {_describe(class_dir)}'
    )
  return files


def _list_images(split_dir: str, classes: list[str], root: str) -> tuple[list[str], np.ndarray]:
  """Image paths under split_dir/<class>/ and their class indices (classes order)."""
  paths, labels = [], []
  for label, name in enumerate(classes):
    class_dir = os.path.join(split_dir, name)
    if not os.path.isdir(class_dir):
      continue  # A test split may lack a class.
    files = _class_images(class_dir, root)
    paths.extend(files)
    labels.extend([label] * len(files))
  return paths, np.asarray(labels, np.int32)


def _annotated_images(split_dir: str, classes: list[str], root: str):
  """Tiny-ImageNet's val/: images/<file> labelled by val_annotations.txt (file, wnid, box)."""
  index = {name: i for i, name in enumerate(classes)}
  paths, labels = [], []
  with open(os.path.join(split_dir, ANNOTATIONS_FILE)) as f:
    for number, line in enumerate(f, start=1):
      fields = line.split('\t')
      if len(fields) < 2 or fields[1].strip() not in index:
        raise ImageFolderError(
          f'{split_dir}/{ANNOTATIONS_FILE} line {number}: expected "<file>\t<class>" with a '
          f'class of {root}/train (or {CLASS_LIST_FILE}), got {line.strip()!r}'
        )
      paths.append(os.path.join(split_dir, 'images', fields[0]))
      labels.append(index[fields[1].strip()])
  missing = [p for p in paths if not os.path.isfile(p)]
  if missing:
    raise ImageFolderError(
      f'{split_dir}/{ANNOTATIONS_FILE} names missing image files: {missing[0]}'
    )
  return paths, np.asarray(labels, np.int32)


def _given_splits(root: str) -> tuple[str, str] | None:
  """(train dir, test dir) of a folder with given splits (val/ standing for a missing
  test/); None for a flat folder of class sub-folders."""
  train, test, val = (os.path.join(root, name) for name in ('train', 'test', 'val'))
  if not os.path.isdir(train):
    return None
  for candidate in (test, val):
    if os.path.isdir(candidate):
      return train, candidate
  raise _unknown_layout(root, f'a train/ sub-folder but neither test/ nor val/; {_describe(root)}')


def _classes(root: str, train_dir: str) -> list[str]:
  """wnids.txt's classes in its order where the folder has one, else train/'s sub-folders."""
  path = os.path.join(root, CLASS_LIST_FILE)
  if not os.path.isfile(path):
    return _class_dirs(train_dir)
  with open(path) as f:
    classes = [line.strip() for line in f if line.strip()]
  missing = [c for c in classes if not os.path.isdir(os.path.join(train_dir, c))]
  if missing or not classes:
    raise ImageFolderError(
      f'{path} lists classes without a folder in {train_dir}: {missing[:5]}'
      if missing
      else f'{path} lists no classes'
    )
  return classes


def readable_names(root: str, classes: list[str]) -> list[str]:
  """Each class's name from root/words.txt (its first synonym: 'n01443537' -> 'goldfish'),
  the class folder's name where the folder has no words.txt or no line for it."""
  path = os.path.join(root, CLASS_NAMES_FILE)
  if not os.path.isfile(path):
    return list(classes)
  wanted, names = set(classes), {}
  with open(path) as f:
    for line in f:
      class_id, _, words = line.rstrip('\n').partition('\t')
      if class_id in wanted:
        names[class_id] = words.split(',')[0].strip() or class_id
  return [names.get(c, c) for c in classes]


@dataclasses.dataclass(frozen=True)
class FolderSplit:
  """One split of an image folder: files, labels, the classes' ids (folder names or
  WordNet ids) and readable names, in label order."""

  paths: list[str]
  labels: np.ndarray
  class_ids: list[str]
  class_names: list[str]


def scan_image_folder(root: str, split: str, seed: int = 0) -> FolderSplit:
  """One split of any layout in LAYOUTS; raises ImageFolderError on others."""
  if split not in ('train', 'test'):
    raise ValueError(f"image_folder has splits 'train' and 'test', not '{split}'")
  if not root or not os.path.isdir(root):
    raise ImageFolderError(f'image folder {root!r} does not exist or is not a directory')
  splits = _given_splits(root)
  if splits is None:
    classes = _class_dirs(root)
    paths, labels = _list_images(root, classes, root)
    indices = stratified_split(labels, seed)[split]
    paths, labels = [paths[i] for i in indices], labels[indices]
    return FolderSplit(paths, labels, classes, readable_names(root, classes))
  train_dir, test_dir = splits
  classes = _classes(root, train_dir)
  split_dir = train_dir if split == 'train' else test_dir
  if os.path.isfile(os.path.join(split_dir, ANNOTATIONS_FILE)):
    paths, labels = _annotated_images(split_dir, classes, root)
  else:
    extra = sorted(set(_class_dirs(split_dir)) - set(classes))
    if extra:
      raise ImageFolderError(f'{split_dir} has classes missing from {train_dir}: {extra}')
    paths, labels = _list_images(split_dir, classes, root)
  return FolderSplit(paths, labels, classes, readable_names(root, classes))


_PIL_ERRORS = (OSError, ValueError, SyntaxError)  # what PIL raises for bad files


def load_rgb(path: str, image_size: int) -> np.ndarray:
  """Reads one image as uint8 [image_size, image_size, 3]; errors name the file."""
  try:
    with Image.open(path) as image:
      image = image.convert('RGB')
      return np.asarray(_center_square_resized(image, image_size), np.uint8)
  except _PIL_ERRORS as error:
    raise ImageFolderError(f'cannot read image file {path}: {error}') from error


def _center_square_resized(image: Image.Image, size: int) -> Image.Image:
  """The centre square resized to size x size: resizing only the cropped box keeps a
  very elongated image (e.g. 1 x 40000) from being scaled up whole first."""
  width, height = image.size
  side = min(width, height)
  left, top = (width - side) // 2, (height - side) // 2
  box = (left, top, left + side, top + side)
  if side == size:
    return image.crop(box)
  return image.resize((size, size), Image.Resampling.BILINEAR, box=box)


def _header_size(path: str) -> tuple[int, int] | str:
  """(width, height) from the file's header, or the error naming the file."""
  try:
    with Image.open(path) as image:  # reads the header only
      return image.size
  except _PIL_ERRORS as error:
    return f'{path}: {error}'


@functools.cache
def _check_headers(paths: tuple[str, ...]) -> collections.Counter:
  """{(width, height): number of files}; raises naming the files whose header PIL cannot
  read (I/O-bound: threads)."""
  with futures.ThreadPoolExecutor(max_workers=16) as pool:
    sizes = list(pool.map(_header_size, paths))
  errors = [e for e in sizes if isinstance(e, str)]
  if errors:
    more = f' (and {len(errors) - 1} more)' if len(errors) > 1 else ''
    raise ImageFolderError(
      f'cannot read image file {errors[0]}{more}; remove or replace the unreadable files'
    )
  return collections.Counter(sizes)


def list_image_files(root: str) -> tuple[list[str], np.ndarray, list[str]]:
  """(paths, labels, class_names) of every image file under `root`, recursively, sorted by
  path. When every image lies in root/<class>/, a label is its class folder's index
  (class_names sorted); otherwise every label is -1 and class_names is empty."""
  if not root or not os.path.isdir(root):
    raise ImageFolderError(f'image folder {root!r} does not exist or is not a directory')
  extensions = image_extensions()
  paths = []
  for directory, subdirs, names in os.walk(root):
    subdirs[:] = [d for d in subdirs if not d.startswith('.')]  # prunes hidden folders
    paths.extend(
      os.path.join(directory, name)
      for name in names
      if not name.startswith('.') and os.path.splitext(name)[1].lower() in extensions
    )
  paths.sort()
  if not paths:
    raise ImageFolderError(f'no image files under {root}')
  parents = [os.path.relpath(os.path.dirname(p), root) for p in paths]
  if any(parent == '.' or os.sep in parent for parent in parents):
    return paths, np.full(len(paths), -1, np.int32), []
  class_names = sorted(set(parents))
  index = {name: i for i, name in enumerate(class_names)}
  return paths, np.asarray([index[p] for p in parents], np.int32), class_names


class ImageFilesSource:
  """Random-access source over given image files, read lazily, each centre-cropped and
  resized to `image_size`. Every header is read at construction: an unreadable file is
  refused there, naming it; `file_sizes` counts the files' (width, height)."""

  def __init__(self, paths, labels, class_names, *, image_size: int = DEFAULT_IMAGE_SIZE):
    self.paths, self.class_names = list(paths), class_names
    self._labels = np.asarray(labels, np.int32)
    self.file_sizes = dict(_check_headers(tuple(self.paths)))
    self.num_classes = len(self.class_names)
    self.image_size = image_size
    self.image_shape = (image_size, image_size, 3)

  def __len__(self) -> int:
    return len(self.paths)

  def __getitem__(self, index: int) -> dict:
    return {
      'image': load_rgb(self.paths[index], self.image_size),
      'label': int(self._labels[index]),
    }

  def labels(self) -> np.ndarray:
    return self._labels


class ImageFolderSource(ImageFilesSource):
  """Random-access source over one split of an image folder (images read lazily)."""

  def __init__(self, root: str, split: str, *, seed: int = 0, image_size: int = DEFAULT_IMAGE_SIZE):
    scanned = scan_image_folder(root, split, seed)
    if not scanned.paths:
      raise ImageFolderError(f"split '{split}' of image folder {root} is empty")
    super().__init__(scanned.paths, scanned.labels, scanned.class_names, image_size=image_size)
    self.class_ids = scanned.class_ids  # folder names or WordNet ids; class_names: readable
