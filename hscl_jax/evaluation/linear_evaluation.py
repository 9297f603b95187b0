"""Linear evaluation of a trained encoder, read from the run's Orbax checkpoint.

The library behind `python -m hscl_jax.linear_eval` (and the comparison reports): reads
the run's resolved config, restores only the encoder's parameters and BatchNorm
statistics from DIR/checkpoints/<step> (latest usable by default), freezes them
(BatchNorm in eval mode) and trains a linear classifier on the L2-normalised backbone
features, then reports top-1/top-5 on the test split and writes DIR/linear_eval.json.
Nothing else in DIR is touched. Protocols (config.linear_eval):
  * features  (default, fast): features extracted once, the classifier trained on them.
  * augmented (the paper's): random resized crop + flip on the fly through the frozen
    encoder, Adam lr 1e-3, weight decay 1e-6, 100 epochs.
The linear probe trained during training, beside the encoder, is `training/online_probe`.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

from absl import logging
import jax
import jax.numpy as jnp
from ml_collections import config_dict
import numpy as np
import optax

from hscl_jax import data
from hscl_jax import losses
from hscl_jax import models
from hscl_jax import optimizers
from hscl_jax import parallel
from hscl_jax import progress
from hscl_jax.config import schema
from hscl_jax.data import augment
from hscl_jax.evaluation import features as eval_features
from hscl_jax.rundir import atomic
from hscl_jax.rundir import trained_run

RESULT_FILE = 'linear_eval.json'


def check_num_epochs_flag(num_epochs: int | None) -> None:
  """`linear_eval --num_epochs`: None (the config's value) or at least 1."""
  if num_epochs is not None and num_epochs < 1:
    raise trained_run.LinearEvalError(
      f'--num_epochs must be >= 1, got {num_epochs} (the classifier would stay at its '
      'initialisation). Fix: pass e.g. --num_epochs=100, or leave it out for the '
      "config's value."
    )


def _cross_entropy(classifier, features, labels):
  logits = features @ classifier['w'] + classifier['b']
  return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


def _topk_correct(logits, labels, k):
  return jnp.any(jax.lax.top_k(logits, k)[1] == labels[:, None], axis=1)


@jax.jit
def _accuracies(classifier, features, labels):
  logits = features @ classifier['w'] + classifier['b']
  top5 = min(5, logits.shape[1])
  return jnp.mean(_topk_correct(logits, labels, 1)), jnp.mean(_topk_correct(logits, labels, top5))


def evaluate(classifier, features, labels) -> dict[str, float]:
  """Top-1 and top-5 accuracy; the arguments on the host or the device."""
  top1, top5 = jax.device_get(_accuracies(*jax.device_put((classifier, features, labels))))
  return {'top1': float(top1), 'top5': float(top5)}


@dataclasses.dataclass(frozen=True)
class LinearSetup:
  num_classes: int
  feature_dim: int
  cfg: config_dict.ConfigDict  # config.linear_eval

  def init(self):
    return {'w': jnp.zeros((self.feature_dim, self.num_classes)), 'b': jnp.zeros(self.num_classes)}

  def optimizer(self):
    # The paper's linear classifier: Adam with coupled L2, as its encoder's optimizer.
    return optimizers.adam_coupled_l2(self.cfg.learning_rate, weight_decay=self.cfg.weight_decay)


def _train_loop(setup: LinearSetup, num_examples: int, batch_fn, seed: int):
  """Minibatch Adam for config.linear_eval.num_epochs; batch_fn(indices, epoch, i) -> (x, y)."""
  cfg = setup.cfg
  batch = min(cfg.batch_size, num_examples)
  steps = max(num_examples // batch, 1)
  optimizer = setup.optimizer()

  @jax.jit  # the zeros made on the device: no transfer
  def initial():
    classifier = setup.init()
    return classifier, optimizer.init(classifier)

  classifier, opt_state = initial()

  @jax.jit
  def step(classifier, opt_state, x, y):
    loss, grads = jax.value_and_grad(_cross_entropy)(classifier, x, y)
    updates, opt_state = optimizer.update(grads, opt_state, classifier)
    return optax.apply_updates(classifier, updates), opt_state, loss

  rng = np.random.default_rng(seed)
  line = progress.ProgressLine(
    cfg.num_epochs,
    unit='epoch',
    rate_unit='examples',
    per_unit=steps * batch,
    every_seconds=progress.EVERY_SECONDS,
    show_elapsed=True,
  )
  for epoch in range(1, cfg.num_epochs + 1):
    order = rng.permutation(num_examples)
    for i in range(steps):
      x, y = batch_fn(order[i * batch : (i + 1) * batch], epoch, i)
      classifier, opt_state, loss = step(classifier, opt_state, x, y)
    line.update(epoch, head='linear eval', detail=lambda: f'loss {float(jax.device_get(loss)):.4f}')
  return classifier


def _extract(model, variables, params: augment.AugmentParams, source, batch_size):
  """Normalised features and labels of a split (the training program's kNN path, 1 device)."""
  mesh = parallel.make_mesh(jax.devices()[:1])
  feature_fn = eval_features.make_feature_fn(model, params, mesh)
  features, labels, mask = eval_features.extract_features(
    feature_fn, variables, source, batch_size, mesh
  )
  return features[mask], labels[mask]


def _augmented_batches(model, variables, source, params: augment.AugmentParams, seed):
  """Random resized crop + flip of raw images, encoded on the fly by the frozen encoder."""
  crop_flip = dataclasses.replace(params, jitter_prob=0.0, grayscale_prob=0.0, blur_prob=0.0)
  images = np.stack([source[i]['image'] for i in range(len(source))])
  labels = np.asarray([source[i]['label'] for i in range(len(source))], np.int32)

  @jax.jit
  def features_of_views(epoch, i, raw):
    """One augmented view of each image, encoded (BatchNorm in eval mode), normalised."""
    batch_key = jax.random.fold_in(jax.random.fold_in(jax.random.key(seed), epoch), i)
    view = augment.two_views(batch_key, jnp.stack([raw, raw], axis=1), crop_flip)[:, 0]
    return losses.l2_normalize(model.apply(variables, view, train=False, method='features'))

  def batch_fn(indices, epoch, i):
    batch = jax.device_put((np.int32(epoch), np.int32(i), images[indices], labels[indices]))
    return features_of_views(*batch[:3]), batch[3]

  return batch_fn


def linear_evaluate(
  config: config_dict.ConfigDict, workdir: str, *, checkpoint_step: trained_run.Checkpoint = None
) -> dict[str, Any]:
  """Runs the configured protocol on the checkpoint and writes DIR/linear_eval.json."""
  cfg = config.linear_eval
  schema.validate_linear_eval(cfg)
  start = time.perf_counter()
  model = models.create_model(config.model)
  params = augment.AugmentParams.from_config(config.augment)
  image_size = params.image_size
  step, variables = trained_run.restore_usable_encoder(
    workdir, checkpoint_step, model, (image_size, image_size, 3)
  )
  train_source, test_source = data.run_sources(config)
  logging.info('linear eval (%s protocol) of %s step %d', cfg.protocol, workdir, step)
  train_x, train_y = _extract(model, variables, params, train_source, cfg.batch_size)
  test_x, test_y = _extract(model, variables, params, test_source, cfg.batch_size)
  setup = LinearSetup(num_classes=train_source.num_classes, feature_dim=train_x.shape[1], cfg=cfg)
  if cfg.protocol == 'features':
    batch_fn = lambda idx, epoch, i: jax.device_put((train_x[idx], train_y[idx]))
  else:
    batch_fn = _augmented_batches(model, variables, train_source, params, config.seed)
  classifier = _train_loop(setup, len(train_y), batch_fn, config.seed)
  result = {
    'protocol': cfg.protocol,
    **evaluate(classifier, test_x, test_y),
    'checkpoint_step': step,
    # Which data: the splits by name, and their sizes (num_train after train_examples).
    'train_split': config.train_split,
    'test_split': config.test_split,
    'num_train': int(len(train_y)),
    'num_test': int(len(test_y)),
    'num_epochs': cfg.num_epochs,
    'learning_rate': cfg.learning_rate,
    'weight_decay': cfg.weight_decay,
    'batch_size': cfg.batch_size,
    'dataset': config.dataset,
    'method': config.method,
    'seconds': time.perf_counter() - start,
  }
  atomic.write_json(os.path.join(workdir, RESULT_FILE), result, newline=True)
  return result
