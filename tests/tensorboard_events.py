"""Reads the scalars of TensorBoard event files as TensorBoard shows them (no TensorFlow).

Event files are TFRecord files of serialized `Event` protos. A `SessionLog.START` event at
step S (what tensorboardX writes for `purge_step=S`) discards the scalars logged earlier
at steps >= S, as TensorBoard does with the data of a run that died and was resumed.
"""

from __future__ import annotations

import pathlib
import struct

from tensorboardX.proto import event_pb2


def _records(path):
  data = pathlib.Path(path).read_bytes()
  offset = 0
  while offset + 12 <= len(data):
    (length,) = struct.unpack('<Q', data[offset : offset + 8])
    start = offset + 12  # uint64 length, uint32 masked CRC of the length
    yield data[start : start + length]
    offset = start + length + 4  # the data's masked CRC


def scalars(logdir, *, wall_time: bool = False) -> dict[str, dict[int, float]]:
  """{tag: {step: value}} over every event file of `logdir`, in write order ({tag: {step:
  the event's wall time}} with `wall_time`)."""
  values: dict[str, dict[int, float]] = {}
  for path in sorted(
    pathlib.Path(logdir).glob('events.out.tfevents.*'), key=lambda p: (p.stat().st_mtime_ns, p.name)
  ):
    for record in _records(path):
      event = event_pb2.Event.FromString(record)
      if event.HasField('session_log') and event.session_log.status == event.session_log.START:
        for steps in values.values():
          for step in [s for s in steps if s >= event.step]:
            del steps[step]
      for value in event.summary.value:
        shown = event.wall_time if wall_time else value.simple_value
        values.setdefault(value.tag, {})[event.step] = shown
  return values
