"""Trains InfoGraph encoders with the four objectives and scores them by InfoGraph's protocol.

One run = one dataset, one method, one seed. UCL/H-UCL (and SCL/H-SCL with
protocol='transductive') train one encoder on every graph. SCL/H-SCL with the default
protocol='leak_free' train one encoder per cross-validation fold on that fold's training
graphs only; the fold encoders are trained together, vmapped in one jitted step (their
batches have the same padded shapes). An epoch is one jitted scan over its batches.
"""

from __future__ import annotations

import functools
import os
import time

from absl import logging
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from hscl_jax import errors
from hscl_jax import losses
from hscl_jax import progress
from hscl_jax.config import methods
from hscl_jax.graphs import data
from hscl_jax.graphs import evaluate
from hscl_jax.graphs import model as model_lib
from hscl_jax.rundir import atomic
from hscl_jax.rundir import lock as workdir_lock
from hscl_jax.rundir import metrics

METHODS = methods.Column(lambda rows: [r.name for r in rows if r.graph])  # the table's graph rows
PROTOCOLS = ('leak_free', 'transductive')
# The local–global estimator: InfoGraph's Jensen–Shannon one (Table II) or eq. (3)'s InfoNCE.
ESTIMATORS = {'jsd': losses.local_global_jsd, 'infonce': losses.local_global_infonce}
EVAL_FILE = 'graph_eval.json'


# Class-aware batches are the image arm's (config.samples_per_class): a graph batch's
# positives are its own nodes, and labels enter only through the supervised objective.
_CLASS_AWARE = (
  'samples_per_class',
  'class-aware batches are for image training (python -m hscl_jax.main); graph batches are uniform',
  'remove it from the graph config',
)
CLASS_AWARE_REFUSAL = errors.config_message(*_CLASS_AWARE)


def validate_config(config: ml_collections.ConfigDict) -> None:
  """Raises errors.ConfigError naming the field and the fix."""
  if 'samples_per_class' in config:
    errors.fail(*_CLASS_AWARE)
  for field, choices in (('method', METHODS), ('protocol', PROTOCOLS), ('estimator', ESTIMATORS)):
    if config[field] not in choices:
      errors.fail(field, f'unknown value {config[field]!r}', f'use one of {", ".join(choices)}')
  if not config.data_dir:
    errors.fail(
      'data_dir',
      'not set',
      f'pass --config.data_dir=DIR, the folder holding '
      f'{config.dataset}/ (python -m hscl_jax.prepare --dataset={config.dataset} '
      '--data_dir=DIR downloads it)',
    )
  if _hardened(config) and not config.beta >= 0:
    errors.fail('beta', f'{config.beta} is negative', 'use beta >= 0 (0 = no hardening)')
  for field in (
    'batch_size',
    'num_epochs',
    'model.hidden',
    'model.num_layers',
    'eval.batch_size',
    'log_every_epochs',
  ):
    value = functools.reduce(lambda node, key: node[key], field.split('.'), config)
    if not (isinstance(value, int) and value >= 1):
      errors.fail(field, f'{value!r} is not a positive integer', 'use an integer >= 1')
  if not config.learning_rate > 0:
    errors.fail('learning_rate', f'{config.learning_rate} is not positive', 'use e.g. 0.01')
  if config.eval.num_folds < 2 or config.eval.inner_folds < 2:
    errors.fail(
      'eval.num_folds',
      'cross-validation needs at least 2 folds (outer and inner)',
      'use eval.num_folds=10, eval.inner_folds=5 (the protocol)',
    )


def _hardened(config: ml_collections.ConfigDict) -> bool:
  return methods.graph_rows()[config.method].hardening == 'exp'


def _supervised(config: ml_collections.ConfigDict) -> bool:
  return methods.graph_rows()[config.method].supervised


def protocol_of(config: ml_collections.ConfigDict) -> str:
  """'unsupervised' (ucl/hucl), or the supervised methods' 'leak_free' / 'transductive'."""
  return config.protocol if _supervised(config) else 'unsupervised'


def beta_of(config: ml_collections.ConfigDict) -> float:
  """The tilt β: 0 for UCL/SCL (η ≡ 1 exactly), config.beta for the hardened methods."""
  return float(config.beta) if _hardened(config) else 0.0


def check_dataset(config: ml_collections.ConfigDict, dataset: data.GraphDataset) -> None:
  """Every class must fill the outer and inner folds (scikit-learn's stratified split)."""
  smallest = int(np.bincount(dataset.labels).min())
  needed = config.eval.num_folds
  if smallest < needed:
    errors.fail(
      'eval.num_folds',
      f'{dataset.name} has a class with {smallest} graphs, fewer than {needed} folds',
      f'use eval.num_folds <= {smallest}',
    )


# --------------------------------------------------------------------------------------
# Jitted training and embedding (cached per model, optimizer and shapes).


def make_model(config, dataset: data.GraphDataset) -> model_lib.InfoGraph:
  return model_lib.InfoGraph(
    feature_dim=dataset.feature_dim,
    hidden=config.model.hidden,
    num_layers=config.model.num_layers,
    bn_momentum=config.model.bn_momentum,
  )


def compiled_for(config, dataset: data.GraphDataset):
  return compiled(
    make_model(config, dataset), float(config.learning_rate), _supervised(config), config.estimator
  )


@functools.cache
def compiled(model: model_lib.InfoGraph, learning_rate: float, supervised: bool, estimator: str):
  """(init, epoch, embed) functions, vmapped over encoders and jitted."""
  optimizer = optax.adam(learning_rate)
  local_global_loss = ESTIMATORS[estimator]

  def init(key, batch):
    variables = model.init(key, batch, train=False)
    params = variables['params']
    return {
      'params': params,
      'batch_stats': variables['batch_stats'],
      'opt_state': optimizer.init(params),
    }

  def step(state, batch, beta):
    def loss_fn(params):
      (local, graph), updates = model.apply(
        {'params': params, 'batch_stats': state['batch_stats']},
        batch,
        train=True,
        mutable=['batch_stats'],
      )
      loss = local_global_loss(
        local,
        graph,
        batch['node_graph'],
        graph_labels=batch['labels'] if supervised else None,
        hardening=losses.exponential(beta),
        node_mask=batch['node_mask'],
        graph_mask=batch['graph_mask'],
      )
      return loss, updates['batch_stats']

    (loss, batch_stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(state['params'])
    updates, opt_state = optimizer.update(grads, state['opt_state'], state['params'])
    new = {
      'params': optax.apply_updates(state['params'], updates),
      'batch_stats': batch_stats,
      'opt_state': opt_state,
    }
    # An empty trailing batch (a smaller fold) leaves the encoder untouched.
    real = jnp.any(batch['graph_mask'])
    new = jax.tree.map(lambda n, o: jnp.where(real, n, o), new, state)
    return new, (loss, real)

  def epoch(state, batches, beta):
    state, (loss, real) = jax.lax.scan(lambda s, b: step(s, b, beta), state, batches)
    return state, jnp.sum(jnp.where(real, loss, 0.0)) / jnp.maximum(jnp.sum(real), 1)

  def embed(state, batches):
    variables = {'params': state['params'], 'batch_stats': state['batch_stats']}
    out = jax.lax.map(lambda b: model.apply(variables, b, method=model.embed), batches)
    return out.reshape(-1, out.shape[-1])

  return (
    jax.jit(jax.vmap(init, in_axes=(0, None))),
    jax.jit(jax.vmap(epoch, in_axes=(0, 0, None)), donate_argnums=0),
    jax.jit(jax.vmap(embed, in_axes=(0, None))),
  )


def epoch_plan(train_sets, batch_size: int, num_epochs: int, seed: int) -> list[list]:
  """[epoch][index set] -> that set's batches of graph indices: every set shuffled anew
  each epoch, all from one stream seeded by `seed`; as many batches for every set (the
  largest set's count), so the vmapped encoders step together."""
  num_batches = -(-max(len(s) for s in train_sets) // batch_size)
  rng = np.random.default_rng(seed)
  return [
    [data.epoch_batches(s, batch_size, num_batches, rng) for s in train_sets]
    for _ in range(num_epochs)
  ]


@functools.partial(jax.jit, static_argnums=(0, 1))
def _encoder_keys(seed: int, count: int) -> jax.Array:
  """The encoders' initialisation keys, made on the device (no transfer of the seed)."""
  return jax.random.split(jax.random.key(seed), count)


def host_batches(dataset, groups: list[list[np.ndarray]], budget: data.Budget):
  """[encoders][batches] graph-index arrays -> NumPy arrays of shape [encoders, batches, ...]
  (placed on the device by the caller's explicit jax.device_put)."""
  return {
    key: value
    for key, value in data.stack_batches(
      [
        data.stack_batches([data.make_batch(dataset, g, budget) for g in batches])
        for batches in groups
      ]
    ).items()
  }


def train_encoders(
  config,
  dataset: data.GraphDataset,
  train_sets: list[np.ndarray],
  workdir: str | None = None,
  *,
  log: bool = True,
):
  """Trains one encoder per index set (vmapped) and returns the stacked final states.

  Writes the mean training loss of each epoch to DIR/metrics.jsonl and logs a progress line.
  """
  init, epoch, _ = compiled_for(config, dataset)
  batch_size = config.batch_size
  plan = epoch_plan(train_sets, batch_size, config.num_epochs, config.seed)
  budget = data.budget_for(dataset, [b for groups in plan for g in groups for b in g], batch_size)
  keys = _encoder_keys(config.seed, len(train_sets))
  first = host_batches(dataset, [[train_sets[0][:batch_size]]], budget)
  state = init(keys, jax.device_put(jax.tree.map(lambda x: x[0, 0], first)))
  beta = jax.device_put(np.float32(beta_of(config)))
  writer = metrics.MetricWriter(workdir or '', enabled=workdir is not None)
  line = progress.ProgressLine(
    config.num_epochs,
    unit='epoch',
    rate_unit='graphs',
    per_unit=sum(len(s) for s in train_sets),
    every=config.log_every_epochs,
    enabled=log,
  )
  for e, groups in enumerate(plan, 1):
    state, loss = epoch(state, jax.device_put(host_batches(dataset, groups, budget)), beta)
    loss = jax.device_get(loss)
    if not np.all(np.isfinite(loss)):
      raise errors.NonFiniteLossError(
        f'non-finite training loss at epoch {e} (per encoder: {loss.tolist()}). '
        'Fix: lower --config.learning_rate'
      )
    writer.write(e, {'epoch': e, 'loss': float(loss.mean()), 'loss_per_encoder': loss})
    line.update(e, detail=f'loss {loss.mean():.4f}')
  writer.close()
  return state


def embed_all(config, dataset: data.GraphDataset, state) -> np.ndarray:
  """[encoders, graphs, d] graph representations of every graph under each encoder."""
  _, _, embed = compiled_for(config, dataset)
  size = config.eval.batch_size
  indices = np.arange(dataset.num_graphs)
  groups = [indices[i : i + size] for i in range(0, dataset.num_graphs, size)]
  budget = data.budget_for(dataset, groups, size)
  batches = jax.tree.map(lambda x: x[0], host_batches(dataset, [groups], budget))
  out = jax.device_get(embed(state, jax.device_put(batches)))  # [encoders, batches·size, d]
  real = np.concatenate([np.arange(len(g)) + i * size for i, g in enumerate(groups)])
  return out[:, real]


def run(config: ml_collections.ConfigDict, workdir: str) -> dict:
  """Trains and evaluates one setting; writes and returns DIR/graph_eval.json's content.

  Holds DIR/run.lock meanwhile (a second run on DIR raises WorkdirBusyError).
  """
  validate_config(config)
  dataset = data.load_tu(config.dataset, config.data_dir)
  check_dataset(config, dataset)
  with workdir_lock.WorkdirLock(workdir):
    return _train_and_evaluate(config, dataset, workdir)


def _train_and_evaluate(config, dataset: data.GraphDataset, workdir: str) -> dict:
  metrics.write_config(workdir, config)
  protocol = protocol_of(config)
  folds = evaluate.outer_folds(dataset.labels, config.eval.num_folds, config.seed)
  if protocol == 'leak_free':
    train_sets = [train for train, _ in folds]
  else:
    train_sets = [np.arange(dataset.num_graphs)]
  logging.info(
    '%s %s (%s, beta=%g, %s): %d graphs, %d encoder(s), %d epochs',
    config.dataset,
    config.method,
    protocol,
    beta_of(config),
    config.estimator,
    dataset.num_graphs,
    len(train_sets),
    config.num_epochs,
  )
  start = time.perf_counter()
  state = train_encoders(config, dataset, train_sets, workdir)
  train_seconds = time.perf_counter() - start
  embeddings = embed_all(config, dataset, state)
  embeddings = list(embeddings) if protocol == 'leak_free' else embeddings[0]
  start = time.perf_counter()
  scores = evaluate.cross_validate(
    embeddings,
    dataset.labels,
    folds,
    cs=config.eval.svm_cs,
    inner_folds=config.eval.inner_folds,
    threads=config.eval.threads,
  )
  result = {
    **scores,
    'dataset': config.dataset,
    'method': config.method,
    'beta': beta_of(config),
    'protocol': protocol,
    'estimator': config.estimator,
    'seed': config.seed,
    'num_epochs': config.num_epochs,
    'num_encoders': len(train_sets),
    'train_seconds': train_seconds,
    'eval_seconds': time.perf_counter() - start,
  }
  atomic.write_json(os.path.join(workdir, EVAL_FILE), result)
  logging.info(
    '%s %s (%s, %s): accuracy %.4f (10-fold mean), train %s, eval %s',
    config.dataset,
    config.method,
    protocol,
    config.estimator,
    result['accuracy'],
    progress.format_duration(train_seconds),
    progress.format_duration(result['eval_seconds']),
  )
  return result
