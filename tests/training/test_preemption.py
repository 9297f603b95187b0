"""training/preemption.PreemptionWatcher on real signals sent to this process: within
`deferring()` a SIGTERM or Ctrl-C waits for `check` (Preempted); outside it, with nothing
to save, or at a second Ctrl-C, it stops at once (StoppedAtOnce); a repeated SIGTERM lets
the stop under way finish; the previous handlers are back after the run."""

from __future__ import annotations

import signal
import threading

import pytest

from hscl_jax.training import preemption


@pytest.fixture(autouse=True)
def main_thread():
  """Only the main thread installs handlers: elsewhere the watcher is inert and a signal
  sent here would end the test process."""
  if threading.current_thread() is not threading.main_thread():
    pytest.skip('signal handlers are installed from the main thread only')


def _send(signum):
  """The signal to this process; Python runs its handler before the next line."""
  signal.raise_signal(signum)


@pytest.mark.parametrize('signum', preemption.SIGNALS)
def test_a_signal_within_deferring_waits_for_the_check(signum):
  with preemption.PreemptionWatcher() as watcher:
    watcher.check()  # nothing came: goes on
    with watcher.deferring():
      _send(signum)
    with pytest.raises(preemption.Preempted) as raised:
      watcher.check()
  assert raised.value.signum == signum


@pytest.mark.parametrize('signum', preemption.SIGNALS)
def test_a_signal_outside_deferring_stops_at_once(signum):
  with preemption.PreemptionWatcher():
    with pytest.raises(preemption.StoppedAtOnce) as raised:
      _send(signum)
  assert (raised.value.signum, raised.value.again) == (signum, False)


def test_a_second_ctrl_c_stops_at_once_and_a_second_sigterm_lets_the_stop_finish():
  with preemption.PreemptionWatcher() as watcher:
    with watcher.deferring():
      _send(signal.SIGTERM)
      _send(signal.SIGTERM)  # a scheduler's repeat: the save under way goes on
      with pytest.raises(preemption.StoppedAtOnce) as raised:
        _send(signal.SIGINT)
  assert (raised.value.signum, raised.value.again) == (signal.SIGINT, True)


def test_a_signal_not_checked_stops_at_once_where_there_is_nothing_new_to_save():
  """It came while a step could still be saved, then the run stopped deferring."""
  with preemption.PreemptionWatcher() as watcher:
    with watcher.deferring():
      _send(signal.SIGTERM)
    with pytest.raises(preemption.StoppedAtOnce) as raised:
      with watcher.deferring(False):
        pass
    # The stop is due from now on: every later call raises it again.
    with pytest.raises(preemption.StoppedAtOnce):
      watcher.check()
  assert (raised.value.signum, raised.value.again) == (signal.SIGTERM, False)


def test_the_previous_handlers_are_back_after_the_run():
  before = {signum: signal.getsignal(signum) for signum in preemption.SIGNALS}
  with preemption.PreemptionWatcher():
    assert all(signal.getsignal(s) != before[s] for s in preemption.SIGNALS)
  assert {signum: signal.getsignal(signum) for signum in preemption.SIGNALS} == before
