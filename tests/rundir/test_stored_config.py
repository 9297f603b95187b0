"""rundir/stored_config: every declared config field's resume rule, the newest included:
a resumed run may change exactly the fields that cannot change what it trains."""

from __future__ import annotations

import dataclasses
import json

from flax import traverse_util
import pytest

from hscl_jax.config import fields
from hscl_jax.config.checks import AS_GIVEN
from hscl_jax.rundir import layout
from hscl_jax.rundir import metrics
from hscl_jax.rundir import stored_config

# Where the data is read from and how fast; how the monitor, the linear evaluation and
# the checkpoints are run; what is logged. Every other field changes the trained run.
FREE = {
  'data_dir',
  'decode_cache_gib',
  'chunk_unroll',
  'knn.batch_size',
  'knn.chunk_size',
  'knn.retrieval',
  'linear_eval.protocol',
  'linear_eval.num_epochs',
  'linear_eval.learning_rate',
  'linear_eval.weight_decay',
  'linear_eval.batch_size',
  'checkpoint_every_epochs',
  'keep_checkpoints',
  'keep_best',
  'log_every_steps',
  'profile_steps',
}


def _stored_with(workdir, field, value):
  """The default config's config.json with `field` (dotted) at `value`."""
  stored = metrics.config_as_json(fields.default_config())
  *sections, name = field.split('.')
  entry = stored
  for section in sections:
    entry = entry[section]
  entry[name] = value
  (workdir / layout.CONFIG_FILE).write_text(json.dumps(stored))


@pytest.mark.parametrize('field', sorted(fields.FIELDS))
def test_a_resumed_run_may_change_a_field_only_if_it_is_free(tmp_path, field):
  _stored_with(tmp_path, field, 'another value')
  if field in FREE:
    stored_config.check_unchanged(str(tmp_path), fields.default_config())
  else:
    with pytest.raises(stored_config.ConfigChangedError, match=f'{field}: "another value"'):
      stored_config.check_unchanged(str(tmp_path), fields.default_config())
    # Unless allowed by name, or by its section's.
    for allowed in {field, field.split('.')[0]}:
      stored_config.check_unchanged(str(tmp_path), fields.default_config(), allowed=(allowed,))


def test_the_free_fields_are_declared_fields():
  assert FREE <= set(fields.FIELDS)
  assert set(fields.FREE_FIELDS) == FREE


# The fields whose declaration states what a stored run without them trained with.
ABSENT = [name for name, field in fields.FIELDS.items() if field.absent is not AS_GIVEN]


def _stored_without(workdir, field) -> dict:
  """The default config's config.json without `field` (dotted), unversioned (format 0)."""
  stored = metrics.config_as_json(fields.default_config())
  *sections, name = field.split('.')
  entry = stored
  for section in sections:
    entry = entry[section]
  del entry[name]
  (workdir / layout.CONFIG_FILE).write_text(json.dumps(stored))
  return stored


def _set(config, field, value):
  *sections, name = field.split('.')
  for section in sections:
    config = config[section]
  config[name] = value


def _another(field: fields.Field, value):
  """A value of `field` other than `value`: its default where that differs."""
  if field.default != value:
    return field.default
  if isinstance(value, bool):
    return not value
  return value + 1.0 if isinstance(value, float) else f'{value}-other'


def _resumed(workdir, field: str, given):
  """The config a run resumes with when given `field` at `given`: as_resumed's, and where
  the stored config reads with the field and refuses another value (a model field, which
  programs build from it), the value its refusal names given instead."""
  config = fields.default_config()
  _set(config, field, given)
  resumed = stored_config.as_resumed(str(workdir), config)
  try:
    stored_config.check_unchanged(str(workdir), resumed)
  except stored_config.ConfigChangedError as error:
    assert field.startswith('model.'), str(error)
    (flag,) = [f for f in str(error).split() if f.startswith(f'--config.{field}=')]
    _set(resumed, field, flag.split('=', 1)[1].rstrip(';'))
    stored_config.check_unchanged(str(workdir), resumed)
  return resumed


def test_the_fields_with_an_absent_value_are_the_ones_added_after_format_0():
  assert ABSENT == [
    'sigmoid_log_t',
    'sigmoid_b',
    'model.activation',
    'model.strided_padding',
    'probe.enabled',
    'keep_best',
  ]


@pytest.mark.parametrize('field', ABSENT)
def test_a_stored_run_without_a_field_resumes_with_what_it_trained_with(tmp_path, field):
  """Given another value (a free field: its default), the run continues with the value its
  declaration states (a model field: refused until given that value)."""
  stored = _stored_without(tmp_path, field)
  declared = fields.FIELDS[field]
  trained = declared.absent_from(traverse_util.flatten_dict(stored, sep='.'))
  assert trained is not AS_GIVEN  # the default config's model is a ResNet
  given = declared.default if declared.free else _another(declared, trained)
  assert given != trained
  assert fields.value_of(_resumed(tmp_path, field, given), field) == trained


def test_a_field_declared_with_absent_later_is_migrated_by_its_declaration_alone(
  tmp_path, monkeypatch
):
  """queue_size and model.norm, as if added after the stored run: a resumed run takes the
  one and is refused another value of the other, which reads as declared."""
  for field, absent in (('queue_size', 0), ('model.norm', 'group')):
    monkeypatch.setitem(
      fields.FIELDS, field, dataclasses.replace(fields.FIELDS[field], absent=absent)
    )
  _stored_without(tmp_path, 'queue_size')
  assert fields.value_of(_resumed(tmp_path, 'queue_size', 512), 'queue_size') == 0
  _stored_without(tmp_path, 'model.norm')
  assert fields.value_of(_resumed(tmp_path, 'model.norm', 'batch'), 'model.norm') == 'group'
