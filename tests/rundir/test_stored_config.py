"""rundir/stored_config: a resumed run is the run that was started. Every declared config
field's resume rule, the newest included: a resumed run may change exactly the fields that
cannot change what it trains; other changes are refused, listed, with the fix."""

from __future__ import annotations

import dataclasses
import json
import pathlib
import sys

from flax import traverse_util
import pytest

from hscl_jax.config import fields
from hscl_jax.config.checks import AS_GIVEN
from hscl_jax.rundir import layout
from hscl_jax.rundir import metrics
from hscl_jax.rundir import stored_config

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # `from configs import ...`, as from the repo root

from configs import digits  # noqa: E402

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


def refused(workdir, config, allowed=()):
  """check_unchanged's refusal message, or None when the config is accepted."""
  try:
    stored_config.check_unchanged(str(workdir), config, allowed=allowed)
  except stored_config.ConfigChangedError as e:
    return str(e)
  return None


def test_changes_that_alter_the_run_are_refused_with_the_fix(tmp_path):
  metrics.write_config(str(tmp_path), digits.get_config())
  changed = digits.get_config()
  changed.batch_size = 128
  changed.method = 'ucl'
  changed.augment.crop_scale = (0.5, 1.0)
  with pytest.raises(stored_config.ConfigChangedError) as error:
    stored_config.check_unchanged(str(tmp_path), changed)
  message = str(error.value)
  assert (
    'augment.crop_scale: [0.3, 1.0] -> [0.5, 1.0]; batch_size: 256 -> 128; method: "hscl" -> "ucl"'
  ) in message
  assert message.endswith(
    'Fix: use a new --workdir, or, to change it deliberately (e.g. more '
    'epochs), add --allow_config_change=augment.crop_scale,batch_size,method'
  )
  assert refused(tmp_path, changed, allowed=('augment', 'batch_size', 'method')) is None


def test_logging_and_evaluation_fields_may_change(tmp_path):
  metrics.write_config(str(tmp_path), digits.get_config())
  config = digits.get_config()
  config.log_every_steps = 7
  config.checkpoint_every_epochs = 2
  config.keep_checkpoints = 9
  config.linear_eval.num_epochs = 3
  config.knn.batch_size = 64
  assert refused(tmp_path, config) is None
  config.num_epochs = 60
  with pytest.raises(stored_config.ConfigChangedError, match='num_epochs: 30 -> 60'):
    stored_config.check_unchanged(str(tmp_path), config)
  assert refused(tmp_path, config, allowed=('num_epochs',)) is None


def test_no_stored_config_nothing_to_compare(tmp_path):
  assert refused(tmp_path, digits.get_config()) is None


def test_fields_of_another_version_do_not_block_a_resume(tmp_path):
  metrics.write_config(str(tmp_path), digits.get_config())
  stored = json.loads((tmp_path / 'config.json').read_text())
  del stored['batch_size']  # a field this version has and the run's version had not
  stored['removed_field'] = 1  # and one it has dropped
  (tmp_path / 'config.json').write_text(json.dumps(stored))
  assert refused(tmp_path, digits.get_config()) is None


def test_a_free_or_allowed_section_frees_every_field_in_it(tmp_path):
  metrics.write_config(str(tmp_path), digits.get_config())
  config = digits.get_config()
  config.linear_eval.num_epochs, config.linear_eval.learning_rate = 3, 0.5  # free section
  assert refused(tmp_path, config) is None
  config.augment.crop_scale, config.augment.flip_prob = (0.5, 1.0), 0.5
  assert 'augment.crop_scale' in refused(tmp_path, config)
  assert refused(tmp_path, config, allowed=('augment',)) is None
  assert 'augment.flip_prob' in refused(tmp_path, config, allowed=('augment.crop_scale',))


def test_a_resnet_stored_before_strided_padding_resumes_only_as_trained(tmp_path):
  """Its config.json lacks the field: it trained with Flax's 'SAME' (the field's `absent`
  in config/fields), so today's default (symmetric) is a change, named; small_cnn, which the
  field does not shape, resumes."""
  config = digits.get_config()
  metrics.write_config(str(tmp_path), config)
  stored = json.loads((tmp_path / 'config.json').read_text())
  del stored['format_version'], stored['model']['strided_padding']  # a run of format 0
  (tmp_path / 'config.json').write_text(json.dumps(stored))
  assert refused(tmp_path, config) is None  # small_cnn
  stored['model']['name'] = config.model.name = 'resnet18'
  (tmp_path / 'config.json').write_text(json.dumps(stored))
  message = refused(tmp_path, config)
  assert 'model.strided_padding: "same" -> "symmetric"' in message
  assert message.endswith(
    'Fix: resume it as it was trained, add --config.model.strided_padding=same; or use a '
    'new --workdir'
  )
  config.model.strided_padding = 'same'
  assert refused(tmp_path, config) is None


@pytest.mark.parametrize(
  'stored, given, resumed',
  [
    (None, 'auto', ''),  # stored before the field: none kept
    ('', 'auto', ''),  # stored when '' was the default
    ('map_at_r', 'auto', 'map_at_r'),  # started with a figure
    ('auto', 'auto', 'auto'),
    ('', 'knn_top1', 'knn_top1'),  # named on the command line: the change is taken
  ],
)
def test_a_resumed_run_left_at_the_default_keep_best_keeps_what_it_kept(
  tmp_path, stored, given, resumed
):
  written = json.loads(json.dumps(digits.get_config().to_dict()))
  if stored is None:
    del written['keep_best']
  else:
    written['keep_best'] = stored
  (tmp_path / 'config.json').write_text(json.dumps(written))
  config = digits.get_config()
  config.keep_best = given
  assert stored_config.as_resumed(str(tmp_path), config).keep_best == resumed
  assert config.keep_best == given  # the caller's is left as it was
  assert refused(tmp_path, config) is None  # keep_best is free
