"""The training step (`make_train_step`): augmentation, forward, loss, gradient and update.

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
    cross-device sum (tests/end_to_end/test_train.py checks 4 devices against 1);
  * the optax update runs on the replicated gradient, so replicas stay identical;
  * a sigmoid row's trained loss parameters (log t, b: the state's loss_state) are
    replicated as the model's, differentiated with them and stepped by the same optimizer
    (its own state), so their gradient too is the global batch's.
With `chunk_size` > 0 the encoder runs in chunks of that many samples per device
(hscl_jax.training.gradcache): forward per chunk keeping only the projections, the loss and
its gradient with respect to all projections of the global batch, then per chunk the
forward again with its backward; the same gradient, with one chunk's activations in memory.
BatchNorm then normalises each chunk (synced over devices) and updates its running
statistics once per chunk.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P
import ml_collections
import optax

from hscl_jax import losses
from hscl_jax import models
from hscl_jax import objectives
from hscl_jax import parallel
from hscl_jax.config import methods
from hscl_jax.data import augment
from hscl_jax.training import gradcache
from hscl_jax.training import online_probe
from hscl_jax.training import queue as negative_queue
from hscl_jax.training import state as state_lib

# What a step returns of its metrics: its loss and its gradient's global norm.
STEP_SCALARS = ('train_loss', 'grad_norm')


def make_loss_fn(config: ml_collections.ConfigDict):
  """(normalised projections [b, 2, d], labels [b], hyper) -> global-batch loss, f32: the
  loss of the config's row of the methods table."""
  common = dict(temperature=config.temperature, M=config.M, axis_name=parallel.AXIS)
  loss = objectives.loss_of(methods.of_config(config))

  def loss_fn(z, labels, hyper, *, keys=None, queue=None, learned=None):
    """``keys``: the key encoder's projections, if any; ``queue``: a negative_queue.Queue;
    ``learned``: the loss's trained parameters (the state's loss_state['params'])."""
    kernel = dict(common, keys=keys, **(queue.loss_arguments() if queue is not None else {}))
    options = objectives.LossOptions(
      kernel, config.tau_plus, config.stop_gradient_weights, learned=learned
    )
    return loss(z, labels, hyper, options)

  def diagnostics_fn(z, labels, hyper):
    return losses.batch_diagnostics(
      z,
      labels,
      hardening=objectives.config_hardening(config, hyper),
      positives=config.diagnostics_positives,
      **common,
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


def _value_and_grad(config, encode, loss_of, state: state_lib.TrainState, inputs):
  """(loss, encoder outputs, new batch_stats, the model's gradient, the loss parameters'
  gradient or None): directly, or with gradient caching (one chunk's activations at a time,
  the same loss and gradient) when chunk_size > 0. `loss_of(outputs, learned)`."""
  learned = None if state.loss_state is None else state.loss_state['params']
  if config.chunk_size:
    (loss, _, outputs, batch_stats), grads = gradcache.value_and_grad(
      encode,
      lambda outputs: (loss_of(outputs, learned), None),
      state.params,
      state.batch_stats,
      _chunks(config, inputs),
      axis_name=parallel.AXIS,
      unroll=config.chunk_unroll,
    )
    # The loss parameters' gradient at the whole batch's projections: one more loss, not
    # another pass of the encoder.
    learned_grads = None if learned is None else jax.grad(lambda p: loss_of(outputs, p))(learned)
    return loss, outputs, batch_stats, grads, learned_grads

  def compute_loss(params, learned):
    outputs, batch_stats = encode(params, state.batch_stats, inputs)
    return loss_of(outputs, learned), (outputs, batch_stats)

  (loss, (outputs, batch_stats)), (grads, learned_grads) = jax.value_and_grad(
    compute_loss, argnums=(0, 1), has_aux=True
  )(state.params, learned)
  return loss, outputs, batch_stats, grads, learned_grads


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
    (z, _), batch_stats = gradcache.forward_only(
      encode, params, batch_stats, _chunks(config, inputs), unroll=config.chunk_unroll
    )
  else:
    (z, _), batch_stats = encode(params, batch_stats, inputs)
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


def learned_values(loss_state) -> dict[str, jax.Array]:
  """What a run logs of the loss's trained parameters: a sigmoid row's t = e^{log_t} and b
  ({} without them)."""
  if loss_state is None:
    return {}
  params = loss_state['params']
  return {'t': jnp.exp(params['log_t']), 'b': params['b']}


def step_scalars(step_metrics, loss_state) -> dict[str, jax.Array]:
  """What a step returns besides the state: its own STEP_SCALARS (the state keeps their
  epoch sums) and a sigmoid row's t and b after its update (`learned_values`)."""
  return {**{name: step_metrics[name] for name in STEP_SCALARS}, **learned_values(loss_state)}


def _optimizer_step(optimizer, state: state_lib.TrainState, grads, learned_grads):
  """(params, opt_state, loss_state) after one step of the optimizer: the model's, and a
  sigmoid row's log t and b, stepped by the same optimizer with their own state."""
  updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  loss_state = state.loss_state
  if loss_state is not None:
    learned, learned_opt = loss_state['params'], loss_state['opt_state']
    updates, learned_opt = optimizer.update(learned_grads, learned_opt, learned)
    loss_state = {'params': optax.apply_updates(learned, updates), 'opt_state': learned_opt}
  return params, opt_state, loss_state


def _encoder(model, augment_params: augment.AugmentParams, rng: jax.Array, step: jax.Array):
  """encode(params, batch_stats, (images, their global indices), probe_features=False) ->
  ((normalised projections [b, 2, d], the probe's detached features [b, 2, f] or None),
  batch_stats): the views of the step's augmentations through the model in train mode."""

  def encode(params, batch_stats, inputs, *, probe_features=False):
    images, index = inputs
    views = augment_batch(rng, step, images, index, augment_params)
    # Sample-major rows [x0v0, x0v1, x1v0, ...]: the losses' row order.
    x = views.reshape((-1,) + views.shape[2:])
    (h, projections), updates = model.apply(
      {'params': params, 'batch_stats': batch_stats}, x, train=True, mutable=['batch_stats']
    )
    per_sample = (images.shape[0], views.shape[1], -1)
    z = losses.l2_normalize(projections).reshape(per_sample)
    h = online_probe.inputs(h).reshape(per_sample) if probe_features else None
    return (z, h), updates.get('batch_stats', batch_stats)  # none without BatchNorm

  return encode


def make_train_step(
  config: ml_collections.ConfigDict,
  model: models.ContrastiveModel,
  optimizer: optax.GradientTransformation,
  augment_params: augment.AugmentParams,
  mesh: jax.sharding.Mesh,
):
  """jit(shard_map(step)): (state, {'image' uint8[B,2,H,W,3], 'label'}, hyper) -> (state,
  `step_scalars`), replicated, the scalars read on the host only at the logging steps. A
  state with an online probe (training/online_probe) trains it in the same step, on the detached
  backbone features of the step's views."""
  loss_fn, diagnostics_fn = make_loss_fn(config)
  probe_optimizer = online_probe.create_optimizer(config)

  def per_device_step(state: state_lib.TrainState, batch, hyper):
    images, labels = batch['image'], batch['label']
    local_batch = labels.shape[0]
    global_index = jax.lax.axis_index(parallel.AXIS) * local_batch + jnp.arange(local_batch)

    encode = _encoder(model, augment_params, state.rng, state.step)
    inputs = (images, global_index)
    keys, key_encoder = _key_features(config, encode, state.key_encoder, inputs)
    loss_of = lambda outputs, learned: loss_fn(
      outputs[0], labels, hyper, keys=keys, queue=state.queue, learned=learned
    )
    online = functools.partial(encode, probe_features=state.probe is not None)
    loss, (z, h), batch_stats, grads, learned_grads = _value_and_grad(
      config, online, loss_of, state, inputs
    )
    params, opt_state, loss_state = _optimizer_step(optimizer, state, grads, learned_grads)
    keys = z if keys is None else keys
    queue, key_encoder = _after_update(config, state.queue, params, key_encoder, keys, labels)
    step_metrics = {'train_loss': loss, 'grad_norm': optax.tree.norm(grads)}
    if config.diagnostics:
      step_metrics.update(diagnostics_fn(z, labels, hyper))
    probe = state.probe
    if probe is not None:
      probe, step_metrics['probe_loss'] = online_probe.update(
        probe_optimizer, probe, h, labels, parallel.AXIS
      )
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
      probe=probe,
      loss_state=loss_state,
    )
    return new_state, step_scalars(step_metrics, loss_state)

  step = jax.shard_map(
    per_device_step, mesh=mesh, in_specs=(P(), P(parallel.AXIS), P()), out_specs=(P(), P())
  )
  return jax.jit(step, donate_argnums=0)
