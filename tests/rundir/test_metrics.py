"""Run outputs: metrics.jsonl is never left torn, and a torn one does not block a resume."""

from __future__ import annotations

import itertools
import json
import logging as std_logging
import os
import types

from absl import logging as absl_logging
from etils import epath
import numpy as np
import pytest
import tensorboard_events  # tests/ is on sys.path (pytest)

from hscl_jax import progress
from hscl_jax.rundir import layout
from hscl_jax.rundir import metrics


def _records(*steps):
  return [{'step': step, 'epoch': i + 1, 'train_loss': 1.0 / step} for i, step in enumerate(steps)]


def _untimed(rows):
  return [{k: v for k, v in row.items() if k != metrics.TIME} for row in rows]


def _write_lines(workdir, lines):
  (workdir / layout.METRICS_FILE).write_text(''.join(line + '\n' for line in lines))


def test_torn_last_line_is_dropped_with_a_warning(tmp_path, caplog):
  good = [json.dumps(r) for r in _records(10, 20)]
  _write_lines(tmp_path, good + ['{"step": 30, "epoch": 3, "train_lo'])
  with caplog.at_level('WARNING'):
    assert metrics.read_metrics(str(tmp_path)) == _records(10, 20)
  assert 'torn last line' in caplog.text
  writer = metrics.MetricWriter(str(tmp_path), keep_through_step=20)  # a resume rewrites the file
  writer.write(30, {'epoch': 3, 'train_loss': 1 / 30})
  writer.close()
  assert _untimed(metrics.read_metrics(str(tmp_path))) == _records(10, 20, 30)


def test_bad_line_in_the_middle_is_named(tmp_path):
  _write_lines(tmp_path, [json.dumps(_records(10)[0]), 'garbage', json.dumps(_records(20)[0])])
  with pytest.raises(ValueError, match='line 2 is not a JSON record.*Fix: repair or delete'):
    metrics.read_metrics(str(tmp_path))


def test_a_write_that_dies_leaves_the_previous_file(tmp_path, monkeypatch):
  writer = metrics.MetricWriter(str(tmp_path))
  writer.write(10, {'epoch': 1, 'train_loss': 0.1})
  before = (tmp_path / layout.METRICS_FILE).read_text()
  local_path = type(epath.Path(tmp_path))  # the class epath gives a local path
  real_open = local_path.open

  class DiesHalfway:  # the disk fills while the new contents are written
    def __init__(self, f):
      self.f = f

    def __enter__(self):
      return self

    def __exit__(self, *exc_info):
      self.f.close()

    def write(self, data):
      self.f.write(data[:-10])
      raise OSError(28, 'No space left on device')

  def open_dying_halfway(path, mode='r', *args, **kwargs):
    f = real_open(path, mode, *args, **kwargs)
    return DiesHalfway(f) if 'w' in mode else f

  monkeypatch.setattr(local_path, 'open', open_dying_halfway)
  with pytest.raises(OSError):
    writer.write(20, {'epoch': 2, 'train_loss': 0.05})
  monkeypatch.undo()
  writer.close()
  assert (tmp_path / layout.METRICS_FILE).read_text() == before
  assert not [p for p in tmp_path.iterdir() if p.name.endswith('.tmp')]
  assert _untimed(metrics.read_metrics(str(tmp_path))) == [
    {'step': 10, 'epoch': 1, 'train_loss': 0.1}
  ]


@pytest.fixture
def one_second(monkeypatch):
  """tensorboardX names an event file by the second it opens: every writer of the test
  opens in the same second (a fast resume), so a file written over would show."""
  from tensorboardX import event_file_writer

  frozen = types.SimpleNamespace(time=lambda: 1_800_000_000.25)  # its only use of `time`
  monkeypatch.setattr(event_file_writer, 'time', frozen)


@pytest.fixture
def stepped_time(monkeypatch):
  """The rows' wall clock: 1000 s at the first row written, one second more at each."""
  seconds = itertools.count(1000)
  monkeypatch.setattr(metrics, 'time', types.SimpleNamespace(time=lambda: float(next(seconds))))


def _scalars(workdir):
  return tensorboard_events.scalars(workdir / layout.EVENTS_DIR).get('train_loss', {})


def test_resumes_keep_rebuild_and_rewrite_rows_like_a_hand_kept_model(
  tmp_path, one_second, stepped_time
):
  """Two resumes, each checked against a model kept by hand (the rows the file must hold,
  with the time each was first written; the train_loss scalars TensorBoard shows): rows
  after the checkpoint's step are dropped, the row at that step is kept, a row of the file
  that differs from the checkpoint's is rebuilt with its own time (file and TensorBoard),
  and the resumed run's new rows follow."""
  times = itertools.count(1000.0)
  row = lambda step, loss: {  # noqa: E731
    'step': step,
    'time': next(times),
    'epoch': step // 10,
    'train_loss': loss,
  }
  writer = metrics.MetricWriter(str(tmp_path))
  for step in (10, 20, 30):
    writer.write(step, {'epoch': step // 10, 'train_loss': step / 100})
  writer.close()
  model = [row(10, 0.1), row(20, 0.2), row(30, 0.3)]
  assert metrics.read_metrics(str(tmp_path)) == model
  # Resume 1: checkpoint at step 20 (its rows 10, 20); the file's row 20 was changed.
  damaged = [model[0], {**model[1], 'train_loss': 9.9}, model[2]]
  _write_lines(tmp_path, [json.dumps(r) for r in damaged])
  checkpoint_rows = model[:2]
  writer = metrics.MetricWriter(str(tmp_path), keep_through_step=20, records=checkpoint_rows)
  model = checkpoint_rows + [row(30, 0.25)]
  writer.write(30, {'epoch': 3, 'train_loss': 0.25})
  writer.close()
  assert metrics.read_metrics(str(tmp_path)) == model
  assert _scalars(tmp_path) == pytest.approx({r['step']: r['train_loss'] for r in model})
  # Resume 2: checkpoint at step 30, file intact: every row kept, two new ones.
  writer = metrics.MetricWriter(str(tmp_path), keep_through_step=30, records=model)
  for step, loss in ((40, 0.125), (50, 0.0625)):
    writer.write(step, {'epoch': step // 10, 'train_loss': loss})
    model.append(row(step, loss))
  writer.close()
  assert metrics.read_metrics(str(tmp_path)) == model
  assert _scalars(tmp_path) == pytest.approx({r['step']: r['train_loss'] for r in model})
  # TensorBoard's events carry each row's time: the rebuilt row 20 its first write's.
  walls = tensorboard_events.scalars(tmp_path / layout.EVENTS_DIR, wall_time=True)['train_loss']
  assert walls == {r['step']: r['time'] for r in model}


def test_step_rows_after_the_checkpoint_are_cut_and_written_again(
  tmp_path, one_second, stepped_time
):
  """StepWriter: rows reach the file at `flush` (and `close`); a resume at step 20 keeps
  the rows through 20 with their times (file and TensorBoard's steps run), drops 30 and
  40, and the rows the resumed run writes follow, timed when written; 'epoch' and 'time'
  are no TensorBoard scalars (the time is the events' own)."""
  steps_run = tmp_path / layout.EVENTS_DIR / layout.STEP_EVENTS_DIR
  writer = metrics.StepWriter(str(tmp_path))
  for step in (10, 20, 30, 40):
    writer.write(step, {'epoch': 1, 'train_loss': step / 100, 'grad_norm': np.float32(2.0)})
  assert metrics.read_steps(str(tmp_path)) == []  # not flushed yet
  writer.flush()
  assert [r['step'] for r in metrics.read_steps(str(tmp_path))] == [10, 20, 30, 40]
  writer.close()
  writer = metrics.StepWriter(str(tmp_path), keep_through_step=20)
  assert [r['step'] for r in metrics.read_steps(str(tmp_path))] == [10, 20]
  writer.write(30, {'epoch': 2, 'train_loss': 0.5, 'grad_norm': 1.0})
  writer.close()
  rows = metrics.read_steps(str(tmp_path))
  assert [(r['step'], r['train_loss']) for r in rows] == [(10, 0.1), (20, 0.2), (30, 0.5)]
  assert [r['time'] for r in rows] == [1000.0, 1001.0, 1004.0]
  assert rows[0]['grad_norm'] == 2.0 and isinstance(rows[0]['grad_norm'], float)
  events = tensorboard_events.scalars(steps_run)
  assert set(events) == {'train_loss', 'grad_norm'}
  assert events['train_loss'] == pytest.approx({10: 0.1, 20: 0.2, 30: 0.5})
  walls = tensorboard_events.scalars(steps_run, wall_time=True)['train_loss']
  assert walls == {10: 1000.0, 20: 1001.0, 30: 1004.0}
  # The epoch records' run is apart: its purge never reaches the steps' events.
  assert tensorboard_events.scalars(tmp_path / layout.EVENTS_DIR) == {}


def test_a_resume_without_a_row_of_the_file_hides_that_rows_events(tmp_path, one_second):
  """The file holds steps 10, 15 and 20; the checkpoint's rows are 10 and 20 (none at 15):
  TensorBoard stops showing the events from step 15 on, the first step where they differ
  (the checkpoint's row 20 logged again), not from 20, which would leave step 15 shown."""
  writer = metrics.MetricWriter(str(tmp_path))
  for step in (10, 15, 20):
    writer.write(step, {'epoch': 1, 'train_loss': step / 100})
  writer.close()
  checkpoint_rows = [{'step': s, 'epoch': 1, 'train_loss': s / 100} for s in (10, 20)]
  writer = metrics.MetricWriter(str(tmp_path), keep_through_step=20, records=checkpoint_rows)
  writer.close()
  assert metrics.read_metrics(str(tmp_path)) == checkpoint_rows
  assert _scalars(tmp_path) == pytest.approx({10: 0.1, 20: 0.2})


@pytest.mark.parametrize(
  'seconds, text',
  [
    (0, '0s'),
    (59.4, '59s'),
    (59.6, '1m00s'),
    (125, '2m05s'),
    (3599, '59m59s'),
    (3600, '1h00m'),
    (7385, '2h03m'),
    (float('inf'), '?'),
    (float('nan'), '?'),
  ],
)
def test_durations_read_in_seconds_minutes_or_hours(seconds, text):
  assert progress.format_duration(seconds) == text


def test_a_periodic_job_is_due_every_nth_time_and_at_the_last():
  due = lambda every: [c for c in range(1, 11) if progress.is_due(c, every, 10)]  # noqa: E731
  assert (due(3), due(4), due(1), due(0)) == ([3, 6, 9, 10], [4, 8, 10], list(range(1, 11)), [])


def test_info_lines_pass_only_from_hscl_jax_and_warnings_but_full_disk_reports_from_all():
  def passes(directory, level, message='m'):
    path = os.path.join(os.sep, 'site', directory, 'module.py')
    return metrics._own_info_or_warning(
      std_logging.LogRecord('x', level, path, 1, message, None, None)
    )

  assert passes('hscl_jax', std_logging.INFO) and not passes('orbax', std_logging.INFO)
  assert passes('orbax', std_logging.WARNING) and passes('orbax', std_logging.ERROR)
  full = 'write failed: [Errno 28] No space left on device'
  assert passes('hscl_jax', std_logging.ERROR, full) and not passes(
    'orbax', std_logging.ERROR, full
  )
  handler = absl_logging.get_absl_handler()
  try:
    metrics.show_only_own_info_logs()
    assert metrics._own_info_or_warning in handler.filters
  finally:
    handler.removeFilter(metrics._own_info_or_warning)
