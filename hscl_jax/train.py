"""Data-parallel contrastive training (UCL/SimCLR, H-UCL, SCL, H-SCL) with a kNN monitor.

Layout: one 1-D mesh over every device of every process, axis 'data'. The training step
is written per device with `jax.shard_map`: parameters, BatchNorm statistics and the
optimizer state are replicated; the batch is split along 'data'. Inside the step
  * each example is augmented with a key derived from (seed, step, global example index),
    so the views do not depend on how many devices share the batch;
  * BatchNorm statistics are averaged over 'data' (the model's bn_axis_name): synced BN;
  * the loss all-gathers the projections over 'data', so every anchor sees the negatives
    of the global batch, and returns the global-batch loss (identical on every device);
  * jax.grad of that loss with respect to the replicated parameters is the gradient of
    the global loss: JAX transposes the implicit broadcast of the parameters into a
    cross-device sum (tests/test_train.py checks 4 devices against 1);
  * the optax update runs on the replicated gradient, so replicas stay identical.

Each epoch: the paper's diagnostics (Assumption 1 fraction; the four losses) averaged
over the training batches, a weighted kNN monitor (train split as memory bank, test split
as queries, normalised backbone features, BatchNorm in eval mode), throughput, epoch time
and learning rate, written to DIR/metrics.jsonl and TensorBoard; then an Orbax checkpoint.
"""

import dataclasses
import math
import os
import signal
import threading
import time
from typing import Any

from absl import logging
import flax.struct
import jax
from jax.experimental import multihost_utils
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import ml_collections
import numpy as np
import optax

from hscl_jax import augment
from hscl_jax import checkpointing
from hscl_jax import data
from hscl_jax import knn
from hscl_jax import losses
from hscl_jax import metrics
from hscl_jax import models

AXIS = 'data'  # the mesh axis the batch is split along

METHODS = ('ucl', 'hucl', 'scl', 'hscl')
HARDENINGS = ('exp', 'threshold')
POSITIVE_MODES = ('augmentation', 'label')
DIAGNOSTICS_POSITIVES = ('sample', 'label')
OPTIMIZERS = ('adam', 'adamw', 'sgd', 'lars')
LR_SCHEDULES = ('constant', 'cosine')

# Every config field the program reads, by section ('' = top level). tests/test_configs.py
# checks that configs/default.py defines exactly these.
CONFIG_FIELDS = {
    '': (
        'dataset', 'data_dir', 'folder', 'split_seed', 'train_split', 'test_split',
        'positive_mode',
        'method', 'hardening', 'beta', 'beta_anneal_steps', 'tau_start', 'tau_end', 'tau_plus',
        'temperature', 'M', 'stop_gradient_weights', 'diagnostics', 'diagnostics_positives',
        'model', 'augment', 'optimizer', 'batch_size', 'num_epochs', 'seed',
        'steps_per_epoch_limit', 'knn', 'linear_eval', 'checkpoint_every_epochs',
        'keep_checkpoints', 'log_every_steps',
    ),
    'model': ('name', 'stem', 'head_hidden', 'head_out', 'dtype', 'bn_momentum'),
    'augment': tuple(f.name for f in dataclasses.fields(augment.AugmentParams)),
    'optimizer': (
        'name', 'learning_rate', 'weight_decay', 'schedule', 'warmup_epochs', 'b1', 'b2', 'eps',
        'momentum', 'nesterov', 'trust_coefficient', 'exclude_rank1_from_decay',
    ),
    'knn': ('every_epochs', 'k', 'temperature', 'batch_size', 'chunk_size'),
    # Read by hscl_jax.linear_eval (from DIR/config.json), not by training.
    'linear_eval': ('protocol', 'num_epochs', 'learning_rate', 'weight_decay', 'batch_size'),
}


class ConfigError(ValueError):
  """An invalid configuration; raised before anything is compiled."""


class NonFiniteLossError(RuntimeError):
  """The training loss became NaN/inf; the bad state was not saved."""


# ----------------------------------------------------------------------------------------
# Configuration checks (before any compilation).


def _fail(field: str, problem: str, fix: str):
  raise ConfigError(f'config.{field}: {problem}. Fix: {fix}.')


def _check_choice(config, field: str, choices) -> None:
  value = config
  for part in field.split('.'):
    value = value[part]
  if value not in choices:
    _fail(field, f'unknown value {value!r}', f'use one of {", ".join(map(repr, choices))}')


def _check_known_fields(config: ml_collections.ConfigDict) -> None:
  for section, known in CONFIG_FIELDS.items():
    node = config if not section else config.get(section)
    prefix = f'{section}.' if section else ''
    if not isinstance(node, (ml_collections.ConfigDict, dict)):
      _fail(section, 'missing section', f'start from configs/default.py, which defines {section}')
    unknown = sorted(set(node.keys()) - set(known))
    if unknown:
      _fail(prefix + unknown[0], 'unknown field',
            f'remove it or use one of: {", ".join(sorted(known))}')
  for field in CONFIG_FIELDS['']:
    if field not in config:
      _fail(field, 'missing field', 'start from configs/default.py, which defines every field')


def _round_up(value: int, multiple: int) -> int:
  return -(-value // multiple) * multiple


def validate_config(config: ml_collections.ConfigDict, *, num_devices: int,
                    num_processes: int = 1) -> None:
  """Raises ConfigError naming the field and the fix for an impossible configuration."""
  _check_known_fields(config)
  _check_choice(config, 'dataset', data.DATASETS)
  _check_choice(config, 'method', METHODS)
  _check_choice(config, 'hardening', HARDENINGS)
  _check_choice(config, 'positive_mode', POSITIVE_MODES)
  _check_choice(config, 'diagnostics_positives', DIAGNOSTICS_POSITIVES)
  _check_choice(config, 'model.name', tuple(models.BACKBONES))
  _check_choice(config, 'model.stem', models.STEMS)
  _check_choice(config, 'model.dtype', tuple(models.DTYPES))
  _check_choice(config, 'optimizer.name', OPTIMIZERS)
  _check_choice(config, 'optimizer.schedule', LR_SCHEDULES)
  if config.dataset == 'image_folder' and not config.folder:
    _fail('folder', 'image_folder needs a root directory', 'pass --config.folder=/path/to/root')

  if not config.temperature > 0:
    _fail('temperature', f'must be positive, got {config.temperature}',
          'use e.g. --config.temperature=0.5 (the paper)')
  if config.beta < 0:
    _fail('beta', f'must be >= 0 (a non-decreasing hardening), got {config.beta}',
          'use e.g. --config.beta=1.0; beta=0 is SCL/UCL')
  if not 0 <= config.tau_plus < 1:
    _fail('tau_plus', f'must be in [0, 1), got {config.tau_plus}', 'use 0 (no debiasing) or e.g. 0.1')
  if config.M is not None and config.M <= 0:
    _fail('M', f'must be positive, got {config.M}', 'leave it unset (None = n - 2)')
  if config.beta_anneal_steps < 0 or config.beta_anneal_steps > config.num_epochs:
    _fail('beta_anneal_steps', f'must be in [0, num_epochs], got {config.beta_anneal_steps}',
          'use 0 (constant beta) or the number of beta decrements')

  if config.num_epochs < 1:
    _fail('num_epochs', f'must be >= 1, got {config.num_epochs}', 'use e.g. 200')
  if config.steps_per_epoch_limit is not None and config.steps_per_epoch_limit < 1:
    _fail('steps_per_epoch_limit', f'must be >= 1, got {config.steps_per_epoch_limit}',
          'leave it unset (a full pass per epoch)')
  divisor = math.lcm(num_devices, num_processes)
  for field in ('batch_size', 'knn.batch_size'):
    value = config.batch_size if field == 'batch_size' else config.knn.batch_size
    if value < 1 or value % divisor:
      _fail(field, f'{value} does not split evenly over the {num_devices} devices '
            f'({num_processes} processes)',
            f'use a multiple of {divisor}, e.g. --config.{field}={_round_up(max(value, 1), divisor)}')

  opt = config.optimizer
  if not opt.learning_rate > 0:
    _fail('optimizer.learning_rate', f'must be positive, got {opt.learning_rate}', 'use e.g. 1e-3')
  if opt.weight_decay < 0:
    _fail('optimizer.weight_decay', f'must be >= 0, got {opt.weight_decay}', 'use e.g. 1e-6')
  if not 0 <= opt.warmup_epochs < config.num_epochs:
    _fail('optimizer.warmup_epochs', f'must be in [0, num_epochs), got {opt.warmup_epochs}',
          'use a few epochs, e.g. 10, or 0')

  if config.knn.every_epochs < 0:
    _fail('knn.every_epochs', f'must be >= 0, got {config.knn.every_epochs}', 'use 1, or 0 to disable')
  if config.knn.k < 1:
    _fail('knn.k', f'must be >= 1, got {config.knn.k}', 'use e.g. 200')
  if not config.knn.temperature > 0:
    _fail('knn.temperature', f'must be positive, got {config.knn.temperature}', 'use e.g. 0.5')
  if config.knn.chunk_size < 1:
    _fail('knn.chunk_size', f'must be >= 1, got {config.knn.chunk_size}', 'use e.g. 256')
  for field in ('checkpoint_every_epochs', 'keep_checkpoints', 'log_every_steps'):
    if config[field] < 1:
      _fail(field, f'must be >= 1, got {config[field]}', 'use e.g. 1')
  try:
    augment.AugmentParams.from_config(config.augment)
  except (TypeError, ValueError) as e:
    _fail('augment', str(e), 'see the fields of hscl_jax.augment.AugmentParams')


# ----------------------------------------------------------------------------------------
# Derived quantities: each computed here and nowhere else.


@dataclasses.dataclass(frozen=True)
class Plan:
  """Step counts and schedules that follow from the config and the dataset size."""

  steps_per_epoch: int
  num_epochs: int
  learning_rate: optax.Schedule

  @property
  def total_steps(self) -> int:
    return self.steps_per_epoch * self.num_epochs

  def epoch_of_step(self, step: int) -> int:
    """1-based epoch that optimisation step `step` (0-based) belongs to."""
    return step // self.steps_per_epoch + 1


def create_learning_rate_schedule(opt: ml_collections.ConfigDict, *, steps_per_epoch: int,
                                  total_steps: int) -> optax.Schedule:
  """Optional linear warm-up from 0, then constant or cosine decay to 0 at the last step."""
  warmup_steps = int(round(opt.warmup_epochs * steps_per_epoch))
  if opt.schedule == 'cosine':
    main = optax.cosine_decay_schedule(opt.learning_rate, max(total_steps - warmup_steps, 1))
  else:
    main = optax.constant_schedule(opt.learning_rate)
  if warmup_steps == 0:
    return main
  warmup = optax.linear_schedule(0.0, opt.learning_rate, warmup_steps)
  return optax.join_schedules([warmup, main], [warmup_steps])


def make_plan(config: ml_collections.ConfigDict, num_train_examples: int) -> Plan:
  if config.batch_size > num_train_examples:
    _fail('batch_size', f'{config.batch_size} exceeds the {num_train_examples} training examples',
          f'use at most {num_train_examples}')
  steps = data.steps_per_epoch(num_train_examples, config.batch_size)
  if config.steps_per_epoch_limit is not None:
    steps = min(steps, config.steps_per_epoch_limit)
  schedule = create_learning_rate_schedule(
      config.optimizer, steps_per_epoch=steps, total_steps=steps * config.num_epochs)
  return Plan(steps_per_epoch=steps, num_epochs=config.num_epochs, learning_rate=schedule)


def loss_hyperparameters(config: ml_collections.ConfigDict, epoch: int) -> dict[str, np.ndarray]:
  """beta (HCL annealing if enabled) and tau (eq. 4) of a 1-based epoch.

  They enter the compiled step as arrays, so changing them never recompiles.
  """
  if config.beta_anneal_steps > 0:
    beta = losses.beta_schedule(epoch, beta=config.beta, num_epochs=config.num_epochs,
                                num_steps=config.beta_anneal_steps)
  else:
    beta = config.beta
  tau = losses.tau_schedule(epoch, start=config.tau_start, end=config.tau_end,
                            num_epochs=config.num_epochs, temperature=config.temperature)
  return {'beta': np.float32(beta), 'tau': np.float32(tau)}


# ----------------------------------------------------------------------------------------
# Optimizer, model and state.


def _rank1_mask(params):
  """True for weights with more than one dimension (kernels), False for biases/BN."""
  return jax.tree.map(lambda p: p.ndim > 1, params)


def create_optimizer(opt: ml_collections.ConfigDict,
                     learning_rate: optax.Schedule) -> optax.GradientTransformation:
  mask = _rank1_mask if opt.exclude_rank1_from_decay else None
  if opt.name == 'adam':
    # torch.optim.Adam's weight_decay (the paper's code): L2 added to the gradient.
    return optax.chain(
        optax.add_decayed_weights(opt.weight_decay, mask),
        optax.scale_by_adam(b1=opt.b1, b2=opt.b2, eps=opt.eps),
        optax.scale_by_learning_rate(learning_rate),
    )
  if opt.name == 'adamw':
    return optax.adamw(learning_rate, b1=opt.b1, b2=opt.b2, eps=opt.eps,
                       weight_decay=opt.weight_decay, mask=mask)
  if opt.name == 'sgd':
    return optax.chain(
        optax.add_decayed_weights(opt.weight_decay, mask),
        optax.sgd(learning_rate, momentum=opt.momentum or None, nesterov=opt.nesterov),
    )
  return optax.lars(learning_rate, weight_decay=opt.weight_decay,
                    weight_decay_mask=mask or True, trust_ratio_mask=mask or True,
                    trust_coefficient=opt.trust_coefficient, momentum=opt.momentum)


class TrainState(flax.struct.PyTreeNode):
  step: jax.Array  # optimisation steps taken
  params: Any
  batch_stats: Any
  opt_state: Any
  rng: jax.Array  # root key of the augmentations (typed key array)
  # Per-step metrics summed since the start of the epoch (checkpointed, so an epoch
  # interrupted by preemption still reports the mean over all of its steps).
  metric_sums: dict[str, jax.Array]


def metric_names(config: ml_collections.ConfigDict) -> tuple[str, ...]:
  names = ('train_loss', 'grad_norm')
  if config.diagnostics:
    names += ('loss_ucl', 'loss_hucl', 'loss_scl', 'loss_hscl', 'assumption1_fraction')
  return names


def make_mesh(devices=None) -> jax.sharding.Mesh:
  """1-D mesh over `devices` (default: all devices of all processes), axis 'data'.

  Auto axes: the step is written per device with shard_map, so explicit sharding types
  would add nothing, and eager code outside the step (kNN, tests) stays sharding-agnostic.
  """
  devices = jax.devices() if devices is None else list(devices)
  return jax.make_mesh((len(devices),), (AXIS,), axis_types=(jax.sharding.AxisType.Auto,),
                       devices=devices)


def create_train_state(config: ml_collections.ConfigDict, model: models.ContrastiveModel,
                       optimizer: optax.GradientTransformation, image_size: int,
                       mesh: jax.sharding.Mesh) -> TrainState:
  """Initial state, replicated over the mesh. Same seed -> same state on any device count.

  Computed by a jit whose outputs are replicated over the mesh, so every process holds its
  devices' copies (a device_put of one device's arrays would not reach other processes).
  """

  def init() -> TrainState:
    init_key, augment_key = jax.random.split(jax.random.key(config.seed))
    variables = models.initialize(model, init_key, (image_size, image_size, 3))
    return TrainState(
        step=jnp.zeros((), jnp.int32),
        params=variables['params'],
        batch_stats=variables['batch_stats'],
        opt_state=optimizer.init(variables['params']),
        rng=augment_key,
        metric_sums={name: jnp.zeros((), jnp.float32) for name in metric_names(config)},
    )

  return jax.jit(init, out_shardings=NamedSharding(mesh, P()))()


def state_to_checkpoint(state: TrainState) -> dict[str, Any]:
  """Pytree of plain arrays (Orbax stores key data, not typed keys)."""
  tree = {f.name: getattr(state, f.name) for f in dataclasses.fields(state)}
  tree['rng'] = jax.random.key_data(state.rng)
  return tree


def state_from_checkpoint(tree: dict[str, Any]) -> TrainState:
  return TrainState(**{**tree, 'rng': jax.random.wrap_key_data(tree['rng'])})


# ----------------------------------------------------------------------------------------
# The training step.


def make_loss_fn(config: ml_collections.ConfigDict):
  """(normalised projections [b, 2, d], labels [b], hyper) -> global-batch loss, f32."""
  common = dict(temperature=config.temperature, M=config.M, axis_name=AXIS)
  method = config.method

  def hardening(hyper):
    if config.hardening == 'exp':
      return losses.exponential(hyper['beta'])
    return losses.threshold(hyper['tau'])

  def loss_fn(z, labels, hyper):
    if method == 'ucl':
      return losses.ucl(z, **common)
    if method == 'hucl':
      return losses.hucl(z, beta=hyper['beta'], tau_plus=config.tau_plus,
                         stop_gradient_weights=config.stop_gradient_weights, **common)
    if method == 'scl':
      return losses.scl(z, labels, **common)
    return losses.hscl(z, labels, hardening=hardening(hyper),
                       stop_gradient_weights=config.stop_gradient_weights, **common)

  def diagnostics_fn(z, labels, hyper):
    return losses.batch_diagnostics(z, labels, hardening=hardening(hyper),
                                    positives=config.diagnostics_positives, **common)

  return loss_fn, diagnostics_fn


def augment_batch(rng: jax.Array, step: jax.Array, images: jax.Array,
                  params: augment.AugmentParams) -> jax.Array:
  """Two views of the local shard; example i's key is fold_in(fold_in(rng, step), global i)."""
  local_batch = images.shape[0]
  global_index = jax.lax.axis_index(AXIS) * local_batch + jnp.arange(local_batch)
  step_key = jax.random.fold_in(rng, step)
  keys = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(step_key, global_index)
  one_example = lambda key, image: augment.two_views(key, image[None], params)[0]
  return jax.vmap(one_example)(keys, images)


def make_train_step(config: ml_collections.ConfigDict, model: models.ContrastiveModel,
                    optimizer: optax.GradientTransformation, augment_params: augment.AugmentParams,
                    mesh: jax.sharding.Mesh):
  """jit(shard_map(step)): (state, {'image' uint8[B,2,H,W,3], 'label'}, hyper) -> (state, loss)."""
  loss_fn, diagnostics_fn = make_loss_fn(config)

  def per_device_step(state: TrainState, batch, hyper):
    images, labels = batch['image'], batch['label']
    local_batch = labels.shape[0]
    views = augment_batch(state.rng, state.step, images, augment_params)
    # Sample-major rows [x0v0, x0v1, x1v0, ...]: the losses' row order.
    x = views.reshape((local_batch * views.shape[1],) + views.shape[2:])

    def compute_loss(params):
      (_, projections), updates = model.apply(
          {'params': params, 'batch_stats': state.batch_stats}, x, train=True,
          mutable=['batch_stats'])
      z = knn.l2_normalize(projections).reshape(local_batch, views.shape[1], -1)
      return loss_fn(z, labels, hyper), (z, updates['batch_stats'])

    (loss, (z, batch_stats)), grads = jax.value_and_grad(compute_loss, has_aux=True)(state.params)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    step_metrics = {'train_loss': loss, 'grad_norm': optax.tree.norm(grads)}
    if config.diagnostics:
      step_metrics.update(diagnostics_fn(z, labels, hyper))
    # The values are already identical on every device; pmean states it to shard_map.
    step_metrics = jax.lax.pmean(step_metrics, AXIS)
    new_state = state.replace(
        step=state.step + 1,
        params=optax.apply_updates(state.params, updates),
        batch_stats=batch_stats,
        opt_state=opt_state,
        metric_sums=jax.tree.map(jnp.add, state.metric_sums, step_metrics),
    )
    return new_state, loss

  step = jax.shard_map(per_device_step, mesh=mesh, in_specs=(P(), P(AXIS), P()),
                       out_specs=(P(), P()))
  return jax.jit(step, donate_argnums=0)


def make_feature_fn(model: models.ContrastiveModel, augment_params: augment.AugmentParams,
                    mesh: jax.sharding.Mesh):
  """jit(shard_map): (variables, eval batch) -> (normalised features, labels, mask), sharded."""

  def per_device(variables, batch):
    x = augment.preprocess_eval(batch['image'], augment_params)
    h = model.apply(variables, x, train=False, method=models.ContrastiveModel.features)
    return knn.l2_normalize(h), batch['label'], batch['mask']

  return jax.jit(jax.shard_map(per_device, mesh=mesh, in_specs=(P(), P(AXIS)),
                               out_specs=P(AXIS)))


# ----------------------------------------------------------------------------------------
# Host-side helpers.


def global_batch(local_batch: dict[str, np.ndarray], mesh: jax.sharding.Mesh, keys) -> dict:
  """Assembles the processes' local batches into arrays sharded along 'data'."""
  sharding = NamedSharding(mesh, P(AXIS))
  return {k: jax.make_array_from_process_local_data(sharding, np.asarray(local_batch[k]))
          for k in keys}


def replicated_value(x: jax.Array) -> np.ndarray:
  """The value of an array replicated over the mesh, read from this process's first copy.

  (float(x) or device_get would need every shard addressable, false with several processes.)
  """
  return np.asarray(x.addressable_data(0))


def _to_host(x: jax.Array) -> np.ndarray:
  if jax.process_count() == 1:
    return np.asarray(x)
  return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def extract_features(feature_fn, variables, source, batch_size: int,
                     mesh: jax.sharding.Mesh) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(features, labels, mask) of a whole split on the host (padded rows have mask False).

  `feature_fn` is `make_feature_fn`'s; `variables` need only the encoder's entries.
  """
  loader = data.eval_loader(source, global_batch_size=batch_size,
                            shard_index=jax.process_index(), shard_count=jax.process_count())
  parts = [feature_fn(variables, global_batch(b, mesh, ('image', 'label', 'mask')))
           for b in loader]
  return tuple(np.concatenate([_to_host(p[i]) for p in parts]) for i in range(3))


def knn_accuracy(config, feature_fn, state, bank_source, query_source, num_classes, mesh) -> float:
  variables = {'params': state.params, 'batch_stats': state.batch_stats}
  bank, bank_labels, bank_mask = extract_features(
      feature_fn, variables, bank_source, config.knn.batch_size, mesh)
  queries, query_labels, query_mask = extract_features(
      feature_fn, variables, query_source, config.knn.batch_size, mesh)
  return knn.weighted_knn_accuracy(
      bank, bank_labels, queries, query_labels, num_classes=num_classes, k=config.knn.k,
      temperature=config.knn.temperature, chunk_size=config.knn.chunk_size,
      query_mask=query_mask, bank_mask=bank_mask)


class PreemptionWatcher:
  """Turns SIGTERM into a flag the training loop polls between steps.

  The loop then saves a checkpoint and returns, so a preempted job resumes from where it
  stopped. Only installable from the main thread (signal handlers are); elsewhere inert.
  """

  def __init__(self):
    self._requested = False
    self._previous = None

  def __enter__(self):
    if threading.current_thread() is threading.main_thread():
      self._previous = signal.signal(signal.SIGTERM, self._handle)
    return self

  def __exit__(self, *exc):
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)

  def _handle(self, signum, frame):
    del signum, frame
    self._requested = True

  def requested(self, *, sync_point: bool) -> bool:
    """Whether to stop now. With several processes, all must stop at the same step, so
    they agree on the flag (a collective) only at `sync_point` steps."""
    if jax.process_count() == 1:
      return self._requested
    if not sync_point:
      return False
    flags = multihost_utils.process_allgather(np.asarray(self._requested))
    return bool(np.any(flags))


@dataclasses.dataclass
class TrainResult:
  state: TrainState
  preempted: bool  # stopped by SIGTERM after saving a checkpoint
  last_record: dict[str, Any] | None  # the last epoch's metrics record


def epoch_summary(record: dict[str, Any]) -> str:
  """One concise log line per epoch (the full record is in metrics.jsonl)."""
  parts = [f"epoch {record['epoch']}: loss {record['train_loss']:.4f}"]
  if 'knn_top1' in record:
    parts.append(f"kNN top-1 {record['knn_top1']:.4f}")
  if 'assumption1_fraction' in record:
    parts.append(f"Assumption 1 {record['assumption1_fraction']:.3f}")
  parts.append(f"lr {record['learning_rate']:.3g}")
  parts.append(f"{record['images_per_second']:.0f} img/s")
  parts.append(f"{record['epoch_time']:.1f} s")
  return ', '.join(parts)


# ----------------------------------------------------------------------------------------
# The training program.


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str, *,
                       mesh: jax.sharding.Mesh | None = None) -> TrainResult:
  """Trains per `config`, resuming from the latest checkpoint in `workdir` if there is one."""
  mesh = make_mesh() if mesh is None else mesh
  validate_config(config, num_devices=mesh.size, num_processes=jax.process_count())
  is_writer = jax.process_index() == 0

  source_kwargs = dict(data_dir=config.data_dir, seed=config.split_seed, folder=config.folder)
  train_source = data.get_source(config.dataset, config.train_split, **source_kwargs)
  test_source = data.get_source(config.dataset, config.test_split, **source_kwargs)
  plan = make_plan(config, len(train_source))
  augment_params = augment.AugmentParams.from_config(config.augment)

  model = models.create_model(config.model, bn_axis_name=AXIS)
  optimizer = create_optimizer(config.optimizer, plan.learning_rate)
  state = create_train_state(config, model, optimizer, augment_params.image_size, mesh)
  train_iter = data.train_loader(
      train_source, global_batch_size=config.batch_size, seed=config.seed,
      positive_mode=config.positive_mode, shard_index=jax.process_index(),
      shard_count=jax.process_count(), num_classes=train_source.num_classes)

  checkpointer = checkpointing.Checkpointer(os.path.join(workdir, 'checkpoints'),
                                            keep=config.keep_checkpoints)
  start_step = checkpointer.latest_step() or 0
  if start_step:
    tree, iterator_state = checkpointer.restore(start_step, state_to_checkpoint(state))
    state = state_from_checkpoint(tree)
    train_iter.set_state(iterator_state)
    logging.info('Resumed from the checkpoint at step %d.', start_step)

  metrics.write_config(workdir, config, enabled=is_writer)
  logging.info('%s on %s: %d devices, global batch %d, %d steps/epoch, %d epochs.',
               config.method, config.dataset, mesh.size, config.batch_size,
               plan.steps_per_epoch, plan.num_epochs)
  run = _Run(
      config=config, plan=plan, mesh=mesh,
      train_step=make_train_step(config, model, optimizer, augment_params, mesh),
      feature_fn=make_feature_fn(model, augment_params, mesh),
      train_iter=train_iter, train_source=train_source, test_source=test_source,
      checkpointer=checkpointer,
      writer=metrics.MetricWriter(workdir, enabled=is_writer, resume_step=start_step),
      progress=metrics.Progress(
          total_steps=plan.total_steps, start_step=start_step,
          steps_per_epoch=plan.steps_per_epoch, images_per_step=2 * config.batch_size,
          enabled=is_writer),
  )
  try:
    with PreemptionWatcher() as preemption:
      return run.train(state, preemption)
  finally:
    checkpointer.close()
    run.writer.close()


@dataclasses.dataclass
class _Run:
  """The pieces of one training run and the epoch loop over them."""

  config: ml_collections.ConfigDict
  plan: Plan
  mesh: jax.sharding.Mesh
  train_step: Any
  feature_fn: Any
  train_iter: Any
  train_source: Any
  test_source: Any
  checkpointer: checkpointing.Checkpointer
  writer: metrics.MetricWriter
  progress: metrics.Progress
  compiled: bool = False  # whether the train step has run (and compiled) in this process

  def train(self, state: TrainState, preemption: PreemptionWatcher) -> TrainResult:
    step = int(replicated_value(state.step))
    record = None
    while step < self.plan.total_steps:
      epoch = self.plan.epoch_of_step(step)
      hyper = loss_hyperparameters(self.config, epoch)
      start_step, start_time = step, time.perf_counter()
      state, step, preempted = self.train_epoch(state, step, epoch, hyper, preemption)
      if preempted:
        return self.stop_for_preemption(state, record, epoch)
      seconds = time.perf_counter() - start_time
      state, record = self.end_epoch(state, epoch, hyper, step - start_step, seconds)
      if step < self.plan.total_steps and preemption.requested(sync_point=True):
        return self.stop_for_preemption(state, record, epoch)
    return TrainResult(state=state, preempted=False, last_record=record)

  def train_epoch(self, state, step, epoch, hyper, preemption):
    """Steps to the end of `epoch` (or to a SIGTERM); returns (state, step, preempted)."""
    config = self.config
    end_step = epoch * self.plan.steps_per_epoch
    self.progress.resume_timer()
    try:
      while step < end_step:
        batch = global_batch(next(self.train_iter), self.mesh, ('image', 'label'))
        state, loss = self.train_step(state, batch, hyper)
        step += 1
        if not self.compiled:
          jax.block_until_ready(loss)
          self.compiled = True
          self.progress.restart(step)  # rates without the first step's compilation
        log_step = step % config.log_every_steps == 0 or step == end_step
        if log_step:
          loss_value = float(replicated_value(loss))  # waits for the step: real timings
          self.check_finite(state, step, epoch)
          self.progress.log(step, loss_value)
        if preemption.requested(sync_point=log_step):
          return state, step, True
      return state, step, False
    finally:
      self.progress.pause_timer()

  def end_epoch(self, state, epoch, hyper, steps_done, seconds):
    """Epoch means, kNN, metrics record and checkpoint; resets the metric sums."""
    config, step = self.config, epoch * self.plan.steps_per_epoch
    record = {name: float(replicated_value(value)) / self.plan.steps_per_epoch
              for name, value in state.metric_sums.items()}
    # Fresh zeros each epoch: the step donates (deletes) the state's buffers.
    state = state.replace(metric_sums=jax.tree.map(jnp.zeros_like, state.metric_sums))
    record.update(
        epoch=epoch,
        step=step,
        learning_rate=float(self.plan.learning_rate(step - 1)),
        epoch_time=seconds,
        images_per_second=2 * config.batch_size * steps_done / seconds,
        samples_per_second=config.batch_size * steps_done / seconds,
        beta=float(hyper['beta']),
        tau=float(hyper['tau']),
    )
    if config.knn.every_epochs and (epoch % config.knn.every_epochs == 0
                                    or epoch == self.plan.num_epochs):
      eval_start = time.perf_counter()
      record['knn_top1'] = knn_accuracy(config, self.feature_fn, state, self.train_source,
                                        self.test_source, self.train_source.num_classes,
                                        self.mesh)
      record['knn_time'] = time.perf_counter() - eval_start
      self.progress.eval_seconds_per_epoch = record['knn_time'] / config.knn.every_epochs
    self.writer.write(step, record)
    logging.info('%s', epoch_summary(record))
    if epoch % config.checkpoint_every_epochs == 0 or epoch == self.plan.num_epochs:
      self.save(state)
    return state, record

  def save(self, state: TrainState) -> None:
    self.checkpointer.save(int(replicated_value(state.step)), state_to_checkpoint(state),
                           self.train_iter.get_state())

  def check_finite(self, state: TrainState, step: int, epoch: int) -> None:
    """Raises if a step of the epoch so far had a non-finite loss or gradient."""
    sums = {name: float(replicated_value(state.metric_sums[name]))
            for name in ('train_loss', 'grad_norm')}
    if all(np.isfinite(v) for v in sums.values()):
      return
    self.checkpointer.wait_until_finished()
    last = self.checkpointer.latest_step()
    where = (f'the last good checkpoint is step {last}; rerunning the same command resumes '
             'from it' if last is not None else 'no checkpoint was written yet')
    raise NonFiniteLossError(
        f'Non-finite training loss or gradient (epoch sums: {sums}) in epoch {epoch}, by step '
        f'{step}. The state was not saved; {where}. Try a lower optimizer.learning_rate, a '
        'larger temperature, or model.dtype=float32.')

  def stop_for_preemption(self, state, record, epoch) -> TrainResult:
    step = int(replicated_value(state.step))
    self.check_finite(state, step, epoch)
    self.save(state)  # a no-op if this step is already saved
    self.checkpointer.wait_until_finished()
    logging.warning('SIGTERM: saved the checkpoint at step %d; rerun the same command to '
                    'resume.', step)
    return TrainResult(state=state, preempted=True, last_record=record)
