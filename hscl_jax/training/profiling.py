"""A `jax.profiler` trace of a run's first steps after the one that compiles
(`--config.profile_steps=N`), into DIR/profile.

The trace starts once the compiling step has finished, so it shows the steady step, and
stops once the N-th traced step has finished. It holds the XProf trace
(DIR/profile/plugins/profile/<time>/<host>.xplane.pb, for TensorBoard's profile plugin or
XProf) and the same trace for the Perfetto UI (perfetto_trace.json.gz beside it). Every
process of a multi-host run traces its own host. A resumed run compiles again and so
traces again, into a new <time> directory.
"""

from __future__ import annotations

import os

import jax

from hscl_jax.rundir import layout


class StepTrace:
  """Call `step_done` with each step's outputs and `close` when the steps end (a trace
  still running then, the run shorter than N steps or stopped, is saved)."""

  def __init__(self, workdir: str, num_steps: int):
    self._directory = os.path.join(workdir, layout.PROFILE_DIR)
    self._left = num_steps
    self._tracing = False

  def step_done(self, outputs) -> None:
    if self._left <= 0:
      return
    jax.block_until_ready(outputs)  # the trace holds whole steps only
    if not self._tracing:  # the compiling step is done: the traced ones follow
      jax.profiler.start_trace(self._directory, create_perfetto_trace=True)
      self._tracing = True
      return
    self._left -= 1
    if self._left == 0:
      self.close()

  def close(self) -> None:
    if self._tracing:
      self._tracing = False
      self._left = 0
      jax.profiler.stop_trace()
