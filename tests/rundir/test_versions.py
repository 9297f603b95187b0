"""The workdir's format version (hscl_jax/rundir/versions.py): what is written carries it,
and a workdir of format 0 reads as what it trained with.
tests/end_to_end/test_stored_workdir.py runs every program on a stored workdir of format 0."""

from __future__ import annotations

import json
import pathlib
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from configs import digits  # noqa: E402
from hscl_jax.rundir import metrics  # noqa: E402
from hscl_jax.rundir import run_log as run_log_lib  # noqa: E402
from hscl_jax.rundir import timing  # noqa: E402
from hscl_jax.rundir import trained_run  # noqa: E402
from hscl_jax.rundir import versions  # noqa: E402

FIXTURE = REPO / 'tests' / 'fixtures' / 'digits_workdir'


def test_config_json_and_checkpoint_metadata_carry_the_version(tmp_path):
  metrics.write_config(str(tmp_path), digits.get_config())
  stored = json.loads((tmp_path / 'config.json').read_text())
  assert stored['format_version'] == versions.FORMAT_VERSION == 1
  assert 'format_version' not in trained_run.load_run_config(str(tmp_path))  # not a field
  pending = run_log_lib.EpochPosition(steps_done=True, times=timing.EpochTimes(seconds=2.5))
  metadata = pending.to_metadata([{'step': 1}])
  assert metadata['format_version'] == 1
  position, records = run_log_lib.EpochPosition.from_metadata(json.loads(json.dumps(metadata)))
  assert position == pending and records == [{'step': 1}]


def test_a_format_0_config_reads_as_it_trained():
  """The stored workdir (format 0) and a ResNet of format 0: the fields that shape the
  backbone and that format 0 lacks are what their absence meant (ReLU; 'SAME' strided
  padding for a ResNet, none for small_cnn, whose convolutions pad 'SAME' anyway)."""
  raw = json.loads((FIXTURE / 'config.json').read_text())
  assert 'format_version' not in raw
  migrated = versions.read_config(FIXTURE / 'config.json')
  assert migrated == raw  # small_cnn of format 0 already stored activation
  resnet = {'num_epochs': 3, 'model': {'name': 'resnet18', 'stem': 'cifar'}}
  assert versions.migrate_config(resnet) == {
    'num_epochs': 3,
    'model': {'name': 'resnet18', 'stem': 'cifar', 'activation': 'relu', 'strided_padding': 'same'},
  }
  assert versions.added_by_migration(resnet) == {'model.activation', 'model.strided_padding'}
  small = {'model': {'name': 'small_cnn'}}
  assert versions.migrate_config(small) == {'model': {'name': 'small_cnn', 'activation': 'relu'}}
  current = versions.stamped({'model': {'name': 'resnet18', 'activation': 'silu'}})
  assert versions.migrate_config(current) == {'model': {'name': 'resnet18', 'activation': 'silu'}}
  assert versions.added_by_migration(current) == set()


def test_a_format_0_checkpoint_s_metadata_has_no_records_and_no_timings():
  position, records = run_log_lib.EpochPosition.from_metadata({'epoch_end_pending': True})
  assert position == run_log_lib.EpochPosition(steps_done=True) and records is None


@pytest.mark.parametrize('version', [2, -1, '1'])
def test_a_format_this_version_cannot_read_is_refused_naming_the_fix(tmp_path, version):
  (tmp_path / 'config.json').write_text(json.dumps({'format_version': version, 'seed': 0}))
  with pytest.raises(versions.FormatError, match='written by a newer hscl_jax. Fix: upgrade'):
    trained_run.load_run_config(str(tmp_path))
  with pytest.raises(versions.FormatError, match=f'format_version {version!r}'):
    run_log_lib.EpochPosition.from_metadata({'format_version': version})
