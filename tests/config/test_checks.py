"""config/checks: each check of one value accepts its bound and refuses one past it (and a
NaN) in one line, `config.<field>: <problem>. Fix: <fix>.`; `unset_or` lets None through
to nothing else; a field's initial value is its default or, unset, a typed placeholder."""

from __future__ import annotations

import math
import re

from acceptance import accepted
from acceptance import refused
from ml_collections import config_dict
import numpy as np
import pytest

from hscl_jax import errors
from hscl_jax.config import checks

BELOW = lambda x: float(np.nextafter(x, -math.inf))
ABOVE = lambda x: float(np.nextafter(x, math.inf))

# check, accepted values (its bounds), refused values, the refusal's problem for refused[0]
CASES = {
  'at_least': (checks.at_least(2, 'raise it'), [2, 2.0, 1e9], [BELOW(2), -math.inf, math.nan]),
  'positive': (checks.positive('raise it'), [ABOVE(0), 1e-300], [0.0, -1.0, math.nan]),
  'in_unit_interval': (
    checks.in_unit_interval('raise it'),
    [0.0, BELOW(1)],
    [1.0, BELOW(0), math.nan, math.inf],
  ),
  'choice': (checks.choice(('adam', 'sgd')), ['adam', 'sgd'], ['Adam', 'lars', None]),
}
PROBLEMS = {
  'at_least': f'must be >= 2, got {BELOW(2)}',
  'positive': 'must be positive, got 0.0',
  'in_unit_interval': 'must be in [0, 1), got 1.0',
  'choice': "unknown value 'Adam'",
}
FIXES = {'choice': "use one of 'adam', 'sgd'"}


@pytest.mark.parametrize('kind', sorted(CASES))
def test_a_check_accepts_its_bounds_and_refuses_one_past_in_one_line(kind):
  check, good, bad = CASES[kind]
  for value in good:
    with accepted(f'{kind} {value!r}'):
      check('optimizer.lr', value)
  for value in bad:
    with refused(r'^config\.optimizer\.lr: [^\n]+\. Fix: [^\n]+\.$', errors.ConfigError):
      check('optimizer.lr', value)
  fix = FIXES.get(kind, 'raise it')
  line = f'config.optimizer.lr: {PROBLEMS[kind]}. Fix: {fix}.'
  with refused(f'^{re.escape(line)}$', errors.ConfigError):
    check('optimizer.lr', bad[0])


def test_unset_or_passes_none_and_checks_every_other_value():
  check = checks.unset_or(checks.positive('set it above 0'))
  with accepted('None'):
    check('queue_size', None)
  with refused(r'^config\.queue_size: must be positive, got 0\. Fix: set it above 0\.$'):
    check('queue_size', 0)


def test_a_fields_initial_value_is_its_default_or_a_placeholder_of_its_type():
  assert checks.Field('seed', 3).initial() == 3
  holder = config_dict.ConfigDict({'size': checks.Field('size', checks.unset(int)).initial()})
  assert holder.size is None
  holder.size = 5
  with pytest.raises(TypeError):
    holder.size = 'five'
