"""The data-parallel layout: one 1-D mesh over every device of every process.

The batch is split along the mesh axis 'data'; parameters and optimizer state are
replicated. These helpers move batches onto the mesh and values back to the host; they
work unchanged with one process or many (each process feeds its own slice). They are the
training's explicit transfers: it runs under jax.transfer_guard('disallow') (docs/training.md).
"""

from __future__ import annotations

import jax
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import numpy as np

AXIS = 'data'  # the mesh axis the batch is split along


def make_mesh(devices=None) -> jax.sharding.Mesh:
  """1-D mesh over `devices` (default: all devices of all processes), axis 'data'.

  Auto axes: the step is written per device with shard_map, so explicit sharding types
  would add nothing, and eager code outside the step (kNN, tests) stays sharding-agnostic.
  """
  devices = jax.devices() if devices is None else list(devices)
  return jax.make_mesh(
    (len(devices),), (AXIS,), axis_types=(jax.sharding.AxisType.Auto,), devices=devices
  )


def global_batch(local_batch: dict[str, np.ndarray], mesh: jax.sharding.Mesh, keys) -> dict:
  """Assembles the processes' local batches into arrays sharded along 'data'."""
  sharding = NamedSharding(mesh, P(AXIS))
  return {
    k: jax.make_array_from_process_local_data(sharding, np.asarray(local_batch[k])) for k in keys
  }


def replicated(tree, mesh: jax.sharding.Mesh):
  """Host values (a pytree of NumPy arrays, the same on every process) replicated over the
  mesh: an explicit transfer, so the compiled step never receives host values."""
  return jax.device_put(tree, NamedSharding(mesh, P()))


def replicated_value(x: jax.Array) -> np.ndarray:
  """The value of an array replicated over the mesh, read from this process's first copy.

  (float(x) or device_get(x) would need every shard addressable, false with several
  processes.)
  """
  return jax.device_get(x.addressable_data(0))


def to_host(x: jax.Array) -> np.ndarray:
  """The whole value of an array sharded over the processes, on every host."""
  if jax.process_count() == 1:
    return jax.device_get(x)
  return np.asarray(multihost_utils.process_allgather(x, tiled=True))
