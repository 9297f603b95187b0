"""Training with a negative queue and a momentum key encoder (config.queue_size,
config.queue_momentum): the queue's FIFO, the EMA, device-count invariance, gradient
caching, resume after SIGTERM, and the config checks. Small CNN on 8x8 digits."""

from __future__ import annotations

import dataclasses
import functools
import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from training_runs import assert_first_step_pinned
from training_runs import assert_trees_equal  # tests/ is on sys.path (pytest)
from training_runs import leaves
from training_runs import random_batch
from training_runs import record_first_step
from training_runs import run_steps
from training_runs import sgd_config
from training_runs import signal_at
from training_runs import step_loss_reference
from training_runs import step_projections
from training_runs import tiny_config

from hscl_jax import errors
from hscl_jax.config import schema
from hscl_jax.training import loop
from hscl_jax.training import queue as negative_queue

# --------------------------------------------------------------------------------------
# The queue alone.


def test_enqueue_is_first_in_first_out():
  """Three steps of 2 samples x 2 views into 8 slots: slots 0-3, 4-7, then 0-3 again,
  rows sample-major with their samples' labels; against a list kept by hand."""
  queue = negative_queue.empty(8, 3)
  expected_keys, expected_labels = [None] * 8, [-1] * 8
  rng = np.random.default_rng(0)
  for step in range(3):
    keys = rng.standard_normal((2, 2, 3)).astype(np.float32)
    labels = np.array([step, 10 + step], np.int32)
    queue = negative_queue.enqueue(queue, keys, labels, axis_name=None)
    start = (4 * step) % 8
    for row in range(4):
      expected_keys[start + row] = keys[row // 2, row % 2]
      expected_labels[start + row] = labels[row // 2]
    filled = [k is not None for k in expected_keys]
    np.testing.assert_array_equal(queue.filled, filled)
    np.testing.assert_array_equal(queue.labels, expected_labels)
    for slot, key in enumerate(expected_keys):
      if key is not None:
        np.testing.assert_array_equal(queue.keys[slot], key)
    assert int(queue.position) == (start + 4) % 8


def test_enqueue_refuses_a_batch_that_would_wrap():
  with pytest.raises(ValueError, match='not a multiple of the 4 rows'):
    negative_queue.enqueue(negative_queue.empty(6, 3), jnp.zeros((2, 2, 3)), jnp.zeros(2), None)


# --------------------------------------------------------------------------------------
# The training step.


def _queue_config(queue_size=64, momentum=0.7, **model):
  """Batch 16 (32 rows a step): 64 slots fill in 2 steps and wrap at the third."""
  config = sgd_config(**model)
  config.queue_size, config.queue_momentum = queue_size, momentum
  return config


BATCHES = [random_batch(seed) for seed in range(3)]


@functools.cache
def _one_device_run(queue_size=64, momentum=0.7):
  """(host states, losses) of run_steps over BATCHES on one device: five tests read the
  same three runs, each trained once per process (no test writes to the host copies)."""
  states, losses, _ = run_steps(_queue_config(queue_size, momentum), 1, BATCHES)
  return states, losses


def test_key_encoder_follows_the_online_encoder_by_ema():
  """θ_k starts at θ_q and after each step is m·θ_k + (1 − m)·θ_q(new), by hand; its
  BatchNorm statistics are its own (they differ from the online ones after a step)."""
  m = 0.7
  states, _ = _one_device_run(momentum=m)
  assert_trees_equal(states[0].key_encoder['params'], states[0].params)
  expected = states[0].params
  for state in states[1:]:
    expected = jax.tree.map(lambda k, q: m * k + (1 - m) * q, expected, state.params)
    for x, y in zip(leaves(state.key_encoder['params']), leaves(expected), strict=True):
      np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7)
  moved = [np.abs(x - y).max() for x, y in zip(leaves(states[2].params), leaves(states[0].params))]
  assert max(moved) > 1e-3  # the online encoder moved, so the EMA was tested
  key_stats, online_stats = (
    leaves(s) for s in (states[3].key_encoder['batch_stats'], states[3].batch_stats)
  )
  assert any(np.abs(x - y).max() > 1e-6 for x, y in zip(key_stats, online_stats))


def _key_encoder_keys(config, state, batch):
  """The key encoder's projections of `batch` at `state`, computed outside the step, as
  the queue's rows [b * 2, d]."""
  keys = step_projections(config, state.key_encoder, state, batch, num_devices=1)
  return keys.reshape(-1, keys.shape[-1])


def test_queue_holds_the_key_encoders_keys_with_momentum():
  """m = 0.7: after each of 3 steps the queue's newest 32 rows are the key encoder's
  projections of that step's batch (the key encoder before its EMA update), by hand; from
  the second step on they differ from the online encoder's (so the source is tested)."""
  config = _queue_config(momentum=0.7)
  states, _ = _one_device_run(momentum=0.7)
  for step, batch in enumerate(BATCHES):
    before, after = states[step], states[step + 1]
    start = (32 * step) % 64
    expected = _key_encoder_keys(config, before, batch)
    np.testing.assert_allclose(after.queue.keys[start : start + 32], expected, atol=2e-5)
    online = _key_encoder_keys(config, before.replace(key_encoder=_online(before)), batch)
    if step:
      assert np.abs(online - expected).max() > 1e-3


def _online(state):
  return {'params': state.params, 'batch_stats': state.batch_stats}


def test_first_step_with_momentum_equals_without():
  """θ_k = θ_q at the first step: the keys are the online features, so the loss equals
  m = 0's and the run without a queue (empty at the first step); from the second step the
  lagging key encoder and the filled queue change it."""
  _, with_momentum = _one_device_run(momentum=0.7)
  _, without_momentum = _one_device_run(momentum=0.0)
  _, no_queue = _one_device_run(queue_size=0, momentum=0.0)
  np.testing.assert_allclose(with_momentum[0], without_momentum[0], rtol=1e-6)
  np.testing.assert_allclose(with_momentum[0], no_queue[0], rtol=1e-6)
  assert abs(with_momentum[1] - without_momentum[1]) > 1e-4
  assert abs(without_momentum[1] - no_queue[1]) > 1e-4


def test_queue_holds_the_previous_batches_keys_without_momentum():
  """m = 0: after step t the queue's newest rows are the online projections of step t's
  batch (the queue's rows against the step's own loss of a one-step run)."""
  states, _ = _one_device_run(momentum=0.0)
  queue = states[1].queue
  assert int(queue.position) == 32 and queue.filled.sum() == 32
  np.testing.assert_allclose(np.linalg.norm(queue.keys[:32], axis=1), 1.0, rtol=1e-5)
  np.testing.assert_array_equal(queue.labels[:32], np.repeat(BATCHES[0]['label'], 2))
  assert states[3].queue.filled.all() and int(states[3].queue.position) == 32  # wrapped


def _assert_states_close(a, b, rtol=1e-4, atol=1e-5):
  for name in ('params', 'batch_stats', 'opt_state', 'key_encoder', 'metric_sums'):
    for x, y in zip(leaves(getattr(a, name)), leaves(getattr(b, name)), strict=True):
      np.testing.assert_allclose(x, y, rtol=rtol, atol=atol, err_msg=name)
  np.testing.assert_array_equal(a.queue.labels, b.queue.labels)
  np.testing.assert_array_equal(a.queue.filled, b.queue.filled)
  np.testing.assert_allclose(a.queue.keys, b.queue.keys, rtol=rtol, atol=atol)


def test_four_devices_match_one_device_with_a_queue():
  """Global keys enqueued on every device: 4 devices hold the same queue as each other
  and as 1 device after 3 steps (the queue wrapped), with the same parameters."""
  assert jax.device_count() == 4
  config = _queue_config()
  four_states, four_losses, live = run_steps(config, 4, BATCHES)
  one_states, one_losses = _one_device_run()
  np.testing.assert_allclose(four_losses, one_losses, rtol=1e-5)
  # Pinned (both runs share the code): the first loss (empty queue, key encoder = online)
  # against the float64 reference, and the newest queue rows against the key encoder's.
  pinned = step_loss_reference(config, one_states[0], BATCHES[0], num_devices=1)
  np.testing.assert_allclose(one_losses[0], pinned, rtol=2e-5)
  newest = _key_encoder_keys(config, one_states[2], BATCHES[2])
  np.testing.assert_allclose(one_states[3].queue.keys[:32], newest, atol=2e-5)
  _assert_states_close(four_states[-1], one_states[-1])
  for leaf in jax.tree.leaves(dataclasses.asdict(live.queue)):
    shards = [np.asarray(s.data) for s in leaf.addressable_shards]
    assert len(shards) == 4 and all(np.array_equal(s, shards[0]) for s in shards)


def test_chunked_queue_step_equals_unchunked_with_group_norm():
  """chunk_size with a queue and a key encoder (GroupNorm mixes no samples): the key
  encoder runs chunk by chunk too, and nothing changes."""
  config = _queue_config(norm='group')
  plain, plain_losses, _ = run_steps(config, 4, BATCHES)
  config.chunk_size = 2
  chunked, chunked_losses, _ = run_steps(config, 4, BATCHES)
  np.testing.assert_allclose(chunked_losses, plain_losses, rtol=1e-6)
  pinned = step_loss_reference(config, plain[0], BATCHES[0], 4)  # both runs share the code
  np.testing.assert_allclose(plain_losses[0], pinned, rtol=2e-5)
  _assert_states_close(chunked[-1], plain[-1], rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------------------
# The training program: checkpoints and resume.


def _run_config():
  config = tiny_config()  # batch 32: 64 rows a step, 3 steps an epoch, 2 epochs
  config.queue_size, config.queue_momentum = 128, 0.7  # not 0.5: swapped EMA terms show
  return config


def test_sigterm_resume_restores_the_queue_and_key_encoder(tmp_path, monkeypatch, caplog):
  """A run stopped by SIGTERM mid-epoch and resumed ends with the uninterrupted run's
  parameters, queue and key encoder; the start-up log gives the queue's memory."""
  with caplog.at_level(logging.INFO), monkeypatch.context() as patch:
    first_step = record_first_step(patch)
    reference = loop.train_and_evaluate(_run_config(), str(tmp_path / 'reference'))
  assert_first_step_pinned(_run_config(), first_step)  # the reference, pinned
  assert 'Negative queue: 128 slots x 128 features, 0.1 MiB per device.' in caplog.text
  # The key encoder's memory, from its arrays (the queue's: 128 x 128 float32 = 0.0625 MiB).
  encoder_bytes = sum(np.asarray(x).nbytes for x in jax.tree.leaves(reference.state.key_encoder))
  assert encoder_bytes > 2**19  # large enough for its figure to show a wrong unit
  expected = f'Momentum key encoder (m = 0.7): {encoder_bytes / 2**20:.1f} MiB per device.'
  assert expected in caplog.text
  workdir = str(tmp_path / 'run')
  with monkeypatch.context() as patch:
    fired = signal_at(patch, 'step', 4)
    stopped = loop.train_and_evaluate(_run_config(), workdir)
  assert fired and stopped.preempted and int(stopped.state.step) == 4
  resumed = loop.train_and_evaluate(_run_config(), workdir)
  assert not resumed.preempted
  for name in ('params', 'opt_state', 'key_encoder', 'queue'):
    assert_trees_equal(getattr(resumed.state, name), getattr(reference.state, name))
  assert resumed.state.queue.filled.all()


# --------------------------------------------------------------------------------------
# Config checks.


@pytest.mark.parametrize(
  'field, value, message',
  [
    ('queue_size', 100, 'config.queue_size: 100 is not a multiple of the 64 rows'),
    ('queue_size', -64, 'config.queue_size: -64 is not a multiple'),
    ('queue_momentum', 1.0, 'config.queue_momentum: must be in [0, 1), got 1.0'),
    ('queue_momentum', -0.1, 'config.queue_momentum: must be in [0, 1)'),
  ],
)
def test_bad_queue_settings_are_refused(field, value, message):
  config = tiny_config()
  config[field] = value
  with pytest.raises(
    errors.ConfigError, match=message.replace('[', r'\[').replace(')', r'\)')
  ) as info:
    schema.validate_config(config, num_devices=4)
  assert 'Fix:' in str(info.value)


@pytest.mark.parametrize('queue_size, suggested', [(100, 128), (30, 64), (200, 256)])
def test_a_refused_queue_size_suggests_the_next_multiple_of_a_steps_rows(queue_size, suggested):
  """64 rows a step (batch 32): above one step's rows the next multiple up, below it one step."""
  config = tiny_config()
  config.queue_size = queue_size
  with pytest.raises(errors.ConfigError) as info:
    schema.validate_config(config, num_devices=4)
  assert f'--config.queue_size={suggested}' in str(info.value)
