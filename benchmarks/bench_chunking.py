"""Peak memory and step time of the training step with and without gradient caching.

    python benchmarks/bench_chunking.py                        # ResNet-18 32 px, batch 32..512
    python benchmarks/bench_chunking.py --model=resnet50 --batches=32,128 --chunk_size=16
    python benchmarks/bench_chunking.py --unroll --batches=32,64,128   # chunk_unroll=True

Each setting (batch, chunk_size or 0 = off) runs in a fresh process on a 1-device mesh:
build the real step (`hscl_jax.training.step.make_train_step`: augmentation, forward, H-SCL loss
and backward, diagnostics, Adam update) and compile it; report the memory XLA's compiled
step needs (`xla_mib`: its arguments, outputs and temporaries, from the compiler's memory
analysis: what a device must hold, independent of the machine's load), and, for batches
up to ``--run_max_batch`` (``--run_max_batch_chunked`` with chunks), run three steps and
report the process's peak resident set (compilation included) and the fastest step's
wall time. From the curves: memory growth per sample each way (least squares), the
largest batch that fits in ``--budget_gib`` each way, and the step time with chunks
relative to without.

On CPU, XLA runs the convolutions of a loop body on a slow path (jax-ml/jax#12868), and
the chunked step loops over chunks (lax.scan): expect its CPU step time to be far above
the unchunked one; on GPUs and TPUs the loop costs the second forward pass only.
``--unroll`` (config.chunk_unroll) unrolls the loops: on CPU this shows the cost of
chunking itself (the second forward pass), at a memory that grows with the batch.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import resource
import subprocess
import sys
import time

VIEWS = 2
ROOT = pathlib.Path(__file__).resolve().parents[1]


def child(
  model_name: str,
  batch: int,
  chunk_size: int,
  image_size: int,
  run: bool,
  unroll: bool,
  steps: int = 3,
) -> dict:
  """One compiled step in this process: XLA's memory figure; if ``run``, the fastest of
  ``steps`` steps and this process's peak RSS."""
  sys.path.insert(0, str(ROOT))  # `configs`, as from the root
  import jax
  import numpy as np

  from configs import default
  from hscl_jax import models
  from hscl_jax import optimizers
  from hscl_jax import parallel
  from hscl_jax.data import augment
  from hscl_jax.training import plan as plan_lib
  from hscl_jax.training import state as state_lib
  from hscl_jax.training import step as step_lib

  config = default.get_config()
  config.model.name = model_name
  config.augment.image_size = image_size
  config.batch_size = batch
  config.chunk_size = chunk_size
  config.chunk_unroll = unroll
  mesh = parallel.make_mesh(jax.devices()[:1])
  model = models.create_model(config.model, bn_axis_name=parallel.AXIS)
  schedule = optimizers.create_learning_rate_schedule(
    config.optimizer, steps_per_epoch=1, total_steps=1
  )
  optimizer = optimizers.create_optimizer(config.optimizer, schedule)
  augment_params = augment.AugmentParams.from_config(config.augment)
  state = state_lib.create_train_state(config, model, optimizer, image_size, mesh)
  step = step_lib.make_train_step(config, model, optimizer, augment_params, mesh)
  hyper = plan_lib.loss_hyperparameters(config, 1)
  rng = np.random.default_rng(0)
  shape = (batch, VIEWS, image_size, image_size, 3)
  data = parallel.global_batch(
    {
      'image': rng.integers(0, 256, shape, dtype=np.uint8),
      'label': (np.arange(batch) % 10).astype(np.int32),
    },
    mesh,
    ('image', 'label'),
  )
  compiled = step.lower(state, data, hyper).compile()
  memory = compiled.memory_analysis()
  xla_mib = (
    memory.argument_size_in_bytes
    + memory.output_size_in_bytes
    + memory.temp_size_in_bytes
    - memory.alias_size_in_bytes
  ) / 2**20
  result = dict(
    model=model_name,
    batch=batch,
    chunk_size=chunk_size,
    unroll=unroll,
    image_size=image_size,
    xla_mib=round(xla_mib),
  )
  if not run:
    return result
  times, first_loss = [], None
  for _ in range(steps):  # the fastest of a few steps: the least disturbed by other jobs
    start = time.perf_counter()
    state, loss = compiled(state, data, hyper)
    jax.block_until_ready(loss)
    times.append(time.perf_counter() - start)
    first_loss = float(loss['train_loss']) if first_loss is None else first_loss
  seconds = min(times)
  peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
  return dict(
    result,
    peak_mib=round(peak_mib),
    step_s=round(seconds, 2),
    loss=first_loss,
    load=round(os.getloadavg()[0], 1),
  )


def run_child(model_name, batch, chunk_size, image_size, run, unroll) -> dict:
  args = [
    sys.executable,
    __file__,
    f'--child={model_name},{batch},{chunk_size},{image_size},{int(run)},{int(unroll)}',
  ]
  result = subprocess.run(args, capture_output=True, text=True, cwd=ROOT)
  if result.returncode:
    return dict(
      model=model_name,
      batch=batch,
      chunk_size=chunk_size,
      image_size=image_size,
      error=result.stderr.strip().splitlines()[-1:],
    )
  return json.loads(result.stdout.strip().splitlines()[-1])


def fit_line(points):
  """Least-squares (intercept, slope) of peak MiB against batch."""
  n = len(points)
  mean_x = sum(x for x, _ in points) / n
  mean_y = sum(y for _, y in points) / n
  var = sum((x - mean_x) ** 2 for x, _ in points)
  slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / var if var else 0.0
  return mean_y - slope * mean_x, slope


def summarise(results, budget_mib):
  print(
    f'\n{"batch":>6} {"XLA MiB":>9} {"chunked":>9} {"RSS MiB":>9} {"chunked":>9} '
    f'{"step s":>8} {"chunked":>9} {"time ratio":>10}'
  )
  by_key = {(r['batch'], r['chunk_size'] > 0): r for r in results if 'error' not in r}
  cell = lambda r, k: f'{r[k]:>9}' if r and k in r else f'{"-":>9}'
  for batch in sorted({r['batch'] for r in results}):
    plain, chunked = by_key.get((batch, False)), by_key.get((batch, True))
    ratio = (
      f'{chunked["step_s"] / plain["step_s"]:>10.2f}'
      if plain and chunked and 'step_s' in plain and 'step_s' in chunked
      else f'{"-":>10}'
    )
    print(
      f'{batch:>6} {cell(plain, "xla_mib")} {cell(chunked, "xla_mib")} '
      f'{cell(plain, "peak_mib")} {cell(chunked, "peak_mib")} '
      f'{cell(plain, "step_s"):>8} {cell(chunked, "step_s")} {ratio}'
    )
  fits = {}
  for key in ('xla_mib', 'peak_mib'):
    for chunked in (False, True):
      points = [(b, r[key]) for (b, c), r in sorted(by_key.items()) if c == chunked and key in r]
      if len(points) < 2:
        continue
      intercept, slope = fit_line(points)
      largest = max(b for b, _ in points)
      # Under 0.1 MiB per sample the curve is flat over the measured range: no extrapolation.
      fits[key, chunked] = int((budget_mib - intercept) / slope) if slope >= 0.1 else None
      where = (
        f'largest batch in {budget_mib / 1024:.0f} GiB ≈ {fits[key, chunked]}'
        if fits[key, chunked]
        else f'flat up to batch {largest} (the limit is the loss)'
      )
      print(
        f'{key}, {"with" if chunked else "without"} chunks: ≈ {intercept:.0f} MiB + '
        f'{slope:.2f} MiB/sample; {where}'
      )
    if fits.get((key, False)) and fits.get((key, True)):
      print(
        f'{key}: the budget holds {fits[key, True] / fits[key, False]:.1f}x the batch with chunks'
      )
    both = [
      b
      for b in sorted({r['batch'] for r in results})
      if key in by_key.get((b, False), {}) and key in by_key.get((b, True), {})
    ]
    if both:
      b = both[-1]
      plain, chunked = by_key[b, False][key], by_key[b, True][key]
      print(
        f'{key} at batch {b}: {plain} MiB without chunks, {chunked} MiB with '
        f'({plain / chunked:.1f}x less)'
      )


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--model', default='resnet18')
  parser.add_argument('--batches', default='32,64,128,256,512')
  parser.add_argument('--chunk_size', type=int, default=16)
  parser.add_argument('--image_size', type=int, default=32)
  parser.add_argument('--budget_gib', type=float, default=8.0)
  parser.add_argument(
    '--max_gib',
    type=float,
    default=10.0,
    help="skip runs predicted (from XLA's figure) to need more than this",
  )
  parser.add_argument(
    '--run_max_batch',
    type=int,
    default=512,
    help='run (RSS, time) unchunked steps up to this batch; compile only above',
  )
  parser.add_argument('--run_max_batch_chunked', type=int, default=64)
  parser.add_argument(
    '--unroll',
    action='store_true',
    help='chunk_unroll=True: unrolled loops over chunks (fast on CPU, memory grows)',
  )
  parser.add_argument('--child', help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.child:
    name, batch, chunk, size, run, unroll = args.child.split(',')
    print(json.dumps(child(name, int(batch), int(chunk), int(size), run == '1', unroll == '1')))
    return
  print(
    f'{args.model} at {args.image_size} px, chunk_size {args.chunk_size}'
    f'{" (unrolled)" if args.unroll else ""}; '
    'one fresh process per setting',
    flush=True,
  )
  results = []
  for batch in (int(b) for b in args.batches.split(',')):
    for chunk in (0, args.chunk_size):
      points = [
        (r['batch'], r['xla_mib'])
        for r in results
        if 'error' not in r and (r['chunk_size'] > 0) == (chunk > 0)
      ]
      run = batch <= (args.run_max_batch_chunked if chunk else args.run_max_batch)
      if run and len(points) >= 2:
        intercept, slope = fit_line(points)
        if intercept + slope * batch > args.max_gib * 1024:
          print(
            f'batch {batch} chunk_size {chunk}: not run, predicted to need '
            f'{(intercept + slope * batch) / 1024:.1f} GiB > --max_gib',
            flush=True,
          )
          run = False
      results.append(
        run_child(args.model, batch, chunk, args.image_size, run, args.unroll and chunk > 0)
      )
      print(json.dumps(results[-1]), flush=True)
  summarise(results, args.budget_gib * 1024)


if __name__ == '__main__':
  main()
