"""Config validation under random bad values: one line naming the field and the fix.

Hypothesis draws a field and an impossible value for it (negative or zero where a
positive number is needed, non-finite numbers, out-of-range probabilities, unknown
choices, batches that do not split over the devices); `schema.validate_config` must
refuse it with a one-line `config.<field>: ... Fix: ...`. One subprocess check covers
the program's side: exit status 1 and no traceback.
"""

from __future__ import annotations

import math
import os
import pathlib
import re
import subprocess
import sys

from hypothesis import HealthCheck
from hypothesis import example
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
import numpy as np
import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # `from configs import default`, as from the repo root

from test_main import ENV  # noqa: E402
from test_main import assert_one_line  # noqa: E402
from test_main import error_lines  # noqa: E402
from test_main import run  # noqa: E402
import xla_flags  # noqa: E402

from configs import default  # noqa: E402
from configs import digits  # noqa: E402
from hscl_jax import errors  # noqa: E402
from hscl_jax.config import methods  # noqa: E402
from hscl_jax.config import schema  # noqa: E402
from hscl_jax.data import sampling  # noqa: E402

DEVICES = 4
finite = dict(allow_nan=False, allow_infinity=False)
non_finite = st.sampled_from([math.nan, math.inf, -math.inf])
not_positive = st.one_of(st.just(0.0), st.floats(max_value=0.0, **finite), non_finite)
negative = st.one_of(st.floats(max_value=-1e-12, **finite), non_finite)
outside_unit_interval = st.one_of(
  st.just(1.0), st.floats(min_value=1.0, **finite), st.floats(max_value=-1e-12, **finite)
)
below_one = st.integers(max_value=0)
unknown = st.text(min_size=1, max_size=8)
not_divisible = st.integers(-64, 4096).filter(lambda b: b < 1 or b % DEVICES)

# field -> strategy of values that field must refuse
BAD_VALUES = {
  'temperature': not_positive,
  'beta': negative,
  'tau_plus': outside_unit_interval,
  'M': st.integers(max_value=0),
  'tau_start': non_finite,
  'num_epochs': below_one,
  'batch_size': not_divisible,
  'knn.batch_size': not_divisible,
  'method': unknown.filter(lambda s: s not in schema.METHODS),
  'hardening': unknown.filter(lambda s: s not in methods.HARDENINGS),
  'optimizer.learning_rate': not_positive,
  'optimizer.weight_decay': negative,
  'optimizer.b1': outside_unit_interval,
  'optimizer.momentum': outside_unit_interval,
  'optimizer.eps': not_positive,
  'knn.k': below_one,
  'knn.temperature': not_positive,
  'knn.chunk_size': below_one,
  'keep_checkpoints': below_one,
}


def _set(config, field, value):
  *parents, leaf = field.split('.')
  node = config
  for part in parents:
    node = node[part]
  node[leaf] = value


@settings(
  max_examples=40,
  deadline=None,
  derandomize=True,
  database=None,
  suppress_health_check=[HealthCheck.too_slow],  # a loaded CI machine
)
@given(data=st.data(), field=st.sampled_from(sorted(BAD_VALUES)))
@example(data=None, field='tau_plus')
def test_config_property_bad_value_is_one_line_naming_the_field(data, field):
  value = 1.0 if data is None else data.draw(BAD_VALUES[field], label=field)
  config = default.get_config()
  _set(config, field, value)
  with pytest.raises(errors.ConfigError) as info:
    schema.validate_config(config, num_devices=DEVICES)
  message = str(info.value)
  assert '\n' not in message, message
  assert message.startswith(f'config.{field}: '), (field, value, message)
  assert '. Fix: ' in message, message


@pytest.mark.parametrize('value', [0, 2, 6])
def test_config_batch_size_boundaries(value):
  """0 splits evenly over any device count but is still refused; 2 and 6 do not split."""
  config = default.get_config()
  config.batch_size = value
  with pytest.raises(errors.ConfigError, match=r'^config\.batch_size: '):
    schema.validate_config(config, num_devices=DEVICES)


def test_config_non_finite_override_exits_1_with_one_line(tmp_path):
  """The program's side: exit status 1, one error line naming the field, no traceback."""
  workdir = tmp_path / 'w'
  code, output = run(
    'hscl_jax.main', '--config=configs/digits.py', f'--workdir={workdir}', '--config.beta=nan'
  )
  assert code == 1, output[-3000:]
  assert_one_line(output, 'config.beta: must be a finite number')
  assert not workdir.exists()


# (devices, processes, fields set) -> the smallest batch_size that passes, by hand: two
# samples (M = n - 2 > 0), a multiple of the devices (times chunk_size) and of the
# processes (times samples_per_class), and two classes for a supervised class-aware method.
SMALLEST_BATCH = [
  (1, 1, {}, 2),
  (4, 1, {}, 4),
  (4, 2, {}, 4),
  (3, 2, {}, 6),
  (1, 1, {'M': 5}, 2),  # an explicit M: a single sample still has no negatives
  (4, 1, {'chunk_size': 8}, 32),
  (1, 1, {'samples_per_class': 2}, 4),  # hscl: 2 classes of 2
  (1, 1, {'samples_per_class': 3, 'method': 'ucl'}, 3),  # ucl: negatives of any class
  (2, 2, {'samples_per_class': 2, 'method': 'scl'}, 4),
  (4, 1, {'samples_per_class': 4, 'chunk_size': 2}, 8),
  (1, 1, {'queue_size': 8}, 2),
]


@pytest.mark.parametrize('devices,processes,fields,smallest', SMALLEST_BATCH)
@pytest.mark.parametrize('value', [0, -1, 1])
def test_a_batch_too_small_for_negatives_names_the_smallest_that_passes(
  value, devices, processes, fields, smallest
):
  """The refusal names the smallest batch_size that passes; it does, and every smaller one
  is refused, by the config's check or by the sampler's (samples_per_class must divide a
  process's share: checked with the data, so that its refusal lists what passes), so no
  config reaches the loss kernel's `M = n - 2` error."""
  config = digits.get_config()
  config.update(fields)
  config.batch_size, config.knn.batch_size = value, 1440  # 1440: every device count here
  with pytest.raises(errors.ConfigError) as refused:
    schema.validate_config(config, num_devices=devices, num_processes=processes)
  message = str(refused.value)
  assert message.startswith(f'config.batch_size: {value} is too small: '), message
  assert f'Fix: use --config.batch_size={smallest}, the smallest that passes here (' in message
  assert '\n' not in message
  config.batch_size = smallest
  schema.validate_config(config, num_devices=devices, num_processes=processes)
  ten_classes = np.full(10, 100)  # digits' classes, each larger than any m here
  m = config.samples_per_class
  for below in range(value, smallest):
    config.batch_size = below
    if (
      m and below > 0 and m not in sampling.passing_samples_per_class(ten_classes, below, processes)
    ):
      continue  # the sampler refuses it
    with pytest.raises(errors.ConfigError, match=r'^config\.(batch|chunk)_size: '):
      schema.validate_config(config, num_devices=devices, num_processes=processes)


def test_a_supervised_class_aware_batch_of_one_class_is_refused_and_an_unsupervised_one_not():
  """batch_size = samples_per_class: every sample of a batch shares its class, so SCL's and
  H-SCL's anchors have no negative; UCL's are the other samples, whatever their class."""
  config = digits.get_config()
  config.batch_size, config.samples_per_class = 8, 8
  with pytest.raises(errors.ConfigError, match=r'Fix: use --config\.batch_size=16, '):
    schema.validate_config(config, num_devices=4)
  config.method = 'ucl'
  schema.validate_config(config, num_devices=4)


def test_the_program_refuses_a_batch_of_one_and_trains_a_step_at_the_size_it_names(tmp_path):
  """On one device, as a user meets it: batch_size=1 was accepted and ended in the loss
  kernel's traceback; now it is one line, and the batch_size it names trains a step."""
  env = {**ENV, 'XLA_FLAGS': xla_flags.with_devices(1)}
  workdir = tmp_path / 'w'
  command = [
    sys.executable, '-m', 'hscl_jax.main', '--config=configs/digits.py', f'--workdir={workdir}',
    '--config.num_epochs=1', '--config.steps_per_epoch_limit=1', '--config.knn.every_epochs=0',
  ]  # fmt: skip
  refused = subprocess.run(
    [*command, '--config.batch_size=1'], cwd=REPO, env=env, capture_output=True, text=True
  )
  assert refused.returncode == 1 and not workdir.exists()
  (line,) = error_lines(refused.stdout + refused.stderr)
  fix = re.search(r'Fix: use (--config\.batch_size=\d+),', line)
  assert fix and fix.group(1) == '--config.batch_size=2', line
  trained = subprocess.run(
    [*command, fix.group(1)], cwd=REPO, env=env, capture_output=True, text=True
  )
  assert trained.returncode == 0, (trained.stdout + trained.stderr)[-3000:]
  assert os.listdir(workdir / 'checkpoints')
