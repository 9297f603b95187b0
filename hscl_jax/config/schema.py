"""The configuration's schema and its validation, before anything is compiled.

Every error is one line, `config.<field>: <problem>. Fix: <fix>.`, raised as ConfigError.
The choices come from the modules that implement them (datasets, positive modes, models,
optimizers); this module only names the fields and checks the values.
"""

from __future__ import annotations

from collections.abc import Callable
import dataclasses
import math
import numbers
from typing import Any

import ml_collections

from hscl_jax import data
from hscl_jax import errors
from hscl_jax import models
from hscl_jax.config import methods
from hscl_jax.data import augment
from hscl_jax.models import factory
from hscl_jax.training import optimizers

METHODS = methods.NAMES  # the methods table's, read when checked
HARDENINGS = methods.HARDENINGS
DIAGNOSTICS_POSITIVES = ('sample', 'label')

ConfigError = errors.ConfigError
fail = errors.fail


# ----------------------------------------------------------------------------------------
# Checks of one value, by kind. Each takes (dotted field, value) and raises ConfigError.


def choice(choices) -> Callable[[str, Any], None]:
  def check(field, value):
    if value not in choices:
      fail(field, f'unknown value {value!r}', f'use one of {", ".join(map(repr, choices))}')

  return check


def at_least(bound, fix: str) -> Callable[[str, Any], None]:
  def check(field, value):
    if not value >= bound:
      fail(field, f'must be >= {bound}, got {value}', fix)

  return check


def positive(fix: str) -> Callable[[str, Any], None]:
  def check(field, value):
    if not value > 0:
      fail(field, f'must be positive, got {value}', fix)

  return check


def in_unit_interval(fix: str) -> Callable[[str, Any], None]:
  """[0, 1)."""

  def check(field, value):
    if not 0 <= value < 1:
      fail(field, f'must be in [0, 1), got {value}', fix)

  return check


def unset_or(check: Callable[[str, Any], None]) -> Callable[[str, Any], None]:
  return lambda field, value: None if value is None else check(field, value)


@dataclasses.dataclass(frozen=True)
class Field:
  """One config field: the check of its value alone (None: free-form, or checked with
  other fields below) and whether a resumed run may change it (`free`: it cannot change
  the trained model, e.g. a logging period)."""

  check: Callable[[str, Any], None] | None = None
  free: bool = False


_KEEP = "drop the override to keep the config file's value"
_AT_LEAST_1 = at_least(1, 'use e.g. 1')

# Every config field the programs read, each declared once (its default lives in
# configs/default.py; tests/test_configs.py checks that the two list the same fields).
FIELDS: dict[str, Field] = {
  'dataset': Field(choice(data.DATASETS)),
  'data_dir': Field(free=True),  # a location
  'folder': Field(),
  'split_seed': Field(),
  'train_split': Field(),
  'test_split': Field(),
  'train_examples': Field(
    unset_or(at_least(0, 'use 0 (or leave it unset) for the whole training split'))
  ),
  'decode_cache_gib': Field(at_least(0, 'use e.g. 2'), free=True),
  'positive_mode': Field(choice(data.POSITIVE_MODES)),
  'samples_per_class': Field(),  # a whole number, below; the rest against the data, at training
  'method': Field(choice(METHODS)),
  'hardening': Field(choice(HARDENINGS)),
  'beta': Field(at_least(0, 'use e.g. --config.beta=1.0; beta=0 is SCL/UCL')),
  'beta_anneal_steps': Field(),  # against num_epochs, below
  'tau_start': Field(),
  'tau_end': Field(),
  'tau_plus': Field(in_unit_interval('use 0 (no debiasing) or e.g. 0.1')),
  'temperature': Field(positive('use e.g. --config.temperature=0.5 (the paper)')),
  'M': Field(unset_or(positive('leave it unset (None = n - 2)'))),
  'stop_gradient_weights': Field(),
  'diagnostics': Field(),
  'diagnostics_positives': Field(choice(DIAGNOSTICS_POSITIVES)),
  'queue_size': Field(),  # against the global batch, below
  'queue_momentum': Field(in_unit_interval('use 0 (no key encoder) or e.g. 0.999 (MoCo-v2)')),
  # model.* and augment.* are checked by the modules that build them (below).
  **{f'model.{name}': Field() for name in factory.CONFIG_FIELDS},
  **{f'augment.{f.name}': Field() for f in dataclasses.fields(augment.AugmentParams)},
  'optimizer.name': Field(choice(optimizers.OPTIMIZERS)),
  'optimizer.learning_rate': Field(positive('use e.g. 1e-3')),
  'optimizer.weight_decay': Field(at_least(0, 'use e.g. 1e-6')),
  'optimizer.schedule': Field(choice(optimizers.LR_SCHEDULES)),
  'optimizer.warmup_epochs': Field(),  # against num_epochs, below
  'optimizer.b1': Field(in_unit_interval('use e.g. 0.9')),
  'optimizer.b2': Field(in_unit_interval('use e.g. 0.9')),
  'optimizer.eps': Field(positive(_KEEP)),
  'optimizer.momentum': Field(in_unit_interval('use e.g. 0.9')),
  'optimizer.nesterov': Field(),
  'optimizer.trust_coefficient': Field(positive(_KEEP)),
  'optimizer.exclude_rank1_from_decay': Field(),
  'batch_size': Field(),  # against the devices, below
  'num_epochs': Field(at_least(1, 'use e.g. 200')),
  'seed': Field(),
  'steps_per_epoch_limit': Field(unset_or(at_least(1, 'leave it unset (a full pass per epoch)'))),
  'knn.every_epochs': Field(at_least(0, 'use 1, or 0 to disable')),
  'knn.k': Field(at_least(1, 'use e.g. 200')),
  'knn.temperature': Field(positive('use e.g. 0.5')),
  'knn.batch_size': Field(free=True),  # against the devices, below
  'knn.chunk_size': Field(at_least(1, 'use e.g. 256'), free=True),
  # Read by hscl_jax.evaluation.linear_probe (from DIR/config.json), not by training.
  'linear_eval.protocol': Field(free=True),
  'linear_eval.num_epochs': Field(at_least(1, 'use e.g. 100'), free=True),
  'linear_eval.learning_rate': Field(positive('use e.g. 1e-3'), free=True),
  'linear_eval.weight_decay': Field(at_least(0, 'use e.g. 1e-6'), free=True),
  'linear_eval.batch_size': Field(at_least(1, 'use e.g. 100'), free=True),
  'checkpoint_every_epochs': Field(_AT_LEAST_1, free=True),
  'keep_checkpoints': Field(_AT_LEAST_1, free=True),
  'log_every_steps': Field(_AT_LEAST_1, free=True),
  'chunk_size': Field(),  # against the per-device batch, below
  # How the compiler loops over the same chunks: not the result.
  'chunk_unroll': Field(free=True),
}


def _sections() -> dict[str, tuple[str, ...]]:
  """{section ('' = top level): its field names}, as configs/default.py nests them."""
  sections: dict[str, list[str]] = {'': []}
  for name in FIELDS:
    section, _, leaf = name.rpartition('.')
    if section and section not in sections['']:
      sections[''].append(section)
    sections.setdefault(section, []).append(leaf)
  return {section: tuple(names) for section, names in sections.items()}


CONFIG_FIELDS = _sections()
FREE_FIELDS = tuple(name for name, field in FIELDS.items() if field.free)


def _value(config, field: str):
  for part in field.split('.'):
    config = config[part]
  return config


def _check_known_fields(config: ml_collections.ConfigDict) -> None:
  for section, known in CONFIG_FIELDS.items():
    node = config if not section else config.get(section)
    prefix = f'{section}.' if section else ''
    if not isinstance(node, (ml_collections.ConfigDict, dict)):
      fail(section, 'missing section', f'start from configs/default.py, which defines {section}')
    unknown = sorted(set(node.keys()) - set(known))
    if unknown:
      fail(
        prefix + unknown[0], 'unknown field', f'remove it or use one of: {", ".join(sorted(known))}'
      )
  for field in CONFIG_FIELDS['']:
    if field not in config:
      fail(field, 'missing field', 'start from configs/default.py, which defines every field')


def _numbers(node, prefix: str = ''):
  """(dotted field, number) for every number in the config, also inside tuples/lists."""
  for key, value in node.items():
    field = prefix + key
    if isinstance(value, (ml_collections.ConfigDict, dict)):
      yield from _numbers(value, field + '.')
    elif isinstance(value, (tuple, list)):
      yield from ((field, v) for v in value if isinstance(v, numbers.Number))
    elif isinstance(value, numbers.Number) and not isinstance(value, bool):
      yield field, value


def _check_finite(config: ml_collections.ConfigDict) -> None:
  for field, value in _numbers(config):
    if not math.isfinite(value):
      fail(
        field,
        f'must be a finite number, got {value}',
        f"pass a finite value, or drop the --config.{field} override to keep the config file's",
      )


def _round_up(value: int, multiple: int) -> int:
  return -(-value // multiple) * multiple


def _check_chunk_size(chunk_size: int, per_device_batch: int) -> None:
  if chunk_size == 0:
    return
  if chunk_size < 0 or per_device_batch % chunk_size:
    valid = [c for c in range(1, per_device_batch + 1) if per_device_batch % c == 0]
    fail(
      'chunk_size',
      f'{chunk_size} does not divide the {per_device_batch} samples per device',
      f'use one of {", ".join(map(str, valid))} (samples per device per chunk), or 0 to '
      'turn chunking off',
    )


def _check_batches(config, num_devices: int, num_processes: int) -> None:
  divisor = math.lcm(num_devices, num_processes)
  for field in ('batch_size', 'knn.batch_size'):
    value = _value(config, field)
    if value < 1 or value % divisor:
      fail(
        field,
        f'{value} does not split evenly over the {num_devices} devices ({num_processes} processes)',
        f'use a multiple of {divisor}, e.g. --config.{field}={_round_up(max(value, 1), divisor)}',
      )
  _check_chunk_size(config.chunk_size, config.batch_size // num_devices)
  data.check_samples_per_class(config.samples_per_class)
  _check_queue_size(config.queue_size, rows=2 * config.batch_size)


def _check_queue_size(queue_size, rows: int) -> None:
  """The queue takes a whole step's rows at a time, so it never wraps inside a step."""
  if not isinstance(queue_size, int) or queue_size < 0 or queue_size % rows:
    fail(
      'queue_size',
      f'{queue_size} is not a multiple of the {rows} rows of a step (2 x batch_size)',
      f'use 0 (no queue) or a multiple of {rows}, e.g. --config.queue_size='
      f'{_round_up(max(int(queue_size), rows), rows)}',
    )


def _check_epoch_counts(config) -> None:
  """Fields bounded by num_epochs."""
  if config.beta_anneal_steps < 0 or config.beta_anneal_steps > config.num_epochs:
    fail(
      'beta_anneal_steps',
      f'must be in [0, num_epochs], got {config.beta_anneal_steps}',
      'use 0 (constant beta) or the number of beta decrements',
    )
  if not 0 <= config.optimizer.warmup_epochs <= config.num_epochs:
    fail(
      'optimizer.warmup_epochs',
      f'must be in [0, num_epochs={config.num_epochs}], got {config.optimizer.warmup_epochs}',
      f'use at most {config.num_epochs} (e.g. --config.optimizer.warmup_epochs=0)',
    )


def _check_model(config) -> None:
  """model.*: the module that builds it says what is wrong."""
  try:
    models.create_model(config.model)
  except ValueError as e:
    raise ConfigError(f'config.{e}') from None


def _check_augment(config) -> None:
  try:
    augment.AugmentParams.from_config(config.augment)
  except (TypeError, ValueError) as e:
    fail('augment', str(e), 'see the fields of hscl_jax.data.augment.AugmentParams')


def validate_config(
  config: ml_collections.ConfigDict, *, num_devices: int, num_processes: int = 1
) -> None:
  """Raises ConfigError naming the field and the fix for an impossible configuration."""
  _check_known_fields(config)
  for name in ('dataset', 'method', 'hardening', 'positive_mode', 'diagnostics_positives'):
    FIELDS[name].check(name, config[name])
  _check_model(config)
  if config.dataset == 'image_folder' and not config.folder:
    fail('folder', 'image_folder needs a root directory', 'pass --config.folder=/path/to/root')
  _check_finite(config)
  # num_epochs first: other fields are checked against it.
  FIELDS['num_epochs'].check('num_epochs', config.num_epochs)
  for name, field in FIELDS.items():
    if field.check is not None:
      field.check(name, _value(config, name))
  _check_epoch_counts(config)
  _check_batches(config, num_devices, num_processes)
  _check_augment(config)


def validate_linear_eval(linear_eval: ml_collections.ConfigDict) -> None:
  """config.linear_eval (checked at training too, so a run's config.json is usable)."""
  for leaf in CONFIG_FIELDS['linear_eval']:
    field = FIELDS[f'linear_eval.{leaf}']
    if field.check is not None:
      if isinstance(linear_eval[leaf], numbers.Number) and not math.isfinite(linear_eval[leaf]):
        fail(f'linear_eval.{leaf}', f'must be a finite number, got {linear_eval[leaf]}', _KEEP)
      field.check(f'linear_eval.{leaf}', linear_eval[leaf])


def validate_dataset(config: ml_collections.ConfigDict, *, num_classes: int) -> None:
  """Checks that need the dataset: supervised methods need negatives of another class."""
  if config.method in methods.SUPERVISED_NAMES and num_classes < 2:
    fail(
      'method',
      f'{config.method!r} takes its negatives from other classes, but the '
      f'{config.dataset} training split has {num_classes} class (every loss would be 0)',
      'add classes (one sub-folder each), or use an unsupervised method, '
      f'--config.method={" or ".join(methods.UNSUPERVISED_NAMES)}',
    )
