"""The one clock of a training run (`Timer`), built on the progress line's stopwatch
(hscl_jax/progress): the phases a run spends its time in (the step's compilation, training
steps, evaluation), read by the epoch's record (`epoch_time`, the throughput, `knn_time`)
and by the progress line's rate and ETA.

What an epoch's record needs of an epoch that a SIGTERM split over several processes
(`EpochTimes`) travels in the checkpoint's metadata (rundir/run_log); the rest is this
process's: the rate since its compiling step, and its last evaluation's time.
"""

from __future__ import annotations

from collections.abc import Callable
import dataclasses
import time
from typing import Any

import jax

from hscl_jax import progress

# jax.monitoring's events of the time JAX spends tracing, lowering and compiling a program.
COMPILE_EVENTS = '/jax/core/compile/'


@dataclasses.dataclass
class EpochTimes:
  """The epoch's training time so far.

  seconds, steps_timed: its spans of training steps, so that its record reports the whole
    epoch's time and throughput;
  compile_seconds, compile_steps: of those, the first step of each process that ran in the
    epoch (it compiles): the record's throughput leaves them out, as the progress line does.
  """

  seconds: float = 0.0
  steps_timed: int = 0
  compile_seconds: float = 0.0
  compile_steps: int = 0

  def without_compilation(self) -> tuple[int, float]:
    """(steps, seconds) of the epoch's throughput: the compiling steps left out, unless
    they were all its steps (an epoch of one step)."""
    steps = self.steps_timed - self.compile_steps
    if steps <= 0:
      return self.steps_timed, self.seconds
    return steps, self.seconds - self.compile_seconds


class Timer:
  """Times a run's training steps in spans (`start` ... `stop`), the first step of the
  process apart (`first_step_done`: it compiles), and its evaluations (`evaluate`).

  `clock` is the rate's stopwatch, which the progress line reads: training time only, from
  `start_step`, or from the compiling step once it is done. `eval_seconds_per_epoch` is the
  last evaluation's time less its compilation, spread over the epochs it serves, which the
  ETA adds for each epoch left. `epoch` accumulates the epoch's times (`EpochTimes`) until
  `next_epoch`.
  """

  def __init__(self, start_step: int = 0, epoch: EpochTimes | None = None):
    self.clock = progress.Stopwatch(start_step)
    self.epoch = EpochTimes() if epoch is None else epoch
    self.compiled = False  # whether this process's first step has run
    self.eval_seconds_per_epoch = 0.0
    self._span_from = None  # the step the running span began at (None: not counted)

  def start(self, step: int | None = None) -> None:
    """A span of training steps begins (after `step` steps; None: its steps not counted)."""
    self.clock.resume()
    self._span_from = step

  def first_step_done(self, step: int) -> None:
    """The span's first step, this process's first, is done at `step` (its result ready):
    its time is the compilation's, and the rate counts from here."""
    seconds = self.clock.restart(step)
    self.epoch.seconds += seconds
    self.epoch.compile_seconds += seconds
    self.epoch.compile_steps += 1
    self.compiled = True

  def stop(self, step: int | None = None) -> None:
    """The running span ends after `step` steps (a no-op if none runs)."""
    if self.clock.started_at is None:
      return
    self.epoch.seconds += self.clock.pause()
    if step is not None and self._span_from is not None:
      self.epoch.steps_timed += step - self._span_from
    self._span_from = None

  def next_epoch(self) -> None:
    self.epoch = EpochTimes()

  def seconds_per_step(self, step: int) -> float:
    """Training seconds per step from the rate's origin to `step` (NaN before any)."""
    return self.clock.seconds_per_unit(step)

  def evaluate(self, evaluation: Callable[[], Any], *, every_epochs: int) -> tuple[Any, float]:
    """(evaluation(), its seconds); an evaluation every `every_epochs` epochs. The ETA's
    share leaves out the seconds it spent compiling (the first evaluation's, several times
    the later ones' on a small dataset), which no later evaluation spends again."""
    with CompileSeconds() as compiling:
      start = time.perf_counter()
      result = evaluation()
      seconds = time.perf_counter() - start
    self.eval_seconds_per_epoch = max(seconds - compiling.seconds, 0.0) / every_epochs
    return result, seconds


class CompileSeconds:
  """The seconds JAX spends compiling (tracing, lowering, XLA) while the block runs, on any
  thread, from jax.monitoring's duration events."""

  def __init__(self):
    self.seconds = 0.0

  def _add(self, event: str, seconds: float, **kwargs) -> None:
    if event.startswith(COMPILE_EVENTS):
      self.seconds += seconds

  def __enter__(self) -> CompileSeconds:
    jax.monitoring.register_event_duration_secs_listener(self._add)
    return self

  def __exit__(self, *exc_info) -> None:
    jax.monitoring.unregister_event_duration_listener(self._add)
