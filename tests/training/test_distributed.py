"""training/distributed.decide: which start-up (one process, explicit flags, SLURM, TPU,
forced), from the flags and the environment, and the flags' bounds refused in one line.
The 2-process runs it starts are tests/end_to_end/test_multiprocess.py's."""

from __future__ import annotations

import re

from acceptance import accepted
import pytest

from hscl_jax.training import distributed as d


def test_decide_modes():
  assert d.decide(env={}).mode == d.SINGLE
  assert d.decide(env={}).initialized is False  # a property: a method would be truthy
  assert d.decide(env={}, multihost=True).mode == d.FORCED
  explicit = d.decide(
    '10.0.0.1:1234', 2, 1, env={'SLURM_JOB_ID': '7', 'SLURM_NTASKS': '4', 'SLURM_PROCID': '0'}
  )
  assert (explicit.mode, explicit.num_processes, explicit.process_id) == (d.EXPLICIT, 2, 1)
  slurm = {
    'SLURM_JOB_ID': '7',
    'SLURM_NTASKS': '2',
    'SLURM_PROCID': '1',
    'SLURM_STEP_NODELIST': 'n[1-2]',
    'SLURM_STEP_NUM_NODES': '2',
    'SLURM_GPUS_ON_NODE': '4',
  }
  per_node = d.decide(env=slurm)
  assert per_node.mode == d.SLURM and per_node.local_device_ids == (0, 1, 2, 3)
  per_gpu = d.decide(env={**slurm, 'SLURM_STEP_NUM_NODES': '1'})  # 2 tasks on one node
  assert per_gpu.mode == d.SLURM and per_gpu.local_device_ids is None  # JAX: GPU LOCALID
  assert d.decide(env={**slurm, 'JAX_LOCAL_DEVICE_IDS': '0,1'}).local_device_ids is None
  # One node, no task count (a single task): every visible GPU; two tasks on it: JAX's.
  one_node = {'SLURM_NNODES': '1', 'CUDA_VISIBLE_DEVICES': '0,1'}
  assert d._slurm_local_device_ids(one_node) == (0, 1)
  assert d._slurm_local_device_ids({**one_node, 'SLURM_NTASKS': '2'}) is None
  assert d.decide(env={**slurm, 'SLURM_NTASKS': '1'}).mode == d.SINGLE  # sbatch, no srun -n
  batch_shell = {k: v for k, v in slurm.items() if not k.startswith('SLURM_STEP_')}
  assert d.decide(env=batch_shell).mode == d.SINGLE  # sbatch --ntasks=2, python without srun
  assert d.decide(env=slurm, multihost=False).mode == d.SINGLE
  assert d.decide(env={'TPU_WORKER_HOSTNAMES': 'h0,h1'}).mode == d.TPU
  assert d.decide(env={'TPU_WORKER_HOSTNAMES': 'h0'}).mode == d.SINGLE


@pytest.mark.parametrize(
  'kwargs, message',
  [
    (dict(coordinator_address='h:1'), 'num_processes, process_id missing'),
    (dict(num_processes=2, process_id=0), 'coordinator_address missing'),
    (dict(coordinator_address='h:1', num_processes=2, process_id=2), 'in [0, 2)'),
    (dict(coordinator_address='h', num_processes=2, process_id=0), 'HOST:PORT'),
  ],
)
def test_decide_rejects_incomplete_or_bad_flags(kwargs, message):
  with pytest.raises(ValueError, match=re.escape(message)):
    d.decide(env={}, **kwargs)


@pytest.mark.parametrize('num_processes,process_id', [(1, 0), (2, 0), (2, 1), (3, 2)])
def test_decide_accepts_the_bounds_of_process_id_and_num_processes(num_processes, process_id):
  with accepted(f'process {process_id} of {num_processes}'):
    setup = d.decide('h:1', num_processes, process_id, env={})
  assert (setup.mode, setup.num_processes, setup.process_id) == (
    d.EXPLICIT,
    num_processes,
    process_id,
  )
  assert setup.initialized is True


@pytest.mark.parametrize(
  'num_processes,process_id,message',
  [
    (2, -1, 'process_id must be an integer in [0, 2), got -1'),
    (2, 2, 'process_id must be an integer in [0, 2), got 2'),
    (2, 1.0, 'process_id must be an integer in [0, 2), got 1.0'),
    (0, 0, 'num_processes must be a positive integer, got 0'),
    ('2', 0, "num_processes must be a positive integer, got '2'"),
  ],
)
def test_decide_refuses_one_past_each_bound(num_processes, process_id, message):
  with pytest.raises(ValueError, match=re.escape(message)):
    d.decide('h:1', num_processes, process_id, env={})
