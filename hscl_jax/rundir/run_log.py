"""A training run's log in its workdir (`RunLog`): all it writes as it goes, so that a
resumed run writes exactly what an uninterrupted one would: its checkpoints with where the
epoch stood (`EpochPosition`, each checkpoint's metadata), its epoch records (metrics.jsonl
and TensorBoard, rundir/metrics) and its per-step scalars (steps.jsonl and TensorBoard).
The log holds the records, it is not one: an epoch record is a row of metrics.jsonl, and
`experiments/run_records` are finished runs' files copied beside a report.

`restore` brings back the newest usable checkpoint's state, the input position, where the
epoch stood and the records so far, and rewrites the records to that checkpoint's step;
`save` writes a checkpoint of all of these; `write_record` adds an epoch's record,
`write_step` a logging step's scalars.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from hscl_jax.rundir import checkpoints
from hscl_jax.rundir import metrics
from hscl_jax.rundir import timing
from hscl_jax.rundir import versions


@dataclasses.dataclass
class EpochPosition:
  """What a checkpoint knows beyond the state.

  steps_done (`epoch_end_pending` on disk): the epoch's steps are all taken but its record
    is not written (a SIGTERM at its last step or during its kNN): the resumed run
    computes the record first;
  times: the epoch's training time so far (rundir/timing), so that its record reports the
    whole epoch's.
  The checkpoint also keeps every metrics record written so far, to rebuild a damaged
  metrics.jsonl.
  """

  steps_done: bool = False
  times: timing.EpochTimes = dataclasses.field(default_factory=timing.EpochTimes)

  def to_metadata(self, records: list[dict[str, Any]]) -> dict[str, Any]:
    """The checkpoint's metadata, in the workdir's format (rundir/versions)."""
    return versions.stamped(
      {
        'epoch_end_pending': self.steps_done,
        'epoch_seconds': self.times.seconds,
        'epoch_steps_timed': self.times.steps_timed,
        'epoch_compile_seconds': self.times.compile_seconds,
        'epoch_compile_steps': self.times.compile_steps,
        # A copy: Orbax may write the metadata after the next epoch's record is appended.
        'records': [dict(record) for record in records],
      }
    )

  @classmethod
  def from_metadata(cls, metadata: dict[str, Any]) -> tuple[EpochPosition, list | None]:
    """(position, records); records are None where the checkpoint kept none (the file is
    then trusted)."""
    metadata = versions.migrate_metadata(metadata)
    times = timing.EpochTimes(
      seconds=float(metadata['epoch_seconds']),
      steps_timed=int(metadata['epoch_steps_timed']),
      compile_seconds=float(metadata['epoch_compile_seconds']),
      compile_steps=int(metadata['epoch_compile_steps']),
    )
    return cls(steps_done=bool(metadata['epoch_end_pending']), times=times), metadata['records']


@dataclasses.dataclass
class Restored:
  step: int  # the checkpoint's step (0: none)
  tree: Any | None  # its state, shaped as the target (None: no checkpoint)
  position: EpochPosition  # where its epoch stood


class RunLog:
  """The checkpoints (rundir/checkpoints, keeping `keep`, and the best by the figure
  `keep_best` names: config.keep_best's text, `checkpoints.KeepBest.parse`) and epoch
  records of the run in `workdir`; only `enabled` processes write records (process 0),
  every process takes part in a checkpoint. `new_best`: whether the last record written
  beats (or ties) every earlier one by keep_best's figure, so that the loop saves its
  epoch whatever checkpoint_every_epochs says, and the best epoch is kept."""

  def __init__(
    self, workdir: str, *, keep: int, keep_best: str | None = None, enabled: bool = True
  ):
    self._workdir, self._enabled = workdir, enabled
    self._keep_best = checkpoints.KeepBest.parse(keep_best)
    self._checkpointer = checkpoints.Checkpointer(workdir, keep=keep, keep_best=self._keep_best)
    self._writer = None
    # The last record given to write_record, on every process (the writer keeps records
    # on process 0 only), so that every process ranks a checkpoint alike.
    self._last_record: dict[str, Any] | None = None
    self._steps = None
    # The best figure so far (`KeepBest.sort_key`), on every process alike: from the
    # checkpoint's records, then each record written.
    self._best = -math.inf
    self.new_best = False

  def restore(self, target: Any, loader) -> Restored:
    """The newest usable checkpoint (shaped as the pytree `target`), `loader` set to its
    input position; the records rewritten to its step, or to what its metadata kept."""
    restored = self._checkpointer.restore_latest(target)
    if restored is None:
      step, tree, position, records = 0, None, EpochPosition(), None
    else:
      step, tree, iterator_state = restored
      loader.set_state(iterator_state)
      position, records = EpochPosition.from_metadata(self._checkpointer.metadata(step))
    self._writer = metrics.MetricWriter(
      self._workdir,
      enabled=self._enabled,
      # An epoch end the resumed run redoes gets its record (again).
      keep_through_step=step - 1 if position.steps_done else step,
      records=records,
    )
    for record in records or []:
      self._rank(record)
    # The steps through the checkpoint's are all taken (and their rows written) before it.
    self._steps = metrics.StepWriter(self._workdir, enabled=self._enabled, keep_through_step=step)
    return Restored(step=step, tree=tree, position=position)

  @property
  def records(self) -> list[dict[str, Any]]:
    """The records written so far (after `restore`), as a checkpoint stores them."""
    return self._writer.records

  def write_record(self, step: int, record: dict[str, Any]) -> dict[str, Any]:
    """Writes the epoch's record at `step`; returns it as written (its step and time)."""
    written = self._writer.write(step, record)
    self._last_record = written
    self.new_best = self._rank(written)
    self._steps.flush()
    return written

  def _rank(self, record: dict[str, Any]) -> bool:
    """Whether `record`'s keep_best figure is at least the best so far (it then is)."""
    if self._keep_best is None:
      return False
    key = self._keep_best.sort_key(self._keep_best.entry(record['step'], record))
    if not math.isfinite(key) or key < self._best:
      return False
    self._best = key
    return True

  def write_step(self, step: int, scalars: dict[str, Any]) -> None:
    self._steps.write(step, scalars)

  def save(self, step: int, tree: Any, loader, position: EpochPosition) -> None:
    """Starts a checkpoint of the state pytree, `loader`'s position and `position` (a
    no-op if `step` is saved already), ranked for keep_best by the record written at
    `step` (a save mid-epoch, after the last epoch's record, is ranked by none), after the
    per-step rows through it are on file."""
    self._steps.flush()
    self._checkpointer.save(
      step,
      tree,
      loader.get_state(),
      position.to_metadata(self._writer.records),
      metric_value=self._last_record,
    )

  def last_saved_step(self) -> int | None:
    """The newest checkpoint's step once every save has finished (None: none)."""
    self._checkpointer.wait_until_finished()
    return self._checkpointer.latest_step()

  def wait_until_finished(self) -> None:
    self._checkpointer.wait_until_finished()

  def close(self) -> None:
    self._checkpointer.close()
    if self._writer is not None:
      self._writer.close()
    if self._steps is not None:
      self._steps.close()
