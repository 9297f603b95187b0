#!/usr/bin/env python3
r"""The paper's grids as training commands, one workdir per run; prints or submits them.

Grid (docs/method.md; the paper's Table I, eq. (4)): methods ucl (SimCLR), hucl (HCL,
beta grid), scl, hscl-exp (H-SCL(beta), beta grid), hscl-threshold (H-SCL(tau), schedule
start x end grid) x seeds x datasets. With the defaults that is 1 + 5 + 1 + 5 + 9 = 21
runs per dataset and seed, 63 for CIFAR-10, CIFAR-100 and STL-10 with one seed (about 630
A100-hours at the paper's 200 epochs, batch 512, ResNet-50).

Examples (from the repository root):
  python launch/sweep.py                                   # print all commands
  python launch/sweep.py --datasets=cifar10 --methods=hscl-exp,scl --seeds=0,1,2
  python launch/sweep.py --datasets=digits --root=/tmp/sweep --set=num_epochs=5 \
      --submit=local                                       # run one after the other here
  python launch/sweep.py --submit=slurm --sbatch_args='--nodes=1 --gpus-per-node=4'
  python launch/sweep.py --submit=tpu --tpu_name=hscl --zone=us-central2-b \
      --accelerator_type=v4-8 --root=gs://bucket/sweep     # runs one after the other
  python launch/sweep.py --format=json                     # machine-readable list

Every command is `python -m hscl_jax.main --config=configs/<dataset>.py --workdir=<root>/
<dataset>/<run>/seed<seed> --config.<field>=<value> ...` (field names of configs/default.py);
--submit wraps it in launch/local.sh, launch/slurm_gpu.sbatch or launch/tpu_vm.sh. A
workdir that already holds checkpoints resumes, so resubmitting a sweep finishes it.
--dry_run prints the submission commands instead of running them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import subprocess
import sys

LAUNCH = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(LAUNCH)
sys.path.insert(0, REPO)  # this checkout's methods table and grid, wherever the script is run from

from hscl_jax.config import methods  # noqa: E402
from hscl_jax.experiments import grid  # noqa: E402

METHODS = methods.Column(lambda rows: [r.sweep_name for r in rows])  # the table's, in order
# The default: the paper's settings (the rows the comparison runs), not the sigmoid family.
COMPARED = methods.Column(lambda rows: [r.sweep_name for r in rows if r.compared])
DATASETS = ('cifar10', 'cifar100', 'stl10')  # the paper's; 'digits' also works


@dataclasses.dataclass(frozen=True)
class Run:
  dataset: str
  name: str  # e.g. hscl-exp_beta0.5
  seed: int
  config: str  # path of the config file, relative to the repository
  workdir: str
  overrides: tuple[tuple[str, object], ...]  # (config field, value)

  def override_args(self) -> list[str]:
    return [f'--config.{field}={_format_value(value)}' for field, value in self.overrides]

  def train_command(self, python: str = 'python') -> list[str]:
    return [
      python,
      '-m',
      'hscl_jax.main',
      f'--config={self.config}',
      f'--workdir={self.workdir}',
      *self.override_args(),
    ]


def _format_value(value) -> str:
  if isinstance(value, bool):
    return str(value)
  if isinstance(value, float):
    return repr(value)  # 0.0, -0.1, 5.0: always parses back as the same float
  return str(value)


def _tag(value: float) -> str:
  return format(value, 'g')


def method_runs(method: str, betas, tau_starts, tau_ends) -> list[tuple[str, list]]:
  """(run name, overrides) of one method (a sweep name of the methods table) over its grid."""
  rows = [r for r in methods.ROWS if r.sweep_name == method]
  if not rows:
    raise ValueError(f'unknown method {method!r}; use one of {", ".join(METHODS)}')
  (row,) = rows
  runs = []
  for point in grid.method_points(row, betas, tau_starts, tau_ends):
    values = {field: float(value) for field, value in point}
    name = method
    if 'beta' in values:
      name += f'_beta{_tag(values["beta"])}'
    if 'tau_start' in values:
      name += f'_tau{_tag(values["tau_start"])}_to{_tag(values["tau_end"])}'
    runs.append((name, [*row.overrides, *values.items()]))
  return runs


def _parse_set(items) -> list[tuple[str, str]]:
  """--set=FIELD=VALUE (repeatable) -> extra overrides of every run, values as given."""
  out = []
  for item in items:
    field, sep, value = item.partition('=')
    if not sep or not field:
      raise ValueError(f'--set expects FIELD=VALUE, got {item!r}')
    out.append((field.removeprefix('config.'), value))
  return out


def build_runs(args) -> list[Run]:
  runs = []
  extra = _parse_set(args.set)
  for dataset in args.datasets:
    config = os.path.join('configs', f'{dataset}.py')
    if not os.path.exists(os.path.join(REPO, config)):
      raise ValueError(f'no config file {config} for dataset {dataset!r}')
    for method in args.methods:
      for name, overrides in method_runs(method, args.betas, args.tau_starts, args.tau_ends):
        for seed in args.seeds:
          all_overrides = overrides + [('seed', seed)]
          if args.positive_mode:
            all_overrides.append(('positive_mode', args.positive_mode))
          all_overrides += extra
          workdir = '/'.join([args.root.rstrip('/'), dataset, name, f'seed{seed}'])
          runs.append(Run(dataset, name, seed, config, workdir, tuple(all_overrides)))
  workdirs = [run.workdir for run in runs]
  if len(set(workdirs)) != len(workdirs):
    raise ValueError('two runs share a workdir; remove duplicated grid values')
  return runs


def submit_command(run: Run, args) -> list[str]:
  """The command that runs (or queues) `run` through one of the launch scripts."""
  rest = [run.config, run.workdir, *run.override_args()]
  if args.submit == 'local':
    return [os.path.join(LAUNCH, 'local.sh'), *rest]
  if args.submit == 'slurm':
    job = f'hscl_{run.dataset}_{run.name}_s{run.seed}'
    return [
      'sbatch',
      f'--job-name={job}',
      *shlex.split(args.sbatch_args),
      os.path.join(LAUNCH, 'slurm_gpu.sbatch'),
      *rest,
    ]
  if args.submit == 'tpu':
    missing = [f'--{n}' for n in ('tpu_name', 'zone', 'accelerator_type') if not getattr(args, n)]
    if missing:
      raise ValueError(f'--submit=tpu needs {", ".join(missing)}')
    return [
      os.path.join(LAUNCH, 'tpu_vm.sh'),
      args.tpu_name,
      args.zone,
      args.accelerator_type,
      *rest,
    ]
  raise ValueError(f'unknown --submit {args.submit!r}')


def _csv(kind):
  def parse(text):
    return tuple(kind(x) for x in text.split(',') if x.strip())

  return parse


def parse_args(argv=None):
  p = argparse.ArgumentParser(
    description=__doc__.split('\n', 1)[0],
    formatter_class=argparse.RawDescriptionHelpFormatter,
    epilog=__doc__.split('\n', 1)[1],
  )
  p.add_argument('--datasets', type=_csv(str), default=DATASETS)
  p.add_argument(
    '--methods',
    type=_csv(str),
    default=COMPARED,
    help=f"{', '.join(METHODS)} (default: the paper's, {', '.join(COMPARED)})",
  )
  p.add_argument('--betas', type=_csv(float), default=methods.BETA_GRID, help='hucl and hscl-exp')
  p.add_argument(
    '--tau_starts', type=_csv(float), default=methods.TAU_STARTS, help='hscl-threshold'
  )
  p.add_argument('--tau_ends', type=_csv(float), default=methods.TAU_ENDS, help='hscl-threshold')
  p.add_argument('--seeds', type=_csv(int), default=(0,))
  p.add_argument(
    '--positive_mode',
    choices=('augmentation', 'label'),
    default=None,
    help="'label' = the Lemma 1 experiment (positives from labels)",
  )
  p.add_argument(
    '--set',
    action='append',
    default=[],
    metavar='FIELD=VALUE',
    help='extra override of every run, e.g. --set=num_epochs=50 (repeatable)',
  )
  p.add_argument('--root', default='runs', help='parent of the workdirs (path or gs://)')
  p.add_argument('--format', choices=('shell', 'json'), default='shell')
  p.add_argument('--python', default='python', help='interpreter in the printed commands')
  p.add_argument('--submit', choices=('none', 'local', 'slurm', 'tpu'), default='none')
  p.add_argument('--dry_run', action='store_true', help='print the submission commands')
  p.add_argument('--sbatch_args', default='', help='extra sbatch options (--submit=slurm)')
  p.add_argument('--tpu_name', default=None)
  p.add_argument('--zone', default=None)
  p.add_argument('--accelerator_type', default=None)
  args = p.parse_args(argv)
  unknown = sorted(set(args.methods) - set(METHODS))
  if unknown:
    p.error(f'unknown method(s) {", ".join(unknown)}; use {", ".join(METHODS)}')
  return args


def main(argv=None) -> int:
  args = parse_args(argv)
  try:
    runs = build_runs(args)
    commands = (
      [submit_command(run, args) for run in runs]
      if args.submit != 'none'
      else [run.train_command(args.python) for run in runs]
    )
  except ValueError as e:
    print(f'sweep.py: error: {e}', file=sys.stderr)
    return 2
  if args.submit == 'none' or args.dry_run:
    if args.format == 'json':
      json.dump(
        [
          {**dataclasses.asdict(run), 'overrides': run.override_args(), 'command': command}
          for run, command in zip(runs, commands)
        ],
        sys.stdout,
        indent=1,
      )
      print()
    else:
      for command in commands:
        print(shlex.join(command))
    return 0
  failed = []
  for i, (run, command) in enumerate(zip(runs, commands), 1):
    print(f'[{i}/{len(runs)}] {shlex.join(command)}', flush=True)
    code = subprocess.call(command, cwd=REPO)
    if code != 0:
      print(f'sweep.py: {run.workdir} exited with {code}', file=sys.stderr, flush=True)
      failed.append(run.workdir)
  if failed:
    print(
      f'sweep.py: {len(failed)} of {len(runs)} runs failed:', *failed, sep='\n  ', file=sys.stderr
    )
    return 1
  return 0


if __name__ == '__main__':
  sys.exit(main())
