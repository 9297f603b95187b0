"""A user's own images: one sub-folder per class (this is also how Tiny-ImageNet is used).

Layouts:
  root/train/<class>/*.png and root/test/<class>/*.jpg  (given splits), or
  root/<class>/*                                         (seeded stratified 80/20 split).
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
import functools
import os

import numpy as np
from PIL import Image

from hscl_jax.data.arrays import stratified_split
from hscl_jax.data.errors import ImageFolderError

DEFAULT_IMAGE_SIZE = 64


@functools.cache
def image_extensions() -> frozenset[str]:
  """Lower-case file extensions PIL can open (e.g. '.png', '.jpg', '.webp')."""
  return frozenset(ext.lower() for ext in Image.registered_extensions())


def _visible_entries(path: str) -> list[os.DirEntry]:
  return sorted((e for e in os.scandir(path) if not e.name.startswith('.')), key=lambda e: e.name)


def _class_dirs(root: str) -> list[str]:
  classes = [e.name for e in _visible_entries(root) if e.is_dir()]
  if not classes:
    raise ImageFolderError(
      f'no class sub-folders in image folder {root} '
      '(expected root/<class>/<image> or root/train/<class>/<image>)'
    )
  return classes


def _list_images(root: str, classes: list[str]) -> tuple[list[str], np.ndarray]:
  """Image paths under root/<class>/ and their class indices (classes order)."""
  paths, labels = [], []
  extensions = image_extensions()
  for label, name in enumerate(classes):
    class_dir = os.path.join(root, name)
    if not os.path.isdir(class_dir):
      continue  # A test split may lack a class.
    files = [
      e.path
      for e in _visible_entries(class_dir)
      if e.is_file() and os.path.splitext(e.name)[1].lower() in extensions
    ]
    if not files:
      raise ImageFolderError(f'class folder {class_dir} has no image files')
    paths.extend(files)
    labels.extend([label] * len(files))
  return paths, np.asarray(labels, np.int32)


def _has_given_splits(root: str) -> bool:
  return os.path.isdir(os.path.join(root, 'train')) and os.path.isdir(os.path.join(root, 'test'))


def scan_image_folder(root: str, split: str, seed: int = 0):
  """(paths, labels, class_names) of one split; raises ImageFolderError on bad layouts."""
  if split not in ('train', 'test'):
    raise ValueError(f"image_folder has splits 'train' and 'test', not '{split}'")
  if not root or not os.path.isdir(root):
    raise ImageFolderError(f'image folder {root!r} does not exist or is not a directory')
  if _has_given_splits(root):
    classes = _class_dirs(os.path.join(root, 'train'))
    test_only = sorted(set(_class_dirs(os.path.join(root, 'test'))) - set(classes))
    if test_only:
      raise ImageFolderError(f'{root}/test has classes missing from train: {test_only}')
    paths, labels = _list_images(os.path.join(root, split), classes)
    return paths, labels, classes
  classes = _class_dirs(root)
  paths, labels = _list_images(root, classes)
  indices = stratified_split(labels, seed)[split]
  return [paths[i] for i in indices], labels[indices], classes


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
    paths, labels, class_names = scan_image_folder(root, split, seed)
    if not paths:
      raise ImageFolderError(f"split '{split}' of image folder {root} is empty")
    super().__init__(paths, labels, class_names, image_size=image_size)
