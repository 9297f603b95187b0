"""Throughput and model FLOPs utilisation (MFU) of the real training step on one device.

    python benchmarks/bench_train_step.py          # ResNet-18 and ResNet-50, 32 px
    python benchmarks/bench_train_step.py --models=resnet50 --batch_size=16 --dtype=bfloat16

The step timed is `hscl_jax.train.make_train_step` itself, jitted over a 1-device mesh
(jax.shard_map, as in training): on-device SimCLR augmentation of both views, forward,
the configured loss (configs/default.py: H-SCL, exponential hardening) and its backward,
the per-step diagnostics (--diagnostics, on by default as in training), the optimizer
update (config.optimizer, Adam with coupled L2) and synced BatchNorm statistics. The
input pipeline is left out: one random uint8 batch stays on the device.

Reported per model: step time (best of --steps after one warm-up step), images/s
(images = samples x 2 views), the step's FLOPs from XLA's cost analysis of the compiled
step, the achieved FLOP/s, and MFU = achieved / peak, where the peak is the FLOP/s of a
large float32 matmul (jnp.dot) measured in the same run: just before each model's timed
steps and at the end. On a shared machine the peak moves with the load; MFU is reported
against the highest peak seen (`mfu`) and against the one measured next to the model's
steps (`mfu_local`), with the 1-minute load average.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # `configs`, as from the root

from configs import default  # noqa: E402
from hscl_jax import augment  # noqa: E402
from hscl_jax import models  # noqa: E402
from hscl_jax import optim  # noqa: E402
from hscl_jax import parallel  # noqa: E402
from hscl_jax import train  # noqa: E402

VIEWS = 2


def flops_of(compiled) -> float:
  """FLOPs of one call from XLA's cost analysis (a dict, or a list of dicts in older JAX)."""
  analysis = compiled.cost_analysis()
  if isinstance(analysis, (list, tuple)):
    analysis = analysis[0] if analysis else {}
  return float(analysis.get('flops', float('nan'))) if analysis else float('nan')


def best_time(fn, *args, repeats):
  """Best wall time of `repeats` calls (after the caller warmed fn up)."""
  best = float('inf')
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    best = min(best, time.perf_counter() - start)
  return best


def matmul_peak(n: int, repeats: int) -> float:
  """FLOP/s of an n x n x n float32 jnp.dot (2 n^3 FLOPs)."""
  a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
  b = jax.random.normal(jax.random.key(1), (n, n), jnp.float32)
  dot = jax.jit(jnp.dot)
  jax.block_until_ready(dot(a, b))
  return 2 * n**3 / best_time(dot, a, b, repeats=repeats)


def bench_config(name, args):
  config = default.get_config()
  config.model.name = name
  config.model.dtype = args.dtype
  config.augment.image_size = args.image_size
  config.batch_size = args.batch_size
  config.diagnostics = args.diagnostics
  return config


def bench_model(name, args):
  config = bench_config(name, args)
  mesh = parallel.make_mesh(jax.devices()[:1])
  model = models.create_model(config.model, bn_axis_name=parallel.AXIS)
  schedule = optim.create_learning_rate_schedule(
    config.optimizer, steps_per_epoch=1, total_steps=args.steps + 1
  )
  optimizer = optim.create_optimizer(config.optimizer, schedule)
  augment_params = augment.AugmentParams.from_config(config.augment)
  state = train.create_train_state(config, model, optimizer, args.image_size, mesh)
  step = train.make_train_step(config, model, optimizer, augment_params, mesh)
  hyper = train.loss_hyperparameters(config, 1)
  rng = np.random.default_rng(0)
  shape = (args.batch_size, VIEWS, args.image_size, args.image_size, 3)
  batch = parallel.global_batch(
    {
      'image': rng.integers(0, 256, shape, dtype=np.uint8),
      'label': (np.arange(args.batch_size) % 10).astype(np.int32),
    },
    mesh,
    ('image', 'label'),
  )

  start = time.perf_counter()
  compiled = step.lower(state, batch, hyper).compile()
  compile_seconds = time.perf_counter() - start
  flops = flops_of(compiled)

  state, loss = compiled(state, batch, hyper)  # warm-up
  jax.block_until_ready(loss)
  peak = matmul_peak(args.matmul_size, repeats=3)
  times = []
  for _ in range(args.steps):
    start = time.perf_counter()
    state, loss = compiled(state, batch, hyper)
    jax.block_until_ready(loss)
    times.append(time.perf_counter() - start)
  seconds = min(times)
  images_per_step = args.batch_size * VIEWS
  achieved = flops / seconds
  return dict(
    model=name,
    dtype=args.dtype,
    image_size=args.image_size,
    batch_size=args.batch_size,
    diagnostics=args.diagnostics,
    images_per_step=images_per_step,
    compile_s=round(compile_seconds, 1),
    step_s_best=round(seconds, 3),
    step_s_median=round(sorted(times)[len(times) // 2], 3),
    images_per_s=round(images_per_step / seconds, 2),
    step_gflop=round(flops / 1e9, 2),
    gflop_per_image=round(flops / 1e9 / images_per_step, 3),
    achieved_gflops=round(achieved / 1e9, 2),
    matmul_peak_local_gflops=round(peak / 1e9, 2),
    mfu_local=round(achieved / peak, 3),
    load_average_1min=round(os.getloadavg()[0], 2),
    loss=float(loss),
  )


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--models', default='resnet18,resnet50')
  parser.add_argument('--batch_size', type=int, default=8, help='samples per step (x2 views)')
  parser.add_argument('--image_size', type=int, default=32)
  parser.add_argument('--steps', type=int, default=3, help='timed steps after one warm-up')
  parser.add_argument('--dtype', default='float32', choices=tuple(models.DTYPES))
  parser.add_argument(
    '--diagnostics',
    action=argparse.BooleanOptionalAction,
    default=True,
    help='the per-step diagnostics of training (config.diagnostics)',
  )
  parser.add_argument('--matmul_size', type=int, default=2048)
  args = parser.parse_args()

  print(f'devices: {jax.devices()[:1]} (1-device mesh)  step: hscl_jax.train.make_train_step')
  peaks = [matmul_peak(args.matmul_size, repeats=5)]
  print(f'matmul peak ({args.matmul_size}^3 float32 jnp.dot): {peaks[0] / 1e9:.1f} GFLOP/s')
  results = []
  for name in args.models.split(','):
    result = bench_model(name, args)
    results.append(result)
    peaks.append(result['matmul_peak_local_gflops'] * 1e9)
    print(json.dumps(result))
  peaks.append(matmul_peak(args.matmul_size, repeats=5))
  peak = max(peaks)
  print(
    f'matmul peak seen: {", ".join(f"{p / 1e9:.1f}" for p in peaks)} GFLOP/s; '
    f'using {peak / 1e9:.1f}'
  )
  print(
    f'\n{"model":10s} {"img/s":>7s} {"GFLOP/img":>10s} {"GFLOP/s":>8s} {"peak":>7s} '
    f'{"MFU":>6s} {"MFU_local":>9s}'
  )
  for r in results:
    r['mfu'] = round(r['achieved_gflops'] * 1e9 / peak, 3)
    print(
      f'{r["model"]:10s} {r["images_per_s"]:7.2f} {r["gflop_per_image"]:10.3f} '
      f'{r["achieved_gflops"]:8.2f} {peak / 1e9:7.1f} {r["mfu"]:6.3f} {r["mfu_local"]:9.3f}'
    )


if __name__ == '__main__':
  main()
