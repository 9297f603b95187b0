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
    cross-device sum (tests/test_train.py checks 4 devices against 1);
  * the optax update runs on the replicated gradient, so replicas stay identical.
With `chunk_size` > 0 the encoder runs in chunks of that many samples per device
(hscl_jax.training.gradcache): forward per chunk keeping only the projections, the loss and
its gradient with respect to all projections of the global batch, then per chunk the
forward again with its backward; the same gradient, with one chunk's activations in memory.
BatchNorm then normalises each chunk (synced over devices) and updates its running
statistics once per chunk.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P
import ml_collections
import optax

from hscl_jax import losses
from hscl_jax import models
from hscl_jax import parallel
from hscl_jax.config import methods
from hscl_jax.data import augment
from hscl_jax.training import gradcache
from hscl_jax.training import queue as negative_queue
from hscl_jax.training import state as state_lib


def make_loss_fn(config: ml_collections.ConfigDict):
  """(normalised projections [b, 2, d], labels [b], hyper) -> global-batch loss, f32: the
  loss of the config's row of the methods table."""
  common = dict(temperature=config.temperature, M=config.M, axis_name=parallel.AXIS)
  method = methods.of_config(config)

  def loss_fn(z, labels, hyper, *, keys=None, queue=None):
    """``keys``: the key encoder's projections, if any; ``queue``: a negative_queue.Queue."""
    kernel = dict(common, keys=keys, **(queue.loss_arguments() if queue is not None else {}))
    options = methods.LossOptions(kernel, config.tau_plus, config.stop_gradient_weights)
    return method.loss(z, labels, hyper, options)

  def diagnostics_fn(z, labels, hyper):
    return losses.batch_diagnostics(
      z,
      labels,
      hardening=methods.config_hardening(config, hyper),
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

  def per_device_step(state: state_lib.TrainState, batch, hyper):
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
