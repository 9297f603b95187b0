"""What the config and the dataset size fix before a run starts: its steps and learning-rate
schedule (`Plan`), its training loader, and each epoch's loss hyperparameters (each
derived quantity computed here and nowhere else)."""

from __future__ import annotations

import dataclasses
import functools

import jax
import ml_collections
import numpy as np
import optax

from hscl_jax import data
from hscl_jax import errors
from hscl_jax import losses
from hscl_jax import models
from hscl_jax import objectives
from hscl_jax import optimizers
from hscl_jax import parallel
from hscl_jax.config import methods
from hscl_jax.config import schema
from hscl_jax.data import augment


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


@dataclasses.dataclass(frozen=True)
class Built:
  """What config.model and config.augment build, built once per run: building them is their
  check (a stored run's config.json is checked by the same builders when it is read back)."""

  model: models.ContrastiveModel
  augment_params: augment.AugmentParams


def validate_run(
  config: ml_collections.ConfigDict, *, num_devices: int, num_processes: int = 1
) -> Built:
  """The run's config check before anything is compiled or written, in config/schema's
  `validate_config` order with config.model (after the names) and config.augment (last)
  checked by what builds them. Raises ConfigError naming the field and the fix."""
  schema.validate_names(config)
  model = _built_model(config)  # before the values' checks: a model's own refusal comes first
  schema.validate_values(config, num_devices=num_devices, num_processes=num_processes)
  return Built(model=model, augment_params=_built_augment(config))


def _built_model(config) -> models.ContrastiveModel:
  """model.*: `models.create_model` refuses a bad value; a value of the wrong kind (a Python
  error of its own) is named as config.model's."""
  try:
    return models.create_model(config.model, bn_axis_name=parallel.AXIS)
  except errors.ConfigError:
    raise
  except ValueError as e:
    errors.fail('model', str(e), 'see the model fields in hscl_jax/config/fields.py')


def _built_augment(config) -> augment.AugmentParams:
  """augment.*: `AugmentParams`, which the pipeline is built from, refuses a bad value."""
  try:
    return augment.AugmentParams.from_config(config.augment)
  except errors.ConfigError:
    raise
  except (TypeError, ValueError) as e:
    errors.fail('augment', str(e), 'see the fields of hscl_jax.data.augment.AugmentParams')


def validate_dataset(config: ml_collections.ConfigDict, *, num_classes: int) -> None:
  """Checks that need the dataset: supervised methods need negatives of another class, the
  online probe labelled training data."""
  tfds_spec = data.TFDS_DATASETS.get(config.dataset)
  if config.probe.enabled and tfds_spec and config.train_split in tfds_spec.unlabelled_splits:
    errors.fail(
      'probe.enabled',
      f'the online probe learns from labels, but the {config.dataset} training split '
      f'{config.train_split!r} is unlabelled',
      'add --config.probe.enabled=False, or train on a labelled split',
    )
  if config.method in methods.SUPERVISED_NAMES and num_classes < 2:
    errors.fail(
      'method',
      f'{config.method!r} takes its negatives from other classes, but the '
      f'{config.dataset} training split has {num_classes} class (every loss would be 0)',
      'add classes (one sub-folder each), or use an unsupervised method, '
      f'--config.method={" or ".join(methods.UNSUPERVISED_NAMES)}',
    )


def check_batch_fits(config: ml_collections.ConfigDict, num_train_examples: int) -> None:
  """A batch of at most the training examples; the refusal names the largest that passes
  the config check here, or, if none does, asks for more examples."""
  if config.batch_size <= num_train_examples:
    return
  devices, processes = jax.device_count(), jax.process_count()
  largest = schema.largest_passing_batch_size(config, devices, processes, num_train_examples)
  if largest is None:
    smallest = schema.passing_batch_size(config, devices, processes)
    fix = f'train on more examples than the smallest batch that passes here, {smallest}'
  else:
    fix = f'use at most {num_train_examples}: --config.batch_size={largest} passes here'
  errors.fail(
    'batch_size', f'{config.batch_size} exceeds the {num_train_examples} training examples', fix
  )


# Uniform batches leave out the remainder of each epoch's shuffled examples (a different
# random set each epoch); a run leaving out at least this share of them is warned at start.
LARGE_DROP_SHARE = 0.25


def dropped_examples_warning(
  config: ml_collections.ConfigDict, order: data.EpochOrder
) -> str | None:
  """The start-up warning of a run of uniform batches whose epochs leave out a large share
  of the training examples, with the batch size that keeps the most; None otherwise."""
  n, batch, steps = order.num_examples, config.batch_size, order.steps_per_epoch
  dropped = n - steps * batch
  # Class-aware epochs have their own line (training/log_lines); a steps_per_epoch_limit
  # chooses what an epoch trains on.
  chosen = config.samples_per_class or config.steps_per_epoch_limit is not None
  if chosen or dropped < LARGE_DROP_SHARE * n:
    return None
  keeping = keeping_batch_size(config, n)
  return (
    f'Each epoch trains on {steps * batch} of the {n} training examples ({_steps(steps)} of '
    f'batch {batch}): the other {dropped} ({dropped / n:.0%}), drawn afresh each epoch, are '
    f'left out. Fix: --config.batch_size={keeping} leaves out {n % keeping} '
    f'({_steps(n // keeping)} an epoch).'
  )


def _steps(count: int) -> str:
  return f'{count} step{"s" * (count != 1)}'


def keeping_batch_size(config: ml_collections.ConfigDict, num_examples: int) -> int:
  """The batch size from config.batch_size down to half of it that the config's checks
  accept here and that leaves out the fewest of `num_examples` an epoch (the largest such)."""
  batch = config.batch_size
  devices = {'num_devices': jax.device_count(), 'num_processes': jax.process_count()}
  passing = [
    b for b in range(batch, (batch - 1) // 2, -1) if schema.batch_size_passes(config, b, **devices)
  ]
  return min(passing, key=lambda b: (num_examples % b, -b))


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
    # What the config check asks of a batch: a refused m may suggest one.
    batch_multiple=schema.batch_multiple(config, jax.device_count(), jax.process_count()),
    min_classes_per_batch=schema.classes_per_batch_needed(config),
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
  tau = objectives.tau_at(config, epoch)
  return {'beta': np.float32(beta), 'tau': np.float32(tau)}


def used_hyperparameters(config: ml_collections.ConfigDict) -> tuple[str, ...]:
  """The entries of `loss_hyperparameters` that the loss or the diagnostics read."""
  used = set(methods.of_config(config).reads)
  if config.diagnostics:
    used.add(methods.HARDENING_PARAMETER[config.hardening])
  return tuple(sorted(used))
