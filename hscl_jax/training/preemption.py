"""SIGTERM and Ctrl-C (SIGINT) during a training run (`PreemptionWatcher`).

Where the run has something to save, a signal is a flag the run checks at its safe points
and raises there as `Preempted` (the loop saves and stops). Where it has nothing to save
(before its first step is taken, e.g. while that step compiles), or at a Ctrl-C while it
is already stopping (a person who will not wait for the save), the signal raises
`StoppedAtOnce` wherever the program is.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
import contextlib
import signal
import sys
import threading

import jax
from jax.experimental import multihost_utils
import numpy as np

from hscl_jax import errors

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Preempted(Exception):
  """A SIGTERM or Ctrl-C reached a safe point of the run: raised there, handled in the
  training loop (training/loop), which saves the state and stops."""

  def __init__(self, signum: int):
    super().__init__(errors.signal_name(signum))
    self.signum = signum


class StoppedAtOnce(BaseException):
  """A signal that stops the run where it is, without saving: `again` when the run was
  already stopping, else it had nothing to save yet. A BaseException, as
  KeyboardInterrupt, so that no `except Exception` on its way (a checkpoint's restore
  tried, a source's fallback) takes it for a failure. `describe_step` names a checkpoint's
  step in the line the loop writes (with its epoch once the run's plan is known)."""

  def __init__(self, signum: int, *, again: bool):
    super().__init__(errors.signal_name(signum))
    self.signum = signum
    self.again = again
    self.describe_step: Callable[[int], str] = lambda step: f'step {step}'


class PreemptionWatcher:
  """Turns SIGTERM and SIGINT into a flag that the run checks at its safe points, within
  `deferring()`; outside it, or at a second Ctrl-C, into `StoppedAtOnce`.

  The handler raises wherever the main thread is; where that is a callback whose error
  the interpreter only reports (a garbage-collection callback while a step compiles), the
  report is silenced and the stop raised again at the watcher's next call (`check`,
  `deferring`). Only installable from the main thread (signal handlers are); elsewhere
  inert.
  """

  def __init__(self):
    self._signum = None  # the first signal that came
    self._at_once = None  # (signum, again) of a stop at once, once one is due
    self._deferring = False
    self._previous = {}
    self._unraisablehook = None

  def __enter__(self):
    if threading.current_thread() is threading.main_thread():
      self._previous = {signum: signal.signal(signum, self._handle) for signum in SIGNALS}
      self._unraisablehook, sys.unraisablehook = sys.unraisablehook, self._unraisable
    return self

  def __exit__(self, *exc):
    for signum, previous in self._previous.items():
      if previous is not None:  # None: not installed from Python, nothing to put back
        signal.signal(signum, previous)
    self._previous = {}
    if self._unraisablehook is not None:
      sys.unraisablehook, self._unraisablehook = self._unraisablehook, None

  def _handle(self, signum, frame):
    del frame
    again = self._signum is not None
    if not again:
      self._signum = signum
    if (again and signum == signal.SIGINT) or not (again or self._deferring):
      self._at_once = (signum, again)
      self._raise_if_stopping()
    # A repeated SIGTERM (a scheduler's, not a person's) lets the stop under way finish.

  def _unraisable(self, report) -> None:
    if not isinstance(report.exc_value, StoppedAtOnce):  # else raised again by the next call
      self._unraisablehook(report)

  def _raise_if_stopping(self) -> None:
    if self._at_once is not None:
      signum, again = self._at_once
      raise StoppedAtOnce(signum, again=again)

  @contextlib.contextmanager
  def deferring(self, defer: bool = True) -> Iterator[None]:
    """Within: a signal waits for `check` (the run has something to save at its next safe
    point). With `defer` False, as outside, it stops the run at once, as does one that came
    before and was not checked yet (it came while there was nothing new to save)."""
    if not defer:
      if self._signum is not None and self._at_once is None:
        self._at_once = (self._signum, False)
      self._raise_if_stopping()
    outer, self._deferring = self._deferring, defer
    try:
      yield
    finally:
      self._deferring = outer

  def check(self, *, sync_point: bool = True) -> None:
    """Raises Preempted if a signal came (StoppedAtOnce if it was to stop at once). With
    several processes, all must stop at the same step, so they agree on the flag (a
    collective) only at `sync_point` steps."""
    self._raise_if_stopping()
    if jax.process_count() == 1:
      signum = self._signum or 0
    elif not sync_point:
      signum = 0
    else:
      came = multihost_utils.process_allgather(np.asarray(self._signum or 0, np.int32))
      signum = int(np.max(came))
    if signum:
      raise Preempted(signum)
