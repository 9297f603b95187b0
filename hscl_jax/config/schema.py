"""The configuration's validation, before anything is compiled.

Every error is one line, `config.<field>: <problem>. Fix: <fix>.`, raised through
`errors.fail` as ConfigError. The fields and the checks of one value are declared in
config/fields; this module runs them, and checks the fields bounded by others (the
batches against the devices, the epoch counts against num_epochs). config.model and
config.augment are checked by what builds them, once per run (`training.plan.validate_run`).
"""

from __future__ import annotations

import math
import numbers

import ml_collections

from hscl_jax import errors
from hscl_jax.config import choices
from hscl_jax.config import fields
from hscl_jax.config import methods

METHODS = methods.NAMES  # the methods table's, read when checked


def _check_known_fields(config: ml_collections.ConfigDict) -> None:
  for section, known in fields.CONFIG_FIELDS.items():
    node = config if not section else config.get(section)
    prefix = f'{section}.' if section else ''
    if not isinstance(node, (ml_collections.ConfigDict, dict)):
      errors.fail(
        section, 'missing section', f'start from configs/default.py, which defines {section}'
      )
    unknown = sorted(set(node.keys()) - set(known))
    if unknown:
      errors.fail(
        prefix + unknown[0], 'unknown field', f'remove it or use one of: {", ".join(sorted(known))}'
      )
  for field in fields.CONFIG_FIELDS['']:
    if field not in config:
      errors.fail(
        field, 'missing field', 'start from configs/default.py, which defines every field'
      )


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
      errors.fail(
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
    errors.fail(
      'chunk_size',
      f'{chunk_size} does not divide the {per_device_batch} samples per device',
      f'use one of {", ".join(map(str, valid))} (samples per device per chunk), or 0 to '
      'turn chunking off',
    )


def _whole(value) -> int:
  """The value of chunk_size or samples_per_class as the batch must meet it: 0
  where the field is off or not a whole number (its own check refuses it then)."""
  return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def classes_per_batch_needed(config) -> int:
  """2 for a supervised method with class-aware batches, whose negatives are the other
  classes' samples; else 1 (an unsupervised method's are the other samples)."""
  supervised = config.method in methods.SUPERVISED_NAMES
  return 2 if supervised and _whole(config.samples_per_class) else 1


def batch_multiple(config, num_devices: int, num_processes: int) -> int:
  """What a batch_size must be a multiple of: the devices (times chunk_size, which must
  divide a device's share) and the processes."""
  return math.lcm(num_devices * max(_whole(config.chunk_size), 1), num_processes)


def _least_batch_size(config) -> tuple[int, str]:
  """The fewest samples a step's loss has negatives in, and why: the views of another sample
  (M = n - 2 of the losses must be positive), or, for a supervised method with class-aware
  batches of m per class, a second class."""
  m = _whole(config.samples_per_class)
  if classes_per_batch_needed(config) == 2:
    return 2 * m, (
      f'with samples_per_class={m} a batch holds batch_size / {m} classes, and '
      f'{config.method} takes its negatives from other classes, so it needs 2 classes'
    )
  return 2, (
    "a contrastive loss needs negatives, another sample's views (M = n - 2 must be positive)"
  )


def _batch_step(config, num_devices: int, num_processes: int) -> int:
  """What a passing batch_size is a multiple of: `batch_multiple` and, with class-aware
  batches, the processes times samples_per_class (m divides a process's share)."""
  m = _whole(config.samples_per_class)
  return math.lcm(batch_multiple(config, num_devices, num_processes), num_processes * max(m, 1))


def passing_batch_size(config, num_devices: int, num_processes: int, at_least: int = 1) -> int:
  """The smallest batch_size >= at_least (and >= the fewest a step has negatives in) that
  is a multiple of `_batch_step`. queue_size is left out: its own refusal names a multiple
  of the rows of the batch chosen."""
  step = _batch_step(config, num_devices, num_processes)
  return _round_up(max(at_least, _least_batch_size(config)[0]), step)


def largest_passing_batch_size(config, num_devices: int, num_processes: int, at_most: int):
  """The largest batch_size <= at_most that passes as `passing_batch_size`'s do, None if
  none does."""
  step = _batch_step(config, num_devices, num_processes)
  largest = at_most - at_most % step
  return largest if largest >= _least_batch_size(config)[0] else None


def _check_batch_size(config, num_devices: int, num_processes: int) -> None:
  value, divisor = config.batch_size, math.lcm(num_devices, num_processes)
  least, why = _least_batch_size(config)
  if value < least:
    smallest = passing_batch_size(config, num_devices, num_processes)
    errors.fail(
      'batch_size',
      f'{value} is too small: {why}',
      f'use --config.batch_size={smallest}, the smallest that passes here '
      f'({_batch_setting(config, num_devices, num_processes)})',
    )
  if value % divisor:
    passing = passing_batch_size(config, num_devices, num_processes, at_least=value)
    _fail_split('batch_size', value, num_devices, num_processes, passing)


def _fail_split(field: str, value: int, num_devices: int, num_processes: int, passing: int):
  errors.fail(
    field,
    f'{value} does not split evenly over the {num_devices} devices ({num_processes} processes)',
    f'use a multiple of {math.lcm(num_devices, num_processes)}, e.g. --config.{field}={passing}',
  )


def _batch_setting(config, num_devices: int, num_processes: int) -> str:
  """What the smallest passing batch_size depends on, as set here."""
  parts = [f'{num_devices} devices, {num_processes} processes']
  for field in ('chunk_size', 'samples_per_class'):
    if _whole(config[field]):
      parts.append(f'{field} {config[field]}')
  if _least_batch_size(config)[0] > 2:
    parts.append(f'method {config.method}')
  return ', '.join(parts)


def _check_batches(config, num_devices: int, num_processes: int) -> None:
  _check_batch_size(config, num_devices, num_processes)
  divisor = math.lcm(num_devices, num_processes)
  value = config.knn.batch_size
  if value < 1 or value % divisor:
    passing = _round_up(max(value, 1), divisor)
    _fail_split('knn.batch_size', value, num_devices, num_processes, passing)
  _check_chunk_size(config.chunk_size, config.batch_size // num_devices)
  choices.check_samples_per_class(config.samples_per_class)
  _check_queue_size(config.queue_size, rows=2 * config.batch_size)


def batch_size_passes(
  config: ml_collections.ConfigDict, batch_size: int, *, num_devices: int, num_processes: int
) -> bool:
  """Whether `batch_size` in place of config.batch_size would pass the checks of the
  batches, the rest of `config` kept: validation's own checks (`_check_batches`) on a copy."""
  candidate = ml_collections.ConfigDict(config.to_dict())
  candidate.batch_size = batch_size
  try:
    _check_batches(candidate, num_devices, num_processes)
  except errors.ConfigError:
    return False
  return True


def _check_queue_size(queue_size, rows: int) -> None:
  """The queue takes a whole step's rows at a time, so it never wraps inside a step."""
  if not isinstance(queue_size, int) or queue_size < 0 or queue_size % rows:
    errors.fail(
      'queue_size',
      f'{queue_size} is not a multiple of the {rows} rows of a step (2 x batch_size)',
      f'use 0 (no queue) or a multiple of {rows}, e.g. --config.queue_size='
      f'{_round_up(max(int(queue_size), rows), rows)}',
    )


def _check_epoch_counts(config) -> None:
  """Fields bounded by num_epochs."""
  if config.beta_anneal_steps < 0 or config.beta_anneal_steps > config.num_epochs:
    errors.fail(
      'beta_anneal_steps',
      f'must be in [0, num_epochs], got {config.beta_anneal_steps}',
      'use 0 (constant beta) or the number of beta decrements',
    )
  if not 0 <= config.optimizer.warmup_epochs <= config.num_epochs:
    errors.fail(
      'optimizer.warmup_epochs',
      f'must be in [0, num_epochs={config.num_epochs}], got {config.optimizer.warmup_epochs}',
      f'use at most {config.num_epochs} (e.g. --config.optimizer.warmup_epochs=0)',
    )


# The softmax losses' options a sigmoid row does not read: (field, its value when off).
SOFTMAX_ONLY = (('queue_size', 0), ('queue_momentum', 0.0), ('tau_plus', 0.0), ('M', None))


def _check_method_row(config) -> None:
  """config.method with config.hardening names a row of the methods table, and a sigmoid
  row is given none of the softmax losses' options (it would silently ignore them)."""
  rows = [r for r in methods.ROWS if r.name == config.method]
  if not any(all(config[f] == v for f, v in r.selects) for r in rows):
    choices = ' or '.join(f'--config.{f}={v}' for r in rows for f, v in r.selects)
    errors.fail(
      'hardening', f'{config.method!r} has no {config.hardening!r} setting', f'use {choices}'
    )
  if methods.of_config(config).family != 'sigmoid':
    return
  for field, off in SOFTMAX_ONLY:
    if config[field] != off:
      errors.fail(
        field,
        f'{config[field]} does not apply to the sigmoid method {config.method!r} (no queue, '
        'no debiasing, no M: its scale and bias are sigmoid_log_t and sigmoid_b)',
        f'drop --config.{field} (it is {off} when off), or use a softmax method',
      )


def validate_config(
  config: ml_collections.ConfigDict, *, num_devices: int, num_processes: int = 1
) -> None:
  """Raises ConfigError naming the field and the fix for an impossible configuration."""
  validate_names(config)
  validate_values(config, num_devices=num_devices, num_processes=num_processes)


def validate_names(config: ml_collections.ConfigDict) -> None:
  """The fields known, and the choices that pick what the others mean."""
  _check_known_fields(config)
  for name in ('dataset', 'method', 'hardening', 'positive_mode', 'diagnostics_positives'):
    fields.FIELDS[name].check(name, config[name])


def validate_values(
  config: ml_collections.ConfigDict, *, num_devices: int, num_processes: int = 1
) -> None:
  """Every value's check, the fields bounded by others, keep_best (after `validate_names`)."""
  if config.dataset == 'image_folder' and not config.folder:
    errors.fail(
      'folder', 'image_folder needs a root directory', 'pass --config.folder=/path/to/root'
    )
  _check_finite(config)
  # num_epochs first: other fields are checked against it.
  fields.FIELDS['num_epochs'].check('num_epochs', config.num_epochs)
  for name, field in fields.FIELDS.items():
    if field.check is not None:
      field.check(name, fields.value_of(config, name))
  _check_method_row(config)
  _check_epoch_counts(config)
  _check_batches(config, num_devices, num_processes)
  choices.keep_best_rule(config.keep_best)  # a bad direction: one line naming the fix


def validate_linear_eval(linear_eval: ml_collections.ConfigDict) -> None:
  """config.linear_eval (checked at training too, so a run's config.json is usable)."""
  for leaf in fields.CONFIG_FIELDS['linear_eval']:
    field = fields.FIELDS[f'linear_eval.{leaf}']
    if field.check is not None:
      if isinstance(linear_eval[leaf], numbers.Number) and not math.isfinite(linear_eval[leaf]):
        errors.fail(
          f'linear_eval.{leaf}', f'must be a finite number, got {linear_eval[leaf]}', fields.KEEP
        )
      field.check(f'linear_eval.{leaf}', linear_eval[leaf])
