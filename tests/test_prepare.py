"""The `python -m hscl_jax.prepare` program: its one-line errors before any work, and the
program end to end, offline: TFDS's own CIFAR-10 builder and download manager turn an
archive in CIFAR-10's real binary format into array_record files, which training then reads
without TensorFlow. (The library's checks: tests/data/test_tfds_prepare.py; the graph
datasets' download: tests/graphs/test_prepare.py.)

The end-to-end test needs the [prepare] extra (TensorFlow); skipped, saying so, without it.
The only thing faked is the archive's registered checksum (ours is a small archive, not the
official one).
"""

from __future__ import annotations

import importlib.util
import io
import os
import pathlib
import subprocess
import sys
import tarfile

import numpy as np
import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # `from configs import ...`, as from the repo root

from configs import cifar10  # noqa: E402
from hscl_jax import data  # noqa: E402
from hscl_jax.rundir import metrics  # noqa: E402
from hscl_jax.training import loop  # noqa: E402

needs_tensorflow = pytest.mark.skipif(
  importlib.util.find_spec('tensorflow') is None,
  reason="TensorFlow is not installed (pip install -e '.[prepare]'): offline prepare not run",
)

TRAIN_FILES = [f'data_batch_{i}.bin' for i in range(1, 6)]
PER_FILE = 4  # images per batch file: 20 train, 4 test
CLASSES = ['airplane', 'automobile', 'bird', 'cat', 'deer', 'dog', 'frog', 'horse', 'ship', 'truck']

# Runs in a subprocess, so this test process never imports TensorFlow.
PREPARE = """
import dataclasses, sys
import tensorflow_datasets as tfds
from tensorflow_datasets.core.download import checksums
import runpy
archive, data_dir, manual_dir = sys.argv[1:]
url = 'https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz'
tfds.builder_cls('cifar10').url_infos = {url: checksums.compute_url_info(archive)}
# The program itself, as `python -m hscl_jax.prepare` (after the checksum above).
sys.argv = ['prepare', '--dataset=cifar10', '--data_dir=' + data_dir, '--manual_dir=' + manual_dir]
runpy.run_module('hscl_jax.prepare', run_name='__main__', alter_sys=True)
"""


def _images_and_labels(file_index):
  rng = np.random.default_rng(file_index)
  images = rng.integers(0, 256, (PER_FILE, 32, 32, 3), np.uint8)
  labels = (np.arange(PER_FILE) + file_index) % len(CLASSES)
  return images, labels


def _binary_batch(images, labels):
  """CIFAR-10's binary records: a label byte, then the R, G and B planes (row-major)."""
  return b''.join(
    bytes([label]) + image.transpose(2, 0, 1).tobytes() for image, label in zip(images, labels)
  )


def write_archive(path):
  """cifar-10-binary.tar.gz with the official layout; returns {split: (images, labels)}."""
  files = {name: _images_and_labels(i) for i, name in enumerate(TRAIN_FILES + ['test_batch.bin'])}
  with tarfile.open(path, 'w:gz') as archive:
    members = {name: _binary_batch(*arrays) for name, arrays in files.items()}
    members['batches.meta.txt'] = ''.join(name + '\n' for name in CLASSES).encode()
    for name, content in members.items():
      info = tarfile.TarInfo(f'cifar-10-batches-bin/{name}')
      info.size = len(content)
      archive.addfile(info, io.BytesIO(content))
  train_arrays = [files[name] for name in TRAIN_FILES]
  return {
    'train': tuple(np.concatenate(a) for a in zip(*train_arrays)),
    'test': files['test_batch.bin'],
  }


@needs_tensorflow
def test_prepare_cifar10_offline_then_train_without_tensorflow(tmp_path):
  manual_dir, data_dir = tmp_path / 'manual', tmp_path / 'tfds'
  manual_dir.mkdir()
  expected = write_archive(manual_dir / 'cifar-10-binary.tar.gz')
  result = subprocess.run(
    [
      sys.executable,
      '-c',
      PREPARE,
      str(manual_dir / 'cifar-10-binary.tar.gz'),
      str(data_dir),
      str(manual_dir),
    ],
    capture_output=True,
    text=True,
    timeout=300,
    cwd=REPO,
  )
  assert result.returncode == 0, result.stderr[-3000:]
  assert "cifar10 is ready (array_record), split sizes: {'train': 20, 'test': 4}" in result.stdout

  for split, (images, labels) in expected.items():  # TFDS shuffles: compare as sets
    source = data.get_source('cifar10', split, data_dir=str(data_dir))
    read = {source[i]['image'].tobytes(): source[i]['label'] for i in range(len(source))}
    assert read == {image.tobytes(): label for image, label in zip(images, labels)}
  assert 'tensorflow' not in sys.modules

  config = cifar10.get_config()
  config.data_dir = str(data_dir)
  config.model.name = 'small_cnn'
  config.batch_size = 8
  config.num_epochs = 1
  config.steps_per_epoch_limit = 1
  config.knn.k = 3
  config.knn.batch_size = 8
  loop.train_and_evaluate(config, str(tmp_path / 'run'))
  (record,) = metrics.read_metrics(str(tmp_path / 'run'))
  assert record['step'] == 1 and np.isfinite(record['train_loss']) and 0 <= record['knn_top1'] <= 1


def _prepare(*args):
  return subprocess.run(
    [sys.executable, '-m', 'hscl_jax.prepare', *args],
    cwd=REPO,
    env={**os.environ, 'PYTHONPATH': str(REPO)},
    capture_output=True,
    text=True,
    timeout=300,
  )


def test_program_errors_are_one_line_before_any_work(tmp_path):
  no_work = _prepare('--dataset=digits')
  assert no_work.returncode == 1 and 'Traceback' not in no_work.stderr
  assert no_work.stderr.strip().splitlines()[-1] == '--dataset=digits needs no preparation'
  # --manual_dir reaches the library: its missing archive is one logged line, nothing written.
  no_archive = _prepare('--dataset=cifar10', f'--manual_dir={tmp_path}', f'--data_dir={tmp_path}')
  assert no_archive.returncode == 1 and 'Traceback' not in no_archive.stderr
  (line,) = [line for line in no_archive.stderr.splitlines() if line.startswith('E')]
  assert f'--manual_dir={tmp_path} has no cifar-10-binary.tar.gz' in line
  assert os.listdir(tmp_path) == []
