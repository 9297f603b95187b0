"""Run outputs: DIR/metrics.jsonl, DIR/steps.jsonl, TensorBoard events, DIR/config.json, a
progress line. Every row of the two jsonl files carries its wall-clock time (`TIME`).

Only process 0 writes (`enabled=False` elsewhere), so a multi-host run produces one copy.
"""

from __future__ import annotations

import itertools
import json
import logging as std_logging
import math
import os
import sys
import time
from typing import Any

from absl import logging
from etils import epath
import ml_collections
import numpy as np

from hscl_jax import errors
from hscl_jax import progress
from hscl_jax.rundir import atomic
from hscl_jax.rundir import layout
from hscl_jax.rundir import timing
from hscl_jax.rundir import versions

_WRITERS_OPENED = itertools.count()

# Every row's wall-clock time, in Unix seconds: when the row was first written (a row
# rebuilt from a checkpoint keeps its own); its TensorBoard scalars carry it as their time.
TIME = 'time'


def _import_tensorboardx():
  """tensorboardX, without PyTorch where PyTorch is not loaded yet: its writer module tries
  `import torch` at the top only to name torch.Tensor in type hints (its conversions
  recognise torch tensors by their type's name), and that import costs ~3.5 s of every
  program's start-up where the [torch] extra is installed. `sys.modules['torch'] = None`
  makes that one import fail as if torch were absent; it is removed at once, so a later
  `import torch` loads it as usual."""
  if 'tensorboardX' in sys.modules or 'torch' in sys.modules:
    import tensorboardX
  else:
    sys.modules['torch'] = None
    try:
      import tensorboardX
    finally:
      del sys.modules['torch']
  return tensorboardX


tensorboardX = _import_tensorboardx()


class MetricsFileError(errors.UserError, ValueError):
  """DIR/metrics.jsonl has a bad line before its last."""


def _to_python(value: Any) -> Any:
  """JSON-friendly Python scalars (NaN/inf stay floats; json writes them as NaN/Infinity)."""
  if isinstance(value, (np.ndarray, np.generic)) or hasattr(value, '__array__'):
    value = np.asarray(value)
    return value.item() if value.ndim == 0 else value.tolist()
  return value


def config_as_json(config: ml_collections.ConfigDict) -> dict[str, Any]:
  """The config as DIR/config.json stores it (tuples as lists, NumPy numbers as Python's)."""
  return json.loads(json.dumps(config.to_dict(), default=_to_python))


def write_config(workdir: str, config: ml_collections.ConfigDict, *, enabled: bool = True) -> None:
  """Writes the resolved config (after command-line overrides) to DIR/config.json, with
  the workdir's format version (rundir/versions)."""
  if not enabled:
    return
  directory = epath.Path(workdir)
  directory.mkdir(parents=True, exist_ok=True)
  text = json.dumps(versions.stamped(config_as_json(config)), indent=2, sort_keys=True)
  atomic.write_text(directory / layout.CONFIG_FILE, text + '\n')


def read_metrics(workdir: str) -> list[dict[str, Any]]:
  """All records of DIR/metrics.jsonl (an empty list if there is none).

  A torn last line (a copy or a filesystem that cut the file) is dropped with a warning;
  a bad line elsewhere raises ValueError naming it.
  """
  return _read_rows(epath.Path(workdir) / layout.METRICS_FILE)


def read_steps(workdir: str) -> list[dict[str, Any]]:
  """All rows of DIR/steps.jsonl, the per-step scalars (read as `read_metrics` reads)."""
  return _read_rows(epath.Path(workdir) / layout.STEPS_FILE)


def _read_rows(path: epath.Path) -> list[dict[str, Any]]:
  if not path.exists():
    return []
  lines = [line for line in path.read_text().splitlines() if line.strip()]
  records = []
  for number, line in enumerate(lines, start=1):
    try:
      records.append(json.loads(line))
    except json.JSONDecodeError:
      if number < len(lines):
        raise MetricsFileError(
          f'{path} line {number} is not a JSON record: {line[:80]!r}. '
          'Fix: repair or delete that line.'
        ) from None
      logging.warning('Dropping the torn last line of %s: %r', path, line[:80])
  return records


def _summary_writer(logdir: str, purge_step: int):
  """A TensorBoard writer of `logdir` hiding the events logged earlier at steps >=
  `purge_step`."""
  return tensorboardX.SummaryWriter(
    logdir=logdir,
    purge_step=purge_step,
    flush_secs=30,
    # tensorboardX names the file by the second it opens and the host: a resume within
    # that second would write over the previous file; the process and a counter keep
    # every writer's file apart (and in opening order within one process).
    filename_suffix=f'.{os.getpid()}.{next(_WRITERS_OPENED):06d}',
  )


def _row(step: int, scalars: dict[str, Any]) -> dict[str, Any]:
  """A row of a jsonl file: its step, its wall-clock time (now, unless `scalars` has one),
  then `scalars` as JSON-friendly Python values."""
  return {
    'step': int(step),
    TIME: round(time.time(), 3),
    **{k: _to_python(v) for k, v in scalars.items()},
  }


def _add_scalars(writer, row: dict[str, Any], *, skip: tuple[str, ...] = ('step',)) -> None:
  for name, value in row.items():
    if name not in (*skip, TIME) and isinstance(value, (int, float)):
      writer.add_scalar(name, value, global_step=int(row['step']), walltime=row.get(TIME))


def _first_difference(rows: list[dict], expected: list[dict]) -> int:
  """Index of the first row that differs from (or is missing from) `expected`."""
  pairs = itertools.zip_longest(rows, expected)
  return next((i for i, (row, want) in enumerate(pairs) if row != want), len(expected))


class MetricWriter:
  """Writes one JSON object per epoch to DIR/metrics.jsonl and scalars to TensorBoard.

  The file is rewritten whole at each epoch (it has one short line per epoch), which works
  on storage without appends (e.g. gs:// workdirs through etils.epath), through a
  temporary file and a rename, so a crash never leaves it torn. On resume, records and
  TensorBoard events after `keep_through_step` (written by a run that died before its
  next checkpoint, or an epoch end the resumed run redoes) are dropped, so both keep one
  record per epoch. `records` are the rows the resumed run must have (the checkpoint keeps
  them): rows of the file that are missing, torn or different (a file damaged from outside)
  are rebuilt from them, TensorBoard scalars too, and a line says so. `records` (the rows
  written so far, as written) is what a checkpoint stores.
  """

  def __init__(
    self,
    workdir: str,
    *,
    enabled: bool = True,
    keep_through_step: int = 0,
    records: list[dict[str, Any]] | None = None,
  ):
    self._enabled = enabled
    self._path = epath.Path(workdir) / layout.METRICS_FILE
    self._tensorboard = None
    self.records = []
    if not enabled:
      return
    epath.Path(workdir).mkdir(parents=True, exist_ok=True)
    on_file = [r for r in read_metrics(workdir) if r.get('step', 0) <= keep_through_step]
    self.records = on_file if records is None else [dict(r) for r in records]
    rebuilt = _first_difference(on_file, self.records)
    self._rewrite()
    # TensorBoard hides the events logged earlier at steps >= purge_step.
    differing = on_file[rebuilt : rebuilt + 1] + self.records[rebuilt : rebuilt + 1]
    self._tensorboard = _summary_writer(
      os.path.join(workdir, layout.EVENTS_DIR),
      min((r['step'] for r in differing), default=keep_through_step + 1),
    )
    for record in self.records[rebuilt:]:
      self._add_scalars(record)
    if rebuilt < len(self.records):
      epochs = ', '.join(str(r.get('epoch', '?')) for r in self.records[rebuilt:])
      logging.warning(
        'Rebuilt %d row(s) of %s (epochs %s) from the checkpoint: the file lacked them or '
        'held other values.',
        len(self.records) - rebuilt,
        self._path,
        epochs,
      )

  def write(self, step: int, scalars: dict[str, Any]) -> dict[str, Any]:
    """Writes the row of `step` (its time now); returns it as the file holds it."""
    record = _row(step, scalars)
    if not self._enabled:
      return record
    self.records.append(record)
    self._rewrite()
    self._add_scalars(record)
    return record

  def _add_scalars(self, record: dict[str, Any]) -> None:
    _add_scalars(self._tensorboard, record)
    self._tensorboard.flush()

  def _rewrite(self) -> None:
    atomic.write_text(self._path, ''.join(json.dumps(r) + '\n' for r in self.records))

  def close(self) -> None:
    if self._tensorboard is not None:
      self._tensorboard.close()
      self._tensorboard = None


class StepWriter:
  """The per-step scalars: one JSON row per logging step in DIR/steps.jsonl, and the
  TensorBoard run DIR/tensorboard/steps.

  The rows are kept in memory and the file is rewritten whole, atomically, at `flush`
  (each epoch's end and before each checkpoint), so it is never torn and a checkpoint
  never starts before the file holds every row through its step. On resume, the rows
  after `keep_through_step` (the checkpoint's step: rows a stopped run wrote after it)
  are dropped from the file and hidden in TensorBoard, and the resumed run writes them
  again as an uninterrupted run would.
  """

  def __init__(self, workdir: str, *, enabled: bool = True, keep_through_step: int = 0):
    self._enabled = enabled
    self._path = epath.Path(workdir) / layout.STEPS_FILE
    self._tensorboard = None
    self.rows = []
    if not enabled:
      return
    epath.Path(workdir).mkdir(parents=True, exist_ok=True)
    self.rows = [r for r in read_steps(workdir) if r['step'] <= keep_through_step]
    self.flush()
    self._tensorboard = _summary_writer(
      os.path.join(workdir, layout.EVENTS_DIR, layout.STEP_EVENTS_DIR), keep_through_step + 1
    )

  def write(self, step: int, scalars: dict[str, Any]) -> None:
    if not self._enabled:
      return
    row = _row(step, scalars)
    self.rows.append(row)
    _add_scalars(self._tensorboard, row, skip=('step', 'epoch'))

  def flush(self) -> None:
    if not self._enabled:
      return
    atomic.write_text(self._path, ''.join(json.dumps(r) + '\n' for r in self.rows))
    if self._tensorboard is not None:
      self._tensorboard.flush()

  def close(self) -> None:
    if self._tensorboard is not None:
      self.flush()
      self._tensorboard.close()
      self._tensorboard = None


class Progress:
  """Training's progress line: epoch, step (of the whole run), loss, views/s and the ETA.

  The ETA extrapolates the training-step rate of its timer (rundir/timing: since the first
  step of this process, excluding its compilation) and adds the last evaluation's time for
  each remaining one. A run passes its own timer; without one, Progress keeps its own.
  """

  def __init__(
    self,
    *,
    total_steps: int,
    start_step: int,
    steps_per_epoch: int,
    images_per_step: int,
    enabled: bool = True,
    timer: timing.Timer | None = None,
  ):
    self._steps_per_epoch = steps_per_epoch
    self._timer = timing.Timer(start_step) if timer is None else timer
    self._line = progress.ProgressLine(
      total_steps,
      unit='step',
      rate_unit='views',
      per_unit=images_per_step,
      overhead=self._eval_seconds_left,
      start=start_step,
      timing=False,
      clock=self._timer.clock,
      enabled=enabled,
    )

  @property
  def eval_seconds_per_epoch(self) -> float:
    return self._timer.eval_seconds_per_epoch

  @eval_seconds_per_epoch.setter
  def eval_seconds_per_epoch(self, seconds: float) -> None:
    self._timer.eval_seconds_per_epoch = seconds

  def _eval_seconds_left(self, step: int) -> float:
    remaining_epochs = math.ceil((self._line.total - step) / self._steps_per_epoch)
    return remaining_epochs * self.eval_seconds_per_epoch

  def resume_timer(self) -> None:
    """Starts timing training steps (call after anything that is not training)."""
    self._line.resume()

  def restart(self, step: int) -> None:
    """Measures rates from `step` on (call after the first step, which compiles)."""
    self._line.restart(step)

  def pause_timer(self) -> None:
    self._line.pause()

  def eta_seconds(self, step: int) -> float:
    return self._line.eta_seconds(step)

  def _head(self, step: int) -> str:
    epoch = (step - 1) // self._steps_per_epoch + 1
    return f'epoch {epoch}/{math.ceil(self._line.total / self._steps_per_epoch)}'

  def line(self, step: int, loss: float) -> str:
    return self._line.line(step, head=self._head(step), detail=f'loss {loss:.4f}')

  def log(self, step: int, loss: float) -> None:
    self._line.log(step, head=self._head(step), detail=f'loss {loss:.4f}')


def _about_full_disk(record) -> bool:
  error = record.exc_info[1] if record.exc_info else None
  return (
    error is not None and errors.is_disk_full(error)
  ) or 'No space left on device' in record.getMessage()


def _own_info_or_warning(record) -> bool:
  if f'{os.sep}hscl_jax{os.sep}' in record.pathname:
    return True
  # A full disk ends the program with one line (hscl_jax.errors); the libraries' own
  # tracebacks of it (Orbax logs one per background thread) would bury that line.
  return record.levelno >= std_logging.WARNING and not _about_full_disk(record)


def show_only_own_info_logs() -> None:
  """Keeps warnings and errors from everyone (but library reports of a full disk), INFO
  lines only from hscl_jax.

  Orbax logs a dozen INFO lines per checkpoint; they would drown the progress line.
  """
  logging.get_absl_handler().addFilter(_own_info_or_warning)
