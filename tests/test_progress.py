"""The one progress line (hscl_jax/progress.py) on a fake clock: its rate, ETA,
percentage and period, the timer's pauses, and training's line built on it.

The other callers' tests check their lines through `progress_lines` (the one format, logged
by this module's call): tests/evaluation/test_embedding.py, data/test_arrays.py,
evaluation/test_linear_evaluation.py, graphs/test_train.py; training's is below.
"""

from __future__ import annotations

from progress_lines import LINE
from progress_lines import progress_lines
import pytest

from hscl_jax import progress
from hscl_jax.rundir import metrics


class FakeClock:
  """perf_counter() reads `now`, set by the test; `reads` counts the readings."""

  def __init__(self, now: float = 0.0):
    self.now, self.reads = now, 0

  def perf_counter(self) -> float:
    self.reads += 1
    return self.now


@pytest.fixture
def clock(monkeypatch):
  fake = FakeClock()
  monkeypatch.setattr(progress, 'time', fake)
  return fake


def test_rate_eta_and_percentage_come_from_the_clock(clock, caplog):
  """250 of 1000 images in 50 s: 5 images/s, 750 left take 150 s, 25% done."""
  clock.now = 100.0
  line = progress.ProgressLine(1000, unit='image', every=250)
  clock.now = 150.0
  with caplog.at_level('INFO'):
    assert line.update(250, head='decoding', detail='split train')
  assert progress_lines(caplog) == [
    'decoding  image 250/1000 (25%)  split train  5 images/s  ETA 2m30s'
  ]
  match = LINE.fullmatch(caplog.messages[0])
  assert (match['done'], match['total'], match['percent']) == ('250', '1000', '25')
  assert line.seconds_per_unit(250) == 50 / 250
  assert line.eta_seconds(250) == 750 * 50 / 250


def test_the_rate_is_of_the_units_per_unit_counts(clock):
  """Steps of 64 views: 3 steps in 4 s are 48 views/s, the 3 left take 4 s."""
  line = progress.ProgressLine(6, unit='step', rate_unit='views', per_unit=64)
  clock.now = 4.0
  assert line.line(3) == 'step 3/6 (50%)  48 views/s  ETA 4s'


def test_a_count_period_logs_every_nth_the_last_and_the_first_when_asked(clock):
  """Every 3rd of 10 and the last; `first` adds the first; `every=0` never. Between two
  lines the clock is not read."""
  for every, first, due in ((3, False, [3, 6, 9, 10]), (3, True, [1, 3, 6, 9, 10]), (0, False, [])):
    line = progress.ProgressLine(10, unit='epoch', every=every, first=first)
    reads = clock.reads
    logged = [done for done in range(1, 11) if line.update(done)]
    assert logged == due
    assert clock.reads == reads + len(due)


def test_a_time_period_logs_once_the_seconds_passed_with_some_done_and_some_left(clock):
  """Every 10 s: not before 10 s since the last line, not with nothing done, not at the end."""
  line = progress.ProgressLine(100, unit='image', every_seconds=10.0)
  times_and_done = [(5, 10), (12, 0), (12, 20), (15, 30), (21, 40), (22, 50), (40, 100)]
  logged = []
  for now, done in times_and_done:
    clock.now = now
    if line.update(done):
      logged.append((now, done))
  assert logged == [(12, 20), (22, 50)]


def test_a_zero_second_period_logs_every_call_with_some_done(clock):
  line = progress.ProgressLine(3, unit='image', every_seconds=0.0)
  assert [line.update(done) for done in (0, 1, 2, 3)] == [False, True, True, False]


def test_paused_time_is_left_out_and_restart_measures_from_its_step(clock):
  """Timed 10 s, paused 390 s, timed 5 s more: 15 s; a restart forgets what came before."""
  line = progress.ProgressLine(100, unit='step', timing=False)
  assert clock.reads == 0
  clock.now = 100.0
  line.resume()
  clock.now = 110.0
  line.pause()
  clock.now = 500.0
  line.resume()
  clock.now = 505.0
  assert line.elapsed() == 15.0
  assert line.seconds_per_unit(30) == 0.5
  line.restart(30)
  clock.now = 507.0
  assert line.elapsed() == 2.0 and line.seconds_per_unit(34) == 0.5
  assert line.line(34) == 'step 34/100 (34%)  2 steps/s  ETA 33s'


def test_the_overhead_is_added_to_the_eta_and_elapsed_is_shown_when_asked(clock):
  line = progress.ProgressLine(
    10,
    unit='epoch',
    rate_unit='examples',
    per_unit=100,
    show_elapsed=True,
    overhead=lambda done: 7.0 * (10 - done),
  )
  clock.now = 8.0
  # 2 epochs in 8 s: 4 s each, 25 examples/s; 8 left: 32 s, plus 8 x 7 s.
  assert line.line(2) == 'epoch 2/10 (20%)  25 examples/s  8s elapsed, ETA 1m28s'


def test_before_any_unit_is_timed_the_line_says_when_the_rate_and_eta_will_be_known(clock):
  """No NaN rate and no unknown ETA: the unit after which both are known, or with no unit
  left the ETA of the other work alone (here 4 s); with elapsed time, that too. Each line
  is in the one format, which refuses a NaN rate and an ETA of '?'."""
  line = progress.ProgressLine(5, unit='step', start=2)
  clock.now = 3.0
  assert line.line(2) == 'step 2/5 (40%)  steps/s and ETA after step 3'
  last = progress.ProgressLine(5, unit='step', start=5, show_elapsed=True, overhead=lambda d: 4.0)
  clock.now = 5.0
  assert last.line(5) == 'step 5/5 (100%)  2s elapsed, ETA 4s'
  assert LINE.fullmatch(line.line(2)) and LINE.fullmatch(last.line(5))
  assert not LINE.fullmatch('step 2/5 (40%)  nan steps/s  ETA ?')


def test_trainings_first_line_at_its_compiling_step_has_no_nan(clock, caplog):
  """An epoch of one step (240 examples at batch 128): step 1 compiles, the rate restarts
  after it, and the line logged at that step says when the views/s and ETA are known."""
  training = metrics.Progress(
    total_steps=3, start_step=0, steps_per_epoch=1, images_per_step=256, enabled=True
  )
  training.resume_timer()
  clock.now = 10.0
  training.restart(1)
  with caplog.at_level('INFO'):
    training.log(1, 4.5)
  expected = 'epoch 1/3  step 1/3 (33%)  loss 4.5000  views/s and ETA after step 2'
  assert progress_lines(caplog) == [expected]
  clock.now = 12.0
  assert training.line(2, 4.0) == 'epoch 2/3  step 2/3 (67%)  loss 4.0000  128 views/s  ETA 2s'


def test_a_disabled_line_is_due_but_logs_nothing(clock, caplog):
  line = progress.ProgressLine(4, unit='epoch', every=1, enabled=False)
  with caplog.at_level('INFO'):
    assert line.update(1)
  assert caplog.messages == []


def test_trainings_line_leaves_out_compilation_and_the_knn_and_adds_the_knn_to_its_eta(
  clock, caplog
):
  """6 steps of 64 views, 3 an epoch, from step 0. Step 1 compiles (0-10 s) and the rate
  restarts after it; steps 2-3 take 2 s; epoch 1's kNN (12-20 s, 5 s of it per epoch
  recorded) is paused out; step 4 takes 2 s. So 3 steps in 4 s: 48 views/s; 2 steps left
  at 4/3 s, plus one epoch's kNN of 5 s: 7.7 s."""
  training = metrics.Progress(
    total_steps=6, start_step=0, steps_per_epoch=3, images_per_step=64, enabled=True
  )
  training.resume_timer()
  clock.now = 10.0
  training.restart(1)
  clock.now = 12.0
  training.pause_timer()
  training.eval_seconds_per_epoch = 5.0
  clock.now = 20.0
  training.resume_timer()
  clock.now = 22.0
  with caplog.at_level('INFO'):
    training.log(4, 1.23456)
  expected = 'epoch 2/2  step 4/6 (67%)  loss 1.2346  48 views/s  ETA 8s'
  assert progress_lines(caplog) == [expected]
  assert training.line(4, 1.23456) == expected
  training.pause_timer()
  assert training.eta_seconds(4) == pytest.approx(2 * 4 / 3 + 5.0)
  assert training.eta_seconds(6) == 0.0
