"""training/plan's start-up warning of a run whose uniform batches leave out a large share
of its training examples every epoch, and the batch size it suggests (on the session's 4
fake devices)."""

from __future__ import annotations

import jax
import pytest

from hscl_jax import data
from hscl_jax.config import fields
from hscl_jax.config import schema
from hscl_jax.training import plan as plan_lib


def config_with(batch_size: int, **changes):
  config = fields.default_config()
  config.batch_size = batch_size
  config.update(changes)
  return config


def validates(config, batch_size: int) -> bool:
  """The whole config validation's answer for `batch_size`, the rest of `config` kept."""
  trial = config.copy_and_resolve_references()
  trial.batch_size = batch_size
  try:
    schema.validate_config(trial, num_devices=jax.device_count())
  except schema.ConfigError:
    return False
  return True


def best_by_brute_force(config, num_examples: int) -> int:
  """Every batch size from config.batch_size down to half of it that validates: the one
  leaving out the fewest examples (a tie: the largest)."""
  batch = config.batch_size
  valid = [b for b in range(batch // 2, batch + 1) if validates(config, b)]
  fewest = min(num_examples % b for b in valid)
  return max(b for b in valid if num_examples % b == fewest)


def test_240_images_at_batch_128_are_warned_with_the_batch_that_keeps_them():
  """One step of 128 an epoch: 112 (47 %) left out. On 4 devices 120 passes and leaves
  out none."""
  assert jax.device_count() == 4
  config = config_with(128)
  order = data.EpochOrder(240, global_batch_size=128, seed=0)
  assert best_by_brute_force(config, 240) == 120
  assert plan_lib.dropped_examples_warning(config, order) == (
    'Each epoch trains on 128 of the 240 training examples (1 step of batch 128): the other '
    '112 (47%), drawn afresh each epoch, are left out. Fix: --config.batch_size=120 leaves '
    'out 0 (2 steps an epoch).'
  )


@pytest.mark.parametrize(
  'num_examples, batch_size, changes',
  [
    (240, 128, {'chunk_size': 8}),  # per-device batches of a multiple of 8: 64, 96, 128
    (301, 200, {}),
    (1000, 512, {'queue_size': 1200}),  # 2 x batch divides 1200: 100, 120, 150, 200, 300
    (140, 100, {}),
  ],
)
def test_the_suggested_batch_validates_and_none_in_range_leaves_out_fewer(
  num_examples, batch_size, changes
):
  config = config_with(batch_size, **changes)
  order = data.EpochOrder(num_examples, global_batch_size=batch_size, seed=0)
  suggested = plan_lib.keeping_batch_size(config, num_examples)
  assert suggested == best_by_brute_force(config, num_examples)
  assert validates(config, suggested) and suggested != batch_size
  warning = plan_lib.dropped_examples_warning(config, order)
  assert f'Fix: --config.batch_size={suggested} leaves out {num_examples % suggested} ' in warning


@pytest.mark.parametrize(
  'num_examples, batch_size, warned',
  [(128, 96, True), (124, 96, False), (1438, 256, False), (256, 256, False)],
)
def test_a_quarter_or_more_left_out_is_warned_less_is_not(num_examples, batch_size, warned):
  """128 at 96: 32 (25 %) left out; 124 at 96: 28 (23 %); the digits run: 158 (11 %)."""
  order = data.EpochOrder(num_examples, global_batch_size=batch_size, seed=0)
  warning = plan_lib.dropped_examples_warning(config_with(batch_size), order)
  assert (warning is not None) == warned, warning


def test_class_aware_batches_and_a_step_limit_are_not_warned_here():
  """Class-aware epochs have their own line; a steps_per_epoch_limit is chosen."""
  labels = [c for c in range(40) for _ in range(6)]
  aware = data.EpochOrder(
    240, labels=labels, global_batch_size=128, seed=0, samples_per_class=4, batch_multiple=4
  )
  assert plan_lib.dropped_examples_warning(config_with(128, samples_per_class=4), aware) is None
  uniform = data.EpochOrder(240, global_batch_size=128, seed=0)
  limited = config_with(128, steps_per_epoch_limit=1)
  assert plan_lib.dropped_examples_warning(limited, uniform) is None
