"""rundir/stored_config: every declared config field's resume rule, the newest included:
a resumed run may change exactly the fields that cannot change what it trains."""

from __future__ import annotations

import json

import pytest

from hscl_jax.config import fields
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
