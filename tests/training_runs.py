"""Helpers of the tests that run training steps and whole runs (tests/end_to_end/test_train.py,
tests/training/test_queue.py, tests/data/test_sampling.py): the end-to-end runs' config,
steps on a mesh of N devices, a first step's loss by eq. (3)'s float64 reference, and a
signal sent at a phase of a run."""

from __future__ import annotations

import gc
import os
import signal

import jax
import jax.numpy as jnp
from losses.test_kernel import reference_loss
from models.test_factory import jit_apply
import numpy as np

from configs import digits
from hscl_jax import models
from hscl_jax import optimizers
from hscl_jax import parallel
from hscl_jax.data import augment
from hscl_jax.evaluation import features as eval_features
from hscl_jax.rundir import checkpoints
from hscl_jax.rundir import metrics
from hscl_jax.training import plan as plan_lib
from hscl_jax.training import state as state_lib
from hscl_jax.training import step as step_lib


def tiny_config():
  """2 epochs x 3 steps of 32 digits on 4 devices; a checkpoint every epoch."""
  config = digits.get_config()
  config.batch_size = 32
  config.num_epochs = 2
  config.steps_per_epoch_limit = 3
  config.optimizer.warmup_epochs = 0.0
  config.knn.batch_size = 256
  config.checkpoint_every_epochs = 1
  config.keep_checkpoints = 3
  config.log_every_steps = 2
  return config


def leaves(tree):
  """The tree's leaves as host arrays."""
  return [np.asarray(x) for x in jax.tree.leaves(jax.device_get(tree))]


def assert_trees_equal(a, b):
  """The same tree structure, and every leaf equal to the bit."""
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for x, y in zip(leaves(a), leaves(b), strict=True):
    np.testing.assert_array_equal(x, y)


def run_steps(config, num_devices, batches):
  """(host copies of the state before and after each step, the losses, the live last
  state): one step per batch on a mesh of `num_devices` (the step donates its input)."""
  mesh = parallel.make_mesh(jax.devices()[:num_devices])
  model = models.create_model(config.model, bn_axis_name=parallel.AXIS)
  schedule = optimizers.create_learning_rate_schedule(
    config.optimizer, steps_per_epoch=3, total_steps=3
  )
  optimizer = optimizers.create_optimizer(config.optimizer, schedule)
  params = augment.AugmentParams.from_config(config.augment)
  state = state_lib.create_train_state(config, model, optimizer, params.image_size, mesh)
  step = step_lib.make_train_step(config, model, optimizer, params, mesh)
  hyper = plan_lib.loss_hyperparameters(config, 1)
  states, losses = [jax.device_get(state)], []
  for batch in batches:
    state, loss = step(state, parallel.global_batch(batch, mesh, ('image', 'label')), hyper)
    states.append(jax.device_get(state))
    losses.append(float(loss['train_loss']))
  return states, losses, state


def step_projections(config, variables, state, batch, num_devices=None):
  """The L2-normalised projections [b, 2, d] (float64) of `batch`'s views at `state`'s
  rng and step, computed outside the step: the views by step_lib.augment_batch (tested in
  test_augment), the model applied by hand to `variables` in train mode, BatchNorm over
  the whole batch (synced over the devices) or, with config.chunk_size, over chunk k of
  every device together (default: all devices)."""
  model = models.create_model(config.model)
  params = augment.AugmentParams.from_config(config.augment)
  images = jnp.asarray(batch['image'])
  # Jitted as wholes, not for the numbers: eagerly, each of their ~200 operations is a
  # program of its own to compile (14 s of a 4-device test's 34 s; 1 s jitted).
  augment_batch = jax.jit(lambda *a: step_lib.augment_batch(*a, params))
  apply = jit_apply(model, train=True, mutable=['batch_stats'])
  views = np.asarray(augment_batch(state.rng, state.step, images, jnp.arange(len(images))))
  local = len(images) // (num_devices or jax.device_count())
  chunk = (np.arange(len(images)) % local) // (config.chunk_size or local)
  z = np.zeros((len(images), 2, config.model.head_out))
  for k in np.unique(chunk):
    rows = views[chunk == k]
    (_, projections), _ = apply(variables, rows.reshape((-1,) + rows.shape[2:]))
    z[chunk == k] = np.asarray(projections, np.float64).reshape(len(rows), 2, -1)
  return z / np.linalg.norm(z, axis=-1, keepdims=True)


def step_loss_reference(config, state, batch, num_devices=None):
  """The loss of a step from `state` (empty queue, key encoder = online: a first step)
  by eq. (3)'s float64 reference (tests/losses/test_kernel.py), H-SCL(β) as the digits config."""
  assert (config.method, config.hardening, config.M) == ('hscl', 'exp', None)
  variables = {'params': state.params, 'batch_stats': state.batch_stats}
  return reference_loss(
    step_projections(config, variables, state, batch, num_devices),
    np.asarray(batch['label']),
    method='label',
    eta=lambda g: np.exp(config.beta * g),
    temperature=config.temperature,
  )


def record_first_step(patch):
  """Wraps step_lib.make_train_step: the first step's input state and batch (on the host)
  and its loss, for a pin of a run that a test compares with another run."""
  seen = {}
  make_train_step = step_lib.make_train_step

  def recording_make_train_step(*args, **kwargs):
    step = make_train_step(*args, **kwargs)

    def recording_step(state, batch, hyper):
      # The test's own reads of the first step: allowed where the run itself is not (a
      # host copy of a typed PRNG key is rebuilt on the device).
      if not seen:
        with jax.transfer_guard('allow'):
          seen['state'], seen['batch'] = jax.device_get((state, batch))  # before donation
      new_state, loss = step(state, batch, hyper)
      seen.setdefault('loss', float(jax.device_get(loss['train_loss'])))
      return new_state, loss

    return recording_step

  patch.setattr(step_lib, 'make_train_step', recording_make_train_step)
  return seen


def assert_first_step_pinned(config, seen):
  np.testing.assert_allclose(
    seen['loss'], step_loss_reference(config, seen['state'], seen['batch']), rtol=2e-5
  )


def _signal_as_the_first_step_is_called(patch, send, *, in_callback):
  make_train_step = step_lib.make_train_step

  def make_train_step_sending_first(*args, **kwargs):
    train_step = make_train_step(*args, **kwargs)

    def send_then_step(state, batch, hyper):
      if in_callback:
        gc.callbacks.append(lambda *_: send())
        try:
          gc.collect()
        finally:
          gc.callbacks.pop()
      else:
        send()
      return train_step(state, batch, hyper)

    return send_then_step

  patch.setattr(step_lib, 'make_train_step', make_train_step_sending_first)


def signal_at(patch, phase, step=None, *, signum=signal.SIGTERM):
  """Sends `signum` once, at the first time this run reaches `phase`:
  'step' (after optimisation step `step`), 'knn' (the kNN's feature extraction),
  'record' (writing an epoch's metrics), 'checkpoint' (while a checkpoint is written),
  'saving' (as the checkpoint of step `step` starts), 'loop-start' (as the first batch is
  put on the devices), 'compile' (as the first step is called: where it compiles),
  'compile-callback' (the same, from a garbage-collection callback, where the interpreter
  only reports an error raised)."""
  fired = []

  def send():
    if not fired:
      fired.append(True)
      os.kill(os.getpid(), signum)
      for _ in range(100):  # the handler runs here, between bytecodes, as in a library
        pass

  def wrap(owner, name, before=True, when=lambda *a: True):
    original = getattr(owner, name)

    def wrapped(*args, **kwargs):
      if before and when(*args):
        send()
      result = original(*args, **kwargs)
      if not before and when(*args, result):
        send()
      return result

    patch.setattr(owner, name, wrapped)

  if phase == 'step':
    make_train_step = step_lib.make_train_step

    def make_train_step_sending(*args, **kwargs):
      train_step = make_train_step(*args, **kwargs)

      def step_then_send(state, batch, hyper):
        new_state, loss = train_step(state, batch, hyper)
        if int(new_state.step) == step:
          send()
        return new_state, loss

      return step_then_send

    patch.setattr(step_lib, 'make_train_step', make_train_step_sending)
  elif phase in ('compile', 'compile-callback'):
    _signal_as_the_first_step_is_called(patch, send, in_callback=phase == 'compile-callback')
  elif phase == 'loop-start':
    wrap(parallel, 'global_batch')
  elif phase == 'knn':
    wrap(eval_features, 'extract_features')
  elif phase == 'record':
    wrap(metrics.MetricWriter, 'write')
  elif phase == 'checkpoint':
    wrap(checkpoints.Checkpointer, 'save', before=False, when=lambda *a: a[-1])  # a real write
  elif phase == 'saving':
    wrap(checkpoints.Checkpointer, 'save', when=lambda checkpointer, at, *a: at == step)
  return fired


def sgd_config(**model):
  """Batch 16, plain SGD with a large step, and a smooth activation (SiLU).

  The tests that use it compare two programs (1 device and 4, chunked and not) that round
  differently. With ReLU the gradient jumps where a pre-activation crosses zero, and of
  the ~200k pre-activations of a step one is often within 1e-6 of it: a rounding
  difference then moves a parameter leaf by up to 5 % (seen on AVX2 CPUs) although both
  programs are right. With SiLU the gradient is continuous in the inputs, so the programs
  agree to rounding, and a real error (a gradient off by the device count, BatchNorm
  statistics of one shard) still shows (docs/testing.md).
  """
  config = tiny_config()
  config.batch_size = 16
  config.optimizer.name, config.optimizer.learning_rate = 'sgd', 0.5
  config.optimizer.momentum = 0.0
  config.model.activation = 'silu'
  config.model.update(model)
  return config


def random_batch(seed=0, size=16):
  rng = np.random.default_rng(seed)
  return {
    'image': rng.integers(0, 256, (size, 2, 8, 8, 3), dtype=np.uint8),
    'label': rng.integers(0, 3, (size,), dtype=np.int32),
  }
