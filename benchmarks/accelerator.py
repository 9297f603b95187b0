"""Every figure this project needs from an accelerator, in one run: a JSON file and a table.

    python benchmarks/accelerator.py --out=DIR            # the full run (minutes on a GPU)
    python benchmarks/accelerator.py --out=DIR --smoke    # tiny sizes, CPU, seconds

On whatever platform JAX sees (one device of it: a 1-device mesh, as bench_train_step.py),
it writes DIR/accelerator.json and DIR/accelerator.md (device kind and count, jax and
jaxlib versions, date) with:

- matmul peaks: FLOP/s of a large square jnp.dot in float32 and bfloat16 at the default
  precision (the one the model's layers use: TF32 for float32 on recent NVIDIA GPUs) and in
  float32 at precision 'highest', each measured in this run;
- the real train step (`train.make_train_step`: on-device augmentation, H-SCL, the
  diagnostics, Adam; bench_train_step.bench_model) for each model x dtype (config.model.dtype)
  at 32 px, batch 512: compile time, images/s (samples x 2 views), GFLOP per image (XLA's
  cost analysis of the compiled step) and MFU against the matmul peak of the step's dtype;
- the loss kernel (`losses.hscl`, exponential hardening, blockwise) forward+backward at
  n = 16,384 and 65,536 rows (d = 128), precision 'highest' (the kernels' default) and
  'default', against the bare matmul bound: the three n x n x d matmuls of a similarity
  and its backward (6 n^2 d FLOPs) at the float32 peak of the same precision;
- the input pipeline: samples/s of `data.TrainLoader` (grain, two views, batch 512) from a
  decoded cache (an in-memory `data.ArraySource`, CIFAR-10's shape, random pixels) beside
  the samples/s each train step consumes, and their ratio (>= 1: the host keeps up).

--smoke runs the same code at tiny sizes (small_cnn at 16 px in bfloat16, batch 8, n = 256)
on any platform, in seconds; tests/test_benchmarks.py runs it, so the script cannot rot.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import sys
import time

import jax
import jaxlib
import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))  # the sibling scripts

import bench_input  # noqa: E402
import bench_losses  # noqa: E402
import bench_train_step  # noqa: E402

# The sizes of the full run and of --smoke (the same code at both).
FULL = dict(
  models='resnet18,resnet50',
  dtypes='float32,bfloat16',
  image_size=32,
  batch_size=512,
  steps=5,
  matmul_size=8192,
  loss_rows='16384,65536',
  loss_block_size=2048,
  loader_images=50_000,
  loader_batches=20,
)
SMOKE = dict(  # one dtype: bfloat16, the less common path (float32's peaks still measured)
  models='small_cnn',
  dtypes='bfloat16',
  image_size=16,
  batch_size=8,
  steps=2,
  matmul_size=256,
  loss_rows='256',
  loss_block_size=128,
  loader_images=512,
  loader_batches=2,
)
PRECISIONS = ('highest', 'default')


def parse_args(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--out', required=True, help='folder for accelerator.json and .md')
  parser.add_argument('--smoke', action='store_true', help='tiny sizes: checks the script')
  for name, value in FULL.items():
    parser.add_argument(
      f'--{name}', type=type(value), help=f'default {value} (smoke: {SMOKE[name]})'
    )
  args = parser.parse_args(argv)
  for name, value in (SMOKE if args.smoke else FULL).items():
    if getattr(args, name) is None:
      setattr(args, name, value)
  return args


def environment(args) -> dict:
  """What ran: device, versions, date (the table's header)."""
  device = jax.devices()[0]
  return dict(
    date=datetime.datetime.now(datetime.UTC).strftime('%Y-%m-%d %H:%M UTC'),
    platform=device.platform,
    device_kind=device.device_kind,
    device_count=jax.device_count(),
    devices_measured=1,
    jax=jax.__version__,
    jaxlib=jaxlib.__version__,
    python=platform.python_version(),
    host_cpus=os.cpu_count(),
    load_average_1min=round(os.getloadavg()[0], 2),
    smoke=args.smoke,
  )


def matmul_peaks(args) -> dict:
  """GFLOP/s of a square matmul per (dtype, precision) the step and the loss use."""
  peak = lambda dtype, precision: bench_train_step.matmul_peak(
    args.matmul_size, repeats=5, dtype=dtype, precision=precision
  )
  peaks = {f'{dtype} default': peak(dtype, None) for dtype in args.dtypes.split(',')}
  peaks.setdefault('float32 default', peak('float32', None))
  peaks['float32 highest'] = peak('float32', 'highest')
  return {key: round(value / 1e9, 2) for key, value in peaks.items()}


def train_steps(args, peaks: dict) -> list[dict]:
  """bench_train_step's measurement per model x dtype; MFU against the peak of that dtype
  (the higher of this run's peak and the one measured next to the step)."""
  rows = []
  for model in args.models.split(','):
    for dtype in args.dtypes.split(','):
      step_args = argparse.Namespace(
        batch_size=args.batch_size,
        image_size=args.image_size,
        dtype=dtype,
        diagnostics=True,
        steps=args.steps,
        matmul_size=args.matmul_size,
      )
      result = bench_train_step.bench_model(model, step_args)
      peak = max(peaks[f'{dtype} default'], result['matmul_peak_local_gflops'])
      result['mfu'] = round(result['achieved_gflops'] / peak, 3)
      rows.append(result)
      print(json.dumps(result), flush=True)
  return rows


def loss_kernels(args, peaks: dict) -> list[dict]:
  """Forward+backward of the blockwise H-SCL kernel / the bare matmul bound."""
  rows = []
  for n in (int(size) for size in args.loss_rows.split(',')):
    z, labels = bench_losses._setup(n)
    for precision in PRECISIONS:
      step = bench_losses._loss_step(args.loss_block_size, precision)
      start = time.perf_counter()
      compiled = step.lower(z, labels).compile()
      compile_s = time.perf_counter() - start
      jax.block_until_ready(compiled(z, labels))  # warm-up
      seconds = bench_train_step.best_time(compiled, z, labels, repeats=args.steps)
      bound_s = 6 * n * n * bench_losses.DIM / (peaks[f'float32 {precision}'] * 1e9)
      rows.append(
        dict(
          rows=n,
          dim=bench_losses.DIM,
          block_size=args.loss_block_size,
          precision=precision,
          compile_s=round(compile_s, 2),
          loss_ms=round(seconds * 1e3, 3),
          matmul_bound_ms=round(bound_s * 1e3, 3),
          ratio=round(seconds / bound_s, 2),
        )
      )
      print(json.dumps(rows[-1]), flush=True)
  return rows


def input_pipeline(args, steps: list[dict]) -> dict:
  """TrainLoader's samples/s from a decoded cache beside what each step consumes."""
  from hscl_jax import data

  rng = np.random.default_rng(0)
  shape = (args.loader_images, args.image_size, args.image_size, 3)
  cache = data.ArraySource(
    rng.integers(0, 256, shape, dtype=np.uint8), np.arange(args.loader_images) % 10, 10
  )
  rate = bench_input.loader_rate(cache, args.batch_size, args.loader_batches)
  consumed = {
    f'{step["model"]} {step["dtype"]}': step['images_per_s'] / bench_train_step.VIEWS
    for step in steps
  }
  return dict(
    loader_samples_per_s=round(rate),
    batch_size=args.batch_size,
    step_samples_per_s={key: round(value, 1) for key, value in consumed.items()},
    loader_over_step={key: round(rate / value, 2) for key, value in consumed.items()},
  )


def markdown(report: dict) -> str:
  """The report as markdown tables (the figures of accelerator.json)."""
  env = report['environment']
  lines = [
    f'# Accelerator figures: {env["device_kind"]} ({env["platform"]}, {env["device_count"]} '
    f'device(s), 1 measured)',
    '',
    f'jax {env["jax"]}, jaxlib {env["jaxlib"]}, Python {env["python"]}, {env["date"]}'
    f'{" (--smoke: tiny sizes, not figures)" if env["smoke"] else ""}',
    '',
    '| matmul | GFLOP/s |',
    '|---|---|',
    *(f'| {key} | {value} |' for key, value in report['matmul_peak_gflops'].items()),
    '',
    '| train step | batch | px | compile s | images/s | GFLOP/image | MFU |',
    '|---|---|---|---|---|---|---|',
    *(
      f'| {r["model"]} {r["dtype"]} | {r["batch_size"]} | {r["image_size"]} | '
      f'{r["compile_s"]} | {r["images_per_s"]} | {r["gflop_per_image"]} | {r["mfu"]} |'
      for r in report['train_step']
    ),
    '',
    '| loss kernel (fwd+bwd) | precision | compile s | ms | matmul bound ms | ratio |',
    '|---|---|---|---|---|---|',
    *(
      f'| n = {r["rows"]}, d = {r["dim"]}, block {r["block_size"]} | {r["precision"]} | '
      f'{r["compile_s"]} | {r["loss_ms"]} | {r["matmul_bound_ms"]} | {r["ratio"]} |'
      for r in report['loss']
    ),
    '',
    f'Input: decoded cache {report["input"]["loader_samples_per_s"]} samples/s '
    f'(batch {report["input"]["batch_size"]}).',
    '',
    '| step | consumes samples/s | loader / step |',
    '|---|---|---|',
    *(
      f'| {key} | {value} | {report["input"]["loader_over_step"][key]} |'
      for key, value in report['input']['step_samples_per_s'].items()
    ),
  ]
  return '\n'.join(lines) + '\n'


def main(argv=None):
  args = parse_args(argv)
  out = pathlib.Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  report = dict(environment=environment(args))
  print(json.dumps(report['environment']), flush=True)
  report['matmul_peak_gflops'] = peaks = matmul_peaks(args)
  print(json.dumps(peaks), flush=True)
  report['train_step'] = train_steps(args, peaks)
  report['loss'] = loss_kernels(args, peaks)
  report['input'] = input_pipeline(args, report['train_step'])
  (out / 'accelerator.json').write_text(json.dumps(report, indent=2) + '\n')
  table = markdown(report)
  (out / 'accelerator.md').write_text(table)
  print('\n' + table)


if __name__ == '__main__':
  main()
