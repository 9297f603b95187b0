"""The configuration's schema and its validation, before anything is compiled.

Every error is one line, `config.<field>: <problem>. Fix: <fix>.`, raised as ConfigError.
The choices come from the modules that implement them (datasets, positive modes, models,
optimizers); this module only names the fields and checks the values.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import os
import sys

import ml_collections

from hscl_jax import augment
from hscl_jax import data
from hscl_jax import errors
from hscl_jax import models
from hscl_jax import optim

METHODS = ('ucl', 'hucl', 'scl', 'hscl')
HARDENINGS = ('exp', 'threshold')
DIAGNOSTICS_POSITIVES = ('sample', 'label')

# Every config field the program reads, by section ('' = top level). tests/test_configs.py
# checks that configs/default.py defines exactly these.
CONFIG_FIELDS = {
  '': (
    'dataset',
    'data_dir',
    'folder',
    'split_seed',
    'train_split',
    'test_split',
    'train_examples',
    'decode_cache_gib',
    'positive_mode',
    'method',
    'hardening',
    'beta',
    'beta_anneal_steps',
    'tau_start',
    'tau_end',
    'tau_plus',
    'temperature',
    'M',
    'stop_gradient_weights',
    'diagnostics',
    'diagnostics_positives',
    'model',
    'augment',
    'optimizer',
    'batch_size',
    'num_epochs',
    'seed',
    'steps_per_epoch_limit',
    'knn',
    'linear_eval',
    'checkpoint_every_epochs',
    'keep_checkpoints',
    'log_every_steps',
    'chunk_size',
    'chunk_unroll',
  ),
  'model': ('name', 'stem', 'norm', 'head_hidden', 'head_out', 'dtype', 'bn_momentum'),
  'augment': tuple(f.name for f in dataclasses.fields(augment.AugmentParams)),
  'optimizer': (
    'name',
    'learning_rate',
    'weight_decay',
    'schedule',
    'warmup_epochs',
    'b1',
    'b2',
    'eps',
    'momentum',
    'nesterov',
    'trust_coefficient',
    'exclude_rank1_from_decay',
  ),
  'knn': ('every_epochs', 'k', 'temperature', 'batch_size', 'chunk_size'),
  # Read by hscl_jax.linear_probe (from DIR/config.json), not by training.
  'linear_eval': ('protocol', 'num_epochs', 'learning_rate', 'weight_decay', 'batch_size'),
}


ConfigError = errors.ConfigError
fail = errors.fail


def _check_choice(config, field: str, choices) -> None:
  value = config
  for part in field.split('.'):
    value = value[part]
  if value not in choices:
    fail(field, f'unknown value {value!r}', f'use one of {", ".join(map(repr, choices))}')


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


def validate_config(
  config: ml_collections.ConfigDict, *, num_devices: int, num_processes: int = 1
) -> None:
  """Raises ConfigError naming the field and the fix for an impossible configuration."""
  _check_known_fields(config)
  _check_choice(config, 'dataset', data.DATASETS)
  _check_choice(config, 'method', METHODS)
  _check_choice(config, 'hardening', HARDENINGS)
  _check_choice(config, 'positive_mode', data.POSITIVE_MODES)
  _check_choice(config, 'diagnostics_positives', DIAGNOSTICS_POSITIVES)
  _check_choice(config, 'optimizer.name', optim.OPTIMIZERS)
  _check_choice(config, 'optimizer.schedule', optim.LR_SCHEDULES)
  try:
    models.create_model(config.model)
  except ValueError as e:
    raise ConfigError(f'config.{e}') from None
  if config.dataset == 'image_folder' and not config.folder:
    fail('folder', 'image_folder needs a root directory', 'pass --config.folder=/path/to/root')
  _check_finite(config)

  # Epochs first: other fields are checked against num_epochs.
  if config.num_epochs < 1:
    fail('num_epochs', f'must be >= 1, got {config.num_epochs}', 'use e.g. 200')
  if not config.temperature > 0:
    fail(
      'temperature',
      f'must be positive, got {config.temperature}',
      'use e.g. --config.temperature=0.5 (the paper)',
    )
  if config.beta < 0:
    fail(
      'beta',
      f'must be >= 0 (a non-decreasing hardening), got {config.beta}',
      'use e.g. --config.beta=1.0; beta=0 is SCL/UCL',
    )
  if not 0 <= config.tau_plus < 1:
    fail(
      'tau_plus', f'must be in [0, 1), got {config.tau_plus}', 'use 0 (no debiasing) or e.g. 0.1'
    )
  if config.M is not None and config.M <= 0:
    fail('M', f'must be positive, got {config.M}', 'leave it unset (None = n - 2)')
  if config.beta_anneal_steps < 0 or config.beta_anneal_steps > config.num_epochs:
    fail(
      'beta_anneal_steps',
      f'must be in [0, num_epochs], got {config.beta_anneal_steps}',
      'use 0 (constant beta) or the number of beta decrements',
    )

  if config.train_examples is not None and config.train_examples < 1:
    fail(
      'train_examples',
      f'must be >= 1, got {config.train_examples}',
      'leave it unset for the whole training split',
    )
  if config.decode_cache_gib < 0:
    fail('decode_cache_gib', f'must be >= 0, got {config.decode_cache_gib}', 'use e.g. 2')
  if config.steps_per_epoch_limit is not None and config.steps_per_epoch_limit < 1:
    fail(
      'steps_per_epoch_limit',
      f'must be >= 1, got {config.steps_per_epoch_limit}',
      'leave it unset (a full pass per epoch)',
    )
  divisor = math.lcm(num_devices, num_processes)
  for field in ('batch_size', 'knn.batch_size'):
    value = config.batch_size if field == 'batch_size' else config.knn.batch_size
    if value < 1 or value % divisor:
      fail(
        field,
        f'{value} does not split evenly over the {num_devices} devices ({num_processes} processes)',
        f'use a multiple of {divisor}, e.g. --config.{field}={_round_up(max(value, 1), divisor)}',
      )
  _check_chunk_size(config.chunk_size, config.batch_size // num_devices)

  opt = config.optimizer
  if not opt.learning_rate > 0:
    fail('optimizer.learning_rate', f'must be positive, got {opt.learning_rate}', 'use e.g. 1e-3')
  if opt.weight_decay < 0:
    fail('optimizer.weight_decay', f'must be >= 0, got {opt.weight_decay}', 'use e.g. 1e-6')
  if not 0 <= opt.warmup_epochs <= config.num_epochs:
    fail(
      'optimizer.warmup_epochs',
      f'must be in [0, num_epochs={config.num_epochs}], got {opt.warmup_epochs}',
      f'use at most {config.num_epochs} (e.g. --config.optimizer.warmup_epochs=0)',
    )
  for field in ('b1', 'b2', 'momentum'):
    if not 0 <= opt[field] < 1:
      fail(f'optimizer.{field}', f'must be in [0, 1), got {opt[field]}', 'use e.g. 0.9')
  for field in ('eps', 'trust_coefficient'):
    if not opt[field] > 0:
      fail(
        f'optimizer.{field}',
        f'must be positive, got {opt[field]}',
        "drop the override to keep the config file's value",
      )

  if config.knn.every_epochs < 0:
    fail(
      'knn.every_epochs', f'must be >= 0, got {config.knn.every_epochs}', 'use 1, or 0 to disable'
    )
  if config.knn.k < 1:
    fail('knn.k', f'must be >= 1, got {config.knn.k}', 'use e.g. 200')
  if not config.knn.temperature > 0:
    fail('knn.temperature', f'must be positive, got {config.knn.temperature}', 'use e.g. 0.5')
  if config.knn.chunk_size < 1:
    fail('knn.chunk_size', f'must be >= 1, got {config.knn.chunk_size}', 'use e.g. 256')
  for field in ('checkpoint_every_epochs', 'keep_checkpoints', 'log_every_steps'):
    if config[field] < 1:
      fail(field, f'must be >= 1, got {config[field]}', 'use e.g. 1')
  validate_linear_eval(config.linear_eval)
  try:
    augment.AugmentParams.from_config(config.augment)
  except (TypeError, ValueError) as e:
    fail('augment', str(e), 'see the fields of hscl_jax.augment.AugmentParams')


def validate_linear_eval(linear_eval: ml_collections.ConfigDict) -> None:
  """config.linear_eval (checked at training too, so a run's config.json is usable)."""
  for field in ('num_epochs', 'batch_size'):
    if linear_eval[field] < 1:
      fail(f'linear_eval.{field}', f'must be >= 1, got {linear_eval[field]}', 'use e.g. 100')
  if not (math.isfinite(linear_eval.learning_rate) and linear_eval.learning_rate > 0):
    fail(
      'linear_eval.learning_rate',
      f'must be positive, got {linear_eval.learning_rate}',
      'use e.g. 1e-3',
    )
  if not (math.isfinite(linear_eval.weight_decay) and linear_eval.weight_decay >= 0):
    fail(
      'linear_eval.weight_decay', f'must be >= 0, got {linear_eval.weight_decay}', 'use e.g. 1e-6'
    )


SUPERVISED_METHODS = ('scl', 'hscl')


def validate_dataset(config: ml_collections.ConfigDict, *, num_classes: int) -> None:
  """Checks that need the dataset: supervised methods need negatives of another class."""
  if config.method in SUPERVISED_METHODS and num_classes < 2:
    fail(
      'method',
      f'{config.method!r} takes its negatives from other classes, but the '
      f'{config.dataset} training split has {num_classes} class (every loss would be 0)',
      'add classes (one sub-folder each), or use an unsupervised method, '
      '--config.method=ucl or hucl',
    )


# ----------------------------------------------------------------------------------------
# The config file on the command line.


def config_file_argument(argv: list[str]) -> str | None:
  """The value of --config in `argv` (its path part: config_flags allows PATH:ARG)."""
  for i, arg in enumerate(argv):
    if arg.startswith('--config='):
      value = arg.split('=', 1)[1]
    elif arg == '--config' and i + 1 < len(argv):
      value = argv[i + 1]
    else:
      continue
    return value if os.path.exists(value) else value.split(':', 1)[0]
  return None


def make_config_importable(argv: list[str]) -> None:
  """Lets configs/<name>.py, which imports `configs.default`, load from any directory;
  a missing file is one line naming it, before flags are parsed."""
  path = config_file_argument(argv)
  if path is None:
    return
  if not os.path.isfile(path):
    sys.exit(
      f'config file {path} not found (from directory {os.getcwd()}). Fix: pass the '
      "path of a file in the repository's configs/ folder, e.g. "
      '--config=configs/digits.py from the repository root, or its absolute path.'
    )
  configs_dir = os.path.dirname(os.path.abspath(path))
  if os.path.isfile(os.path.join(configs_dir, '__init__.py')):
    sys.path.insert(0, os.path.dirname(configs_dir))
