"""Orbax checkpoints of the full training state plus the input pipeline's position.

The one module that knows the layout on disk. A checkpoint of the run in DIR is a
directory DIR/checkpoints/<step>/ with two items:
  'state':         the array pytree (params, batch_stats, opt_state, step, RNG key data,
                   partial-epoch metric sums), saved with StandardSave (collective: every
                   process takes part and writes its shards);
  'data_iterator': each process's input-iterator state, one JSON file per process
                   (process_<i>-of-<n>.json), so every host resumes its own shard exactly
                   (a run with another process count reads process 0's state).
Saving is asynchronous (training continues while arrays are written); the manager keeps
the newest `keep` checkpoints and, with `keep_best`, the best one by a figure of the epoch
records (`KeepBest`: Orbax's LatestN and BestN policies together). Such a run's checkpoints
each hold a third item, Orbax's 'metrics': {'metric', 'mode', 'value'}, the figure the
checkpoint is ranked by (value null where its step has no record with that figure), which
`best_checkpoint` reads back without building a training state. Each checkpoint carries the
caller's metadata (Orbax custom metadata, opaque here: training stores where the epoch stood
and its records).
A checkpoint that no longer restores (a truncated file) is moved to
DIR/checkpoints_unusable/<step> and the run falls back to the newest one that does.
`restore_subtree` reads part of the state (e.g. only the encoder, for evaluation) without
building the training state.
"""

from __future__ import annotations

import base64
import dataclasses
import errno
import json
import math
import shutil
from typing import Any

from absl import logging
from etils import epath
import jax
from jax.experimental import multihost_utils
import numpy as np
import orbax.checkpoint as ocp

from hscl_jax.config import choices
from hscl_jax.rundir import layout

STATE = 'state'
DATA_ITERATOR = 'data_iterator'


class RestoreError(RuntimeError):
  """A checkpoint that cannot be read into the requested tree (the message names the path)."""


def directory(workdir: str) -> epath.Path:
  """DIR/checkpoints: where the run in `workdir` keeps its checkpoints, absolute (Orbax reads
  and writes absolute paths only; a workdir may be given relative to the current folder)."""
  return epath.Path(workdir).absolute() / layout.CHECKPOINT_DIR


def finished_steps(workdir: str) -> list[int]:
  """Steps of the finished checkpoints (Orbax renames a checkpoint to its step once complete)."""
  path = directory(workdir)
  if not path.exists():
    return []
  return sorted(int(p.name) for p in path.iterdir() if p.name.isdigit())


def disk_full_message(workdir: str) -> str:
  """The one line for a full disk under a training run's workdir: which checkpoint is
  intact and that rerunning resumes from it, or that none was and rerunning starts over."""
  steps = finished_steps(workdir)
  if not steps:  # the run removed what it had written (rundir/lock)
    return (
      f'no space at {workdir}, no checkpoint had been written. Fix: free space (or move the '
      'workdir) and rerun the same command; it starts over, as nothing was kept.'
    )
  return (
    f'no space at {workdir}, last good checkpoint {steps[-1]} is intact. Fix: free space (or '
    'move the workdir) and rerun the same command to resume.'
  )


def _first_line(error: BaseException) -> str:
  lines = str(error).strip().splitlines()
  return f'{type(error).__name__}: {lines[0] if lines else ""}'


def restore_subtree(workdir: str, step: int, target: Any) -> Any:
  """The entries of checkpoint `step`'s state named by `target`, on the default device.

  `target` is a pytree of jax.ShapeDtypeStruct shaped as part of the saved state (e.g.
  {'params': {'encoder': ...}}); the rest of the checkpoint is not read.
  """
  sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  restore_args = jax.tree.map(
    lambda x: ocp.ArrayRestoreArgs(sharding=sharding, global_shape=x.shape, dtype=x.dtype), target
  )
  path = directory(workdir) / str(step) / STATE
  try:
    with ocp.PyTreeCheckpointer() as checkpointer:
      restored = checkpointer.restore(
        path,
        args=ocp.args.PyTreeRestore(item=target, restore_args=restore_args, partial_restore=True),
      )
  except Exception as e:  # Orbax raises many types; all mean "this path is unusable"
    raise RestoreError(
      f'cannot restore from {path}: {_first_line(e)}. The checkpoint is missing or '
      'corrupt, or was written by a run with a different model config.'
    ) from e
  _check_shapes(restored, target, path)
  return restored


def _check_shapes(restored, target, path) -> None:
  """Partial restore leaves keys absent from the checkpoint unrestored: name the mismatch."""
  restored_leaves = jax.tree_util.tree_leaves_with_path(restored)
  missing = [jax.tree_util.keystr(k) for k, v in restored_leaves if not isinstance(v, jax.Array)]
  got = jax.tree.map(lambda x: tuple(x.shape), restored)
  want = jax.tree.map(lambda x: tuple(x.shape), target)
  if missing or got != want:
    detail = f'it lacks {missing[0]}' if missing else 'the parameter shapes differ'
    raise RestoreError(
      f'{path} holds another model than the config describes ({detail}): the workdir '
      "is from a different model; pass the run's own config (DIR/config.json)."
    )


def _encode_iterator_state(state: Any) -> dict[str, Any]:
  """Iterator states may be bytes (grain DataLoader) or JSON-able objects (dicts)."""
  if isinstance(state, (bytes, bytearray)):
    return {'encoding': 'base64', 'value': base64.b64encode(bytes(state)).decode('ascii')}
  return {'encoding': 'json', 'value': state}


def _decode_iterator_state(record: dict[str, Any]) -> Any:
  if record['encoding'] == 'base64':
    return base64.b64decode(record['value'])
  return record['value']


class IteratorStateHandler(ocp.CheckpointHandler):
  """Writes this process's iterator state to process_<i>-of-<n>.json (every process writes)."""

  def _path(self, directory: epath.Path) -> epath.Path:
    return directory / f'process_{jax.process_index()}-of-{jax.process_count()}.json'

  def save(self, directory: epath.Path, args: IteratorStateSave):
    self._path(directory).write_text(json.dumps(_encode_iterator_state(args.state)))

  def restore(self, directory: epath.Path, args: IteratorStateRestore | None = None):
    del args
    path = self._path(directory)
    if not path.exists():
      # Written with another process count. hscl_jax.data's loaders keep a state that
      # does not depend on it (the number of global batches served), so process 0's
      # state serves every process of the new run.
      others = sorted(directory.glob('process_0-of-*.json'))
      if not others:
        raise FileNotFoundError(f'{path} not found, and no process_0-of-*.json beside it.')
      path = others[0]
    return _decode_iterator_state(json.loads(path.read_text()))


@ocp.args.register_with_handler(IteratorStateHandler, for_save=True)
@dataclasses.dataclass
class IteratorStateSave(ocp.args.CheckpointArgs):
  state: Any  # a snapshot (iterator.get_state()), so an asynchronous save sees that moment


@ocp.args.register_with_handler(IteratorStateHandler, for_restore=True)
@dataclasses.dataclass
class IteratorStateRestore(ocp.args.CheckpointArgs):
  pass


def _all_processes(ok: bool) -> bool:
  if jax.process_count() == 1:
    return ok
  return bool(np.all(multihost_utils.process_allgather(np.asarray(ok))))


@dataclasses.dataclass(frozen=True)
class KeepBest:
  """The figure of the epoch records that ranks checkpoints for keeping the best one, and
  which way: 'max' (an accuracy, a retrieval figure) or 'min' (a loss)."""

  metric: str
  mode: str = 'max'

  def __post_init__(self):
    choices.check_keep_best(self.metric, self.mode)

  @classmethod
  def parse(cls, text: str | None) -> KeepBest | None:
    """config.keep_best, read by `choices.keep_best_rule` (which config/schema checks)."""
    rule = choices.keep_best_rule(text)
    return None if rule is None else cls(*rule)

  def entry(self, step: int, figures: float | dict[str, Any] | None) -> dict[str, Any]:
    """What checkpoint `step` is ranked by. `figures` is the figure itself, or the metrics
    record written at `step` (a record of another step, such as the last epoch's at a save
    mid-epoch, ranks nothing), or None; a missing or non-finite figure is null."""
    if isinstance(figures, dict):
      figures = figures.get(self.metric) if figures.get('step', step) == step else None
    value = None if figures is None else float(figures)
    finite = value is not None and math.isfinite(value)
    return {'metric': self.metric, 'mode': self.mode, 'value': value if finite else None}

  def rank(self, entry: dict[str, Any] | None) -> float:
    """The entry's value, better by `mode`; an entry without one, or ranked by another
    figure or way, is worse than any. Orbax's sort is stable, so of equal ranks the newest
    step is the best (`best_checkpoint` breaks ties the same way)."""
    entry = entry or {}
    value = entry.get('value')
    if value is None or (entry.get('metric'), entry.get('mode')) != (self.metric, self.mode):
      return -math.inf if self.mode == 'max' else math.inf
    return float(value)

  def sort_key(self, entry: dict[str, Any] | None) -> float:
    """Larger is better, whichever the mode."""
    return self.rank(entry) if self.mode == 'max' else -self.rank(entry)


@dataclasses.dataclass(frozen=True)
class Best:
  """The best checkpoint a run kept: its step, the figure it was ranked by and its value."""

  step: int
  metric: str
  mode: str
  value: float


def best_checkpoint(workdir: str) -> Best | None:
  """The best of the finished checkpoints by the figure the newest ranked checkpoint was
  ranked by (a run resumed with another `keep_best` ranks by the new one); None where no
  checkpoint has a value of that figure (a run without `keep_best`)."""
  steps = finished_steps(workdir)
  if not steps:
    return None
  manager = ocp.CheckpointManager(
    directory(workdir), options=ocp.CheckpointManagerOptions(create=False, save_interval_steps=0)
  )
  try:
    entries = {step: manager.metrics(step) for step in steps}
  finally:
    manager.close()
  ranked = [
    (step, entry)
    for step, entry in entries.items()
    if isinstance(entry, dict)
    and entry.get('metric')
    and entry.get('mode') in choices.KEEP_BEST_MODES
  ]
  if not ranked:
    return None
  keep_best = KeepBest(ranked[-1][1]['metric'], ranked[-1][1]['mode'])
  scored = [(step, entry) for step, entry in ranked if math.isfinite(keep_best.rank(entry))]
  if not scored:
    return None
  step, entry = max(scored, key=lambda item: (keep_best.sort_key(item[1]), item[0]))
  return Best(step, keep_best.metric, keep_best.mode, float(entry['value']))


class Checkpointer:
  """Saves/restores {state pytree, iterator state} of the run in `workdir`, keeping the
  newest `keep` and, with `keep_best`, the best by its figure besides (one directory where
  the best is among the newest). The ranks are read back from the checkpoints, so a resumed
  run (any `keep`, 1 included) still keeps the best its earlier part saved."""

  def __init__(self, workdir: str, *, keep: int, keep_best: KeepBest | None = None):
    self._workdir = workdir
    self._keep_best = keep_best
    self._figures_seen: list[str] | None = None  # a record's, while none had keep_best's
    policies = [ocp.checkpoint_managers.LatestN(keep)]
    if keep_best is not None:
      policies.append(
        ocp.checkpoint_managers.BestN(
          get_metric_fn=keep_best.rank,
          reverse=keep_best.mode == 'min',  # BestN keeps the last of the sorted ranks
          n=1,
          keep_checkpoints_without_metrics=False,  # LatestN keeps the newest of those
        )
      )
    self._manager = ocp.CheckpointManager(
      directory(workdir),
      options=ocp.CheckpointManagerOptions(
        preservation_policy=ocp.checkpoint_managers.AnyPreservationPolicy(policies),
        # Orbax writes and reads back the 'metrics' item only where best_fn is set.
        best_fn=keep_best.rank if keep_best else None,
        best_mode=keep_best.mode if keep_best else 'max',
        enable_async_checkpointing=True,
      ),
      item_names=(STATE, DATA_ITERATOR),
    )

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def all_steps(self) -> list[int]:
    return list(self._manager.all_steps())

  def save(
    self,
    step: int,
    state: Any,
    iterator_state: Any,
    metadata: dict[str, Any] | None = None,
    *,
    metric_value: float | dict[str, Any] | None = None,
  ) -> bool:
    """Starts saving (asynchronously); a step that is already saved is skipped. `metadata`
    (JSON-serialisable, the caller's: this module does not read it) is stored beside.
    `metric_value` ranks the checkpoint for `keep_best` (`KeepBest.entry`: the figure, or
    the metrics record written at `step`); without `keep_best` it is not used."""
    if step in self._manager.all_steps():
      return False
    self._check_space(state)
    entry = None
    if self._keep_best is not None:
      entry = self._keep_best.entry(step, metric_value)
      self._note_figures(entry, metric_value)
    return self._manager.save(
      step,
      args=ocp.args.Composite(
        **{STATE: ocp.args.StandardSave(state), DATA_ITERATOR: IteratorStateSave(iterator_state)}
      ),
      metrics=entry,
      force=True,  # the training loop decides when to save
      custom_metadata=metadata or {},
    )

  def _note_figures(self, entry: dict[str, Any], metric_value: Any) -> None:
    """Remembers a record's figures while none had keep_best's, for `close` to name."""
    if entry['value'] is not None:
      self._figures_seen = []
    elif isinstance(metric_value, dict) and self._figures_seen != []:
      self._figures_seen = sorted(metric_value)

  def _check_space(self, state: Any) -> None:
    """Raises ENOSPC before writing a checkpoint that cannot fit (local disks): a save
    that fails half-way leaves a partial directory and a burst of library tracebacks."""
    path = directory(self._workdir)
    if not path.exists() or '://' in str(path):
      return
    needed = sum(x.nbytes for x in jax.tree.leaves(state))  # uncompressed: an upper bound
    free = shutil.disk_usage(path).free
    if free < needed:
      raise OSError(
        errno.ENOSPC,
        f'No space left on device: a checkpoint needs up to {needed} bytes, {free} are free',
        str(path),
      )

  def metadata(self, step: int) -> dict[str, Any]:
    """The `metadata` saved with checkpoint `step` ({} if none)."""
    return dict(self._manager.metadata(step).custom_metadata or {})

  def restore_latest(self, target: Any) -> tuple[int, Any, Any] | None:
    """(step, state, iterator state) of the newest checkpoint that restores; None if none.

    Newer ones that fail (e.g. a truncated file) are moved to DIR/checkpoints_unusable/
    with a warning naming the step. If none restores, nothing is moved and the newest
    one's error is raised (a model change or a bug, rather than a damaged file).
    """
    failed = []
    for step in sorted(self._manager.all_steps(), reverse=True):
      error = None
      try:
        state, iterator_state = self.restore(step, target)
      except Exception as e:  # Orbax/TensorStore raise many types; all mean "unusable"
        error = e
      if _all_processes(error is None):
        for bad_step, bad_error in failed:
          self._move_aside(bad_step, bad_error, fallback=step)
        return step, state, iterator_state
      failed.append((step, error))
    for _, error in failed:
      if error is not None:
        raise error
    if failed:
      raise RuntimeError(f'checkpoint {failed[0][0]} failed to restore on another process.')
    return None

  def _move_aside(self, step: int, error: BaseException | None, *, fallback: int) -> None:
    destination = epath.Path(self._workdir) / layout.UNUSABLE_DIR / str(step)
    if jax.process_index() == 0:
      destination.parent.mkdir(parents=True, exist_ok=True)
      if destination.exists():
        destination = destination.with_name(f'{step}-{len(list(destination.parent.iterdir()))}')
      (directory(self._workdir) / str(step)).rename(destination)
    if jax.process_count() > 1:
      multihost_utils.sync_global_devices(f'moved aside checkpoint {step}')
    self._manager.reload()
    logging.warning(
      'The checkpoint at step %d cannot be restored (%s); it was moved to %s '
      'and the run resumes from step %d.',
      step,
      _first_line(error) if error else 'failed on another process',
      destination,
      fallback,
    )

  def restore(self, step: int, target: Any) -> tuple[Any, Any]:
    """(state pytree shaped and sharded like `target`, iterator state) of checkpoint `step`."""
    restored = self._manager.restore(
      step,
      args=ocp.args.Composite(
        **{STATE: ocp.args.StandardRestore(target), DATA_ITERATOR: IteratorStateRestore()}
      ),
    )
    return restored[STATE], restored[DATA_ITERATOR]

  def wait_until_finished(self) -> None:
    self._manager.wait_until_finished()

  def close(self) -> None:
    self._manager.wait_until_finished()
    self._manager.close()
    if self._figures_seen:
      logging.warning(
        'config.keep_best=%s: no record saved by this run has the figure %r (its figures: '
        '%s), so no best checkpoint was kept besides the newest.',
        self._keep_best.metric,
        self._keep_best.metric,
        ', '.join(self._figures_seen),
      )
