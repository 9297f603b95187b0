"""configs/cifar10_folder.py and configs/image_folder.py end to end: generated folders, and
CIFAR-10 when it is there.

The cifar10_folder run trains on a class-balanced subset (config.train_examples); the kNN
monitor's bank and the linear evaluation use that same subset, which is checked by
recomputing the reported figures independently from the checkpoint.
"""

from __future__ import annotations

import json
import os
import pathlib
import sys

import jax
import numpy as np
from PIL import Image
from progress_lines import LINE
from progress_lines import progress_lines
import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # `from configs import ...`, as from the repo root

from configs import cifar10_folder  # noqa: E402
from configs import image_folder  # noqa: E402
from hscl_jax import data  # noqa: E402
from hscl_jax import models  # noqa: E402
from hscl_jax import parallel  # noqa: E402
from hscl_jax.config import fields  # noqa: E402
from hscl_jax.data import augment  # noqa: E402
from hscl_jax.evaluation import features as eval_features  # noqa: E402
from hscl_jax.evaluation import knn  # noqa: E402
from hscl_jax.evaluation import linear_evaluation  # noqa: E402
from hscl_jax.rundir import layout  # noqa: E402
from hscl_jax.rundir import metrics  # noqa: E402
from hscl_jax.rundir import trained_run  # noqa: E402
from hscl_jax.training import loop  # noqa: E402

CIFAR10 = REPO.parent / 'shared' / 'data' / 'cifar10'
NUM_CLASSES = 4


def write_folder(root: pathlib.Path, per_class: dict[str, int], shift: float = 0) -> None:
  """root/<split>/class<c>/<i>.png: 32 x 32 noise around a colour of the class, moved
  per image by a random colour of std `shift` (pixel noise alone averages out)."""
  rng = np.random.default_rng(0)
  for split, count in per_class.items():
    for c in range(NUM_CLASSES):
      colour = np.array([60 * c, 255 - 60 * c, 40 + 50 * (c % 2)])
      os.makedirs(root / split / f'class{c}', exist_ok=True)
      for i in range(count):
        image_colour = colour + rng.normal(0, shift, 3)
        pixels = image_colour + rng.normal(0, 40, (32, 32, 3))
        pixels = np.clip(pixels, 0, 255).astype(np.uint8)
        Image.fromarray(pixels).save(root / split / f'class{c}' / f'{i}.png')


def short_config(folder: str):
  config = cifar10_folder.get_config()
  config.folder = folder
  config.train_examples = 24
  config.batch_size = 8
  config.num_epochs = 1
  config.optimizer.warmup_epochs = 0.0
  config.linear_eval.num_epochs = 3
  config.knn.k = 5
  config.knn.batch_size = 8
  return config


def recomputed_knn(config, workdir, *, bank_split: str = 'subset', k: int | None = None) -> float:
  """The kNN accuracy of the last checkpoint, from a bank built here from the subset (or,
  `bank_split='train'`, the whole train split), with config.knn's k (or `k`)."""
  model = models.create_model(config.model)
  size = config.augment.image_size
  step, variables = trained_run.restore_usable_encoder(workdir, None, model, (size, size, 3))
  mesh = parallel.make_mesh(jax.devices()[:1])
  params = augment.AugmentParams.from_config(config.augment)
  feature_fn = eval_features.make_feature_fn(model, params, mesh)
  full_train, test = (
    data.get_source('image_folder', 'train', folder=config.folder, folder_image_size=size),
    data.get_source('image_folder', 'test', folder=config.folder, folder_image_size=size),
  )
  subset = data.SubsetSource(
    full_train, data.balanced_subset(full_train.labels(), config.train_examples, config.split_seed)
  )
  bank_source = subset if bank_split == 'subset' else full_train
  bank, bank_labels, bank_mask = eval_features.extract_features(
    feature_fn, variables, bank_source, 8, mesh
  )
  queries, query_labels, query_mask = eval_features.extract_features(
    feature_fn, variables, test, 8, mesh
  )
  assert bank_mask.sum() == len(bank_source) and query_mask.sum() == len(test)
  return knn.weighted_knn_accuracy(
    bank[bank_mask],
    bank_labels[bank_mask],
    queries[query_mask],
    query_labels[query_mask],
    num_classes=NUM_CLASSES,
    k=k or config.knn.k,
    temperature=config.knn.temperature,
  )


def test_cifar10_folder_config_runs_an_epoch_on_a_generated_folder(tmp_path):
  # Colours moved per image: a kNN neither at chance nor perfect, so the bank and k the
  # monitor uses change its figure (on separable classes every bank scores 1).
  write_folder(tmp_path / 'images', {'train': 16, 'test': 10}, shift=70)
  config = short_config(str(tmp_path / 'images'))
  workdir = str(tmp_path / 'run')
  loop.train_and_evaluate(config, workdir)
  (record,) = metrics.read_metrics(workdir)
  assert record['step'] == 3  # 24 subset examples / batch 8: the subset is what is trained on
  expected = recomputed_knn(config, workdir)
  wrong = (
    recomputed_knn(config, workdir, bank_split='train'),
    recomputed_knn(config, workdir, k=1),
  )
  assert 0.25 < expected < 1 and expected not in wrong, (expected, wrong)
  assert record['knn_top1'] == pytest.approx(expected, abs=1e-6)
  result = linear_evaluation.linear_evaluate(config, workdir)
  assert (result['num_train'], result['num_test']) == (24, 40)
  with open(os.path.join(workdir, layout.CONFIG_FILE)) as f:
    assert json.load(f)['train_examples'] == 24


@pytest.mark.slow  # 42 s idle: decodes 60,000 JPEGs; the generated folder above is the path
@pytest.mark.skipif(not CIFAR10.is_dir(), reason=f'CIFAR-10 image folder not at {CIFAR10}')
def test_short_real_cifar10_run(tmp_path):
  """A few steps on the real JPEGs: decoded into memory, a learned kNN above chance."""
  config = cifar10_folder.get_config()
  config.folder = str(CIFAR10)
  config.train_examples = 1000
  config.batch_size = 100
  config.num_epochs = 1
  config.steps_per_epoch_limit = 4
  config.optimizer.warmup_epochs = 0.0
  workdir = str(tmp_path / 'run')
  loop.train_and_evaluate(config, workdir)
  (record,) = metrics.read_metrics(workdir)
  assert record['step'] == 4 and np.isfinite(record['train_loss'])
  assert record['knn_top1'] > 0.2  # 10 classes: chance is 0.1


def test_image_folder_config_runs_on_a_small_folder_and_says_what_its_epochs_leave_out(
  tmp_path, caplog
):
  """configs/image_folder.py as shipped (2 epochs) on 100 generated training images of 4
  classes (ROOT/train/, ROOT/test/): one step of batch 64 an epoch leaves out 36 (36 %),
  warned at start with the batch that keeps the most (48 on the 4 devices: 4 left out).
  The whole split is trained on (no train_examples), at 32 px with ImageNet's
  normalisation; the first progress line, at the compiling step, says when the rate and
  ETA are known, and no line shows a NaN rate or an unknown ETA (progress_lines' format)."""
  write_folder(tmp_path / 'images', {'train': 25, 'test': 5})
  config = image_folder.get_config()
  config.folder = str(tmp_path / 'images')
  config.num_epochs = 2
  workdir = str(tmp_path / 'run')
  with caplog.at_level('INFO'):
    loop.train_and_evaluate(config, workdir)
  warnings = [r.getMessage() for r in caplog.records if r.levelname == 'WARNING']
  assert warnings == [
    'Each epoch trains on 64 of the 100 training examples (1 step of batch 64): the other '
    '36 (36%), drawn afresh each epoch, are left out. Fix: --config.batch_size=48 leaves '
    'out 4 (2 steps an epoch).'
  ]
  lines = progress_lines(caplog)
  assert [LINE.fullmatch(line)['done'] for line in lines] == ['1', '2'], lines
  assert lines[0].endswith('views/s and ETA after step 2'), lines
  records = metrics.read_metrics(workdir)
  assert [r['step'] for r in records] == [1, 2] and 'knn_top1' in records[-1]
  assert np.isfinite(records[-1]['train_loss'])
  with open(os.path.join(workdir, layout.CONFIG_FILE)) as f:
    stored = json.load(f)
  assert stored['train_examples'] == 0 and stored['augment']['image_size'] == 32
  assert tuple(stored['augment']['mean']) == fields.NORMALIZATION['imagenet'][0]
  assert tuple(stored['augment']['std']) == fields.NORMALIZATION['imagenet'][1]
