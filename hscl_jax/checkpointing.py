"""Orbax checkpoints of the full training state plus the input pipeline's position.

A checkpoint is a directory DIR/checkpoints/<step>/ with two items:
  'state':         the array pytree (params, batch_stats, opt_state, step, RNG key data,
                   partial-epoch metric sums), saved with StandardSave (collective: every
                   process takes part and writes its shards);
  'data_iterator': each process's input-iterator state, one JSON file per process
                   (process_<i>-of-<n>.json), so every host resumes its own shard exactly
                   (a run with another process count reads process 0's state).
Saving is asynchronous (training continues while arrays are written); the manager keeps
the newest `keep` checkpoints.
"""

import base64
import dataclasses
import json
from typing import Any

from etils import epath
import jax
import orbax.checkpoint as ocp

STATE = 'state'
DATA_ITERATOR = 'data_iterator'


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

  def save(self, directory: epath.Path, args: 'IteratorStateSave'):
    self._path(directory).write_text(json.dumps(_encode_iterator_state(args.state)))

  def restore(self, directory: epath.Path, args: 'IteratorStateRestore | None' = None):
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


class Checkpointer:
  """Saves/restores {state pytree, iterator state} under `directory`, keeping the last `keep`."""

  def __init__(self, directory: str, *, keep: int):
    self._manager = ocp.CheckpointManager(
        epath.Path(directory).absolute(),
        options=ocp.CheckpointManagerOptions(
            preservation_policy=ocp.checkpoint_managers.LatestN(keep),
            enable_async_checkpointing=True,
        ),
        item_names=(STATE, DATA_ITERATOR),
    )

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def all_steps(self) -> list[int]:
    return list(self._manager.all_steps())

  def save(self, step: int, state: Any, iterator_state: Any) -> bool:
    """Starts saving (asynchronously); a step that is already saved is skipped."""
    if step in self._manager.all_steps():
      return False
    return self._manager.save(
        step,
        args=ocp.args.Composite(**{
            STATE: ocp.args.StandardSave(state),
            DATA_ITERATOR: IteratorStateSave(iterator_state),
        }),
        force=True,  # the training loop decides when to save
    )

  def restore(self, step: int, target: Any) -> tuple[Any, Any]:
    """(state pytree shaped and sharded like `target`, iterator state) of checkpoint `step`."""
    restored = self._manager.restore(
        step,
        args=ocp.args.Composite(**{
            STATE: ocp.args.StandardRestore(target),
            DATA_ITERATOR: IteratorStateRestore(),
        }),
    )
    return restored[STATE], restored[DATA_ITERATOR]

  def wait_until_finished(self) -> None:
    self._manager.wait_until_finished()

  def close(self) -> None:
    self._manager.wait_until_finished()
    self._manager.close()
