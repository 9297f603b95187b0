"""training/plan: what the config and the dataset size fix before a run (its validation and
the builders it runs once, the start-up warning of epochs that leave out many examples).
"""

from __future__ import annotations

import pathlib
import shutil
import sys

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


REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # `from configs import ...`, as from the repo root

from configs import default  # noqa: E402
from hscl_jax import models  # noqa: E402
from hscl_jax import parallel  # noqa: E402
from hscl_jax.data import augment  # noqa: E402
from hscl_jax.training import loop  # noqa: E402


def test_validate_run_returns_what_the_builders_build():
  config = default.get_config()
  built = plan_lib.validate_run(config, num_devices=4)
  assert built.model == models.create_model(config.model, bn_axis_name=parallel.AXIS)
  assert built.augment_params == augment.AugmentParams.from_config(config.augment)


@pytest.mark.parametrize(
  'section, leaf, value, expected',
  [
    ('model', 'name', 'vit', "config.model.name: unknown value 'vit'"),
    ('model', 'head_out', 0, 'config.model.head_out: must be positive, got 0'),
    ('augment', 'flip_prob', 2.0, 'config.augment: flip_prob must be in [0, 1]'),
  ],
)
def test_the_model_and_augmentation_are_checked_by_their_builders(section, leaf, value, expected):
  """config/schema (which imports no builder) passes them; the run's check refuses them."""
  config = default.get_config()
  config[section][leaf] = value
  schema.validate_config(config, num_devices=4)
  with pytest.raises(schema.ConfigError) as info:
    plan_lib.validate_run(config, num_devices=4)
  assert str(info.value).startswith(expected) and '. Fix: ' in str(info.value)


def test_the_model_is_checked_before_the_values_as_it_always_was():
  """A NaN momentum gets the model's own line, not the finite check's."""
  config = default.get_config()
  config.model.bn_momentum = float('nan')
  with pytest.raises(
    schema.ConfigError, match=r'^config\.model\.bn_momentum: must be in \[0, 1\), got nan'
  ):
    plan_lib.validate_run(config, num_devices=4)


def test_a_run_builds_its_model_and_augmentation_once(digits_run, tmp_path, monkeypatch):
  """The finished digits run, resumed from a copy: validated, built and found complete, with
  one create_model and one AugmentParams.from_config (the check's)."""
  source, config, _ = digits_run
  workdir = tmp_path / 'run'
  shutil.copytree(source, workdir)
  calls = {'model': 0, 'augment': 0}

  def counted(name, build):
    def call(*args, **kwargs):
      calls[name] += 1
      return build(*args, **kwargs)

    return call

  monkeypatch.setattr(models, 'create_model', counted('model', models.create_model))
  monkeypatch.setattr(
    augment.AugmentParams,
    'from_config',
    staticmethod(counted('augment', augment.AugmentParams.from_config)),
  )
  result = loop.train_and_evaluate(config, str(workdir))
  assert result.already_complete
  assert calls == {'model': 1, 'augment': 1}
