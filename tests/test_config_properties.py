"""Config validation under random bad values: one line naming the field and the fix.

Hypothesis draws a field and an impossible value for it (negative or zero where a
positive number is needed, non-finite numbers, out-of-range probabilities, unknown
choices, batches that do not split over the devices); `schema.validate_config` must
refuse it with a one-line `config.<field>: ... Fix: ...`. One subprocess check covers
the program's side: exit status 1 and no traceback.
"""

from __future__ import annotations

import math
import pathlib
import sys

from hypothesis import HealthCheck
from hypothesis import example
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # `from configs import default`, as from the repo root

from test_main_errors import assert_one_line  # noqa: E402
from test_main_errors import run  # noqa: E402

from configs import default  # noqa: E402
from hscl_jax.config import schema  # noqa: E402

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
  'hardening': unknown.filter(lambda s: s not in schema.HARDENINGS),
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
  with pytest.raises(schema.ConfigError) as info:
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
  with pytest.raises(schema.ConfigError, match=r'^config\.batch_size: '):
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
