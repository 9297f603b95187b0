"""rundir/timing: a run's clock on a stepped clock (each phase a known number of seconds):
what an epoch's record and the progress line's rate read of it."""

from __future__ import annotations

import math
import time

import pytest

from hscl_jax.rundir import timing


class SteppedClock:
  """The process's clock, moved on only by `advance`."""

  def __init__(self):
    self.now = 1000.0

  def __call__(self) -> float:
    return self.now

  def advance(self, seconds: float) -> None:
    self.now += seconds


@pytest.fixture
def clock(monkeypatch) -> SteppedClock:
  stepped = SteppedClock()
  for name in ('perf_counter', 'monotonic'):
    monkeypatch.setattr(time, name, stepped)
  return stepped


def _train(timer, clock, steps, seconds_per_step, *, start):
  """`steps` training steps of `seconds_per_step` from step `start`, in one span."""
  timer.start(start)
  clock.advance(steps * seconds_per_step)
  timer.stop(start + steps)


def test_the_compiling_step_is_timed_apart_and_the_rate_counts_after_it(clock):
  timer = timing.Timer()
  timer.start(0)
  clock.advance(30.0)  # the first step compiles
  timer.first_step_done(1)
  clock.advance(3 * 2.0)
  timer.stop(4)
  assert timer.compiled
  assert timer.epoch == timing.EpochTimes(
    seconds=36.0, steps_timed=4, compile_seconds=30.0, compile_steps=1
  )
  assert timer.epoch.without_compilation() == (3, 6.0)
  assert timer.seconds_per_step(4) == pytest.approx(2.0)


def test_an_evaluation_between_spans_is_not_training_time(clock):
  timer = timing.Timer()
  _train(timer, clock, 4, 1.5, start=0)
  result, seconds = timer.evaluate(lambda: clock.advance(12.0) or 'figures', every_epochs=3)
  assert (result, seconds) == ('figures', 12.0)
  assert timer.eval_seconds_per_epoch == pytest.approx(4.0)
  _train(timer, clock, 2, 1.5, start=4)
  assert (timer.epoch.seconds, timer.epoch.steps_timed) == (9.0, 6)
  assert timer.seconds_per_step(6) == pytest.approx(1.5)
  # Nothing compiled in this epoch: its throughput is all its steps.
  assert timer.epoch.without_compilation() == (6, 9.0)


def test_a_span_started_without_a_step_adds_time_but_no_steps(clock):
  timer = timing.Timer()
  timer.start(None)
  clock.advance(5.0)
  timer.stop(3)
  timer.stop(4)  # no span runs: nothing changes
  assert (timer.epoch.seconds, timer.epoch.steps_timed) == (5.0, 0)


def test_a_resumed_epoch_adds_to_the_times_its_checkpoint_kept(clock):
  """The epoch's times so far (from a checkpoint's metadata) go on; the new process's
  first step compiles again and is left out of the throughput with the old one's."""
  kept = timing.EpochTimes(seconds=20.0, steps_timed=5, compile_seconds=8.0, compile_steps=1)
  timer = timing.Timer(start_step=5, epoch=kept)
  assert math.isnan(timer.seconds_per_step(5))
  timer.start(5)
  clock.advance(10.0)
  timer.first_step_done(6)
  clock.advance(4 * 3.0)
  timer.stop(10)
  assert timer.epoch == timing.EpochTimes(
    seconds=42.0, steps_timed=10, compile_seconds=18.0, compile_steps=2
  )
  assert timer.epoch.without_compilation() == (8, 24.0)
  assert timer.seconds_per_step(10) == pytest.approx(3.0)
  timer.next_epoch()
  assert timer.epoch == timing.EpochTimes()


def test_an_epoch_of_only_compiling_steps_reports_them():
  times = timing.EpochTimes(seconds=7.0, steps_timed=1, compile_seconds=7.0, compile_steps=1)
  assert times.without_compilation() == (1, 7.0)
