"""evaluation/linear_evaluation, linear evaluation from Orbax checkpoints: the pipeline, the
protocols, the errors (the program in a process of its own: tests/test_linear_eval.py)."""

from __future__ import annotations

import itertools
import pathlib
import re
import shutil
import sys
import types

import jax
import ml_collections
import numpy as np
import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # `from configs import ...`, as from the repo root

from acceptance import accepted  # noqa: E402
from acceptance import refused  # noqa: E402
from progress_lines import progress_lines  # noqa: E402
from transfer_guard import no_implicit_transfers  # noqa: E402

from configs import digits  # noqa: E402
from hscl_jax import data  # noqa: E402
from hscl_jax import models  # noqa: E402
from hscl_jax import progress  # noqa: E402
from hscl_jax.data import augment  # noqa: E402
from hscl_jax.evaluation import linear_evaluation  # noqa: E402
from hscl_jax.rundir import checkpoints  # noqa: E402
from hscl_jax.rundir import layout  # noqa: E402
from hscl_jax.rundir import trained_run  # noqa: E402
from hscl_jax.training import loop  # noqa: E402


def one_epoch_config():
  config = digits.get_config()
  config.num_epochs = 1
  config.optimizer.warmup_epochs = 0.0
  config.knn.every_epochs = 0
  config.linear_eval.num_epochs = 30
  return config


@pytest.fixture(scope='module')
def trained(tmp_path_factory):
  """One epoch on digits over the 4 fake devices of the test process; its config frozen:
  the tests share it, and one that set a field in place changed what the others read (a
  test that set protocol='knn' failed every test after it that evaluated the run)."""
  workdir = tmp_path_factory.mktemp('run')
  config = one_epoch_config()
  with no_implicit_transfers():
    loop.train_and_evaluate(config, str(workdir))
  return workdir, ml_collections.FrozenConfigDict(config)


def _recomputed_accuracies(config, workdir, step, classifier, source):
  """top-1/top-5 of `classifier` on every example of `source`, computed directly: the
  checkpoint's encoder on preprocess_eval'd images, L2-normalised features, NumPy logits."""
  model = models.create_model(config.model)
  params = augment.AugmentParams.from_config(config.augment)
  size = params.image_size
  variables = trained_run.restore_encoder(str(workdir), step, model, (size, size, 3))
  images = np.stack([source[i]['image'] for i in range(len(source))])
  labels = np.asarray([source[i]['label'] for i in range(len(source))])
  features = np.asarray(
    model.apply(variables, augment.preprocess_eval(images, params), train=False, method='features'),
    np.float64,
  )
  features /= np.linalg.norm(features, axis=1, keepdims=True)
  logits = features @ np.asarray(classifier['w'], np.float64) + np.asarray(classifier['b'])
  ranked = np.argsort(-logits, axis=1)
  return np.mean(ranked[:, 0] == labels), np.mean(np.any(ranked[:, :5] == labels[:, None], axis=1))


def add_untrained_checkpoint(workdir, config, step: int) -> None:
  """An older checkpoint beside the run's: the encoder at its random initialisation."""
  size = config.augment.image_size
  variables = models.initialize(
    models.create_model(config.model), jax.random.key(7), (size, size, 3)
  )
  elsewhere = workdir.parent / 'untrained'
  checkpointer = checkpoints.Checkpointer(str(elsewhere), keep=1)
  checkpointer.save(step, jax.device_get(dict(variables)), iterator_state={})
  checkpointer.close()
  shutil.move(elsewhere / layout.CHECKPOINT_DIR / str(step), workdir / 'checkpoints')


def test_reported_accuracy_is_recomputed_on_the_test_split(trained, tmp_path, monkeypatch):
  """The report's top-1/top-5 are the trained classifier's on the test split, every
  example once: recomputed independently from the checkpoint and the classifier. Beside
  the trained checkpoint lies an older, untrained one: the newest is the one evaluated
  (and named), where the oldest would give other figures."""
  workdir, _ = trained
  copy = tmp_path / 'run'
  shutil.copytree(workdir, copy)
  (newest,) = checkpoints.finished_steps(str(copy))
  add_untrained_checkpoint(copy, one_epoch_config(), step=1)
  assert checkpoints.finished_steps(str(copy)) == [1, newest] and newest > 1
  config = one_epoch_config()
  config.linear_eval.num_epochs = 5
  classifiers = []
  train_loop = linear_evaluation._train_loop

  def capture(*args, **kwargs):
    classifiers.append(jax.device_get(train_loop(*args, **kwargs)))
    return classifiers[-1]

  monkeypatch.setattr(linear_evaluation, '_train_loop', capture)
  with no_implicit_transfers():
    result = linear_evaluation.linear_evaluate(config, str(copy))
  (classifier,) = classifiers
  train_source, test_source = data.run_sources(config)
  assert (result['num_train'], result['num_test']) == (len(train_source), len(test_source))
  assert result['checkpoint_step'] == newest
  top1, top5 = _recomputed_accuracies(config, copy, newest, classifier, test_source)
  tolerance = 1.5 / len(test_source)  # one example on a float32 tie at most
  assert abs(result['top1'] - top1) <= tolerance, (result, top1)
  assert abs(result['top5'] - top5) <= tolerance, (result, top5)
  assert top5 > top1  # top-5 is its own figure here, not a copy of top-1
  train_top1, _ = _recomputed_accuracies(config, copy, newest, classifier, train_source)
  assert abs(train_top1 - top1) > tolerance  # the splits are told apart by the figure
  oldest_top1, _ = _recomputed_accuracies(config, copy, 1, classifier, test_source)
  assert abs(oldest_top1 - top1) > tolerance  # the checkpoints are told apart by it
  assert (result['train_split'], result['test_split']) == (config.train_split, config.test_split)


def test_augmented_protocol(trained, tmp_path):
  workdir, frozen = trained
  copy = tmp_path / 'run'
  shutil.copytree(workdir, copy)
  config = frozen.as_configdict()  # a copy of the shared config
  config.linear_eval.protocol = 'augmented'
  config.linear_eval.num_epochs = 3
  with no_implicit_transfers():
    result = linear_evaluation.linear_evaluate(config, str(copy))
  assert result['protocol'] == 'augmented'
  assert result['top1'] > 0.3, result


def test_clear_errors_name_the_path(trained, tmp_path):
  workdir, config = trained
  with pytest.raises(trained_run.LinearEvalError, match=str(tmp_path / 'config.json')):
    trained_run.load_run_config(str(tmp_path))
  with pytest.raises(trained_run.LinearEvalError, match='no checkpoint in'):
    linear_evaluation.linear_evaluate(config, str(tmp_path))
  with pytest.raises(trained_run.LinearEvalError, match='no checkpoint for step 12345'):
    linear_evaluation.linear_evaluate(config, str(workdir), checkpoint_step=12345)

  other_model = one_epoch_config()
  other_model.model.head_hidden = 64  # head differs: still fine, only the encoder is read
  other_model.model.name = 'resnet18'
  with pytest.raises(trained_run.LinearEvalError, match='checkpoints'):
    linear_evaluation.linear_evaluate(other_model, str(workdir))

  corrupt = tmp_path / 'corrupt'
  shutil.copytree(workdir, corrupt)
  (corrupt / linear_evaluation.RESULT_FILE).unlink(missing_ok=True)
  step = max(checkpoints.finished_steps(str(corrupt)))
  state_dir = corrupt / 'checkpoints' / str(step) / 'state'
  for path in state_dir.rglob('*'):
    if path.is_file() and path.stat().st_size > 100:
      path.write_bytes(b'garbage')
  with pytest.raises(trained_run.LinearEvalError, match=str(state_dir)):
    linear_evaluation.linear_evaluate(config, str(corrupt))
  assert not (corrupt / linear_evaluation.RESULT_FILE).exists()


def test_augmented_views_are_drawn_anew_for_each_epoch_batch_and_seed(trained):
  """The augmented protocol's crops and flips: the same for the same (seed, epoch, batch),
  drawn anew for another epoch, another batch of the epoch and another seed (a key that
  ignored one of them would show the classifier the same views every epoch)."""
  workdir, config = trained
  model = models.create_model(config.model)
  params = augment.AugmentParams.from_config(config.augment)
  size = params.image_size
  step = max(checkpoints.finished_steps(str(workdir)))
  variables = trained_run.restore_encoder(str(workdir), step, model, (size, size, 3))
  source = data.SubsetSource(data.run_sources(config)[0], np.arange(64))
  batches = {
    seed: linear_evaluation._augmented_batches(model, variables, source, params, seed)
    for seed in (0, 1)
  }
  indices = np.arange(5, 37)
  views = lambda seed, epoch, i: np.asarray(jax.device_get(batches[seed](indices, epoch, i)[0]))
  first = views(0, 1, 0)
  labels = jax.device_get(batches[0](indices, 1, 0)[1])
  np.testing.assert_array_equal(labels, source.labels()[indices])
  np.testing.assert_array_equal(views(0, 1, 0), first)  # a function of its key
  for other in (views(0, 2, 0), views(0, 1, 1), views(1, 1, 0)):
    changed = np.any(np.abs(other - first) > 1e-6, axis=1)
    assert changed.mean() > 0.5, changed  # most of the 32 images seen otherwise


def test_the_num_epochs_flag_accepts_one_and_none_and_refuses_zero():
  for value in (1, None):
    with accepted(f'--num_epochs={value}'):
      linear_evaluation.check_num_epochs_flag(value)
  with refused(r'^--num_epochs must be >= 1, got 0 .* Fix: ', trained_run.LinearEvalError):
    linear_evaluation.check_num_epochs_flag(0)


def test_unknown_protocol(trained):
  workdir, frozen = trained
  config = frozen.as_configdict()  # a copy of the shared config
  config.linear_eval.protocol = 'knn'
  with pytest.raises(ValueError, match='linear_eval.protocol'):
    linear_evaluation.linear_evaluate(config, str(workdir))


def _train_on_a_clock(monkeypatch, seconds_per_reading):
  """20 epochs of the linear probe's loop, the clock advancing at each reading."""
  clock = itertools.count(0.0, seconds_per_reading)
  monkeypatch.setattr(progress, 'time', types.SimpleNamespace(perf_counter=lambda: next(clock)))
  cfg = ml_collections.ConfigDict(
    dict(num_epochs=20, batch_size=8, learning_rate=0.1, weight_decay=0.0)
  )
  setup = linear_evaluation.LinearSetup(num_classes=3, feature_dim=4, cfg=cfg)
  rng = np.random.default_rng(0)
  x, y = rng.normal(size=(16, 4)).astype(np.float32), np.arange(16, dtype=np.int32) % 3
  linear_evaluation._train_loop(setup, 16, lambda indices, epoch, i: (x[indices], y[indices]), 0)


def test_the_training_loop_logs_every_ten_seconds_with_elapsed_and_eta_and_a_short_one_never(
  monkeypatch, caplog
):
  """The clock is read once an epoch (and once at the start): at 0.01 s a reading the 20
  epochs take 0.2 s and log no line; at 3 s a reading a line comes once 10 s have passed
  since the last, at epochs 4, 8, 12 and 16 (12 s, 24 s, ...), with the elapsed time and
  the ETA of the epochs left at the rate so far."""
  with caplog.at_level('INFO'):
    _train_on_a_clock(monkeypatch, 0.01)
  assert caplog.messages == []
  with caplog.at_level('INFO'):
    _train_on_a_clock(monkeypatch, 3.0)
  assert progress_lines(caplog) == caplog.messages
  logged = [
    re.fullmatch(
      r'linear eval  epoch (\d+)/20 \(\d+%\)  loss [\d.]+  \d+ examples/s  '
      r'(\d+)s elapsed, ETA (\d+)s',
      m,
    )
    for m in caplog.messages
  ]
  assert all(logged), caplog.messages
  assert [tuple(int(g) for g in m.groups()) for m in logged] == [
    (4, 12, 48),
    (8, 24, 36),
    (12, 36, 24),
    (16, 48, 12),
  ]
