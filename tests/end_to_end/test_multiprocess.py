"""Several JAX processes on 127.0.0.1 (gloo CPU collectives) equal one process.

Each case starts worker processes (this file run as a script) with fake CPU devices:
2 processes x 2 devices, joined through `hscl_jax.training.distributed.initialize` with explicit
coordinator flags, against 1 process x 4 devices (no jax.distributed). The workers
write their results to .npz files; the test compares them here.

  * the cross-process loss: jax.shard_map over all 4 devices of both processes,
    losses.hscl with axis_name (negatives gathered across processes) and its gradient
    w.r.t. replicated weights equal the single-process values (and the unsharded loss);
  * the training program (~1 min on 2 cores, in the default run: it is the only test of
    the training loop's multi-process paths): loop.train_and_evaluate on digits (small CNN,
    a few steps, Orbax checkpoints written collectively by both processes) ends with the
    parameters of the single-process run on the same global batches, and a 2-process
    checkpoint resumes with 1 process x 4 devices.

Every worker is killed if the test fails or times out (tests/processes.py).
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import processes
import pytest

REPO = processes.REPO
WORKER = pathlib.Path(__file__).resolve()


def run_concurrently(*groups: dict, timeout: float = processes.TIMEOUT_SECONDS):
  """Starts every group (kwargs of processes.Workers) of this file's workers at once."""
  return processes.run_concurrently(WORKER, *groups, timeout=timeout)


def _assert_same(actual: dict, expected: dict, *, rtol: float, atol: float, skip=()):
  names = sorted(set(expected) - set(skip))
  assert set(names) <= set(actual), sorted(set(names) - set(actual))
  for name in names:
    np.testing.assert_allclose(actual[name], expected[name], rtol=rtol, atol=atol, err_msg=name)


def test_importing_main_leaves_jax_uninitialised_and_torch_unloaded(tmp_path):
  """hscl_jax.main imports train, losses, models, ... before it calls
  jax.distributed.initialize, which must come before any backend use: no module may run a
  JAX computation at import time (a module-level jnp constant broke SLURM launches). Nor
  does it load PyTorch (tensorboardX's writer would: ~3.5 s of every program's start where
  the [torch] extra is installed), and torch, where installed, still imports afterwards and
  its tensors still reach TensorBoard."""
  code = (
    'import sys\n'
    'import hscl_jax.main\n'
    'from jax._src import xla_bridge\n'
    'assert not xla_bridge.backends_are_initialized()\n'
    "assert 'torch' not in sys.modules, 'torch loaded'\n"
    'try:\n'
    '  import torch\n'
    'except ImportError:\n'
    "  print('no torch')\n"
    '  raise SystemExit\n'
    'from hscl_jax.rundir import metrics\n'
    f'writer = metrics.tensorboardX.SummaryWriter({str(tmp_path)!r})\n'
    "writer.add_scalar('x', torch.tensor(2.5), 1)\n"
    'writer.close()\n'
    "print('torch', torch.ones(2).sum().item())\n"
  )
  done = subprocess.run(
    [sys.executable, '-c', code],
    env=processes.worker_env(1),
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=120,
    check=False,
  )
  assert done.returncode == 0, done.stderr[-2000:]
  assert done.stdout in ('no torch\n', 'torch 2.0\n'), done.stdout
  if done.stdout.startswith('torch'):
    import tensorboard_events  # tests/ is on sys.path (pytest)

    events = tensorboard_events.scalars(tmp_path)
    assert events == {'x': {1: 2.5}}, events


# ----------------------------------------------------------------------------------------
# The cases.


def test_cross_process_hscl_gradient_equals_single_process(tmp_path):
  """2 processes x 2 devices == 1 process x 4 devices == unsharded, loss and gradient."""
  multi, (single,) = run_concurrently(
    dict(task='grad', out_dir=tmp_path / 'multi', num_processes=2, devices_per_process=2, args={}),
    dict(task='grad', out_dir=tmp_path / 'single', num_processes=1, devices_per_process=4, args={}),
  )
  for result in multi:
    assert int(result['process_count']) == 2 and int(result['device_count']) == 4
  assert int(single['process_count']) == 1 and int(single['device_count']) == 4
  info = ('process_count', 'process_index', 'device_count', 'local_device_count', 'described')
  # The start-up log line (main.py's 'JAX ...') names this process of how many, and the
  # local and global devices: counts that differ here (2 processes x 2 of 4 devices).
  for process, result in enumerate(multi):
    assert str(result['described']) == f'explicit: process {process}/2, 2 local of 4 devices (cpu)'
  assert str(single['described']) == 'single: process 0/1, 4 local of 4 devices (cpu)'
  # Both processes hold the same (replicated) values, equal to one process's.
  _assert_same(multi[0], multi[1], rtol=0, atol=0, skip=info)
  _assert_same(
    multi[0], single, rtol=1e-5, atol=1e-6, skip=info + ('loss_unsharded', 'grad_unsharded')
  )
  np.testing.assert_allclose(single['loss'], single['loss_unsharded'], rtol=1e-5)
  np.testing.assert_allclose(single['grad'], single['grad_unsharded'], rtol=1e-4, atol=1e-6)
  assert np.abs(single['grad']).max() > 1e-3  # a real gradient, not zeros


TRAIN_ARGS = {'num_epochs': 2, 'steps_per_epoch_limit': 2, 'batch_size': 16}
TRAIN_INFO = (
  'process_count',
  'process_index',
  'device_count',
  'local_device_count',
  'knn_top1',
  'resumed_from',
  'described',
)


def test_two_processes_train_like_one_and_resume_with_one(tmp_path):
  """train_and_evaluate with 2 processes x 2 devices (one shared workdir, collective
  checkpoints) == 1 process x 4 devices on the same global batches; then the 2-process
  checkpoint of epoch 1 resumed by 1 process x 4 devices ends at the same parameters."""
  args = dict(TRAIN_ARGS, compilation_cache=str(tmp_path / 'jax_cache'))
  multi_workdir = tmp_path / 'multi_workdir'
  multi, (single,) = run_concurrently(
    dict(
      task='train',
      out_dir=tmp_path / 'multi',
      num_processes=2,
      devices_per_process=2,
      args=dict(args, workdir=str(multi_workdir)),
    ),
    dict(
      task='train',
      out_dir=tmp_path / 'single',
      num_processes=1,
      devices_per_process=4,
      args=dict(args, workdir=str(tmp_path / 'single_workdir')),
    ),
  )
  for result in multi:
    assert int(result['process_count']) == 2 and int(result['device_count']) == 4
  _assert_same(multi[0], multi[1], rtol=0, atol=0, skip=('process_index', 'described'))
  # Same global batches, synced BN, global negatives and gradients: same parameters.
  _assert_same(multi[0], single, rtol=1e-4, atol=1e-5, skip=TRAIN_INFO)
  np.testing.assert_allclose(multi[0]['knn_top1'], single['knn_top1'], atol=2e-3)
  assert int(multi[0]['step']) == TRAIN_ARGS['num_epochs'] * TRAIN_ARGS['steps_per_epoch_limit']
  # One collective checkpoint per epoch, and only process 0 wrote the metrics.
  steps = sorted(int(p.name) for p in (multi_workdir / 'checkpoints').iterdir() if p.name.isdigit())
  assert steps == [2, 4]
  records = (multi_workdir / 'metrics.jsonl').read_text().splitlines()
  assert [json.loads(r)['epoch'] for r in records] == [1, 2]

  # Resume the epoch-1 (step 2) checkpoint of the 2-process run with 1 process.
  resumed = tmp_path / 'resumed_workdir'
  shutil.copytree(multi_workdir, resumed)
  shutil.rmtree(resumed / 'checkpoints' / '4')
  (resumed / 'metrics.jsonl').write_text(records[0] + '\n')
  ((result,),) = run_concurrently(
    dict(
      task='train',
      out_dir=tmp_path / 'resumed',
      num_processes=1,
      devices_per_process=4,
      args=dict(args, workdir=str(resumed)),
    )
  )
  assert int(result['resumed_from']) == 2
  _assert_same(result, single, rtol=1e-4, atol=1e-5, skip=TRAIN_INFO)


@pytest.mark.slow  # ~60 s, 2 processes: the 2-process run above and the 4-device chunk and
# queue tests (end_to_end/test_train.py, training/test_queue.py) cover its collectives and its code
def test_two_processes_train_like_one_with_gradient_caching_and_a_queue(tmp_path):
  """chunk_size on: the projections' gradient is taken over the global batch of both
  processes, then pulled back chunk by chunk on each device; 2 processes x 2 devices ==
  1 process x 4 devices (same chunks, so BatchNorm's per-chunk statistics agree too;
  with chunks in one run only, the parameters differ by ~0.04). With a negative queue
  and a momentum key encoder: both processes end with the single process's queue (the
  keys of both processes' devices) and key encoder."""
  args = dict(
    TRAIN_ARGS,
    num_epochs=1,
    chunk_size=2,
    queue_size=64,  # 2 steps of 32 rows
    queue_momentum=0.9,
    compilation_cache=str(tmp_path / 'cache'),
  )
  multi, (single,) = run_concurrently(
    *[
      dict(
        task='train',
        out_dir=tmp_path / name,
        num_processes=processes,
        devices_per_process=4 // processes,
        args=dict(args, workdir=str(tmp_path / f'{name}_workdir')),
      )
      for name, processes in (('multi', 2), ('single', 1))
    ]
  )
  assert int(multi[0]['process_count']) == 2 and int(single['process_count']) == 1
  _assert_same(multi[0], multi[1], rtol=0, atol=0, skip=('process_index', 'described'))
  _assert_same(multi[0], single, rtol=1e-4, atol=1e-5, skip=TRAIN_INFO)
  assert single['queue/filled'].all()
  assert any(name.startswith('key_encoder/params/') for name in single)


# ----------------------------------------------------------------------------------------
# Worker side (this file run as a script with a JSON spec).


def _local_value(x) -> np.ndarray:
  """The value of a replicated (possibly multi-process) array, from this process."""
  return np.asarray(x.addressable_data(0))


def _process_info(jax) -> dict:
  return {
    'process_count': jax.process_count(),
    'process_index': jax.process_index(),
    'device_count': jax.device_count(),
    'local_device_count': jax.local_device_count(),
  }


def _grad_worker(spec) -> dict:
  import jax
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P

  from hscl_jax import losses

  mesh = jax.make_mesh((jax.device_count(),), ('data',), axis_types=(jax.sharding.AxisType.Auto,))
  rng = np.random.default_rng(0)
  batch, d_in, d_out = 16, 12, 8
  x = rng.standard_normal((batch, 2, d_in)).astype(np.float32)
  labels = rng.integers(0, 3, (batch,)).astype(np.int32)  # repeated labels: SCL positives
  w = (0.3 * rng.standard_normal((d_in, d_out))).astype(np.float32)

  def loss_fn(w, x, labels, axis_name):
    z = x @ w
    z = z / jax.numpy.linalg.norm(z, axis=-1, keepdims=True)
    return losses.hscl(z, labels, hardening=losses.exponential(1.0), axis_name=axis_name)

  def per_device(w, x, labels):
    return jax.value_and_grad(loss_fn)(w, x, labels, 'data')

  step = jax.jit(
    jax.shard_map(per_device, mesh=mesh, in_specs=(P(), P('data'), P('data')), out_specs=(P(), P()))
  )

  def global_array(value, spec):
    sharding = NamedSharding(mesh, spec)
    return jax.make_array_from_callback(value.shape, sharding, lambda index: value[index])

  loss, grad = step(
    global_array(w, P()), global_array(x, P('data')), global_array(labels, P('data'))
  )
  out = {'loss': _local_value(loss), 'grad': _local_value(grad)}
  if jax.process_count() == 1:
    loss_u, grad_u = jax.jit(jax.value_and_grad(loss_fn), static_argnums=3)(w, x, labels, None)
    out.update(loss_unsharded=np.asarray(loss_u), grad_unsharded=np.asarray(grad_u))
  return out


def _train_worker(spec) -> dict:
  import jax

  # The runs of one test share compiled programs (the resumed run reuses the 1-process one).
  jax.config.update('jax_compilation_cache_dir', spec['compilation_cache'])
  jax.config.update('jax_persistent_cache_min_compile_time_secs', 0.0)
  from configs import digits
  from hscl_jax.training import loop

  config = digits.get_config()
  config.batch_size = spec['batch_size']
  config.num_epochs = spec['num_epochs']
  config.steps_per_epoch_limit = spec['steps_per_epoch_limit']
  config.optimizer.warmup_epochs = 0.0
  # SGD at a small rate: Adam's first steps (~lr*sign(g)) and SGD at 0.1 with momentum
  # magnify f32 summation-order noise to ~1e-3 within 4 steps; at 0.02 it stays ~1e-7.
  config.optimizer.name, config.optimizer.learning_rate = 'sgd', 0.02
  # Smooth: 2 processes and 1 sum in other orders, and with ReLU a pre-activation within
  # rounding of zero would move the gradient by percents (end_to_end/test_train._sgd_config).
  config.model.activation = 'silu'
  config.knn.every_epochs = config.num_epochs  # once, at the end (cross-process gather)
  config.knn.batch_size = 256
  config.checkpoint_every_epochs = 1
  config.log_every_steps = 1
  config.chunk_size = spec.get('chunk_size', 0)
  config.queue_size = spec.get('queue_size', 0)
  config.queue_momentum = spec.get('queue_momentum', 0.0)
  ckpt_dir = pathlib.Path(spec['workdir']) / 'checkpoints'
  existing = (
    [int(p.name) for p in ckpt_dir.iterdir() if p.name.isdigit()] if ckpt_dir.exists() else []
  )
  result = loop.train_and_evaluate(config, spec['workdir'])
  out = {
    '/'.join(str(getattr(k, 'key', k)) for k in path): _local_value(leaf)
    for path, leaf in jax.tree_util.tree_leaves_with_path(
      {
        'params': result.state.params,
        'batch_stats': result.state.batch_stats,
        'key_encoder': result.state.key_encoder,
        'queue': None if result.state.queue is None else dataclasses.asdict(result.state.queue),
      }
    )
  }
  out['step'] = _local_value(result.state.step)
  out['knn_top1'] = np.float64(result.last_record['knn_top1'])
  out['resumed_from'] = max(existing, default=0)
  return out


def _worker_main(spec: dict) -> None:
  from hscl_jax.training import distributed

  # Before any other JAX call: joins the other processes (gloo collectives on CPU).
  setup = distributed.initialize(
    spec['coordinator_address'],
    spec['num_processes'],
    spec['process_id'],
    initialization_timeout=60,
  )
  import jax

  out = {'grad': _grad_worker, 'train': _train_worker}[spec['task']](spec)
  out.update(_process_info(jax), described=distributed.describe(setup))
  np.savez(spec['out'], **out)


if __name__ == '__main__':
  _worker_main(json.loads(sys.argv[1]))
