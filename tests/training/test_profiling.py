"""training/profiling.StepTrace: the trace starts once the compiling step has finished and
stops once the N-th traced step has, into DIR/profile; a run shorter than N steps, or
stopped, saves what it traced at `close`. jax.profiler's calls are recorded (the real
trace: tests/end_to_end/test_train.py)."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import pytest

from hscl_jax.rundir import layout
from hscl_jax.training import profiling


@pytest.fixture
def calls(monkeypatch):
  """What the profiler was asked, in order, with the steps finished at each call."""
  seen = []
  monkeypatch.setattr(
    jax.profiler,
    'start_trace',
    lambda directory, create_perfetto_trace=False: seen.append(
      ('start', directory, create_perfetto_trace)
    ),
  )
  monkeypatch.setattr(jax.profiler, 'stop_trace', lambda: seen.append(('stop',)))
  return seen


def test_the_steps_after_the_compiling_one_are_traced_n_of_them(calls, tmp_path):
  trace = profiling.StepTrace(str(tmp_path), num_steps=2)
  directory = os.path.join(str(tmp_path), layout.PROFILE_DIR)
  trace.step_done(jnp.ones(3))  # the compiling step
  assert calls == [('start', directory, True)]
  trace.step_done(jnp.ones(3))
  assert len(calls) == 1  # one traced step of two
  trace.step_done(jnp.ones(3))
  assert calls == [('start', directory, True), ('stop',)]
  for _ in range(3):
    trace.step_done(jnp.ones(3))
  trace.close()
  assert len(calls) == 2  # traced once


def test_a_run_shorter_than_n_steps_saves_its_trace_at_close(calls, tmp_path):
  trace = profiling.StepTrace(str(tmp_path), num_steps=5)
  trace.step_done(jnp.ones(3))
  trace.step_done(jnp.ones(3))
  trace.close()
  trace.close()
  assert [call[0] for call in calls] == ['start', 'stop']


@pytest.mark.parametrize('num_steps', [0, -1])
def test_no_steps_traces_nothing(calls, tmp_path, num_steps):
  trace = profiling.StepTrace(str(tmp_path), num_steps=num_steps)
  trace.step_done(jnp.ones(3))
  trace.step_done(jnp.ones(3))
  trace.close()
  assert calls == []


def test_each_traced_step_is_finished_before_the_trace_goes_on(calls, tmp_path, monkeypatch):
  """The trace holds whole steps: the step's outputs are waited for at each call."""
  waited = []
  monkeypatch.setattr(jax, 'block_until_ready', lambda outputs: waited.append(outputs))
  trace = profiling.StepTrace(str(tmp_path), num_steps=1)
  outputs = [{'loss': jnp.float32(i)} for i in range(2)]
  for out in outputs:
    trace.step_done(out)
  assert waited == outputs and [call[0] for call in calls] == ['start', 'stop']
