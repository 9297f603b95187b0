"""A label-aware queue of negatives and the momentum key encoder (MoCo-v2; HCL App. C.1).

The queue holds K L2-normalised keys of earlier batches, each with its sample's label and a
filled flag, first in, first out. After each training step the keys of the whole global
batch (every view, all-gathered over the devices) are written at the write position, so
every device holds the same queue and the current batch is never in it. Its slots are the
``queue``, ``queue_labels`` and ``queue_filled`` arguments of the losses.

With a momentum m > 0 the keys come from a key encoder (backbone and head) whose
parameters follow the online ones after each optimizer step, θ_k ← m·θ_k + (1 − m)·θ_q;
with m = 0 they are the online projections, detached.
"""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax


class Queue(flax.struct.PyTreeNode):
  keys: jax.Array  # [K, dim] float32, L2-normalised
  labels: jax.Array  # [K] int32, -1 = unlabelled
  filled: jax.Array  # [K] bool
  position: jax.Array  # int32 scalar: the next slot written

  @property
  def size(self) -> int:
    return self.keys.shape[0]

  def loss_arguments(self) -> dict[str, jax.Array]:
    """The losses' keyword arguments for this queue's negatives."""
    return {'queue': self.keys, 'queue_labels': self.labels, 'queue_filled': self.filled}


def empty(size: int, dim: int) -> Queue:
  """A queue of ``size`` slots of ``dim`` features, none filled."""
  return Queue(
    keys=jnp.zeros((size, dim), jnp.float32),
    labels=jnp.full((size,), -1, jnp.int32),
    filled=jnp.zeros((size,), bool),
    position=jnp.zeros((), jnp.int32),
  )


def enqueue(queue: Queue, keys: jax.Array, labels: jax.Array, axis_name: str | None) -> Queue:
  """``queue`` with the global batch's keys written over its oldest slots.

  Args:
    queue: the queue before the step (the same on every device).
    keys: [local batch, views, dim] this device's keys; detached here.
    labels: [local batch] their samples' labels.
    axis_name: the data axis to all-gather the keys over (None: one device).

  The global batch's n rows (sample-major, as the losses order them) go to slots
  position … position + n − 1; K being a multiple of n, they never wrap.
  """
  keys = jax.lax.stop_gradient(keys).astype(jnp.float32)
  labels = jnp.asarray(labels, jnp.int32)
  if axis_name is not None:
    keys, labels = (_gather_replicated(x, axis_name) for x in (keys, labels))
  batch, views, dim = keys.shape
  rows = batch * views
  if queue.size % rows:
    raise ValueError(f'queue size {queue.size} is not a multiple of the {rows} rows per step.')
  start = queue.position
  row_labels = jnp.repeat(labels, views)
  return Queue(
    keys=jax.lax.dynamic_update_slice(queue.keys, keys.reshape(rows, dim), (start, 0)),
    labels=jax.lax.dynamic_update_slice(queue.labels, row_labels, (start,)),
    filled=jax.lax.dynamic_update_slice(queue.filled, jnp.ones((rows,), bool), (start,)),
    position=(start + rows) % queue.size,
  )


def _gather_replicated(x: jax.Array, axis_name: str) -> jax.Array:
  """Every device's ``x`` stacked on axis 0, typed as replicated over ``axis_name`` (so
  the queue can leave ``jax.shard_map`` as one value): each device writes its block into
  zeros and a psum adds the blocks, exactly (every other term is 0)."""
  num = x.shape[0]
  blocks = jnp.zeros((jax.lax.axis_size(axis_name) * num,) + x.shape[1:], x.dtype)
  mine = jax.lax.axis_index(axis_name) * num
  return jax.lax.psum(jax.lax.dynamic_update_slice_in_dim(blocks, x, mine, axis=0), axis_name)


def momentum_update(key_tree: Any, online_tree: Any, momentum: float) -> Any:
  """θ_k ← m·θ_k + (1 − m)·θ_q, leaf by leaf (no gradient): optax's Polyak average with
  step size 1 − m."""
  averaged = optax.incremental_update(online_tree, key_tree, step_size=1.0 - momentum)
  return jax.tree.map(jax.lax.stop_gradient, averaged)


def nbytes(tree: Any) -> int:
  """Bytes of the arrays of a pytree (a queue, a key encoder): per device, replicated."""
  return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))
