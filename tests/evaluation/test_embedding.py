"""evaluation/embedding, the work of `python -m hscl_jax.embed` (the program itself:
tests/test_embed.py): the kNN monitor's features of a split or a folder, as .npz."""

from __future__ import annotations

import pathlib
import types

from acceptance import accepted
import jax
import numpy as np
from PIL import Image
from progress_lines import progress_lines
import pytest

from hscl_jax import data
from hscl_jax import models
from hscl_jax import parallel
from hscl_jax import progress
from hscl_jax.data import augment
from hscl_jax.data import image_folder
from hscl_jax.evaluation import embedding
from hscl_jax.evaluation import features as eval_features
from hscl_jax.rundir import checkpoints
from hscl_jax.rundir import metrics

REPO = pathlib.Path(__file__).resolve().parents[2]


def _direct_features(config, variables, images, *, projections=False):
  """Features computed here on one device, normalised in NumPy (float64): no mesh, no
  loader, no feature function of the package."""
  model = models.create_model(config.model)
  x = augment.preprocess_eval(np.asarray(images), augment.AugmentParams.from_config(config.augment))
  h, z = jax.jit(lambda v, x: model.apply(v, x, train=False))(variables, x)
  out = np.asarray(z if projections else h, np.float64)
  return out / np.linalg.norm(out, axis=1, keepdims=True)


def _trained_variables(result):
  return jax.device_get({'params': result.state.params, 'batch_stats': result.state.batch_stats})


def test_the_runs_epoch_counts_the_training_split(digits_run):
  """The run these tests read (digits, batch 256, no step limit): an epoch is the training
  split's full batches (1438 examples: 5 steps), counted independently here from the 80/20
  per-class split, not the test split's (359: 1 step) nor all 1797 (7)."""
  from sklearn.datasets import load_digits

  workdir, config, result = digits_run
  assert config.steps_per_epoch_limit is None and config.samples_per_class == 0
  sizes = np.bincount(load_digits().target)
  num_train = int(sum(n - round(0.2 * n) for n in sizes))
  steps = num_train // config.batch_size
  assert (num_train, steps) == (1438, 5)
  records = metrics.read_metrics(str(workdir))
  assert [(r['epoch'], r['step']) for r in records] == [(1, steps)]
  assert int(result.state.step) == steps
  assert checkpoints.finished_steps(str(workdir)) == [steps]


def test_split_features_are_the_monitors(digits_run, tmp_path):
  """Embedding the test split (restored from the checkpoint) gives exactly what the kNN
  monitor computes from the trained state, in the split's order, normalised, labelled."""
  workdir, config, result = digits_run
  out = tmp_path / 'test.npz'
  summary = embedding.embed(str(workdir), str(out), split='test')
  saved = np.load(out)
  assert set(saved.files) == {
    'features',
    'labels',
    'class_names',
    'indices',
    'checkpoint_step',
    'split',
  }
  # What it was made from: the run's newest (its only) checkpoint, and the test split.
  newest = max(checkpoints.finished_steps(str(workdir)))
  assert int(saved['checkpoint_step']) == summary['checkpoint_step'] == newest
  assert str(saved['split']) == 'test'
  _, test = data.run_sources(config)
  mesh = parallel.make_mesh()
  assert mesh.size == 4
  monitor = eval_features.make_feature_fn(
    models.create_model(config.model), augment.AugmentParams.from_config(config.augment), mesh
  )
  features, labels, mask = eval_features.extract_features(
    monitor, _trained_variables(result), test, config.knn.batch_size, mesh
  )
  np.testing.assert_array_equal(saved['features'], features[mask])
  np.testing.assert_array_equal(saved['labels'], test.labels())
  np.testing.assert_array_equal(saved['indices'], np.arange(len(test)))
  assert list(saved['class_names']) == [str(i) for i in range(10)]
  assert saved['features'].shape == (len(test), models.feature_dim(config.model.name))
  assert saved['features'].dtype == np.float32
  np.testing.assert_allclose(np.linalg.norm(saved['features'], axis=1), 1.0, atol=1e-6)
  first = [test[i]['image'] for i in range(5)]
  direct = _direct_features(config, _trained_variables(result), first)
  np.testing.assert_allclose(saved['features'][:5], direct, atol=1e-5)
  assert summary['num_images'] == len(test)
  assert summary['checkpoint_step'] == max(checkpoints.finished_steps(str(workdir)))


def test_projections_are_the_heads_outputs_with_a_progress_line(
  digits_run, tmp_path, monkeypatch, caplog
):
  workdir, config, result = digits_run
  out = tmp_path / 'train.npz'
  monkeypatch.setattr(progress, 'EVERY_SECONDS', 0.0)  # a line every batch
  with caplog.at_level('INFO'):
    embedding.embed(str(workdir), str(out), split='train', projections=True)
  for done in (512, 1024):
    assert f'embedding  image {done}/1438 ({100 * done / 1438:.0f}%)' in caplog.text
  saved = np.load(out)
  train, _ = data.run_sources(config)
  assert saved['features'].shape == (len(train), config.model.head_out)
  picks = [0, 7, len(train) - 1]
  direct = _direct_features(
    config, _trained_variables(result), [train[i]['image'] for i in picks], projections=True
  )
  np.testing.assert_allclose(saved['features'][picks], direct, atol=1e-5)
  np.testing.assert_array_equal(saved['labels'], train.labels())


def test_the_progress_line_gives_rate_and_eta_from_the_clock(monkeypatch, caplog):
  clock = iter(range(0, 1000, 10))  # 10 s between two batches
  monkeypatch.setattr(progress, 'time', types.SimpleNamespace(perf_counter=lambda: next(clock)))
  line = embedding._progress_check(1438, 512)  # started at 0 s
  with caplog.at_level('INFO'):
    line()  # 10 s, nothing embedded yet: no line
    line()  # 20 s, 512 embedded: 25.6 img/s, 926 left
  eta = progress.format_duration(926 / 25.6)
  assert caplog.messages == [f'embedding  image 512/1438 (36%)  26 images/s  ETA {eta}']
  assert progress_lines(caplog) == caplog.messages


def _write_images(root: pathlib.Path, size: int) -> list[pathlib.Path]:
  """Two class folders of random RGB images of side `size`, names out of sorted order."""
  rng = np.random.default_rng(0)
  paths = []
  for name, count in (('zebra', 3), ('ant', 2)):
    (root / name).mkdir(parents=True)
    for i in (2, 0, 1)[:count]:
      path = root / name / f'img{i}.png'
      Image.fromarray(rng.integers(0, 256, (size, size, 3), np.uint8)).save(path)
      paths.append(path)
  return sorted(paths)


def test_folder_of_another_size_is_resized_labelled_and_in_path_order(digits_run, tmp_path, caplog):
  workdir, config, result = digits_run
  paths = _write_images(tmp_path / 'images', size=20)
  out = tmp_path / 'folder.npz'
  with caplog.at_level('INFO'):
    embedding.embed(str(workdir), str(out), folder=str(tmp_path / 'images'))
  assert '5 of the 5 images of' in caplog.text and 'resized to 8x8' in caplog.text
  saved = np.load(out)
  assert list(saved['paths']) == [str(p) for p in paths]
  assert list(saved['class_names']) == ['ant', 'zebra']
  np.testing.assert_array_equal(saved['labels'], [0, 0, 1, 1, 1])
  images = [image_folder.load_rgb(str(p), 8) for p in paths]
  direct = _direct_features(config, _trained_variables(result), images)
  np.testing.assert_allclose(saved['features'], direct, atol=1e-5)


def test_flat_folder_has_unknown_labels(digits_run, tmp_path):
  workdir, _, _ = digits_run
  _write_images(tmp_path / 'images', size=8)
  for path in list((tmp_path / 'images').rglob('*.png')):
    path.rename(tmp_path / 'images' / f'{path.parent.name}_{path.name}')
  out = tmp_path / 'flat.npz'
  embedding.embed(str(workdir), str(out), folder=str(tmp_path / 'images'))
  saved = np.load(out)
  np.testing.assert_array_equal(saved['labels'], [-1] * 5)
  assert len(saved['class_names']) == 0 and len(saved['paths']) == 5


def test_unreadable_file_is_refused_naming_it_before_any_work(digits_run, tmp_path, monkeypatch):
  workdir, _, _ = digits_run
  _write_images(tmp_path / 'images', size=8)
  bad = tmp_path / 'images' / 'ant' / 'broken.png'
  bad.write_bytes(b'not an image')

  def no_restore(*args, **kwargs):
    raise AssertionError('the checkpoint was read before the folder was checked')

  monkeypatch.setattr(embedding, 'restore', no_restore)
  out = tmp_path / 'never.npz'
  with pytest.raises(data.ImageFolderError, match=f'cannot read image file {bad}'):
    embedding.embed(str(workdir), str(out), folder=str(tmp_path / 'images'))
  assert not out.exists()


@pytest.mark.parametrize(
  'kwargs, message',
  [
    (dict(out='x.npz'), 'pass exactly one of --folder=DIR'),
    (dict(out='x.npz', folder='a', split='test'), 'pass exactly one of --folder=DIR'),
    (dict(out='x.csv', split='test'), r"--out='x.csv' must name a .npz file"),
    (dict(out='x.npz', split='valid'), "--split='valid' is not a split of the run"),
  ],
)
def test_bad_requests_are_one_line(digits_run, kwargs, message):
  workdir, _, _ = digits_run
  out = kwargs.pop('out')
  with pytest.raises(embedding.EmbedError, match=message):
    embedding.embed(str(workdir), out, **kwargs)


@pytest.mark.parametrize('split, size', [('train', 1438), ('test', 359)])
def test_each_split_of_the_run_is_accepted_and_is_that_split(digits_run, split, size):
  """Both splits the program offers are accepted (a refusal is a failed assertion naming
  it, not a crash) and give that split: the sizes counted in the epoch test above."""
  _, config, _ = digits_run
  with accepted(f'--split={split}'):
    source = embedding.split_source(config, split)
  assert len(source) == size
