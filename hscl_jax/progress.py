"""The one progress line of every long job (training, embedding, decoding, the linear probe,
graph training), and the durations and periods it is read in.

A line reads `[HEAD  ]UNIT done/total (p%)[  DETAIL]  R RATE_UNIT/s  [E elapsed, ]ETA T`,
e.g. `epoch 1/2  step 2/6 (33%)  loss 4.1234  1280 views/s  ETA 3s`; before any unit is
timed, `... [E elapsed, ]RATE_UNIT/s and ETA after UNIT n` (with units left) or
`... [E elapsed, ]ETA T` (none left).
"""

from __future__ import annotations

from collections.abc import Callable
import math
import time

from absl import logging

# How often a long job without a natural count (embedding, decoding, a linear probe) logs its
# progress line at most: a loop shorter than this logs none.
EVERY_SECONDS = 10.0


def is_due(count: int, every: int, last: int) -> bool:
  """Whether a periodic job runs at `count` (1-based): every `every`-th and at the `last`;
  never when `every` is 0."""
  return every > 0 and (count % every == 0 or count == last)


def format_duration(seconds: float) -> str:
  """Seconds as e.g. '42s', '3m05s', '2h07m'."""
  if not math.isfinite(seconds):
    return '?'
  seconds = int(round(seconds))
  if seconds < 60:
    return f'{seconds}s'
  if seconds < 3600:
    return f'{seconds // 60}m{seconds % 60:02d}s'
  return f'{seconds // 3600}h{seconds % 3600 // 60:02d}m'


class Stopwatch:
  """Seconds timed in spans (`resume` ... `pause`) since `start` units were done, or since
  the last `restart`."""

  def __init__(self, start: int = 0):
    self.start = start
    self._timed = 0.0  # in the spans already closed
    self._mark = None  # when the running span began

  @property
  def started_at(self) -> float | None:
    """When the running span began (None: paused)."""
    return self._mark

  def resume(self) -> None:
    """Starts (or goes on) timing."""
    self._mark = time.perf_counter()

  def pause(self) -> float:
    """Stops timing until `resume`; returns the seconds of the span it closes (0: none ran)."""
    if self._mark is None:
      return 0.0
    seconds = time.perf_counter() - self._mark
    self._timed += seconds
    self._mark = None
    return seconds

  def restart(self, done: int) -> float:
    """Times from now, over the units after `done`; returns the seconds of the running span
    it cuts off (0: none ran)."""
    now = time.perf_counter()
    seconds = 0.0 if self._mark is None else now - self._mark
    self.start, self._timed, self._mark = done, 0.0, now
    return seconds

  def elapsed(self, now: float | None = None) -> float:
    """Seconds timed since the start (or `restart`)."""
    if self._mark is None:
      return self._timed
    return self._timed + (time.perf_counter() if now is None else now) - self._mark

  def seconds_per_unit(self, done: int, now: float | None = None) -> float:
    units = done - self.start
    return self.elapsed(now) / units if units > 0 else float('nan')


class ProgressLine:
  """Counts `done` of `total` units and logs the line when it is due.

  The rate is of the units done since the start (or `restart`) over the seconds timed
  meanwhile: `pause` and `resume` leave out work that is not the job's (a training run's
  kNN and checkpoints). The ETA extrapolates that rate to the units left and adds
  `overhead(done)`, the seconds of other work still to come. `update` logs a line every
  `every`-th unit and at the last (and at the first with `first`; never by count when
  `every` is 0), or once `every_seconds` have passed since the last line with some units
  done and some left. It reads the clock only when a line may be due, so a job logged by
  count reads it at its lines alone. The seconds are `clock`'s (a `Stopwatch` from `start`
  units): its own, or one the job times itself with (a training run's, rundir/timing).
  """

  def __init__(
    self,
    total: int,
    *,
    unit: str,
    rate_unit: str | None = None,
    per_unit: float = 1.0,
    every: int = 0,
    every_seconds: float | None = None,
    first: bool = False,
    show_elapsed: bool = False,
    overhead: Callable[[int], float] | None = None,
    start: int = 0,
    timing: bool = True,
    clock: Stopwatch | None = None,
    enabled: bool = True,
  ):
    self.total, self.unit, self.rate_unit = total, unit, rate_unit or f'{unit}s'
    self.per_unit, self.every, self.every_seconds = per_unit, every, every_seconds
    self.first, self.show_elapsed, self.enabled = first, show_elapsed, enabled
    self._overhead = overhead or (lambda done: 0.0)
    self.clock = Stopwatch(start) if clock is None else clock
    self._last_line = None
    if timing:
      self.resume()

  def resume(self) -> None:
    """Starts (or goes on) timing the job."""
    self.clock.resume()
    if self._last_line is None:
      self._last_line = self.clock.started_at

  def pause(self) -> None:
    """Stops timing until `resume`: what follows is not the job's work."""
    self.clock.pause()

  def restart(self, done: int) -> None:
    """Measures the rate from `done` units on, timing from now."""
    self.clock.restart(done)
    if self._last_line is None:
      self._last_line = self.clock.started_at

  def elapsed(self, now: float | None = None) -> float:
    """Seconds timed since the start (or `restart`)."""
    return self.clock.elapsed(now)

  def seconds_per_unit(self, done: int, now: float | None = None) -> float:
    return self.clock.seconds_per_unit(done, now)

  def eta_seconds(self, done: int, now: float | None = None) -> float:
    return (self.total - done) * self.seconds_per_unit(done, now) + self._overhead(done)

  def line(self, done: int, *, head: str = '', detail: str = '', now: float | None = None) -> str:
    now = time.perf_counter() if now is None else now
    count = f'{self.unit} {done}/{self.total} ({100 * done / self.total:.0f}%)'
    parts = (head, count, detail, *self._pace(done, now))
    return '  '.join(part for part in parts if part)

  def _pace(self, done: int, now: float) -> tuple[str, str]:
    """(the rate, the ETA). Before any unit is timed (at a training run's compiling step)
    neither is known: the line says after which unit they will be, or, with none left,
    gives the ETA of the other work alone."""
    if done > self.clock.start:
      seconds_per_unit = self.seconds_per_unit(done, now)
      rate = self.per_unit / seconds_per_unit if seconds_per_unit else math.inf
      pace = f'{rate:.0f} {self.rate_unit}/s'
      eta = f'ETA {format_duration(self.eta_seconds(done, now))}'
    elif done < self.total:
      pace, eta = '', f'{self.rate_unit}/s and ETA after {self.unit} {done + 1}'
    else:
      pace, eta = '', f'ETA {format_duration(self._overhead(done))}'
    if self.show_elapsed:
      eta = f'{format_duration(self.elapsed(now))} elapsed, {eta}'
    return pace, eta

  def log(self, done: int, *, head: str = '', detail: str = '', now: float | None = None) -> None:
    """Logs the line now, due or not (when enabled)."""
    if self.enabled:
      logging.info('%s', self.line(done, head=head, detail=detail, now=now))

  def update(self, done: int, *, head: str = '', detail: str | Callable[[], str] = '') -> bool:
    """Logs the line if it is due at `done`; `detail` may be a function, called only then
    (a device read of the loss, say). Returns whether it was due."""
    counted = is_due(done, self.every, self.total) or (self.first and done == self.clock.start + 1)
    if not (counted or self.every_seconds is not None):
      return False
    now = time.perf_counter()
    timed = (
      self.every_seconds is not None
      and self._last_line is not None
      and 0 < done < self.total
      and now - self._last_line >= self.every_seconds
    )
    if not (counted or timed):
      return False
    self._last_line = now
    self.log(done, head=head, detail=detail() if callable(detail) else detail, now=now)
    return True
