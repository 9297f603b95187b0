"""SIGTERM turned into a flag the run checks at its safe points (`PreemptionWatcher`), and
raised there as `Preempted`."""

from __future__ import annotations

import signal
import threading

import jax
from jax.experimental import multihost_utils
import numpy as np


class Preempted(Exception):
  """A SIGTERM reached a safe point of the run: raised there, handled in the training loop
  (training/loop), which saves the state and stops."""


class PreemptionWatcher:
  """Turns SIGTERM into a flag that the run checks at its safe points.

  Only installable from the main thread (signal handlers are); elsewhere inert.
  """

  def __init__(self):
    self._requested = False
    self._previous = None

  def __enter__(self):
    if threading.current_thread() is threading.main_thread():
      self._previous = signal.signal(signal.SIGTERM, self._handle)
    return self

  def __exit__(self, *exc):
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)

  def _handle(self, signum, frame):
    del signum, frame
    self._requested = True

  def check(self, *, sync_point: bool = True) -> None:
    """Raises Preempted if a SIGTERM came. With several processes, all must stop at the
    same step, so they agree on the flag (a collective) only at `sync_point` steps."""
    if jax.process_count() == 1:
      stop = self._requested
    elif not sync_point:
      stop = False
    else:
      stop = bool(np.any(multihost_utils.process_allgather(np.asarray(self._requested))))
    if stop:
      raise Preempted()
