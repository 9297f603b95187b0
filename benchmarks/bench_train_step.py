"""Throughput and model FLOPs utilisation (MFU) of the real training step on one device.

    python benchmarks/bench_train_step.py          # ResNet-18 and ResNet-50, 32 px
    python benchmarks/bench_train_step.py --models=resnet50 --batch_size=16 --dtype=bfloat16

The step timed is `hscl_jax.training.step.make_train_step` itself, jitted over a 1-device mesh
(jax.shard_map, as in training): on-device SimCLR augmentation of both views, forward,
the configured loss (configs/default.py: H-SCL, exponential hardening) and its backward,
the per-step diagnostics (--diagnostics, on by default as in training), the optimizer
update (config.optimizer, Adam with coupled L2) and synced BatchNorm statistics. The
input pipeline is left out: one random uint8 batch stays on the device.

Reported per model: step time (best of --steps after one warm-up step), images/s
(images = samples x 2 views), the step's FLOPs from XLA's cost analysis of the compiled
step, the achieved FLOP/s, and MFU = achieved / peak, where the peak is the FLOP/s of a
large matmul (jnp.dot) of the step's dtype measured in the same run: just before each model's timed
steps and at the end. On a shared machine the peak moves with the load; MFU is reported
against the highest peak seen (`mfu`) and against the one measured next to the model's
steps (`mfu_local`), with the 1-minute load average. `augment_ms`: the step's on-device
augmentation alone (jitted on its own).

--torch: the same step in PyTorch (benchmarks/torch_reference.py: the same model, H-SCL
loss and Adam, no augmentation; torch's threads = the CPU count), timed right after each
model's JAX steps: `torch_images_per_s` and `jax_over_torch`. Needs PyTorch
(`pip install -e '.[bench]'`).

    python benchmarks/bench_train_step.py --torch --models=resnet18 --batch_size=32
    python benchmarks/bench_train_step.py --torch --models=small_cnn --batch_size=256

--probe: instead, the step with the online linear probe (training/online_probe) on and off, timed
in alternating steps in one run, and their ratio (`probe_ratio`, on / off, best of --steps
each; `probe_ratio_median` of the medians; `probe_flop_ratio`, of XLA's FLOP counts, which
the machine's load does not move):

    python benchmarks/bench_train_step.py --probe --models=small_cnn --batch_size=16 --steps=20
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
from hscl_jax import models  # noqa: E402
from hscl_jax import optimizers  # noqa: E402
from hscl_jax import parallel  # noqa: E402
from hscl_jax.data import augment  # noqa: E402
from hscl_jax.models import factory  # noqa: E402
from hscl_jax.training import plan as plan_lib  # noqa: E402
from hscl_jax.training import state as state_lib  # noqa: E402
from hscl_jax.training import step as step_lib  # noqa: E402

VIEWS = 2
PROBE_CLASSES = 10


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


def matmul_peak(n: int, repeats: int, dtype: str = 'float32', precision=None) -> float:
  """FLOP/s of an n x n x n jnp.dot of `dtype` at `precision` (2 n^3 FLOPs); the default
  precision is the one the model's layers use (e.g. TF32 for float32 on recent GPUs)."""
  a = jax.random.normal(jax.random.key(0), (n, n), dtype)
  b = jax.random.normal(jax.random.key(1), (n, n), dtype)
  dot = jax.jit(lambda a, b: jnp.dot(a, b, precision=precision))
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


def build_step(config, args, *, probe_classes=None):
  """(the compiled step, its initial state, the batch, hyper, the augmentation's
  parameters, the compile seconds) on a 1-device mesh; with `probe_classes`, the state
  holds an online linear probe of that many classes (training/online_probe)."""
  mesh = parallel.make_mesh(jax.devices()[:1])
  model = models.create_model(config.model, bn_axis_name=parallel.AXIS)
  schedule = optimizers.create_learning_rate_schedule(
    config.optimizer, steps_per_epoch=1, total_steps=args.steps + 1
  )
  optimizer = optimizers.create_optimizer(config.optimizer, schedule)
  augment_params = augment.AugmentParams.from_config(config.augment)
  state = state_lib.create_train_state(
    config, model, optimizer, args.image_size, mesh, probe_classes=probe_classes
  )
  step = step_lib.make_train_step(config, model, optimizer, augment_params, mesh)
  hyper = plan_lib.loss_hyperparameters(config, 1)
  rng = np.random.default_rng(0)
  shape = (args.batch_size, VIEWS, args.image_size, args.image_size, 3)
  batch = parallel.global_batch(
    {
      'image': rng.integers(0, 256, shape, dtype=np.uint8),
      'label': (np.arange(args.batch_size) % PROBE_CLASSES).astype(np.int32),
    },
    mesh,
    ('image', 'label'),
  )
  start = time.perf_counter()
  compiled = step.lower(state, batch, hyper).compile()
  return compiled, state, batch, hyper, augment_params, time.perf_counter() - start


def probe_comparison(name, args):
  """The step's best time with the online probe off and on (PROBE_CLASSES classes), both
  compiled first and then timed in alternating steps, so that a change of the machine's
  load reaches both, each round in the other order (the first step of a round runs on
  colder caches): `probe_ratio` = on / off."""
  config = bench_config(name, args)
  runs = {
    on: list(build_step(config, args, probe_classes=PROBE_CLASSES if on else None))
    for on in (False, True)
  }
  times = {False: [], True: []}
  for repeat in range(args.steps + 1):  # the first round warms both up
    for on in (False, True) if repeat % 2 else (True, False):
      run = runs[on]
      compiled, state, batch, hyper = run[:4]
      start = time.perf_counter()
      run[1], loss = compiled(state, batch, hyper)
      jax.block_until_ready(loss)
      if repeat:
        times[on].append(time.perf_counter() - start)
  off, on = min(times[False]), min(times[True])
  median = {probe: sorted(t)[len(t) // 2] for probe, t in times.items()}
  flops = {probe: flops_of(run[0]) for probe, run in runs.items()}
  return dict(
    model=name,
    batch_size=args.batch_size,
    probe_off_step_s_best=round(off, 5),
    probe_on_step_s_best=round(on, 5),
    probe_ratio=round(on / off, 4),
    probe_ratio_median=round(median[True] / median[False], 4),
    probe_flop_ratio=round(flops[True] / flops[False], 4),  # XLA's count: load-free
  )


def bench_model(name, args):
  config = bench_config(name, args)
  compiled, state, batch, hyper, augment_params, compile_seconds = build_step(config, args)
  flops = flops_of(compiled)

  state, loss = compiled(state, batch, hyper)  # warm-up
  jax.block_until_ready(loss)
  peak = matmul_peak(args.matmul_size, repeats=3, dtype=args.dtype)
  times = []
  for _ in range(args.steps):
    start = time.perf_counter()
    state, loss = compiled(state, batch, hyper)
    jax.block_until_ready(loss)
    times.append(time.perf_counter() - start)
  seconds = min(times)
  images_per_step = args.batch_size * VIEWS
  augment_seconds = augment_time(state, batch, augment_params, args.steps)
  achieved = flops / seconds
  return dict(
    model=name,
    dtype=args.dtype,
    image_size=args.image_size,
    batch_size=args.batch_size,
    diagnostics=args.diagnostics,
    images_per_step=images_per_step,
    compile_s=round(compile_seconds, 1),
    step_s_best=round(seconds, 5),
    step_s_median=round(sorted(times)[len(times) // 2], 5),
    images_per_s=round(images_per_step / seconds, 2),
    step_gflop=round(flops / 1e9, 2),
    gflop_per_image=round(flops / 1e9 / images_per_step, 3),
    achieved_gflops=round(achieved / 1e9, 2),
    matmul_peak_local_gflops=round(peak / 1e9, 2),
    mfu_local=round(achieved / peak, 3),
    augment_ms=round(1e3 * augment_seconds, 1),
    load_average_1min=round(os.getloadavg()[0], 2),
    loss=float(loss['train_loss']),
  )


def augment_time(state, batch, augment_params, repeats):
  """Best time of the step's two-view augmentation of the batch, jitted alone."""
  images = batch['image']
  index = jnp.arange(images.shape[0])
  fn = jax.jit(lambda rng, x: step_lib.augment_batch(rng, 0, x, index, augment_params))
  jax.block_until_ready(fn(state.rng, images))
  return best_time(fn, state.rng, images, repeats=repeats)


def torch_step(result, args):
  """Adds the PyTorch step's images/s (same model, batch, loss, optimizer) to `result`."""
  import torch_reference  # benchmarks/ is on sys.path when this script runs

  images_per_s, loss = torch_reference.step_images_per_second(
    result['model'], args.batch_size, args.image_size, args.steps, threads=os.cpu_count()
  )
  result.update(
    torch_images_per_s=round(images_per_s, 2),
    torch_loss=round(loss, 4),
    jax_over_torch=round(result['images_per_s'] / images_per_s, 3),
  )


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--models', default='resnet18,resnet50')
  parser.add_argument('--batch_size', type=int, default=8, help='samples per step (x2 views)')
  parser.add_argument('--image_size', type=int, default=32)
  parser.add_argument('--steps', type=int, default=3, help='timed steps after one warm-up')
  parser.add_argument('--dtype', default='float32', choices=tuple(factory.DTYPES))
  parser.add_argument(
    '--diagnostics',
    action=argparse.BooleanOptionalAction,
    default=True,
    help='the per-step diagnostics of training (config.diagnostics)',
  )
  parser.add_argument('--matmul_size', type=int, default=2048)
  parser.add_argument('--torch', action='store_true', help='also time the PyTorch step')
  parser.add_argument(
    '--probe', action='store_true', help='only the step with the online probe on over off'
  )
  args = parser.parse_args()
  if args.probe:
    for name in args.models.split(','):
      result = probe_comparison(name, args)
      print(json.dumps(result))
      print(f'{name}: step with the online probe / without: {result["probe_ratio"]:.3f}')
    return

  step_name = 'hscl_jax.training.step.make_train_step'
  print(f'devices: {jax.devices()[:1]} (1-device mesh)  step: {step_name}')
  peaks = [matmul_peak(args.matmul_size, repeats=5, dtype=args.dtype)]
  print(f'matmul peak ({args.matmul_size}^3 {args.dtype} jnp.dot): {peaks[0] / 1e9:.1f} GFLOP/s')
  results = []
  for name in args.models.split(','):
    result = bench_model(name, args)
    if args.torch:
      torch_step(result, args)
    results.append(result)
    peaks.append(result['matmul_peak_local_gflops'] * 1e9)
    print(json.dumps(result))
  peaks.append(matmul_peak(args.matmul_size, repeats=5, dtype=args.dtype))
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
    torch_part = (
      f'  torch {r["torch_images_per_s"]:.2f} img/s, JAX/torch {r["jax_over_torch"]:.3f}'
      if 'torch_images_per_s' in r
      else ''
    )
    print(
      f'{r["model"]:10s} {r["images_per_s"]:7.2f} {r["gflop_per_image"]:10.3f} '
      f'{r["achieved_gflops"]:8.2f} {peak / 1e9:7.1f} {r["mfu"]:6.3f} {r["mfu_local"]:9.3f}'
      f'{torch_part}'
    )


if __name__ == '__main__':
  main()
