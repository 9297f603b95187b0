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
With `chunk_size` > 0 the encoder runs in chunks of that many samples per device
(hscl_jax.training.gradcache): forward per chunk keeping only the projections, the loss and its
gradient with respect to all projections of the global batch, then per chunk the forward
again with its backward; the same gradient, with one chunk's activations in memory.
BatchNorm then normalises each chunk (synced over devices) and updates its running
statistics once per chunk.

Each epoch: the paper's diagnostics (Assumption 1 fraction; the four losses) averaged
over the training batches, a weighted kNN monitor (train split as memory bank, test split
as queries, normalised backbone features, BatchNorm in eval mode), throughput, epoch time
and learning rate, written to DIR/metrics.jsonl and TensorBoard; then an Orbax checkpoint.
"""

from __future__ import annotations

import dataclasses
import functools
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

from hscl_jax import data
from hscl_jax import errors
from hscl_jax import losses
from hscl_jax import models
from hscl_jax import parallel
from hscl_jax.config import schema
from hscl_jax.data import augment
from hscl_jax.evaluation import features as eval_features
from hscl_jax.rundir import checkpoints
from hscl_jax.rundir import lock as workdir_lock
from hscl_jax.rundir import metrics
from hscl_jax.rundir import stored_config
from hscl_jax.training import gradcache
from hscl_jax.training import optimizers
from hscl_jax.training import queue as negative_queue

NonFiniteLossError = errors.NonFiniteLossError


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

  def learning_rate_at(self, step: int) -> float:
    """The learning rate of `step`, on the host. The optax schedule is jnp code: evaluated
    eagerly it would compile a dozen one-op programs; here it is one compiled program."""
    return float(jax.device_get(self._compiled_learning_rate(jax.device_put(np.int32(step)))))

  @functools.cached_property
  def _compiled_learning_rate(self):
    return jax.jit(self.learning_rate)


def check_batch_fits(config: ml_collections.ConfigDict, num_train_examples: int) -> None:
  if config.batch_size > num_train_examples:
    schema.fail(
      'batch_size',
      f'{config.batch_size} exceeds the {num_train_examples} training examples',
      f'use at most {num_train_examples}',
    )


def make_train_loader(config: ml_collections.ConfigDict, train_source) -> data.TrainLoader:
  """This process's two-view batches of the run's training subset, in the config's order."""
  check_batch_fits(config, len(train_source))
  return data.TrainLoader(
    train_source,
    global_batch_size=config.batch_size,
    seed=config.seed,
    positive_mode=config.positive_mode,
    samples_per_class=config.samples_per_class,
    shard_index=jax.process_index(),
    shard_count=jax.process_count(),
    num_classes=train_source.num_classes,
    # What the config check asks of a batch_size: a refused m may suggest one.
    batch_multiple=math.lcm(jax.device_count(), jax.process_count()),
  )


def make_plan(config: ml_collections.ConfigDict, train_order: data.EpochOrder) -> Plan:
  """The plan of a run whose epochs visit the training examples in `train_order`."""
  steps = train_order.steps_per_epoch
  if config.steps_per_epoch_limit is not None:
    steps = min(steps, config.steps_per_epoch_limit)
  schedule = optimizers.create_learning_rate_schedule(
    config.optimizer, steps_per_epoch=steps, total_steps=steps * config.num_epochs
  )
  return Plan(steps_per_epoch=steps, num_epochs=config.num_epochs, learning_rate=schedule)


def loss_hyperparameters(config: ml_collections.ConfigDict, epoch: int) -> dict[str, np.ndarray]:
  """beta (HCL annealing if enabled) and tau (eq. 4) of a 1-based epoch, on the host.

  They enter the compiled step as arrays (`parallel.replicated`), so changing them never
  recompiles.
  """
  if config.beta_anneal_steps > 0:
    beta = losses.beta_schedule(
      epoch, beta=config.beta, num_epochs=config.num_epochs, num_steps=config.beta_anneal_steps
    )
  else:
    beta = config.beta
  tau = losses.tau_schedule(
    epoch,
    start=config.tau_start,
    end=config.tau_end,
    num_epochs=config.num_epochs,
    temperature=config.temperature,
  )
  return {'beta': np.float32(beta), 'tau': np.float32(tau)}


def used_hyperparameters(config: ml_collections.ConfigDict) -> tuple[str, ...]:
  """The entries of `loss_hyperparameters` that the loss or the diagnostics read."""
  hardening_parameter = 'beta' if config.hardening == 'exp' else 'tau'
  used = set()
  if config.method == 'hucl':
    used.add('beta')
  if config.method == 'hscl' or config.diagnostics:
    used.add(hardening_parameter)
  return tuple(sorted(used))


# ----------------------------------------------------------------------------------------
# Model and state.


class TrainState(flax.struct.PyTreeNode):
  step: jax.Array  # optimisation steps taken
  params: Any
  batch_stats: Any
  opt_state: Any
  rng: jax.Array  # root key of the augmentations (typed key array)
  # Per-step metrics summed since the start of the epoch (checkpointed, so an epoch
  # interrupted by preemption still reports the mean over all of its steps).
  metric_sums: dict[str, jax.Array]
  # Negatives beyond the batch (hscl_jax.training.queue), None with config.queue_size = 0.
  queue: negative_queue.Queue | None = None
  # The momentum key encoder {'params', 'batch_stats'}, None with config.queue_momentum = 0.
  key_encoder: dict[str, Any] | None = None


def metric_names(config: ml_collections.ConfigDict) -> tuple[str, ...]:
  names = ('train_loss', 'grad_norm')
  if config.diagnostics:
    names += ('loss_ucl', 'loss_hucl', 'loss_scl', 'loss_hscl', 'assumption1_fraction')
  return names


def create_train_state(
  config: ml_collections.ConfigDict,
  model: models.ContrastiveModel,
  optimizer: optax.GradientTransformation,
  image_size: int,
  mesh: jax.sharding.Mesh,
) -> TrainState:
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
      queue=(
        negative_queue.empty(config.queue_size, config.model.head_out)
        if config.queue_size
        else None
      ),
      # θ_k starts at θ_q: the first step's keys are the online features.
      key_encoder=(
        {'params': variables['params'], 'batch_stats': variables['batch_stats']}
        if config.queue_momentum > 0
        else None
      ),
    )

  return jax.jit(init, out_shardings=NamedSharding(mesh, P()))()


def state_to_checkpoint(state: TrainState) -> dict[str, Any]:
  """Pytree of plain arrays (Orbax stores key data, not typed keys); the parts a run does
  not use (no queue, no key encoder) are left out, so its checkpoints are as before."""
  tree = {f.name: getattr(state, f.name) for f in dataclasses.fields(state)}
  tree['rng'] = jax.random.key_data(state.rng)
  if state.queue is not None:
    tree['queue'] = dataclasses.asdict(state.queue)
  return {name: value for name, value in tree.items() if value is not None}


def state_from_checkpoint(tree: dict[str, Any]) -> TrainState:
  tree = {**tree, 'rng': jax.random.wrap_key_data(tree['rng'])}
  if 'queue' in tree:
    tree['queue'] = negative_queue.Queue(**tree['queue'])
  return TrainState(**tree)


# ----------------------------------------------------------------------------------------
# The training step.


def make_loss_fn(config: ml_collections.ConfigDict):
  """(normalised projections [b, 2, d], labels [b], hyper) -> global-batch loss, f32."""
  common = dict(temperature=config.temperature, M=config.M, axis_name=parallel.AXIS)
  method = config.method

  def hardening(hyper):
    if config.hardening == 'exp':
      return losses.exponential(hyper['beta'])
    return losses.threshold(hyper['tau'])

  def loss_fn(z, labels, hyper, *, keys=None, queue=None):
    """``keys``: the key encoder's projections, if any; ``queue``: a negative_queue.Queue."""
    kw = dict(common, keys=keys, **(queue.loss_arguments() if queue is not None else {}))
    if method == 'ucl':
      return losses.ucl(z, **kw)
    if method == 'hucl':
      return losses.hucl(
        z,
        beta=hyper['beta'],
        tau_plus=config.tau_plus,
        stop_gradient_weights=config.stop_gradient_weights,
        **kw,
      )
    if method == 'scl':
      return losses.scl(z, labels, **kw)
    return losses.hscl(
      z,
      labels,
      hardening=hardening(hyper),
      stop_gradient_weights=config.stop_gradient_weights,
      **kw,
    )

  def diagnostics_fn(z, labels, hyper):
    return losses.batch_diagnostics(
      z, labels, hardening=hardening(hyper), positives=config.diagnostics_positives, **common
    )

  return loss_fn, diagnostics_fn


def augment_batch(
  rng: jax.Array,
  step: jax.Array,
  images: jax.Array,
  global_index: jax.Array,
  params: augment.AugmentParams,
) -> jax.Array:
  """Two views per image; example i's key is fold_in(fold_in(rng, step), global_index[i])."""
  step_key = jax.random.fold_in(rng, step)
  keys = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(step_key, global_index)
  one_example = lambda key, image: augment.two_views(key, image[None], params)[0]
  return jax.vmap(one_example)(keys, images)


def _value_and_grad(config, encode, loss_of, state: TrainState, inputs):
  """(loss, projections, new batch_stats, gradient): directly, or with gradient caching
  (one chunk's activations at a time, the same loss and gradient) when chunk_size > 0."""
  if config.chunk_size:
    (loss, _, z, batch_stats), grads = gradcache.value_and_grad(
      encode,
      lambda z: (loss_of(z), None),
      state.params,
      state.batch_stats,
      _chunks(config, inputs),
      axis_name=parallel.AXIS,
      unroll=config.chunk_unroll,
    )
    return loss, z, batch_stats, grads

  def compute_loss(params):
    z, batch_stats = encode(params, state.batch_stats, inputs)
    return loss_of(z), (z, batch_stats)

  (loss, (z, batch_stats)), grads = jax.value_and_grad(compute_loss, has_aux=True)(state.params)
  return loss, z, batch_stats, grads


def _chunks(config, inputs):
  """The per-device inputs as config.chunk_size-sample chunks (gradient caching)."""
  return gradcache.split(inputs, inputs[0].shape[0] // config.chunk_size)


def _key_features(config, encode, key_encoder, inputs):
  """(the key encoder's projections of the batch, the key encoder with the BatchNorm
  statistics of that forward pass), chunked as the online encoder; (None, None) without."""
  if key_encoder is None:
    return None, None
  params, batch_stats = key_encoder['params'], key_encoder['batch_stats']
  if config.chunk_size:
    z, batch_stats = gradcache.forward_only(
      encode, params, batch_stats, _chunks(config, inputs), unroll=config.chunk_unroll
    )
  else:
    z, batch_stats = encode(params, batch_stats, inputs)
  return jax.lax.stop_gradient(z), {'params': params, 'batch_stats': batch_stats}


def _after_update(config, queue, params, key_encoder, keys, labels):
  """(queue, key encoder) after the optimizer step: θ_k ← m·θ_k + (1 − m)·θ_q, and the
  batch's keys (the key encoder's, else the online projections) enqueued."""
  if key_encoder is not None:
    key_params = negative_queue.momentum_update(
      key_encoder['params'], params, config.queue_momentum
    )
    key_encoder = {**key_encoder, 'params': key_params}
  if queue is not None:
    queue = negative_queue.enqueue(queue, keys, labels, parallel.AXIS)
  return queue, key_encoder


def make_train_step(
  config: ml_collections.ConfigDict,
  model: models.ContrastiveModel,
  optimizer: optax.GradientTransformation,
  augment_params: augment.AugmentParams,
  mesh: jax.sharding.Mesh,
):
  """jit(shard_map(step)): (state, {'image' uint8[B,2,H,W,3], 'label'}, hyper) -> (state, loss)."""
  loss_fn, diagnostics_fn = make_loss_fn(config)

  def per_device_step(state: TrainState, batch, hyper):
    images, labels = batch['image'], batch['label']
    local_batch = labels.shape[0]
    global_index = jax.lax.axis_index(parallel.AXIS) * local_batch + jnp.arange(local_batch)

    def encode(params, batch_stats, inputs):
      """(images, their global indices) -> (normalised projections [b, 2, d], batch_stats)."""
      images, index = inputs
      views = augment_batch(state.rng, state.step, images, index, augment_params)
      # Sample-major rows [x0v0, x0v1, x1v0, ...]: the losses' row order.
      x = views.reshape((-1,) + views.shape[2:])
      (_, projections), updates = model.apply(
        {'params': params, 'batch_stats': batch_stats}, x, train=True, mutable=['batch_stats']
      )
      z = losses.l2_normalize(projections).reshape(images.shape[0], views.shape[1], -1)
      return z, updates.get('batch_stats', batch_stats)  # none without BatchNorm

    inputs = (images, global_index)
    keys, key_encoder = _key_features(config, encode, state.key_encoder, inputs)
    loss_of = lambda z: loss_fn(z, labels, hyper, keys=keys, queue=state.queue)
    loss, z, batch_stats, grads = _value_and_grad(config, encode, loss_of, state, inputs)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    keys = z if keys is None else keys
    queue, key_encoder = _after_update(config, state.queue, params, key_encoder, keys, labels)
    step_metrics = {'train_loss': loss, 'grad_norm': optax.tree.norm(grads)}
    if config.diagnostics:
      step_metrics.update(diagnostics_fn(z, labels, hyper))
    # The values are already identical on every device; pmean states it to shard_map.
    step_metrics = jax.lax.pmean(step_metrics, parallel.AXIS)
    new_state = state.replace(
      step=state.step + 1,
      params=params,
      batch_stats=batch_stats,
      opt_state=opt_state,
      metric_sums=jax.tree.map(jnp.add, state.metric_sums, step_metrics),
      queue=queue,
      key_encoder=key_encoder,
    )
    return new_state, loss

  step = jax.shard_map(
    per_device_step, mesh=mesh, in_specs=(P(), P(parallel.AXIS), P()), out_specs=(P(), P())
  )
  return jax.jit(step, donate_argnums=0)


# ----------------------------------------------------------------------------------------
# The training program.


class Preempted(Exception):
  """A SIGTERM reached a safe point of the run: raised there, handled in `_Run.train`,
  which saves the state and stops."""


class PreemptionWatcher:
  """Turns SIGTERM into a flag that the run checks at its safe points.

  Only installable from the main thread (signal handlers are); elsewhere inert.
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

  def check(self, *, sync_point: bool = True) -> None:
    """Raises Preempted if a SIGTERM came. With several processes, all must stop at the
    same step, so they agree on the flag (a collective) only at `sync_point` steps."""
    if jax.process_count() == 1:
      stop = self._requested
    elif not sync_point:
      stop = False
    else:
      stop = bool(np.any(multihost_utils.process_allgather(np.asarray(self._requested))))
    if stop:
      raise Preempted()


@dataclasses.dataclass
class TrainResult:
  state: TrainState
  preempted: bool  # stopped by SIGTERM after saving a checkpoint
  last_record: dict[str, Any] | None  # the last epoch's metrics record (None: none trained)
  records: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # all epochs' so far
  already_complete: bool = False  # the workdir's run had trained every epoch: nothing ran


def epoch_summary(record: dict[str, Any], *, compile_seconds: float = 0.0) -> str:
  """One concise log line per epoch (the full record is in metrics.jsonl); the throughput
  leaves out the step that compiled, whose time is shown apart."""
  parts = [f'epoch {record["epoch"]}: loss {record["train_loss"]:.4f}']
  if 'knn_top1' in record:
    parts.append(f'kNN top-1 {record["knn_top1"]:.4f}')
  if 'assumption1_fraction' in record:
    parts.append(f'Assumption 1 {record["assumption1_fraction"]:.3f}')
  parts.append(f'lr {record["learning_rate"]:.3g}')
  # Samples (the batch's images) apart from views (two per sample, what the encoder sees).
  parts.append(
    f'{record["samples_per_second"]:.0f} samples/s ({record["images_per_second"]:.0f} views/s)'
  )
  epoch_time = f'{record["epoch_time"]:.1f} s'
  if compile_seconds:
    epoch_time += f' ({compile_seconds:.1f} s of it compiling the step)'
  parts.append(epoch_time)
  return ', '.join(parts)


def train_and_evaluate(
  config: ml_collections.ConfigDict,
  workdir: str,
  *,
  mesh: jax.sharding.Mesh | None = None,
  allowed_config_changes: tuple[str, ...] = (),
) -> TrainResult:
  """Trains per `config`, resuming from the latest checkpoint in `workdir` if there is one.

  The workdir is locked for the run (a second run on it stops, naming the holder); resuming
  with a config that differs from DIR/config.json is refused unless the differing fields
  are in `allowed_config_changes` (see hscl_jax.rundir.stored_config).
  """
  start = time.perf_counter()
  mesh = parallel.make_mesh() if mesh is None else mesh
  schema.validate_config(config, num_devices=mesh.size, num_processes=jax.process_count())
  lock = workdir_lock.acquire_for_run(workdir)
  stopped = True
  try:
    if checkpoints.finished_steps(workdir):
      stored_config.check_unchanged(workdir, config, allowed=allowed_config_changes)
    run = _build_run(config, workdir, mesh)
    try:
      with PreemptionWatcher() as run.preemption:
        result = run.train()
    finally:
      run.close()
    stopped = False
  finally:
    if lock is not None:
      # A run stopped (refused data, a crash, Ctrl-C) before its first checkpoint leaves
      # the workdir as it found it; a preempted one has saved a checkpoint.
      lock.release(undo=stopped and not checkpoints.finished_steps(workdir))
  if not result.preempted and jax.process_index() == 0:
    logging.info('%s', closing_summary(config, workdir, result, time.perf_counter() - start))
  return result


def final_knn(records: list[dict[str, Any]]) -> str:
  """The last kNN top-1 of a run's records, as the closing lines show it."""
  values = [r['knn_top1'] for r in records if 'knn_top1' in r]
  return f'final kNN top-1 {values[-1]:.4f}' if values else 'no kNN evaluated'


def closing_summary(
  config: ml_collections.ConfigDict, workdir: str, result: TrainResult, seconds: float
) -> str:
  """What the run did and the commands that use it, the workdir filled in."""
  workdir = os.path.abspath(workdir)
  if result.already_complete:
    head = 'Nothing trained (already complete)'
  else:
    head = (
      f'Finished {config.num_epochs} epochs in {metrics.format_duration(seconds)}, '
      f'{final_knn(result.records)}'
    )
  commands = [
    f'python -m hscl_jax.linear_eval --workdir={workdir}',
    f'python -m hscl_jax.embed --workdir={workdir} --split=test --out={workdir}/embeddings.npz',
    f'python -m hscl_jax.inspect --workdir={workdir} --out={workdir}/inspect',
  ]
  if config.model.name.startswith('resnet'):  # export refuses other backbones (and says why)
    commands.append(
      f'python -m hscl_jax.export --workdir={workdir} --format=torch '
      f'--out={workdir}/backbone.safetensors'
    )
  return f'{head}; workdir {workdir}. Next:\n' + '\n'.join(f'  {c}' for c in commands)


# ----------------------------------------------------------------------------------------
# Where an epoch stood: owned here, stored with each checkpoint as opaque metadata.


@dataclasses.dataclass
class EpochPosition:
  """What a checkpoint knows beyond the state, so that a resumed run writes exactly the
  records an uninterrupted one would.

  steps_done: the epoch's steps are all taken but its record is not written (a SIGTERM
    at its last step or during its kNN): the resumed run computes the record first;
  seconds, steps_timed: the epoch's training time so far, so that its record reports the
    whole epoch's throughput;
  compile_seconds, compile_steps: of those, the first step of each process that ran in the
    epoch (it compiles): the record's throughput leaves them out, as the progress line does.
  The checkpoint also keeps every metrics record written so far, to rebuild a damaged
  metrics.jsonl.
  """

  steps_done: bool = False
  seconds: float = 0.0
  steps_timed: int = 0
  compile_seconds: float = 0.0
  compile_steps: int = 0

  def steps_timed_without_compilation(self) -> tuple[int, float]:
    """(steps, seconds) of the epoch's throughput: the compiling steps left out, unless
    they were all its steps (an epoch of one step)."""
    steps = self.steps_timed - self.compile_steps
    if steps <= 0:
      return self.steps_timed, self.seconds
    return steps, self.seconds - self.compile_seconds

  def to_metadata(self, records: list[dict[str, Any]]) -> dict[str, Any]:
    # Key names of the checkpoints written before this class existed, so they resume.
    return {
      'epoch_end_pending': self.steps_done,
      'epoch_seconds': self.seconds,
      'epoch_steps_timed': self.steps_timed,
      'epoch_compile_seconds': self.compile_seconds,
      'epoch_compile_steps': self.compile_steps,
      'records': records,
    }

  @classmethod
  def from_metadata(cls, metadata: dict[str, Any]) -> tuple[EpochPosition, list | None]:
    """(position, records); records are None in older checkpoints (the file is trusted)."""
    position = cls(
      steps_done=bool(metadata.get('epoch_end_pending', False)),
      seconds=float(metadata.get('epoch_seconds', 0.0)),
      steps_timed=int(metadata.get('epoch_steps_timed', 0)),
      compile_seconds=float(metadata.get('epoch_compile_seconds', 0.0)),
      compile_steps=int(metadata.get('epoch_compile_steps', 0)),
    )
    return position, metadata.get('records')


def _build_run(config: ml_collections.ConfigDict, workdir: str, mesh: jax.sharding.Mesh):
  """The run's data, model, step, state (restored if a checkpoint exists) and writers."""
  is_writer = jax.process_index() == 0
  train_source, test_source = data.run_sources(config)
  schema.validate_dataset(config, num_classes=train_source.num_classes)
  train_iter = make_train_loader(config, train_source)
  plan = make_plan(config, train_iter.order)
  augment_params = augment.AugmentParams.from_config(config.augment)
  model = models.create_model(config.model, bn_axis_name=parallel.AXIS)
  optimizer = optimizers.create_optimizer(config.optimizer, plan.learning_rate)
  state = create_train_state(config, model, optimizer, augment_params.image_size, mesh)
  checkpointer = checkpoints.Checkpointer(workdir, keep=config.keep_checkpoints)
  state, start_step, position, records = _restore(checkpointer, state, train_iter)
  metrics.write_config(workdir, config, enabled=is_writer)
  log_queue_memory(config, state)
  logging.info(
    '%s on %s: %d devices, global batch %d, %d steps/epoch, %d epochs.',
    config.method,
    config.dataset,
    mesh.size,
    config.batch_size,
    plan.steps_per_epoch,
    plan.num_epochs,
  )
  if config.samples_per_class:
    info, warning = class_aware_epoch_lines(config, train_iter.order)
    logging.info('%s', info)
    if warning:
      logging.warning('%s', warning)
  return _Run(
    config=config,
    plan=plan,
    mesh=mesh,
    train_step=make_train_step(config, model, optimizer, augment_params, mesh),
    feature_fn=eval_features.make_feature_fn(model, augment_params, mesh),
    train_iter=train_iter,
    train_source=train_source,
    test_source=test_source,
    checkpointer=checkpointer,
    # An epoch end the resumed run redoes gets its record (again).
    writer=metrics.MetricWriter(
      workdir,
      enabled=is_writer,
      keep_through_step=start_step - 1 if position.steps_done else start_step,
      records=records,
    ),
    progress=metrics.Progress(
      total_steps=plan.total_steps,
      start_step=start_step,
      steps_per_epoch=plan.steps_per_epoch,
      images_per_step=2 * config.batch_size,
      enabled=is_writer,
    ),
    state=state,
    position=position,
  )


# Below this share of the training examples per epoch, a class-aware run is warned: its
# epochs (and so its schedule, in steps) are much shorter than uniform batches' epochs.
LOW_EPOCH_SHARE = 0.5


def class_aware_epoch_lines(
  config: ml_collections.ConfigDict, order: data.EpochOrder
) -> tuple[str, str | None]:
  """(what a class-aware epoch is, a warning where it visits few of the examples, or None)."""
  m, batch, steps = config.samples_per_class, config.batch_size, order.steps_per_epoch
  uniform = data.steps_per_epoch(order.num_examples, batch)
  share = steps * batch / order.num_examples
  info = (
    f'Class-aware batches: {m} samples of each of {batch // m} classes per batch; an epoch '
    f'of {steps} steps visits {share:.1%} of the {order.num_examples} training examples '
    f'(uniform batches: {uniform} steps).'
  )
  if share >= LOW_EPOCH_SHARE:
    return info, None
  longer = math.ceil(config.num_epochs * uniform / steps)
  warning = (
    f'Class-aware epochs visit only {share:.1%} of the training examples ({steps} steps '
    f'instead of {uniform}): the smaller classes run out of groups of {m} early, so each '
    f'epoch, and the learning-rate schedule in steps, is {uniform / steps:.1f}x shorter. '
    f'Fix: --config.num_epochs={longer} trains as many steps as uniform batches would, or '
    'balance the classes (--config.train_examples), or use --config.samples_per_class=0.'
  )
  return info, warning


def log_queue_memory(config: ml_collections.ConfigDict, state: TrainState) -> None:
  """The memory the queue and the key encoder hold on every device (both replicated)."""
  if state.queue is not None:
    logging.info(
      'Negative queue: %d slots x %d features, %.1f MiB per device.',
      config.queue_size,
      config.model.head_out,
      negative_queue.nbytes(state.queue) / 2**20,
    )
  if state.key_encoder is not None:
    logging.info(
      'Momentum key encoder (m = %g): %.1f MiB per device.',
      config.queue_momentum,
      negative_queue.nbytes(state.key_encoder) / 2**20,
    )


def _restore(checkpointer, state: TrainState, train_iter):
  """(state, step, position, records) of the newest usable checkpoint, or initial ones."""
  restored = checkpointer.restore_latest(state_to_checkpoint(state))
  if restored is None:
    return state, 0, EpochPosition(), None
  step, tree, iterator_state = restored
  train_iter.set_state(iterator_state)
  position, records = EpochPosition.from_metadata(checkpointer.metadata(step))
  return state_from_checkpoint(tree), step, position, records


@dataclasses.dataclass
class _Run:
  """The pieces of one training run, its state and the epoch loop over them."""

  config: ml_collections.ConfigDict
  plan: Plan
  mesh: jax.sharding.Mesh
  train_step: Any
  feature_fn: Any
  train_iter: Any
  train_source: Any
  test_source: Any
  checkpointer: checkpoints.Checkpointer
  writer: metrics.MetricWriter
  progress: metrics.Progress
  state: TrainState
  position: EpochPosition  # of the epoch in progress
  preemption: PreemptionWatcher | None = None
  last_record: dict[str, Any] | None = None
  compiled: bool = False  # whether the train step has run (and compiled) in this process

  @property
  def step(self) -> int:
    return int(parallel.replicated_value(self.state.step))

  def train(self) -> TrainResult:
    """For each epoch: train it, finish it. A SIGTERM, in whatever phase it lands, saves
    the state and where the epoch stood, then stops."""
    if self.step >= self.plan.total_steps and not self.position.steps_done:
      logging.info('%s', self.already_complete_line())
      return self.result(already_complete=True)
    if self.step:
      logging.info('Resumed from the checkpoint at step %d.', self.step)
    try:
      while self.step < self.plan.total_steps or self.position.steps_done:
        epoch = self.plan.epoch_of_step(self.step - 1 if self.position.steps_done else self.step)
        hyper = loss_hyperparameters(self.config, epoch)
        if not self.position.steps_done:
          self.train_epoch(epoch, hyper)
        self.finish_epoch(epoch, hyper)
        if self.step < self.plan.total_steps:
          self.preemption.check()
    except Preempted:
      self.stop_for_preemption()
      return self.result(preempted=True)
    return self.result()

  def result(self, *, preempted: bool = False, already_complete: bool = False) -> TrainResult:
    return TrainResult(
      state=self.state,
      preempted=preempted,
      last_record=self.last_record,
      records=list(self.writer.records),
      already_complete=already_complete,
    )

  def already_complete_line(self) -> str:
    epochs = self.plan.num_epochs
    return (
      f'Already complete: {epochs} of {epochs} epochs ({final_knn(self.writer.records)}). '
      f'To train longer, rerun with --config.num_epochs={2 * epochs} (or any larger number) '
      '--allow_config_change=num_epochs.'
    )

  def train_epoch(self, epoch: int, hyper) -> None:
    """Steps to the end of `epoch`; a SIGTERM raises Preempted between two steps."""
    end_step = epoch * self.plan.steps_per_epoch
    step = self.step
    hyper = parallel.replicated(hyper, self.mesh)
    start, start_time = step, time.perf_counter()
    self.progress.resume_timer()
    try:
      while step < end_step:
        step_start = time.perf_counter()
        batch = parallel.global_batch(next(self.train_iter), self.mesh, ('image', 'label'))
        self.state, loss = self.train_step(self.state, batch, hyper)
        step += 1
        self.position.steps_done = step == end_step
        log_step = step % self.config.log_every_steps == 0 or step == end_step
        if not self.compiled:
          self.after_first_step(step, loss, step_start)
        self.after_step(step, epoch, loss, log_step)
        self.preemption.check(sync_point=log_step)
    finally:
      self.progress.pause_timer()
      self.position.seconds += time.perf_counter() - start_time
      self.position.steps_timed += step - start

  def after_first_step(self, step: int, loss, step_start: float) -> None:
    """The first step of this process compiles: timed apart, left out of the rates."""
    jax.block_until_ready(loss)
    self.compiled = True
    self.position.compile_seconds += time.perf_counter() - step_start
    self.position.compile_steps += 1
    self.progress.restart(step)

  def after_step(self, step: int, epoch: int, loss, log_step: bool) -> None:
    if log_step:
      loss_value = float(parallel.replicated_value(loss))  # waits for the step: real timings
      self.check_finite(epoch)
      self.progress.log(step, loss_value)

  def finish_epoch(self, epoch: int, hyper) -> None:
    """The epoch's record (means, timings, kNN), written; the metric sums reset; a
    checkpoint when one is due. A SIGTERM during the kNN raises before anything is written."""
    record = self.epoch_record(epoch, hyper)
    if metrics.is_due(epoch, self.config.knn.every_epochs, self.plan.num_epochs):
      record.update(self.knn())
    # Fresh zeros each epoch: the step donates (deletes) the state's buffers.
    zeros = jax.tree.map(lambda x: np.zeros(x.shape, x.dtype), self.state.metric_sums)
    self.state = self.state.replace(metric_sums=parallel.replicated(zeros, self.mesh))
    self.writer.write(epoch * self.plan.steps_per_epoch, record)
    logging.info('%s', epoch_summary(record, compile_seconds=self.position.compile_seconds))
    self.last_record, self.position = record, EpochPosition()
    if metrics.is_due(epoch, self.config.checkpoint_every_epochs, self.plan.num_epochs):
      self.save()

  def epoch_record(self, epoch: int, hyper) -> dict[str, Any]:
    """Means of the per-step metrics over the epoch, learning rate, throughput, hyper."""
    step = epoch * self.plan.steps_per_epoch
    record = {
      name: float(parallel.replicated_value(value)) / self.plan.steps_per_epoch
      for name, value in self.state.metric_sums.items()
    }
    samples, seconds = self.position.steps_timed_without_compilation()
    samples *= self.config.batch_size
    seconds = max(seconds, 1e-9)
    record.update(
      epoch=epoch,
      step=step,
      learning_rate=self.plan.learning_rate_at(step - 1),
      epoch_time=self.position.seconds,
      images_per_second=2 * samples / seconds,
      samples_per_second=samples / seconds,
      **{name: float(hyper[name]) for name in used_hyperparameters(self.config)},
    )
    return record

  def knn(self) -> dict[str, float]:
    start = time.perf_counter()
    variables = {'params': self.state.params, 'batch_stats': self.state.batch_stats}
    top1 = eval_features.knn_accuracy(
      self.config.knn,
      self.feature_fn,
      variables,
      self.train_source,
      self.test_source,
      num_classes=self.train_source.num_classes,
      mesh=self.mesh,
      check=self.preemption.check,
    )
    seconds = time.perf_counter() - start
    self.progress.eval_seconds_per_epoch = seconds / self.config.knn.every_epochs
    return {'knn_top1': top1, 'knn_time': seconds}

  def save(self) -> None:
    """A checkpoint of the state, the input position and where the epoch stands."""
    self.checkpointer.save(
      self.step,
      state_to_checkpoint(self.state),
      self.train_iter.get_state(),
      self.position.to_metadata(self.writer.records),
    )

  def check_finite(self, epoch: int) -> None:
    """Raises if a step of the epoch so far had a non-finite loss or gradient."""
    sums = {
      name: float(parallel.replicated_value(self.state.metric_sums[name]))
      for name in ('train_loss', 'grad_norm')
    }
    if all(np.isfinite(v) for v in sums.values()):
      return
    self.checkpointer.wait_until_finished()
    last = self.checkpointer.latest_step()
    where = (
      f'the last good checkpoint is step {last}; rerunning the same command resumes from it'
      if last is not None
      else 'no checkpoint was written yet'
    )
    raise NonFiniteLossError(
      f'Non-finite training loss or gradient (epoch sums: {sums}) in epoch {epoch}, by step '
      f'{self.step}. The state was not saved; {where}. Try a lower optimizer.learning_rate, a '
      'larger temperature, or model.dtype=float32.'
    )

  def stop_for_preemption(self) -> None:
    step = self.step
    self.check_finite(self.plan.epoch_of_step(max(step - 1, 0)))
    self.save()  # a no-op if this step is already saved
    self.checkpointer.wait_until_finished()
    logging.warning(
      'SIGTERM: saved the checkpoint at step %d; rerun the same command to resume.', step
    )

  def close(self) -> None:
    self.checkpointer.close()
    self.writer.close()
