"""A resumed run is the run that was started: config changes are refused, listed, with the fix."""

from __future__ import annotations

import json
import pathlib
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # `from configs import ...`, as from the repo root

from configs import digits  # noqa: E402
from hscl_jax.rundir import metrics  # noqa: E402
from hscl_jax.rundir import stored_config  # noqa: E402


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
