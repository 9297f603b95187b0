"""rundir/timing: a run's clock on a stepped clock (each phase a known number of seconds):
what an epoch's record and the progress line's rate read of it."""

from __future__ import annotations

import math
import time
import types

import jax
import pytest

from hscl_jax import progress
from hscl_jax.rundir import metrics
from hscl_jax.rundir import run_log as run_log_lib
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


def test_the_epoch_throughput_leaves_out_the_compiling_steps():
  """An epoch timed over 10 steps in 12 s, of which 2 steps (one per process) compiled in
  4 s: its throughput counts the other 8 steps over the other 8 s. An epoch whose every
  step compiled keeps them all (there is nothing else to time); a resumed epoch's position
  round-trips through the checkpoint's metadata."""
  times = timing.EpochTimes(seconds=12.0, steps_timed=10, compile_seconds=4.0, compile_steps=2)
  assert times.without_compilation() == (8, 8.0)
  one_step = timing.EpochTimes(seconds=3.0, steps_timed=1, compile_seconds=3.0, compile_steps=1)
  assert one_step.without_compilation() == (1, 3.0)
  position = run_log_lib.EpochPosition(times=times)
  restored, records = run_log_lib.EpochPosition.from_metadata(position.to_metadata([{'epoch': 1}]))
  assert restored == position and records == [{'epoch': 1}]


def test_one_timer_gives_the_epoch_s_times_the_rate_and_the_eta(monkeypatch):
  """A span from step 4 whose first step (the process's) compiles in 10 s, two more steps
  in 5 s, then an evaluation of 1 s every 2 epochs: the epoch keeps 15 s over 3 steps (10 s
  and 1 step of them compiling), the rate is 2.5 s a step after the compilation, and the
  progress line's ETA at step 7 of 10 is 3 steps at that rate plus one epoch's share of
  the evaluation (3 x 2.5 + 0.5)."""
  readings = iter([0.0, 10.0, 12.0, 15.0, 20.0, 21.0])
  clock = types.SimpleNamespace(perf_counter=lambda: next(readings))
  monkeypatch.setattr(progress, 'time', clock)  # the stopwatch of the steps
  monkeypatch.setattr(timing, 'time', clock)  # the evaluation's
  timer = timing.Timer(start_step=4)
  timer.start(4)
  timer.first_step_done(5)
  assert timer.compiled and timer.seconds_per_step(6) == 2.0  # read mid-span, at 12 s
  timer.stop(7)
  assert timer.epoch == timing.EpochTimes(
    seconds=15.0, steps_timed=3, compile_seconds=10.0, compile_steps=1
  )
  assert timer.epoch.without_compilation() == (2, 5.0)
  assert timer.evaluate(lambda: 'top-1', every_epochs=2) == ('top-1', 1.0)
  line = metrics.Progress(
    total_steps=10, start_step=4, steps_per_epoch=5, images_per_step=2, timer=timer
  )
  assert line.eval_seconds_per_epoch == 0.5
  assert timer.seconds_per_step(7) == 2.5 and line.eta_seconds(7) == 8.0
  timer.next_epoch()
  assert timer.epoch == timing.EpochTimes()


def test_the_eta_counts_down_without_a_jump_when_the_first_evaluation_compiles(monkeypatch):
  """30 epochs of 5 steps on a stepped clock: each step 1 s (the first compiles 10 s more),
  each epoch's kNN 2 s, the first kNN 6 s more compiling (jax.monitoring's event, as JAX
  reports it). The ETA at each epoch's last step (the loop's progress line, before its kNN)
  is the steps left at 1 s plus the epochs left at 2 s, from epoch 2 on: a countdown of 7 s
  an epoch. Taking the first kNN's 8 s as every kNN's would show 364 s at epoch 2 after 145
  s at epoch 1, then 189 s at epoch 3."""
  clock = types.SimpleNamespace(now=0.0)
  clock.perf_counter = lambda: clock.now
  monkeypatch.setattr(progress, 'time', clock)
  monkeypatch.setattr(timing, 'time', clock)
  timer = timing.Timer(start_step=0)
  line = metrics.Progress(
    total_steps=150, start_step=0, steps_per_epoch=5, images_per_step=2, timer=timer
  )

  def knn(epoch):
    clock.now += 2.0
    if epoch == 1:
      clock.now += 6.0
      jax.monitoring.record_event_duration_secs('/jax/core/compile/backend_compile_duration', 6.0)
    return epoch

  etas = []
  for epoch in range(1, 31):
    timer.start(5 * (epoch - 1))
    for step in range(5 * (epoch - 1) + 1, 5 * epoch + 1):
      clock.now += 11.0 if step == 1 else 1.0
      if not timer.compiled:
        timer.first_step_done(step)
    timer.stop(5 * epoch)
    etas.append(line.eta_seconds(5 * epoch))
    assert timer.evaluate(lambda: knn(epoch), every_epochs=1) == (epoch, 8.0 if epoch == 1 else 2.0)
    timer.next_epoch()
  assert etas[0] == 145.0  # no kNN timed yet
  assert etas[1:] == pytest.approx([7.0 * (30 - epoch) for epoch in range(2, 31)])
