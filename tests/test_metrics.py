"""Run outputs: metrics.jsonl is never left torn, and a torn one does not block a resume."""

from __future__ import annotations

import json

from etils import epath
import pytest

from hscl_jax import metrics


def _records(*steps):
  return [{'step': step, 'epoch': i + 1, 'train_loss': 1.0 / step} for i, step in enumerate(steps)]


def _write_lines(workdir, lines):
  (workdir / metrics.METRICS_FILE).write_text(''.join(line + '\n' for line in lines))


def test_torn_last_line_is_dropped_with_a_warning(tmp_path, caplog):
  good = [json.dumps(r) for r in _records(10, 20)]
  _write_lines(tmp_path, good + ['{"step": 30, "epoch": 3, "train_lo'])
  with caplog.at_level('WARNING'):
    assert metrics.read_metrics(str(tmp_path)) == _records(10, 20)
  assert 'torn last line' in caplog.text
  writer = metrics.MetricWriter(str(tmp_path), keep_through_step=20)  # a resume rewrites the file
  writer.write(30, {'epoch': 3, 'train_loss': 1 / 30})
  writer.close()
  assert metrics.read_metrics(str(tmp_path)) == _records(10, 20, 30)


def test_bad_line_in_the_middle_is_named(tmp_path):
  _write_lines(tmp_path, [json.dumps(_records(10)[0]), 'garbage', json.dumps(_records(20)[0])])
  with pytest.raises(ValueError, match='line 2 is not a JSON record.*Fix: repair or delete'):
    metrics.read_metrics(str(tmp_path))


def test_a_write_that_dies_leaves_the_previous_file(tmp_path, monkeypatch):
  writer = metrics.MetricWriter(str(tmp_path))
  writer.write(10, {'epoch': 1, 'train_loss': 0.1})
  before = (tmp_path / metrics.METRICS_FILE).read_text()
  real_write_text = epath.Path.write_text

  def dies_halfway(path, text, *args, **kwargs):
    real_write_text(path, text[:-10], *args, **kwargs)
    raise OSError(28, 'No space left on device')

  monkeypatch.setattr(epath.Path, 'write_text', dies_halfway)
  with pytest.raises(OSError):
    writer.write(20, {'epoch': 2, 'train_loss': 0.05})
  monkeypatch.undo()
  writer.close()
  assert (tmp_path / metrics.METRICS_FILE).read_text() == before
  assert metrics.read_metrics(str(tmp_path)) == [{'step': 10, 'epoch': 1, 'train_loss': 0.1}]
