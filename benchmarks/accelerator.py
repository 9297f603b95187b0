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
  the samples/s each train step consumes, and their ratio (>= 1: the host keeps up);
- PyTorch on the same GPU (`torch_reference.py`, in a process of its own, first, before
  JAX takes the GPU's memory; at most --torch_timeout_s): the same models, batch and image
  size, float32 (TF32) and bfloat16 autocast with channels_last, eager and torch.compile'd;
  then per model x dtype the ratio JAX images/s / the fastest PyTorch variant's. What each
  side includes differs: the JAX step augments both views on the device (timed alone as
  `augment_ms`; `jax_without_augment_over_torch` takes it out) and computes the
  diagnostics; PyTorch's reads random images already on the device. Skipped, with the
  reason in the report, without PyTorch or without a CUDA device (--torch_device=auto);
  --torch_device=cpu runs it on the CPU (the smoke test does), off skips it.

--smoke runs the same code at tiny sizes (small_cnn at 16 px in bfloat16, batch 8, n = 256,
PyTorch eager only) on any platform, in seconds; tests/test_benchmarks.py runs it, so the
script cannot rot.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import pathlib
import platform
import signal
import subprocess
import sys
import time

import jax
import jaxlib
import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))  # the sibling scripts

import bench_input  # noqa: E402
import bench_losses  # noqa: E402
import bench_train_step  # noqa: E402
from rows import measured  # noqa: E402

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
  torch_variants=('eager,compile', 'eager'),
  torch_timeout_s=(240, 120),
)
PRECISIONS = ('highest', 'default')


def parse_args(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--out', required=True, help='folder for accelerator.json and .md')
  parser.add_argument('--smoke', action='store_true', help='tiny sizes: checks the script')
  parser.add_argument(
    '--torch_device',
    default='auto',
    choices=('auto', 'cuda', 'cpu', 'off'),
    help='PyTorch beside JAX: auto = on CUDA when PyTorch sees it, else skipped',
  )
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


def torch_reference(args) -> dict:
  """torch_reference.py's rows (in a process of its own: PyTorch's memory is freed before
  JAX starts), or why they are missing: {'environment', 'rows'} or {'skipped'}."""
  if args.torch_device == 'off':
    return dict(skipped='--torch_device=off')
  if importlib.util.find_spec('torch') is None:
    return dict(skipped='PyTorch is not installed (pip install torch)')
  script = pathlib.Path(__file__).resolve().parent / 'torch_reference.py'
  sizes = dict(
    device=args.torch_device,
    models=args.models,
    # bfloat16 first: the compiled rows come last, and a time limit may cut the last ones
    dtypes=','.join(sorted(args.dtypes.split(','), key=lambda dtype: dtype != 'bfloat16')),
    variants=args.torch_variants,
    batch_size=args.batch_size,
    image_size=args.image_size,
    steps=args.steps,
  )
  command = [sys.executable, str(script), *(f'--{key}={value}' for key, value in sizes.items())]
  proc = subprocess.Popen(
    command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
  )
  try:
    stdout, stderr = proc.communicate(timeout=args.torch_timeout_s)
    ended = f'exit status {proc.returncode}'
  except subprocess.TimeoutExpired:  # the rows printed so far still count
    os.killpg(proc.pid, signal.SIGKILL)  # torch.compile's worker processes too
    stdout, stderr = proc.communicate()
    ended = f'stopped after --torch_timeout_s={args.torch_timeout_s}'
  lines = [json.loads(line) for line in stdout.splitlines() if line.startswith('{')]
  result = {key: line[key] for line in lines for key in ('environment', 'skipped') if key in line}
  if 'skipped' in result:
    return result
  result['rows'] = [line for line in lines if 'model' in line]
  if ended != 'exit status 0':
    last = (stderr.strip().splitlines() or [''])[-1][:300]  # e.g. the error it died of
    result['ended'] = f'{ended}: {last}' if last else ended
  print(json.dumps(result), flush=True)
  return result


def jax_over_torch(steps: list[dict], torch_part: dict, platform_name: str) -> list[dict]:
  """Per model x dtype measured on both sides: JAX images/s / the fastest PyTorch variant's,
  with and without the JAX step's augmentation (its step time less augment_ms); none where
  PyTorch did not run or ran on another kind of device than JAX."""
  torch_device = torch_part.get('environment', {}).get('device')
  if torch_device is None or (platform_name == 'gpu') != (torch_device == 'cuda'):
    return []
  ratios = []
  for step in steps:
    torch_rows = [
      row
      for row in torch_part['rows']
      if (row['model'], row['dtype']) == (step.get('model'), step.get('dtype'))
      and 'error' not in row
    ]
    if 'error' in step or not torch_rows:
      continue
    fastest = max(torch_rows, key=lambda row: row['images_per_s'])
    without_augment = step['images_per_step'] / (step['step_s_best'] - step['augment_ms'] / 1e3)
    ratios.append(
      dict(
        model=step['model'],
        dtype=step['dtype'],
        jax_images_per_s=step['images_per_s'],
        torch_images_per_s=fastest['images_per_s'],
        torch_variant=fastest['variant'],
        jax_over_torch=round(step['images_per_s'] / fastest['images_per_s'], 3),
        jax_without_augment_over_torch=round(without_augment / fastest['images_per_s'], 3),
      )
    )
  return ratios


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
TORCH_COLUMNS = (('variant', 'variant'), ('warm-up s', 'warmup_s'), ('images/s', 'images_per_s'))
RATIO_COLUMNS = (
  ('JAX images/s', 'jax_images_per_s'),
  ('fastest PyTorch images/s', 'torch_images_per_s'),
  ('its variant', 'torch_variant'),
  ('JAX / PyTorch', 'jax_over_torch'),
  ('without JAX augmentation', 'jax_without_augment_over_torch'),
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
  lines += _torch_lines(report)
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


def _torch_lines(report: dict) -> list[str]:
  """The PyTorch rows and the JAX / PyTorch ratios, or why PyTorch was not run."""
  part = report.get('torch')
  if part is None:
    return []
  if 'skipped' in part:
    return [f'PyTorch: skipped ({part["skipped"]}).', '']
  env = part.get('environment', {})
  lines = [
    f'PyTorch {env.get("torch")} on {env.get("device_name")} (the same step, random images '
    'on the device, no augmentation; float32 with TF32 on CUDA, bfloat16 autocast with '
    f'channels_last){"; " + part["ended"] if "ended" in part else ""}.',
    '',
    *_table(
      ['PyTorch step', *(name for name, _ in TORCH_COLUMNS)],
      [[f'{r["model"]} {r["dtype"]}', *_cells(r, TORCH_COLUMNS)] for r in part['rows']],
    ),
  ]
  return lines + _table(
    ['JAX vs PyTorch', *(name for name, _ in RATIO_COLUMNS)],
    [[f'{r["model"]} {r["dtype"]}', *_cells(r, RATIO_COLUMNS)] for r in report.get('ratio', [])],
  )


def main(argv=None):
  args = parse_args(argv)
  out = pathlib.Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  torch_part = torch_reference(args)  # first: its process ends before JAX takes the GPU
  report = dict(environment=environment(args), torch=torch_part)
  print(json.dumps(report['environment']), flush=True)
  save(report, out)
  report['matmul_peak_gflops'] = peaks = matmul_peaks(args)
  print(json.dumps(peaks), flush=True)
  report['train_step'] = []
  for model in args.models.split(','):
    for dtype in args.dtypes.split(','):
      step = measured(lambda: train_step(model, dtype, args, peaks), model=model, dtype=dtype)
      report['train_step'].append(step)
      report['ratio'] = jax_over_torch(
        report['train_step'], torch_part, report['environment']['platform']
      )
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
