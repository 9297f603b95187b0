"""The lines a run logs (absl's log; the TensorBoard scalars are rundir/metrics'): what the
run is (its parameters per part, its train state's bytes), each epoch's line
(`epoch_line`), the final monitor's figures, what a class-aware epoch visits, the memory
the queue and the key encoder hold."""

from __future__ import annotations

import math
from typing import Any

from absl import logging
import jax
import ml_collections
import numpy as np

from hscl_jax import data
from hscl_jax.evaluation import retrieval_metrics
from hscl_jax.training import queue as negative_queue
from hscl_jax.training import state as state_lib

# The monitor's figures an epoch's line shows (where its record has them), by short name.
EPOCH_LINE_FIGURES = {'knn_top1': 'kNN', 'probe_top1': 'probe'}

# The parts of the model's parameters by their top-level entry; any other entry (e.g. an
# online probe's 'probe') is named as itself.
PARAMETER_PARTS = {'encoder': 'backbone', 'head': 'head'}


def parameter_counts(params: dict[str, Any]) -> dict[str, int]:
  """{part: its number of parameters}: the backbone, the head, then any other entry."""
  order = [k for k in PARAMETER_PARTS if k in params]
  order += sorted(k for k in params if k not in PARAMETER_PARTS)
  return {
    PARAMETER_PARTS.get(key, key): sum(int(np.size(x)) for x in jax.tree.leaves(params[key]))
    for key in order
  }


def state_bytes(state: state_lib.TrainState) -> int:
  """The train state's bytes on one device (every leaf is replicated): parameters,
  BatchNorm statistics, optimizer state, metric sums, queue and key encoder."""
  return sum(int(x.nbytes) for x in jax.tree.leaves(state))


def size_line(state: state_lib.TrainState) -> str:
  """What the model is: e.g. 'Parameters: backbone 1,234, head 567 (1,801 in all); train
  state 21,640 bytes (0.0 MiB) per device.'"""
  params = dict(state.params)
  if state.probe is not None:  # the online probe's parameters live beside the model's
    params['probe'] = state.probe['params']
  if state.loss_state is not None:  # a sigmoid row's log t and b
    params['loss'] = state.loss_state['params']
  counts = parameter_counts(params)
  parts = ', '.join(f'{part} {count:,}' for part, count in counts.items())
  total = sum(counts.values())
  size = state_bytes(state)
  return (
    f'Parameters: {parts} ({total:,} in all); '
    f'train state {size:,} bytes ({size / 2**20:.1f} MiB) per device.'
  )


def epoch_line(record: dict[str, Any], *, num_epochs: int, compile_seconds: float = 0.0) -> str:
  """One short line per epoch (under 100 columns): its loss, the kNN's and the online
  probe's top-1 where measured, views/s and its time, the step's compilation apart (the
  throughput leaves it out). Every other figure is in metrics.jsonl and TensorBoard; each
  is named in docs/training.md."""
  parts = [f'epoch {record["epoch"]}/{num_epochs}', f'loss {record["train_loss"]:.4f}']
  parts += [
    f'{short} {record[name]:.4f}' for name, short in EPOCH_LINE_FIGURES.items() if name in record
  ]
  parts.append(f'{record["images_per_second"]:.0f} views/s')
  epoch_time = _seconds(record['epoch_time'])
  if compile_seconds:
    epoch_time += f' ({_seconds(compile_seconds)} compiling)'
  parts.append(epoch_time)
  return '  '.join(parts)


def _seconds(seconds: float) -> str:
  """'12.3 s'; whole seconds from 100 s on, where a tenth says nothing."""
  return f'{seconds:.1f} s' if seconds < 100 else f'{seconds:.0f} s'


def monitor_parts(record: dict[str, Any]) -> list[str]:
  """The monitor's figures of an epoch record as the lines show them: the kNN top-1, the
  retrieval metrics in their order, the online probe's top-1 (those the record has)."""
  names = ['knn_top1', *(k for k in record if retrieval_metrics.is_metric(k)), 'probe_top1']
  return [f'{figure_name(k)} {record[k]:.4f}' for k in names if k in record]


def figure_name(key: str) -> str:
  """A figure of the records as the closing lines name it: 'kNN top-1', 'P@1', ..."""
  if retrieval_metrics.is_metric(key):
    return retrieval_metrics.short_name(key)
  return {'knn_top1': 'kNN top-1', 'probe_top1': 'probe top-1'}.get(key, key)


def final_monitor(records: list[dict[str, Any]]) -> str:
  """The last monitored epoch's figures, as the closing lines show them."""
  monitored = [r for r in records if 'knn_top1' in r]
  return f'final {", ".join(monitor_parts(monitored[-1]))}' if monitored else 'no kNN evaluated'


def best_epoch(records: list[dict[str, Any]], metric: str, mode: str) -> dict[str, Any] | None:
  """The record whose `metric` is best by `mode` ('max' or 'min'; of equal ones the newer,
  as the best checkpoint); None where no record has a finite one."""
  scored = [r for r in records if _finite(r.get(metric))]
  sign = 1 if mode == 'max' else -1
  return max(scored, key=lambda r: (sign * r[metric], r['step']), default=None)


def _finite(value: Any) -> bool:
  return isinstance(value, (int, float)) and math.isfinite(value)


def best_part(record: dict[str, Any], metric: str) -> str:
  """'best kNN top-1 0.9861 at epoch 18': `record`'s `metric` (the best epoch's)."""
  return f'best {figure_name(metric)} {record[metric]:.4f} at epoch {record["epoch"]}'


# Below this share of the training examples per epoch, a class-aware run is warned: its
# epochs (and so its schedule, in steps) are much shorter than uniform batches' epochs.
LOW_EPOCH_SHARE = 0.5


def class_aware_epoch_lines(
  config: ml_collections.ConfigDict, order: data.EpochOrder
) -> tuple[str, str | None]:
  """(what a class-aware epoch is, a warning where it visits few of the examples, or None)."""
  m, batch, steps = config.samples_per_class, config.batch_size, order.steps_per_epoch
  uniform = data.steps_per_epoch(order.num_examples, batch)
  share = steps * batch / order.num_examples
  info = (
    f'Class-aware batches: {m} samples of each of {batch // m} classes per batch; an epoch '
    f'of {steps} steps visits {share:.1%} of the {order.num_examples} training examples '
    f'(uniform batches: {uniform} steps).'
  )
  if share >= LOW_EPOCH_SHARE:
    return info, None
  longer = math.ceil(config.num_epochs * uniform / steps)
  warning = (
    f'Class-aware epochs visit only {share:.1%} of the training examples ({steps} steps '
    f'instead of {uniform}): the smaller classes run out of groups of {m} early, so each '
    f'epoch, and the learning-rate schedule in steps, is {uniform / steps:.1f}x shorter. '
    f'Fix: --config.num_epochs={longer} trains as many steps as uniform batches would, or '
    'balance the classes (--config.train_examples), or use --config.samples_per_class=0.'
  )
  return info, warning


def log_queue_memory(config: ml_collections.ConfigDict, state: state_lib.TrainState) -> None:
  """The memory the queue and the key encoder hold on every device (both replicated)."""
  if state.queue is not None:
    logging.info(
      'Negative queue: %d slots x %d features, %.1f MiB per device.',
      config.queue_size,
      config.model.head_out,
      negative_queue.nbytes(state.queue) / 2**20,
    )
  if state.key_encoder is not None:
    logging.info(
      'Momentum key encoder (m = %g): %.1f MiB per device.',
      config.queue_momentum,
      negative_queue.nbytes(state.key_encoder) / 2**20,
    )
