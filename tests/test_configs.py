"""The configs: paper defaults, the field schema, command-line overrides, validation errors."""

from __future__ import annotations

import json
import os
import pathlib
import re
import sys

from absl import flags
import numpy as np
import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # `from configs import default`, as from the repo root

from config.test_command_line import _LOAD_MODULE_WARNING  # noqa: E402
from config.test_command_line import _parse  # noqa: E402

from configs import cifar10  # noqa: E402
from configs import cifar100  # noqa: E402
from configs import default  # noqa: E402
from configs import digits  # noqa: E402
from configs import stl10  # noqa: E402
from hscl_jax import data  # noqa: E402
from hscl_jax import errors  # noqa: E402
from hscl_jax import optimizers  # noqa: E402
from hscl_jax.config import fields  # noqa: E402
from hscl_jax.config import schema  # noqa: E402
from hscl_jax.evaluation import retrieval_metrics  # noqa: E402
from hscl_jax.training import loop  # noqa: E402
from hscl_jax.training import plan as plan_lib  # noqa: E402

ALL_CONFIGS = {'digits': digits, 'cifar10': cifar10, 'cifar100': cifar100, 'stl10': stl10}


def _assert_valid(config, devices=4):
  """validate_config accepts `config`: a refusal fails as an assertion naming the error (a
  valid value refused is a wrong answer, not a crash of the test)."""
  try:
    plan_lib.validate_run(config, num_devices=devices)
  except errors.ConfigError as error:
    raise AssertionError(f'a valid config refused: {error}') from None


@pytest.mark.parametrize('name', sorted(ALL_CONFIGS))
def test_configs_are_valid_on_1_and_4_devices(name):
  config = ALL_CONFIGS[name].get_config()
  assert config.dataset == name
  for devices in (1, 4):
    _assert_valid(config, devices)


@pytest.mark.parametrize('name', sorted(ALL_CONFIGS))
def test_configs_define_exactly_the_fields_the_program_reads(name):
  config = ALL_CONFIGS[name].get_config()
  for section, names in fields.CONFIG_FIELDS.items():
    node = config[section] if section else config
    assert sorted(node.keys()) == sorted(names), section


@pytest.mark.parametrize('name', ['cifar10', 'cifar100', 'stl10'])
def test_paper_protocol_defaults(name):
  config = ALL_CONFIGS[name].get_config()
  assert (config.model.name, config.model.stem) == ('resnet50', 'cifar')
  assert (config.model.head_hidden, config.model.head_out) == (512, 128)
  assert config.optimizer.name == 'adam'
  assert config.optimizer.learning_rate == 1e-3 and config.optimizer.weight_decay == 1e-6
  assert config.optimizer.schedule == 'constant' and config.optimizer.warmup_epochs == 0
  assert (config.batch_size, config.num_epochs, config.temperature) == (512, 200, 0.5)
  assert config.M is None  # n - 2
  assert (config.method, config.hardening, config.beta) == ('hscl', 'exp', 1.0)
  assert (config.knn.k, config.knn.temperature) == (200, 0.5)
  assert config.augment.jitter_prob == 0.8 and config.augment.grayscale_prob == 0.2
  assert (config.augment.brightness, config.augment.hue) == (0.4, 0.1)
  assert config.augment.crop_scale == (0.08, 1.0) and config.augment.flip_prob == 0.5
  size, blur = (96, 0.5) if name == 'stl10' else (32, 0.0)
  assert (config.augment.image_size, config.augment.blur_prob) == (size, blur)


def test_digits_gives_several_per_step_rows_an_epoch():
  """The embedded default's per-step curves: a row at every log_every_steps-th step and at
  each epoch's last (training/loop), so at least 3 in each of digits' 5-step epochs."""
  config = digits.get_config()
  order = data.EpochOrder(1438, global_batch_size=config.batch_size, seed=0)
  plan = plan_lib.make_plan(config, order)
  assert plan.steps_per_epoch == 5
  for epoch in range(1, config.num_epochs + 1):
    steps = range((epoch - 1) * plan.steps_per_epoch + 1, epoch * plan.steps_per_epoch + 1)
    rows = [s for s in steps if s % config.log_every_steps == 0 or s == steps[-1]]
    assert len(rows) >= 3, (epoch, rows)


def test_digits_knn_votes_with_fewer_neighbours_than_a_class_has_in_the_bank():
  """A neighbourhood of one class only is possible: with k above the smallest class, every
  vote counts other classes' images whatever the features (raw pixels read as learned ones)."""
  config = digits.get_config()
  bank, _ = data.run_sources(config)
  smallest = np.bincount(bank.labels()).min()
  assert config.knn.k < smallest, (config.knn.k, smallest)


@pytest.mark.filterwarnings(_LOAD_MODULE_WARNING)
def test_command_line_overrides():
  config = _parse(
    f'--config={REPO}/configs/cifar10.py',
    '--config.method=scl',
    '--config.M=100',
    '--config.num_epochs=50',
    '--config.optimizer.name=lars',
    '--config.model.dtype=bfloat16',
    '--config.augment.crop_scale=(0.2,1.0)',
  )
  assert (config.method, config.M, config.num_epochs) == ('scl', 100, 50)
  assert (config.optimizer.name, config.model.dtype) == ('lars', 'bfloat16')
  assert tuple(config.augment.crop_scale) == (0.2, 1.0)
  _assert_valid(config)


@pytest.mark.filterwarnings(_LOAD_MODULE_WARNING)
def test_unknown_override_is_rejected_by_the_flag_parser():
  with pytest.raises((flags.Error, AttributeError, KeyError), match='lerning_rate'):
    _parse(f'--config={REPO}/configs/cifar10.py', '--config.optimizer.lerning_rate=0.1')


def _invalid(mutate, *, devices=4):
  config = default.get_config()
  mutate(config)
  with pytest.raises(errors.ConfigError) as info:
    plan_lib.validate_run(config, num_devices=devices)
  return str(info.value)


def _setitem(path, value):
  def mutate(config):
    *parents, leaf = path.split('.')
    node = config
    for parent in parents:
      node = node[parent]
    with node.unlocked():
      node[leaf] = value

  return mutate


@pytest.mark.parametrize(
  'path, value, expected',
  [
    ('lerning_rate', 0.1, r'config\.lerning_rate: unknown field'),
    ('optimizer.lerning_rate', 0.1, r'config\.optimizer\.lerning_rate: unknown field'),
    ('augment.colour', 0.1, r'config\.augment\.colour: unknown field'),
    ('method', 'simclr', r"config\.method: unknown value 'simclr'.*'ucl', 'hucl', 'scl', 'hscl'"),
    ('hardening', 'linear', r"config\.hardening: unknown value 'linear'.*'exp', 'threshold'"),
    ('model.name', 'vit', r'config\.model\.name: unknown value'),
    ('optimizer.name', 'rmsprop', r'config\.optimizer\.name: unknown value'),
    ('dataset', 'imagenet', r'config\.dataset: unknown value'),
    ('temperature', -0.5, r'config\.temperature: must be positive.*--config\.temperature=0\.5'),
    ('temperature', 0.0, r'config\.temperature: must be positive'),
    (
      'batch_size',
      510,
      r'config\.batch_size: 510 does not split evenly over the 4 devices'
      r'.*--config\.batch_size=512',
    ),
    ('knn.batch_size', 6, r'config\.knn\.batch_size: 6 does not split evenly.*=8'),
    (
      'chunk_size',
      48,
      r'config\.chunk_size: 48 does not divide the 128 samples per device'
      r'.*use one of 1, 2, 4, 8, 16, 32, 64, 128 .*or 0',
    ),
    ('chunk_size', -4, r'config\.chunk_size: -4 does not divide'),
    ('model.norm', 'instance', r"config\.model\.norm: unknown value 'instance'"),
    ('beta', -1.0, r'config\.beta: must be >= 0'),
    ('M', 0, r'config\.M: must be positive'),
    ('num_epochs', 0, r'config\.num_epochs'),
    ('optimizer.warmup_epochs', 500.0, r'config\.optimizer\.warmup_epochs'),
    ('augment.flip_prob', 2.0, r'config\.augment: flip_prob must be in \[0, 1\]'),
    ('keep_checkpoints', 0, r'config\.keep_checkpoints'),
    # Non-finite values, and the field actually at fault (the cases).
    ('beta', float('nan'), r'config\.beta: must be a finite number, got nan.*drop the'),
    ('tau_start', float('nan'), r'config\.tau_start: must be a finite number'),
    ('tau_end', float('inf'), r'config\.tau_end: must be a finite number'),
    ('optimizer.learning_rate', float('nan'), r'config\.optimizer\.learning_rate: must be a fin'),
    ('augment.crop_scale', (float('nan'), 1.0), r'config\.augment\.crop_scale: must be a finite'),
    ('knn.temperature', float('inf'), r'config\.knn\.temperature: must be a finite'),
    ('num_epochs', -1, r'config\.num_epochs: must be >= 1, got -1'),
    ('optimizer.b2', 1.0, r'config\.optimizer\.b2: must be in \[0, 1\)'),
    ('linear_eval.num_epochs', 0, r'config\.linear_eval\.num_epochs: must be >= 1'),
  ],
)
def test_invalid_configs_name_the_field_and_the_fix(path, value, expected):
  message = _invalid(_setitem(path, value))
  assert 'Fix:' in message
  assert re.search(expected, message), message


def test_a_batch_refusal_names_the_devices_and_the_processes():
  """8 devices over 2 processes: the refusal counts each (not one for the other) and
  suggests the next multiple of lcm(8, 2) = 8."""
  config = default.get_config()
  config.batch_size = 510
  with pytest.raises(errors.ConfigError) as info:
    schema.validate_config(config, num_devices=8, num_processes=2)
  assert 'batch_size: 510 does not split evenly over the 8 devices (2 processes)' in str(info.value)
  assert '--config.batch_size=512' in str(info.value)


def _closure(function) -> dict:
  return dict(zip(function.__code__.co_freevars, (c.cell_contents for c in function.__closure__)))


def _range_checks():
  """(field, kind, bound) of every field config/fields checks against a range: its
  at_least(bound), positive or in_unit_interval check, bare or inside unset_or."""
  for name, field in fields.FIELDS.items():
    check = field.check
    if check is not None and check.__name__ == '<lambda>':  # unset_or(check)
      check = _closure(check)['check']
    kind = check.__qualname__.split('.')[0] if check is not None else None
    if kind in ('at_least', 'positive', 'in_unit_interval'):
      yield name, kind, _closure(check).get('bound')


def _edges(kind, bound, integer):
  """(values the check must accept: the bounds, values it must refuse: one past each)."""
  below = (lambda b: b - 1) if integer else (lambda b: float(np.nextafter(b, -np.inf)))
  if kind == 'at_least':
    return [bound], [below(bound)]
  if kind == 'positive':  # (0, inf): the least positive value, and 0
    return [1 if integer else float(np.nextafter(0.0, 1.0))], [0]
  return [0.0, float(np.nextafter(1.0, 0.0))], [float(np.nextafter(0.0, -1.0)), 1.0]  # [0, 1)


# Every range a field of config/fields must lie in, written here from the fields' meaning
# (not read from the schema, whose bound a bug would change): at_least(bound), positive
# (> 0), unit = [0, 1).
AT_LEAST_0 = ('beta', 'decode_cache_gib', 'knn.every_epochs', 'train_examples', 'profile_steps')
AT_LEAST_0 += ('optimizer.weight_decay', 'linear_eval.weight_decay', 'probe.weight_decay')
AT_LEAST_1 = ('num_epochs', 'steps_per_epoch_limit', 'knn.k', 'knn.chunk_size')
AT_LEAST_1 += ('checkpoint_every_epochs', 'keep_checkpoints', 'log_every_steps')
AT_LEAST_1 += ('linear_eval.num_epochs', 'linear_eval.batch_size')
POSITIVE = (
  'temperature',
  'M',
  'knn.temperature',
  'linear_eval.learning_rate',
  'probe.learning_rate',
)
POSITIVE += ('optimizer.learning_rate', 'optimizer.eps', 'optimizer.trust_coefficient')
UNIT = ('tau_plus', 'queue_momentum', 'optimizer.b1', 'optimizer.b2', 'optimizer.momentum')
RANGES = {
  **{f: ('at_least', 0) for f in AT_LEAST_0},
  **{f: ('at_least', 1) for f in AT_LEAST_1},
  **{f: ('positive', None) for f in POSITIVE},
  **{f: ('in_unit_interval', None) for f in UNIT},
}


def test_every_range_check_of_the_schema_has_its_expected_range():
  assert {name: (kind, bound) for name, kind, bound in _range_checks()} == RANGES


@pytest.mark.parametrize('name', sorted(RANGES))
def test_every_range_check_accepts_its_bounds_and_refuses_one_past(name):
  """Each bound accepted (a check `>` for `>=` refuses it) and the value one past it
  refused, in the field's own type (one integer, or the next float)."""
  kind, bound = RANGES[name]
  value = fields.value_of(default.get_config(), name)
  integer = value is None or isinstance(value, int) and not isinstance(value, bool)
  accepted, refused = _edges(kind, bound, integer)
  for edge in accepted:
    config = default.get_config()
    _setitem(name, edge)(config)
    _assert_valid(config)
  for edge in refused:
    message = _invalid(_setitem(name, edge))
    assert message.startswith(f'config.{name}: '), (edge, message)


@pytest.mark.parametrize(
  'path, accepted, refused',
  [
    # Bounded by another field (num_epochs = 200, 4 devices, batch_size 512: 128 per device).
    ('beta_anneal_steps', (0, 200), (-1, 201)),
    ('optimizer.warmup_epochs', (0.0, 200.0), (-1e-9, 200.000001)),
    ('chunk_size', (0, 1, 128), (-1, 129, 256)),
    ('batch_size', (4, 1024), (0, 2, 1026)),
    ('knn.batch_size', (4,), (0, 6)),
    ('queue_size', (0, 1024, 2048), (-1024, 1023, 1025)),
    # Checked by the module that builds them (models.create_model).
    ('model.bn_momentum', (0.0, float(np.nextafter(1.0, 0.0))), (-1e-300, 1.0)),
    ('model.head_hidden', (1,), (0,)),
    ('model.head_out', (1,), (0,)),
  ],
)
def test_cross_field_checks_accept_their_bounds_and_refuse_one_past(path, accepted, refused):
  for value in accepted:
    config = default.get_config()
    _setitem(path, value)(config)
    _assert_valid(config)
  for value in refused:
    message = _invalid(_setitem(path, value))
    assert message.startswith(f'config.{path}: '), (value, message)


@pytest.mark.parametrize('name', sorted(ALL_CONFIGS))
def test_every_shipped_config_accepts_one_epoch(name):
  """num_epochs=1 keeps each config valid (a warm-up may span the whole run)."""
  config = ALL_CONFIGS[name].get_config()
  config.num_epochs = 1
  _assert_valid(config)
  schedule = optimizers.create_learning_rate_schedule(
    config.optimizer, steps_per_epoch=5, total_steps=5
  )
  rates = [float(schedule(step)) for step in range(5)]
  assert all(0 <= r <= config.optimizer.learning_rate for r in rates) and rates[-1] > 0


def test_config_errors_are_value_errors():
  assert issubclass(errors.ConfigError, ValueError)


def test_invalid_config_stops_before_touching_data_or_workdir(tmp_path):
  config = digits.get_config()
  config.temperature = -1.0
  with pytest.raises(errors.ConfigError, match='temperature'):
    loop.train_and_evaluate(config, str(tmp_path / 'run'))
  assert not os.path.exists(tmp_path / 'run')


def test_batch_larger_than_the_training_split_is_reported(tmp_path):
  config = digits.get_config()
  config.batch_size = 4096
  with pytest.raises(
    errors.ConfigError, match=r'config\.batch_size: 4096 exceeds the \d+ training'
  ):
    loop.train_and_evaluate(config, str(tmp_path / 'run'))


def test_loss_hyperparameters_follow_the_schedules():
  config = default.get_config()
  config.num_epochs, config.tau_start, config.tau_end = 11, -0.5, 0.0
  first, last = (plan_lib.loss_hyperparameters(config, e) for e in (1, 11))
  assert first['tau'] == pytest.approx(2.718281828 ** (-0.5 / 0.5))
  assert last['tau'] == pytest.approx(1.0)
  assert first['beta'] == last['beta'] == 1.0
  config.beta_anneal_steps = 2  # HCL: beta, then beta/2 from epoch 6, then 0 at the end
  betas = [float(plan_lib.loss_hyperparameters(config, e)['beta']) for e in (1, 5, 6, 11)]
  assert betas == [1.0, 1.0, 0.5, 0.0]


def test_learning_rate_schedule_warmup_then_cosine():
  config = default.get_config()
  config.optimizer.schedule, config.optimizer.warmup_epochs = 'cosine', 1.0
  schedule = optimizers.create_learning_rate_schedule(
    config.optimizer, steps_per_epoch=10, total_steps=110
  )
  assert float(schedule(0)) == 0.0
  assert float(schedule(10)) == pytest.approx(1e-3)
  assert float(schedule(60)) == pytest.approx(0.5e-3, rel=1e-3)
  assert float(schedule(110)) == pytest.approx(0.0, abs=1e-9)


def test_config_json_round_trips(tmp_path):
  from hscl_jax.rundir import metrics

  config = stl10.get_config()
  metrics.write_config(str(tmp_path), config)
  saved = json.loads((tmp_path / 'config.json').read_text())
  assert saved['augment']['image_size'] == 96 and saved['M'] is None
  assert saved['model']['name'] == 'resnet50'


def test_an_image_folder_without_its_root_is_refused():
  def mutate(config):
    config.dataset = ''.join(list('image_folder'))  # a fresh string, as parsed from a flag
    config.folder = ''

  message = _invalid(mutate)
  assert message.startswith('config.folder: image_folder needs a root directory. Fix: pass')


def test_the_monitors_retrieval_metrics_are_checked_by_name():
  """config.knn.retrieval: a comma-separated list; an unknown name is refused naming it,
  spaces and repeats are forgiven, '' names none."""
  message = _invalid(_setitem('knn.retrieval', 'precision_at_1,map_at_k'))
  assert message.startswith(
    "config.knn.retrieval: Unknown retrieval metric 'map_at_k': use precision_at_1, "
  ), message
  assert message.endswith("Fix: use e.g. 'precision_at_1,map_at_r', or ''."), message
  for text in ('', 'recall_at_16', ' map_at_r , recall_at_1,map_at_r'):
    config = default.get_config()
    config.knn.retrieval = text
    schema.validate_config(config, num_devices=4)
  assert retrieval_metrics.metric_names(' map_at_r , recall_at_1,map_at_r,') == (
    'map_at_r',
    'recall_at_1',
  )
  assert retrieval_metrics.metric_names('') == ()
