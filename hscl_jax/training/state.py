"""The training state (parameters, BatchNorm statistics, optimizer state, the augmentations'
key, the epoch's metric sums, the negative queue and key encoder, the online probe, the
loss's own trained parameters), its initial value on the mesh and its checkpoint form."""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import ml_collections
import optax

from hscl_jax import models
from hscl_jax.config import methods
from hscl_jax.training import online_probe
from hscl_jax.training import queue as negative_queue


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
  # The online linear probe {'params', 'opt_state'} (training/online_probe), None without one.
  probe: dict[str, Any] | None = None
  # The loss's trained parameters {'params': {'log_t', 'b'}, 'opt_state'} (a sigmoid row of
  # config/methods), stepped by the model's optimizer; None for a loss that trains none.
  loss_state: dict[str, Any] | None = None


def metric_names(config: ml_collections.ConfigDict) -> tuple[str, ...]:
  names = ('train_loss', 'grad_norm')
  if config.diagnostics:
    names += ('loss_ucl', 'loss_hucl', 'loss_scl', 'loss_hscl', 'assumption1_fraction')
  return names


def _metric_sums(config, probe_classes) -> dict[str, jax.Array]:
  names = metric_names(config) + (('probe_loss',) if probe_classes else ())
  return {name: jnp.zeros((), jnp.float32) for name in names}


def create_train_state(
  config: ml_collections.ConfigDict,
  model: models.ContrastiveModel,
  optimizer: optax.GradientTransformation,
  image_size: int,
  mesh: jax.sharding.Mesh,
  *,
  probe_classes: int | None = None,
) -> TrainState:
  """Initial state, replicated over the mesh. Same seed -> same state on any device count.

  `probe_classes`: the classes of an online linear probe (training/online_probe) the state holds;
  None: no probe (the training loop passes the dataset's classes where config.probe is on).
  Computed by a jit whose outputs are replicated over the mesh, so every process holds its
  devices' copies (a device_put of one device's arrays would not reach other processes).
  """

  def init() -> TrainState:
    init_key, augment_key = jax.random.split(jax.random.key(config.seed))
    image_shape = (image_size, image_size, 3)
    variables = models.initialize(model, init_key, image_shape)
    return TrainState(
      step=jnp.zeros((), jnp.int32),
      params=variables['params'],
      batch_stats=variables['batch_stats'],
      opt_state=optimizer.init(variables['params']),
      rng=augment_key,
      metric_sums=_metric_sums(config, probe_classes),
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
      probe=_initial_probe(config, model, variables, image_shape, probe_classes),
      loss_state=_initial_loss_state(config, optimizer),
    )

  return jax.jit(init, out_shardings=NamedSharding(mesh, P()))()


def _initial_probe(config, model, variables, image_shape, probe_classes):
  if not probe_classes:
    return None
  features = jax.eval_shape(
    lambda: model.apply(
      variables, jnp.zeros((1, *image_shape)), method=models.ContrastiveModel.features
    )
  )
  return online_probe.initial(
    online_probe.create_optimizer(config), features.shape[-1], probe_classes
  )


def _initial_loss_state(config, optimizer):
  params = methods.learned_initial(config)
  if params is None:
    return None
  params = jax.tree.map(jnp.asarray, params)
  return {'params': params, 'opt_state': optimizer.init(params)}


def state_to_checkpoint(state: TrainState) -> dict[str, Any]:
  """Pytree of plain arrays (Orbax stores key data, not typed keys); the parts a run does
  not use (no queue, no key encoder, no probe, no trained loss parameters) are left out, so a
  run without them stores the same tree as one whose code never had them."""
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
