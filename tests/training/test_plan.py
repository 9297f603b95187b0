"""training/plan: a run's check (config/schema's, then the model and augmentation built once
by their builders), its steps, learning-rate schedule and each epoch's loss hyperparameters
against the formulas (docs/method.md's eq. (4), HCL's β annealing), and the start-up warning
of epochs that leave out many examples; no training loop."""

from __future__ import annotations

import math
import pathlib
import re
import shutil
import sys

from acceptance import accepted
from acceptance import refused
import jax
import numpy as np
import pytest

from hscl_jax import data
from hscl_jax import errors
from hscl_jax.config import fields
from hscl_jax.config import schema
from hscl_jax.training import plan as plan_lib

NUM_EXAMPLES = 100  # 6 steps of 16, 4 examples dropped


def _plan(config, num_examples=NUM_EXAMPLES):
  order = data.EpochOrder(num_examples, global_batch_size=config.batch_size, seed=config.seed)
  return plan_lib.make_plan(config, order)


def test_an_epoch_is_the_full_batches_and_steps_count_from_epoch_one(tiny_config):
  plan = _plan(tiny_config())
  assert (plan.steps_per_epoch, plan.num_epochs, plan.total_steps) == (6, 3, 18)
  epochs = [plan.epoch_of_step(step) for step in range(plan.total_steps)]
  assert epochs == [1] * 6 + [2] * 6 + [3] * 6


def test_steps_per_epoch_limit_shortens_every_epoch_and_the_schedule(tiny_config):
  config = tiny_config()
  config.steps_per_epoch_limit = 4
  plan = _plan(config)
  assert (plan.steps_per_epoch, plan.total_steps, plan.epoch_of_step(4)) == (4, 12, 2)
  # The cosine ends at the limited run's last step, not the unlimited one's.
  assert plan.learning_rate_at(12) == pytest.approx(0.0, abs=1e-9)
  config.steps_per_epoch_limit = 10  # above the epoch's steps: no limit
  assert _plan(config).steps_per_epoch == 6


def _warmup_cosine(step, *, peak, warmup, total):
  """Linear from 0 over `warmup` steps, then cosine from `peak` to 0 at `total`."""
  if step < warmup:
    return peak * step / warmup
  return (
    peak * 0.5 * (1 + math.cos(math.pi * min(step - warmup, total - warmup) / (total - warmup)))
  )


def test_the_learning_rate_warms_up_for_an_epoch_then_decays_by_a_cosine(tiny_config):
  plan = _plan(tiny_config())
  peak = tiny_config().optimizer.learning_rate
  got = [plan.learning_rate_at(step) for step in range(plan.total_steps + 1)]
  want = [_warmup_cosine(step, peak=peak, warmup=6, total=18) for step in range(19)]
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-9)
  assert max(got) == pytest.approx(peak) and got.index(max(got)) == 6


def test_a_constant_schedule_without_warmup_is_the_rate_at_every_step(tiny_config):
  config = tiny_config()
  config.optimizer.schedule, config.optimizer.warmup_epochs = 'constant', 0.0
  plan = _plan(config)
  assert {plan.learning_rate_at(step) for step in (0, 7, 17)} == {np.float32(3e-3)}


def test_beta_is_annealed_by_beta_over_l_every_e_over_l_epochs(tiny_config):
  """HCL's annealing (ℓ = 3 changes over E = 6 epochs): β lowered by β/3 at epochs 2, 4, 6."""
  config = tiny_config()
  config.num_epochs, config.beta, config.beta_anneal_steps = 6, 1.5, 3
  betas = [plan_lib.loss_hyperparameters(config, epoch)['beta'] for epoch in range(1, 7)]
  np.testing.assert_allclose(betas, [1.5, 1.0, 1.0, 0.5, 0.5, 0.0], rtol=1e-6)
  config.beta_anneal_steps = 0
  assert {float(plan_lib.loss_hyperparameters(config, e)['beta']) for e in (1, 6)} == {1.5}


def test_tau_follows_eq_4_from_start_to_end(tiny_config):
  """τ = exp(l/γ), l linear from tau_start at epoch 1 to tau_end at the last epoch."""
  config = tiny_config()
  config.num_epochs, config.temperature = 5, 0.25
  config.tau_start, config.tau_end = -0.5, 0.1
  for epoch in range(1, 6):
    level = -0.5 + (epoch - 1) / 4 * 0.6
    hyper = plan_lib.loss_hyperparameters(config, epoch)
    assert hyper['tau'].dtype == np.float32
    assert hyper['tau'] == pytest.approx(math.exp(level / 0.25), rel=1e-6)


@pytest.mark.parametrize(
  'method,hardening,diagnostics,used',
  [
    ('ucl', 'exp', False, ()),
    ('ucl', 'threshold', True, ('tau',)),
    ('scl', 'exp', True, ('beta',)),
    ('hucl', 'exp', False, ('beta',)),
    ('hscl', 'threshold', False, ('tau',)),
    ('hscl', 'exp', True, ('beta',)),
  ],
)
def test_the_hyperparameters_used_are_the_methods_and_the_diagnostics(
  tiny_config, method, hardening, diagnostics, used
):
  config = tiny_config()
  config.method, config.hardening, config.diagnostics = method, hardening, diagnostics
  assert plan_lib.used_hyperparameters(config) == used


def test_a_batch_of_every_training_example_passes_and_one_more_is_refused(tiny_config):
  config = tiny_config()
  with accepted('a batch of all 16 examples'):
    plan_lib.check_batch_fits(config, 16)
  with refused(
    r'^config\.batch_size: 16 exceeds the 15 training examples.*Fix:', errors.ConfigError
  ):
    plan_lib.check_batch_fits(config, 15)


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
  except errors.ConfigError:
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
from configs import digits  # noqa: E402
from hscl_jax import models  # noqa: E402
from hscl_jax import optimizers  # noqa: E402
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
  with pytest.raises(errors.ConfigError) as info:
    plan_lib.validate_run(config, num_devices=4)
  assert str(info.value).startswith(expected) and '. Fix: ' in str(info.value)


def test_the_model_is_checked_before_the_values_as_it_always_was():
  """A NaN momentum gets the model's own line, not the finite check's."""
  config = default.get_config()
  config.model.bn_momentum = float('nan')
  with pytest.raises(
    errors.ConfigError, match=r'^config\.model\.bn_momentum: must be in \[0, 1\), got nan'
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


@pytest.mark.parametrize(
  'devices,processes,method,samples_per_class,chunk_size',
  [(2, 2, 'scl', 2, 0), (8, 2, 'scl', 3, 0), (8, 2, 'ucl', 0, 2), (4, 2, 'hscl', 0, 0)],
)
def test_the_batch_a_refusal_suggests_on_two_processes_passes_the_config_check_there(
  tiny_config, monkeypatch, devices, processes, method, samples_per_class, chunk_size
):
  """A batch that fits 30 examples and passes the check of a run over `processes`
  processes, m dividing each process's share: one for one process could split unevenly."""
  monkeypatch.setattr(jax, 'device_count', lambda: devices)
  monkeypatch.setattr(jax, 'process_count', lambda: processes)
  config = tiny_config()
  config.method, config.samples_per_class, config.chunk_size = method, samples_per_class, chunk_size
  config.batch_size = 64
  try:
    plan_lib.check_batch_fits(config, 30)
  except errors.ConfigError as refusal:
    suggested = int(re.search(r'--config\.batch_size=(\d+) passes here', str(refusal)).group(1))
  else:
    raise AssertionError('a batch of 64 from 30 examples was accepted')
  config.batch_size = suggested
  with accepted(f'the suggested batch_size={suggested}'):
    schema.validate_config(config, num_devices=devices, num_processes=processes)
  assert suggested <= 30 and (suggested // processes) % max(samples_per_class, 1) == 0


def test_wiring_epoch_of_step_is_one_based():
  plan = plan_lib.Plan(
    steps_per_epoch=3, num_epochs=4, learning_rate=optimizers.optax.constant_schedule(1.0)
  )
  assert [plan.epoch_of_step(s) for s in range(7)] == [1, 1, 1, 2, 2, 2, 3]
  assert plan.total_steps == 12


def test_wiring_hyperparameters_use_the_run_temperature():
  """eq. (4) at γ = 0.2: τ = exp((start + (e - 1)/(E - 1)·(end - start)) / γ)."""
  config = digits.get_config()
  config.num_epochs, config.tau_start, config.tau_end, config.temperature = 5, -0.3, 0.1, 0.2
  for epoch in (1, 3, 5):
    level = -0.3 + (epoch - 1) / 4 * 0.4
    tau = plan_lib.loss_hyperparameters(config, epoch)['tau']
    assert float(tau) == pytest.approx(math.exp(level / 0.2), rel=1e-5)


def test_a_batch_fits_up_to_the_training_examples_and_not_one_more():
  """One more is refused naming the largest batch that passes on the 4 devices (a multiple
  of 4, and with chunk_size 4 of 16), or, with fewer examples than any, asking for more."""
  config = digits.get_config()
  config.batch_size = 64
  with accepted('a batch of all 64 training examples'):
    plan_lib.check_batch_fits(config, 64)
  refusal = r'^config\.batch_size: 64 exceeds the 63 training examples\. Fix: use at most 63: '
  with pytest.raises(errors.ConfigError, match=refusal + r'--config\.batch_size=60 passes here\.$'):
    plan_lib.check_batch_fits(config, 63)
  config.chunk_size = 4
  with pytest.raises(errors.ConfigError, match=r'--config\.batch_size=48 passes here\.$'):
    plan_lib.check_batch_fits(config, 63)
  with pytest.raises(errors.ConfigError, match=r'Fix: train on more examples than the .*, 16\.$'):
    plan_lib.check_batch_fits(config, 15)


def test_a_refused_samples_per_class_suggests_a_batch_every_device_divides():
  """The run's loader asks a suggested batch_size to be a multiple of the devices (4
  here) and processes (1): with no m passing at 7, the largest such batch that has one."""
  assert (jax.device_count(), jax.process_count()) == (4, 1)
  labels = np.repeat(np.arange(6), [1, 1, 1, 1, 1, 3]).astype(np.int32)  # 6 classes
  source = data.ArraySource(np.zeros((8, 4, 4, 3), np.uint8), labels, 6)
  config = digits.get_config()
  config.batch_size, config.samples_per_class = 7, 7
  # Batch 6 would take one of each class; 4 is the largest multiple of 4 devices below 7.
  with pytest.raises(errors.ConfigError, match=r'use --config\.batch_size=4 with samples_per'):
    plan_lib.make_train_loader(config, source)


def test_a_refused_samples_per_class_suggests_what_the_config_check_passes():
  """The loader asks what the config check asks (config/schema): a suggested batch_size a
  multiple of the devices times chunk_size, and for a supervised method two classes per
  batch, which an unsupervised one does without."""
  assert (jax.device_count(), jax.process_count()) == (4, 1)
  labels = np.repeat(np.arange(12), [1] * 11 + [20]).astype(np.int32)  # m = 1 only
  singles = data.ArraySource(np.zeros((31, 4, 4, 3), np.uint8), labels, 12)
  config = digits.get_config()
  config.batch_size, config.samples_per_class = 17, 17  # no m passes at 17: 12 classes
  for chunk_size, batch in ((0, 12), (2, 8)):
    config.chunk_size = chunk_size
    with pytest.raises(errors.ConfigError, match=rf'use --config\.batch_size={batch} with '):
      plan_lib.make_train_loader(config, singles)
  pairs = data.ArraySource(np.zeros((16, 4, 4, 3), np.uint8), np.repeat(np.arange(2), 8), 2)
  config.batch_size, config.samples_per_class, config.chunk_size = 8, 8, 0
  assert config.method == 'hscl'
  with pytest.raises(errors.ConfigError, match=r'fewer than the 2 .* use samples_per_class=4 '):
    plan_lib.make_train_loader(config, pairs)
  config.method = 'ucl'
  assert plan_lib.make_train_loader(config, pairs).steps_per_epoch == 2
