"""The first ten minutes on a GPU node, one command: every accelerator figure and a CIFAR-10 run.

    python3 tools/first_light.py --out=OUT                 # on the node (~9 minutes)
    python tools/first_light.py --out=OUT --smoke --data=FOLDER --torch_device=cpu  # the test

Each step runs in a process of its own, under its own time limit, and none needs the one
before it to have succeeded:

1. install: `tools/gpu_bundle.py install` when bundle/ is there: its wheels into a target
   folder that the later steps get on PYTHONPATH, and CIFAR-10 unpacked unless --data
   names the image folder already;
2. devices: jax.devices() and nvidia-smi;
3. accelerator: `benchmarks/accelerator.py --out=OUT` in full (its figures are saved as
   they come, so a step cut at its limit keeps what it measured);
4. plan: the training's epochs from the samples/s of the ResNet-18 bfloat16 step just
   measured (or, where that is missing, from `bench_train_step.py` run now; or 1 epoch),
   the slower of it and the loader's, times --efficiency, over the time left once the
   reserves are taken off; so the cosine schedule knows its end;
5. train: `python -m hscl_jax.main --config=configs/cifar10_folder.py` with ResNet-18,
   H-SCL(beta = 1) (the config's method), bfloat16, batch 512, the whole training split,
   the planned epochs, the kNN monitor and a checkpoint every quarter of them; at its limit
   it gets SIGTERM, saves a checkpoint and stops;
6. linear evaluation of the last checkpoint (`python -m hscl_jax.linear_eval`).

OUT then holds at most 8 files: accelerator.json and .md, first_light.json and .md (the
steps, their seconds and status, the plan and what the run reached), the run's
metrics.jsonl, config.json and linear_eval.json, and first_light.log (every step's output,
also printed). --smoke: small_cnn at batch 8, at most --max_epochs, the accelerator's
--smoke: checks the whole chain on a CPU in about a minute (tests/test_first_light.py).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import threading
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
RUN_FILES = ('metrics.jsonl', 'config.json', 'linear_eval.json')  # copied from the workdir
# The training (the full run, --smoke).
TRAIN = dict(model=('resnet18', 'small_cnn'), batch_size=(512, 8))
DTYPE = 'bfloat16'
DEVICES = (  # the devices as JAX sees them, and nvidia-smi's list where there is one
  'import jax, shutil, subprocess; print("jax", jax.__version__, jax.devices()); '
  'print("device kind:", jax.devices()[0].device_kind); '
  'shutil.which("nvidia-smi") and subprocess.run(["nvidia-smi", "-L"])'
)


def parse_args(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--out', required=True, help='the (at most 8) files go here')
  parser.add_argument('--budget_s', type=float, default=540, help='wall time of all steps')
  parser.add_argument('--accelerator_s', type=float, default=300, help="the benchmark's limit")
  parser.add_argument('--torch_timeout_s', type=float, default=100, help="PyTorch's part of it")
  parser.add_argument(
    '--torch_device',
    default='auto',
    choices=('auto', 'cuda', 'cpu', 'off'),
    help='passed to accelerator.py',
  )
  parser.add_argument('--bundle', default=str(REPO / 'bundle'), help='tools/gpu_bundle.py build')
  parser.add_argument('--data', help='CIFAR-10 image folder (default: the bundle, unpacked)')
  parser.add_argument('--work', default='/tmp/hscl_first_light', help='site, data, the run')
  parser.add_argument('--startup_s', type=float, default=90, help='reserve: start, decode, compile')
  parser.add_argument('--knn_s', type=float, default=5, help='reserve: one kNN evaluation')
  parser.add_argument('--linear_eval_s', type=float, default=75, help='reserve: the linear eval')
  parser.add_argument('--efficiency', type=float, default=0.8, help='of the step rate, planned')
  parser.add_argument('--max_epochs', type=int, default=200)
  parser.add_argument('--smoke', action='store_true', help='tiny sizes, for the test on a CPU')
  return parser.parse_args(argv)


class Log:
  """Every line to OUT/first_light.log and to stdout; a step's lines kept for its caller."""

  def __init__(self, path: pathlib.Path):
    self.file = open(path, 'a', buffering=1)  # noqa: SIM115 (open for the whole run)
    self.lock = threading.Lock()

  def write(self, text: str) -> None:
    with self.lock:
      self.file.write(text)
      sys.stdout.write(text)
      sys.stdout.flush()

  def line(self, text: str) -> None:
    self.write(f'[first_light {time.strftime("%H:%M:%S")}] {text}\n')


def run_step(name: str, command: list[str], limit_s: float, log: Log, env: dict):
  """Runs command for at most limit_s (then SIGTERM; SIGKILL to its process group 60 s
  later), its output into the log. Returns (the step's record, its output lines)."""
  log.line(f'{name}: {" ".join(command)} (limit {limit_s:.0f} s)')
  if limit_s < 1:
    log.line(f'{name}: skipped, no time left')
    return dict(step=name, status='skipped: no time left', seconds=0.0), []
  start, lines, status = time.monotonic(), [], None
  proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, start_new_session=True)  # fmt: skip
  pump = threading.Thread(target=lambda: [(lines.append(x), log.write(x)) for x in proc.stdout])
  pump.start()
  try:
    proc.wait(timeout=limit_s)
  except subprocess.TimeoutExpired:
    status = f'stopped at its limit of {limit_s:.0f} s'
    proc.send_signal(signal.SIGTERM)  # the training saves a checkpoint on it
    try:
      proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
      os.killpg(proc.pid, signal.SIGKILL)
      proc.wait()
  pump.join()
  seconds = round(time.monotonic() - start, 1)
  status = status or ('ok' if proc.returncode == 0 else f'failed: exit status {proc.returncode}')
  log.line(f'{name}: {status} after {seconds} s')
  return dict(step=name, status=status, seconds=seconds), lines


def read_json(path: pathlib.Path) -> dict:
  try:
    return json.loads(path.read_text())
  except (OSError, ValueError):
    return {}


def measured_rate(out: pathlib.Path, model: str) -> dict:
  """The training step's samples/s in OUT/accelerator.json (and the loader's), or {}."""
  report = read_json(out / 'accelerator.json')
  for step in report.get('train_step', []):
    if (step.get('model'), step.get('dtype')) == (model, DTYPE) and 'images_per_s' in step:
      rate = dict(step_samples_per_s=step['images_per_s'] / 2, source='accelerator.json')
      if 'loader_samples_per_s' in report.get('input', {}):
        rate['loader_samples_per_s'] = report['input']['loader_samples_per_s']
      return rate
  return {}


def bench_rate(model: str, batch_size: int, limit_s: float, log: Log, env: dict):
  """(the step's samples/s from bench_train_step.py run now, or {}; the step's record)."""
  command = [sys.executable, 'benchmarks/bench_train_step.py', f'--models={model}',
             f'--batch_size={batch_size}', f'--dtype={DTYPE}', '--steps=3',
             '--matmul_size=1024']  # fmt: skip
  record, lines = run_step('step rate', command, limit_s, log, env)
  for line in lines:
    if line.startswith('{') and json.loads(line).get('model') == model:
      return dict(
        step_samples_per_s=json.loads(line)['images_per_s'] / 2, source=command[1]
      ), record
  return {}, record


def plan_epochs(rate: dict, seconds_left: float, examples: int, args) -> dict:
  """Epochs that fit: the time left less the reserves, at --efficiency of the slower of
  the step and the loader; the kNN monitor and a checkpoint every quarter of them."""
  usable = min(rate.get('step_samples_per_s', 0), rate.get('loader_samples_per_s', math.inf))
  train_s = seconds_left - args.startup_s - args.linear_eval_s - 5 * args.knn_s
  epoch_s = examples / (usable * args.efficiency) if usable > 0 else math.inf
  fit = math.floor(train_s / epoch_s) if train_s > 0 else 0
  epochs = min(max(fit, 1), args.max_epochs)
  return dict(
    **rate,
    examples=examples,
    seconds_left=round(seconds_left, 1),
    train_s=round(train_s, 1),
    epoch_s=round(epoch_s, 2) if usable > 0 else None,  # None: no rate measured
    efficiency=args.efficiency,
    epochs=epochs,
    every_epochs=max(epochs // 4, 1),
  )


def train_command(data: str, workdir: pathlib.Path, plan: dict, args) -> list[str]:
  full = 0 if not args.smoke else 1
  overrides = dict(
    folder=data,
    train_examples=0,  # the whole split
    batch_size=TRAIN['batch_size'][full],
    num_epochs=plan['epochs'],
    **{'model.name': TRAIN['model'][full], 'model.dtype': DTYPE},
    **{'knn.every_epochs': plan['every_epochs'], 'checkpoint_every_epochs': plan['every_epochs']},
    **{'linear_eval.batch_size': TRAIN['batch_size'][full], 'log_every_steps': 50},
  )
  if args.smoke:  # a bank of a few dozen images
    overrides.update({'knn.k': 5, 'knn.batch_size': 8, 'linear_eval.num_epochs': 2})
  return [sys.executable, '-m', 'hscl_jax.main', '--config=configs/cifar10_folder.py',
          f'--workdir={workdir}', *(f'--config.{k}={v}' for k, v in overrides.items())]  # fmt: skip


def count_images(split: pathlib.Path) -> int:
  """Files under split/<class>/ (the examples of an epoch), 0 where there is no folder."""
  if not split.is_dir():
    return 0
  return sum(len(os.listdir(folder)) for folder in split.iterdir() if folder.is_dir())


def run_summary(workdir: pathlib.Path) -> dict:
  """What the training reached: epochs, minutes, throughput, every kNN, the linear eval."""
  path = workdir / 'metrics.jsonl'
  records = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
  summary = dict(epochs_done=records[-1]['epoch'] if records else 0)
  if records:
    rates = sorted(record['samples_per_second'] for record in records)
    summary.update(
      train_minutes=round(sum(record['epoch_time'] for record in records) / 60, 2),
      median_samples_per_s=round(rates[len(rates) // 2], 1),
      knn_top1={record['epoch']: record['knn_top1'] for record in records if 'knn_top1' in record},
      last_train_loss=records[-1].get('train_loss'),
    )
  linear = read_json(workdir / 'linear_eval.json')
  if linear:
    summary['linear_eval'] = {key: linear[key] for key in ('top1', 'top5', 'num_epochs', 'seconds')}
  return summary


def markdown(summary: dict) -> str:
  line = lambda cells: '| ' + ' | '.join(str(cell) for cell in cells) + ' |'
  plan, run = summary.get('plan', {}), summary.get('run', {})
  lines = [
    f'# First light: {summary["date"]}{" (--smoke: not figures)" if summary["smoke"] else ""}',
    '',
    *summary.get('devices', []),
    '',
    line(['step', 'status', 'seconds']),
    '|---|---|---|',
    *(line([s['step'], s['status'], s['seconds']]) for s in summary['steps']),
    '',
    f'Plan: {plan.get("epochs")} epochs of {plan.get("examples")} examples (kNN and checkpoint '
    f'every {plan.get("every_epochs")}) from {plan.get("step_samples_per_s")} samples/s '
    f'({plan.get("source", "no rate measured")}) x {plan.get("efficiency")}, '
    f'{plan.get("train_s")} s to train.',
    '',
    f'Run ({summary["training"]}): {run.get("epochs_done")} epochs in '
    f'{run.get("train_minutes")} min of training, {run.get("median_samples_per_s")} samples/s '
    f'(median epoch); kNN top-1 by epoch {run.get("knn_top1")}; linear evaluation '
    f'{run.get("linear_eval", "none")}.',
    '',
  ]
  return '\n'.join(lines)


def environment(site: pathlib.Path) -> dict:
  paths = [str(site), os.environ.get('PYTHONPATH', '')]
  return dict(os.environ, PYTHONUNBUFFERED='1', PYTHONPATH=os.pathsep.join(p for p in paths if p))


def unpack(args, work: pathlib.Path, log: Log, env: dict, steps: list) -> str:
  """The bundle's wheels installed (where there is a bundle) and its CIFAR-10 unpacked,
  unless --data names the folder (unpacking it costs half a minute); the data folder."""
  data = args.data or str(work / 'data')
  if pathlib.Path(args.bundle).is_dir():
    command = [sys.executable, 'tools/gpu_bundle.py', f'--bundle={args.bundle}', 'install',
               f'--site={work / "site"}', f'--data_to={work / "data"}',
               f'--data_sets={"" if args.data else "cifar10"}']  # fmt: skip
    steps.append(run_step('install', command, 120, log, env)[0])
  return data


def main(argv=None):
  args = parse_args(argv)
  deadline = time.monotonic() + args.budget_s
  left = lambda: deadline - time.monotonic()
  out, work = pathlib.Path(args.out), pathlib.Path(args.work)
  out.mkdir(parents=True, exist_ok=True)
  work.mkdir(parents=True, exist_ok=True)
  log, env, steps = Log(out / 'first_light.log'), environment(work / 'site'), []
  model, batch_size = (TRAIN[key][int(args.smoke)] for key in ('model', 'batch_size'))
  summary = dict(
    date=datetime.datetime.now(datetime.UTC).strftime('%Y-%m-%d %H:%M UTC'),
    budget_s=args.budget_s,
    smoke=args.smoke,
    training=f'{model}, H-SCL(beta=1), {DTYPE}, batch {batch_size}, configs/cifar10_folder.py',
    steps=steps,
  )
  data = unpack(args, work, log, env, steps)
  record, lines = run_step('devices', [sys.executable, '-c', DEVICES], min(60, left()), log, env)
  steps.append(record)
  summary['devices'] = [line.strip() for line in lines if line.strip()][-20:]
  accelerator = [sys.executable, 'benchmarks/accelerator.py', f'--out={out}',
                 f'--torch_device={args.torch_device}', *(['--smoke'] * args.smoke),
                 f'--torch_timeout_s={int(args.torch_timeout_s)}']  # fmt: skip
  limit = min(args.accelerator_s, left() - args.startup_s - args.linear_eval_s - 60)
  steps.append(run_step('accelerator', accelerator, limit, log, env)[0])
  rate = measured_rate(out, model)
  if not rate:
    rate, record = bench_rate(model, batch_size, min(150, left() - 200), log, env)
    steps.append(record)
  summary['plan'] = plan = plan_epochs(
    rate, left(), count_images(pathlib.Path(data) / 'train'), args
  )
  log.line(f'plan: {json.dumps(plan)}')
  workdir = work / 'run'
  shutil.rmtree(workdir, ignore_errors=True)  # a fresh run: its schedule is this plan's
  train = train_command(data, workdir, plan, args)
  steps.append(run_step('train', train, left() - args.linear_eval_s, log, env)[0])
  evaluate = [sys.executable, '-m', 'hscl_jax.linear_eval', f'--workdir={workdir}']
  steps.append(run_step('linear eval', evaluate, left() - 5, log, env)[0])
  for name in RUN_FILES:
    if (workdir / name).exists():
      shutil.copy(workdir / name, out / name)
  summary['run'] = run_summary(workdir)
  (out / 'first_light.json').write_text(json.dumps(summary, indent=2) + '\n')
  (out / 'first_light.md').write_text(markdown(summary))
  log.line(f'done in {args.budget_s - left():.0f} s: {out}')
  log.write(markdown(summary))


if __name__ == '__main__':
  main()
