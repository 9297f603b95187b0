"""The declared fields (hscl_jax/config/fields.py) against what configs/default.py gave
before they were declared: the same fields, values, types, placeholders and free fields."""

from __future__ import annotations

import json
import pathlib
import sys

from config_rows import rows
from ml_collections import config_dict
import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # `from configs import default`, as from the repo root

from configs import default  # noqa: E402
from hscl_jax import errors  # noqa: E402
from hscl_jax import models  # noqa: E402
from hscl_jax.config import checks  # noqa: E402
from hscl_jax.config import fields  # noqa: E402
from hscl_jax.config import schema  # noqa: E402
from hscl_jax.data import augment  # noqa: E402

FROZEN = REPO / 'tests' / 'fixtures' / 'default_config.json'


def test_the_defaults_are_those_of_configs_default_before_the_declarations():
  """Field for field: its value, the value's type, the type an override must have (a
  placeholder's for M, train_examples, ...), the types in a tuple, and `free`. A field
  declared later is not in the frozen copy; every field in it is still declared."""
  today = {row[0]: row for row in rows(default.get_config(), fields.FREE_FIELDS)}
  frozen = json.loads(FROZEN.read_text())
  assert [row[0] for row in frozen if row[0] not in today] == []
  assert [today[row[0]] for row in frozen] == frozen


def test_each_field_is_declared_once_and_the_config_holds_exactly_the_declared():
  names = [field.name for field in fields.DECLARED]
  assert len(names) == len(set(names)) == len(fields.FIELDS)
  leaves = [row[0] for row in rows(fields.default_config(), ()) if row[1] != 'section']
  assert sorted(leaves) == sorted(names)
  for name in names:
    assert fields.value_of(fields.default_config(), name) == _default(fields.FIELDS[name])


def _default(field):
  return None if isinstance(field.default, checks.Unset) else field.default


def test_every_unset_field_is_a_fresh_placeholder_of_its_type():
  """Two configs share no placeholder (setting one leaves the other unset), and a value of
  another type is refused, as `config_dict.placeholder(type)` does."""
  unset = [f for f in fields.DECLARED if isinstance(f.default, checks.Unset)]
  assert {f.name: f.default.type for f in unset} == {
    'data_dir': str,
    'folder': str,
    'train_examples': int,
    'M': int,
    'steps_per_epoch_limit': int,
  }
  first, second = fields.default_config(), fields.default_config()
  first.M = 100
  assert (first.M, second.M) == (100, None)
  with pytest.raises(TypeError):
    second.M = 'n - 2'
  reference = config_dict.ConfigDict({'M': config_dict.placeholder(int)})
  assert second.get_type('M') is reference.get_type('M') is int


def test_configs_default_is_the_declared_defaults():
  assert default.get_config() == fields.default_config()
  assert default.NORMALIZATION is fields.NORMALIZATION
  assert tuple(default.get_config().augment.mean) == fields.NORMALIZATION['cifar10'][0]


@pytest.mark.parametrize(
  'build, start',
  [
    (lambda: models.create_model(_model(norm='instance')), "config.model.norm: unknown value 'in"),
    (lambda: models.create_model(_model(head_out=0)), 'config.model.head_out: must be positive'),
    (lambda: augment.AugmentParams(image_size=32, hue=0.6), 'config.augment: hue must be in'),
    (lambda: schema.validate_linear_eval(_linear(protocol='knn')), 'config.linear_eval.protocol: '),
  ],
)
def test_the_builders_checks_are_one_line_config_errors(build, start):
  """The checks of what builds a section (the model, the augmentations) and the linear
  evaluation's are the schema's kind: ConfigError, `config.<field>: <problem>. Fix: <fix>.`"""
  with pytest.raises(errors.ConfigError) as refusal:
    build()
  message = str(refusal.value)
  assert message.startswith(start) and '. Fix: ' in message and message.endswith('.')
  assert '\n' not in message


def _model(**overrides):
  config = fields.default_config().model
  config.update(overrides)
  return config


def _linear(**overrides):
  config = fields.default_config().linear_eval
  config.update(overrides)
  return config


def test_every_field_states_its_meaning_for_config_help():
  """--config_help lists each field with its doc: a field added without one shows no meaning."""
  undocumented = [name for name, field in fields.FIELDS.items() if not field.doc.strip()]
  assert undocumented == []
