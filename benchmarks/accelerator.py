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

# Each size as (the full run, --smoke): the same code runs at both. The smoke run takes one
# dtype, bfloat16, the less common path (float32's matmul peaks are measured anyway).
SIZES = dict(
  models=('resnet18,resnet50', 'small_cnn'),
  dtypes=('float32,bfloat16', 'bfloat16'),
  image_size=(32, 16),
  batch_size=(512, 8),
  steps=(5, 2),
  matmul_size=(8192, 256),
  loss_rows=('16384,65536', '256'),
  loss_block_size=(2048, 128),
  loader_images=(50_000, 512),
  loader_batches=(20, 2),
)
PRECISIONS = ('highest', 'default')


def parse_args(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--out', required=True, help='folder for accelerator.json and .md')
  parser.add_argument('--smoke', action='store_true', help='tiny sizes: checks the script')
  for name, (full, smoke) in SIZES.items():
    parser.add_argument(f'--{name}', type=type(full), help=f'default {full} (smoke: {smoke})')
  args = parser.parse_args(argv)
  for name, (full, smoke) in SIZES.items():
    if getattr(args, name) is None:
      setattr(args, name, smoke if args.smoke else full)
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


def measured(measure, **labels) -> dict:
  """measure()'s row; where it fails (e.g. out of memory), the labels and the error's first
  line, so that one failure does not cost the rest of the run."""
  try:
    row = measure()
  except Exception as error:  # recorded in the report; the run goes on
    first_line = (str(error).strip().splitlines() or [''])[0][:300]
    row = dict(labels, error=f'{type(error).__name__}: {first_line}')
  print(json.dumps(row), flush=True)
  return row


def train_step(model: str, dtype: str, args, peaks: dict) -> dict:
  """bench_train_step's measurement; MFU against the matmul peak of the step's dtype (the
  higher of this run's peak and the one measured next to the step)."""
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
  return result


def loss_kernel(n: int, precision: str, args, peaks: dict) -> dict:
  """Forward+backward of the blockwise H-SCL kernel / the bare matmul bound."""
  z, labels = bench_losses._setup(n)
  step = bench_losses._loss_step(args.loss_block_size, precision)
  start = time.perf_counter()
  compiled = step.lower(z, labels).compile()
  compile_s = time.perf_counter() - start
  jax.block_until_ready(compiled(z, labels))  # warm-up
  seconds = bench_train_step.best_time(compiled, z, labels, repeats=args.steps)
  bound_s = 6 * n * n * bench_losses.DIM / (peaks[f'float32 {precision}'] * 1e9)
  return dict(
    rows=n,
    dim=bench_losses.DIM,
    block_size=args.loss_block_size,
    precision=precision,
    compile_s=round(compile_s, 2),
    loss_ms=round(seconds * 1e3, 3),
    matmul_bound_ms=round(bound_s * 1e3, 3),
    ratio=round(seconds / bound_s, 2),
  )


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
    if 'error' not in step
  }
  return dict(
    loader_samples_per_s=round(rate),
    batch_size=args.batch_size,
    step_samples_per_s={key: round(value, 1) for key, value in consumed.items()},
    loader_over_step={key: round(rate / value, 2) for key, value in consumed.items()},
  )


# The columns of the tables: (header, JSON field).
STEP_COLUMNS = (
  ('batch', 'batch_size'),
  ('px', 'image_size'),
  ('compile s', 'compile_s'),
  ('images/s', 'images_per_s'),
  ('GFLOP/image', 'gflop_per_image'),
  ('MFU', 'mfu'),
)
LOSS_COLUMNS = (
  ('block', 'block_size'),
  ('compile s', 'compile_s'),
  ('ms', 'loss_ms'),
  ('matmul bound ms', 'matmul_bound_ms'),
  ('ratio', 'ratio'),
)


def _table(header: list, rows: list[list]) -> list[str]:
  """A markdown table's lines (none without rows), then a blank line."""
  if not rows:
    return []
  line = lambda cells: '| ' + ' | '.join(str(cell) for cell in cells) + ' |'
  return [line(header), '|' + '---|' * len(header), *map(line, rows), '']


def _cells(row: dict, columns) -> list:
  """The row's fields in the columns' order, or the error it failed with."""
  if 'error' in row:
    return [f'failed: {row["error"]}'] + [''] * (len(columns) - 1)
  return [row[field] for _, field in columns]


def markdown(report: dict) -> str:
  """What the report holds so far as markdown tables (the figures of accelerator.json)."""
  env, steps, loss = report['environment'], report.get('train_step', []), report.get('loss', [])
  lines = [
    f'# Accelerator figures: {env["device_kind"]} ({env["platform"]}, {env["device_count"]} '
    f'device(s), 1 measured)',
    '',
    f'jax {env["jax"]}, jaxlib {env["jaxlib"]}, Python {env["python"]}, {env["date"]}'
    f'{" (--smoke: tiny sizes, not figures)" if env["smoke"] else ""}',
    '',
    *_table(['matmul', 'GFLOP/s'], list(report.get('matmul_peak_gflops', {}).items())),
    *_table(
      ['train step', *(name for name, _ in STEP_COLUMNS)],
      [[f'{r["model"]} {r["dtype"]}', *_cells(r, STEP_COLUMNS)] for r in steps],
    ),
    *_table(
      [f'loss kernel, fwd+bwd, d = {bench_losses.DIM}', 'precision', *(n for n, _ in LOSS_COLUMNS)],
      [[f'n = {r["rows"]}', r['precision'], *_cells(r, LOSS_COLUMNS)] for r in loss],
    ),
  ]
  if 'input' in report:
    flow = report['input']
    lines.append(
      f'Input: decoded cache {flow["loader_samples_per_s"]} samples/s '
      f'(batch {flow["batch_size"]}).\n'
    )
    lines += _table(
      ['step', 'consumes samples/s', 'loader / step'],
      [
        [key, rate, flow['loader_over_step'][key]]
        for key, rate in flow['step_samples_per_s'].items()
      ],
    )
  return '\n'.join(lines)


def main(argv=None):
  args = parse_args(argv)
  out = pathlib.Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  report = dict(environment=environment(args))
  print(json.dumps(report['environment']), flush=True)
  report['matmul_peak_gflops'] = peaks = matmul_peaks(args)
  print(json.dumps(peaks), flush=True)
  report['train_step'] = [
    measured(lambda: train_step(model, dtype, args, peaks), model=model, dtype=dtype)
    for model in args.models.split(',')
    for dtype in args.dtypes.split(',')
  ]
  save(report, out)
  report['loss'] = [
    measured(lambda: loss_kernel(n, precision, args, peaks), rows=n, precision=precision)
    for n in (int(size) for size in args.loss_rows.split(','))
    for precision in PRECISIONS
  ]
  save(report, out)
  report['input'] = input_pipeline(args, report['train_step'])
  print('\n' + save(report, out))


def save(report: dict, out: pathlib.Path) -> str:
  """Writes what is measured so far (a run cut short keeps it); returns the table."""
  (out / 'accelerator.json').write_text(json.dumps(report, indent=2) + '\n')
  table = markdown(report)
  (out / 'accelerator.md').write_text(table)
  return table


if __name__ == '__main__':
  main()
