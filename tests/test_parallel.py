"""parallel: the 1-D mesh over the 4 fake devices (tests/conftest.py), a batch split row-wise
over it, replicated values, and the values read back, under the training's transfer guard
(the helpers are its explicit transfers)."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from hscl_jax import parallel

DEVICES = 4


@pytest.fixture(scope='module')
def mesh():
  if jax.device_count() < DEVICES:
    pytest.skip('needs 4 devices (tests/conftest.py sets them)')
  return parallel.make_mesh()


def test_the_mesh_is_every_device_along_data_and_takes_a_subset():
  assert parallel.make_mesh().shape == {'data': jax.device_count()}
  two = parallel.make_mesh(jax.devices()[1:3])
  assert two.shape == {'data': 2}
  assert list(two.devices) == jax.devices()[1:3]


def test_a_global_batch_puts_consecutive_rows_on_consecutive_devices(mesh):
  local = {'image': np.arange(8 * 3, dtype=np.float32).reshape(8, 3), 'label': np.arange(8)}
  with jax.transfer_guard('disallow'):
    batch = parallel.global_batch(local, mesh, keys=('image',))
  assert set(batch) == {'image'}  # only the keys asked for
  image = batch['image']
  assert image.shape == (8, 3)
  for shard in image.addressable_shards:
    index = list(mesh.devices).index(shard.device)
    np.testing.assert_array_equal(shard.data, local['image'][2 * index : 2 * index + 2])
  with jax.transfer_guard('disallow'):
    np.testing.assert_array_equal(parallel.to_host(image), local['image'])


def test_replicated_values_are_whole_on_every_device_and_read_back_from_one(mesh):
  tree = {'w': np.array([[1.5, -2.0]], np.float32), 'step': np.int32(7)}
  with jax.transfer_guard('disallow'):
    on_mesh = parallel.replicated(tree, mesh)
    step = parallel.replicated_value(on_mesh['step'])
  assert len(on_mesh['w'].addressable_shards) == DEVICES
  for shard in on_mesh['w'].addressable_shards:
    np.testing.assert_array_equal(shard.data, tree['w'])
  assert isinstance(step, np.ndarray) and step == 7
