"""The paper's comparison (Table I, Figs. 1, 4, 5) on any config as a grid: its settings,
its plan of runs, the runs themselves, and a sweep's points read back from their records.

The library behind `python -m hscl_jax.experiments.compare`. The settings are the methods
table's (hscl_jax/config/methods.py) compared rows, with the β grid {0.1, 0.5, 1, 2, 5}
for H-UCL and H-SCL(β), eq. (4)'s start × end τ grid for H-SCL(τ), the queue runs and the
supervised sigmoid rows (`sigmoid`: Sig-SCL, Sig-H-SCL(β)) where asked; each run's config
and directory follow from a setting and a seed (launch/sweep.py's training commands read
the same settings). Each run is trained (or resumed, or reused when finished),
linear-evaluated and recorded (experiments/run_records: beside the report, or where the
records are asked for); a run whose workdir another process holds is skipped, so several
processes can share one grid. A sweep is several comparisons of one config that
differ in one field (`samples_per_class`, `num_epochs`): its points (`VALUE=REPORT_DIR`)
are read back from their records alone. The reports are experiments/reports, with the
paired differences (experiments/paired) and the plots (experiments/plots).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import time

from absl import logging
import ml_collections

from hscl_jax import progress
from hscl_jax.config import methods
from hscl_jax.evaluation import linear_evaluation
from hscl_jax.experiments import run_records
from hscl_jax.rundir import layout
from hscl_jax.rundir import lock as workdir_lock
from hscl_jax.rundir import metrics
from hscl_jax.rundir import stored_config
from hscl_jax.rundir import trained_run
from hscl_jax.rundir import versions
from hscl_jax.training import loop
from hscl_jax.training import preemption

METHODS = methods.COMPARED_LABELS  # the paper labels of the table's compared rows, in its order


INSPECT_DIR = 'inspect'  # RUN/inspect: where the report looks for a run's inspect figures


@dataclasses.dataclass(frozen=True)
class Setting:
  """One method (a paper label of the methods table) with one hyperparameter choice;
  `overrides` are config fields."""

  method: str
  overrides: tuple[tuple[str, object], ...]

  @property
  def label(self) -> str:
    hyper = [f'{k}={v}' for k, v in self.overrides if k in methods.GRID_FIELDS]
    if self.queue_size:
      hyper.append(f'queue {self.queue_size}, m={self.queue_momentum}')
    return f'{self.method} ({", ".join(hyper)})' if hyper else self.method

  @property
  def slug(self) -> str:
    parts = [methods.by_label(self.method).slug]
    parts += [f'{k}{v}' for k, v in self.overrides if k in methods.GRID_FIELDS]
    parts += [f'queue{self.queue_size}'] if self.queue_size else []
    parts += [f'm{self.queue_momentum}'] if self.queue_momentum else []
    return '_'.join(parts)

  @property
  def queue_size(self) -> int:
    return dict(self.overrides).get('queue_size', 0)

  @property
  def queue_momentum(self) -> float:
    return dict(self.overrides).get('queue_momentum', 0.0)

  def without_queue(self) -> Setting:
    return Setting(self.method, tuple(o for o in self.overrides if o[0] not in QUEUE_FIELDS))


# The queue experiment (--grid=queue): SCL and H-SCL(β) again with a queue of about this
# many negatives (a multiple of a step's 2 x batch_size rows) filled by a momentum key
# encoder, against the same runs without one. Momentum 0.99, not MoCo's 0.999: a few
# hundred steps only. With momentum 0 (the online projections of the last 16 steps as
# negatives) SCL on the CIFAR-10 CPU budget fell from 53 % to 32 % linear top-1
# (docs/results/cifar10/reading.md), as MoCo reports for m = 0.
QUEUE_NEGATIVES = 4096


QUEUE_MOMENTUM = 0.99


QUEUE_FIELDS = ('queue_size', 'queue_momentum')


def queue_size_for(config: ml_collections.ConfigDict) -> int:
  rows = 2 * config.batch_size
  return rows * max(1, round(QUEUE_NEGATIVES / rows))


def method_points(
  row: methods.Method,
  betas=methods.BETA_GRID,
  tau_starts=methods.TAU_STARTS,
  tau_ends=methods.TAU_ENDS,
) -> list[tuple]:
  """A methods table row's grid points (config fields): one per β, per τ schedule of the
  starts × ends, or one empty one; the paper's grids by default (launch/sweep.py's too)."""
  return row.grid(betas, list(itertools.product(tau_starts, tau_ends)))


def sigmoid_rows() -> list[methods.Method]:
  """The methods table's supervised sigmoid rows, which `--grid=sigmoid` adds."""
  return [row for row in methods.ROWS if row.family == 'sigmoid' and row.supervised]


def compared_rows(grids: set[str]) -> list[methods.Method]:
  """The rows a comparison runs: the table's compared rows, with `sigmoid_rows` where asked."""
  extra = sigmoid_rows() if 'sigmoid' in grids else []
  return [row for row in methods.ROWS if row.compared or row in extra]


def report_pairs(grids: set[str]) -> tuple[tuple[str, str], ...]:
  """The pairs a comparison's report tests: the sigmoid family's question with
  `--grid=sigmoid`, the paper's claims otherwise."""
  return methods.SIGMOID_PAIRS if 'sigmoid' in grids else methods.PAIRS


def settings(config: ml_collections.ConfigDict, grids: set[str]) -> list[Setting]:
  """The methods of Table I (with the supervised sigmoid rows for `--grid=sigmoid`), with
  the β / τ grids where asked and the config's values otherwise."""
  betas = methods.BETA_GRID if 'beta' in grids else (config.beta,)
  if 'tau' in grids:
    starts, ends = methods.TAU_STARTS, methods.TAU_ENDS
  else:
    starts, ends = (config.tau_start,), (config.tau_end,)
  out = [
    Setting(row.label, row.overrides + point)
    for row in compared_rows(grids)
    for point in method_points(row, betas, starts, ends)
  ]
  if 'queue' in grids:
    queue = (('queue_size', queue_size_for(config)), ('queue_momentum', QUEUE_MOMENTUM))
    out += [Setting(s.method, s.overrides + queue) for s in out if methods.by_label(s.method).queue]
  # The table's order; stable, so a queue run follows its own setting.
  return sorted(out, key=lambda s: methods.LABELS.index(s.method))


def run_config(base: ml_collections.ConfigDict, setting: Setting, seed: int, protocol=None):
  """The config of one run (with the comparison's linear-evaluation protocol, if given)."""
  config = ml_collections.ConfigDict(base.to_dict())
  for key, value in setting.overrides:
    config[key] = value
  config.seed = seed
  if protocol is not None:
    config.linear_eval.protocol = protocol
  return config


def run_dir(root: str, setting: Setting, seed: int) -> str:
  return os.path.join(root, setting.slug, f'seed{seed}')


def dataset_label(config) -> str:
  """'cifar10', or for an image folder 'image_folder (<its directory name>)'."""
  if config.dataset == 'image_folder' and config.folder:
    return f'image_folder ({os.path.basename(os.path.normpath(config.folder))})'
  return config.dataset


GRIDS = ('beta', 'tau', 'queue', 'sigmoid')


def method_slug(method: str) -> str:
  """'H-SCL(β)' -> 'hscl_beta': a method's name as a run directory and --seeds_for spell it."""
  return Setting(method, ()).slug


def plan_runs(config, seeds: list[int], grids: set[str], seeds_for: dict[str, int] | None = None):
  """(setting, seed) pairs, seed by seed (seed 0 of every setting first). `seeds_for` maps
  a method's slug (the methods table's: ucl, hucl, scl, hscl_beta, hscl_tau; sig_scl,
  sig_hscl_beta with --grid=sigmoid) to its own number of seeds (0, 1, ...), e.g. more
  seeds for the pair a claim rests on, 0 for a method left out; others get `seeds`."""
  seeds_for = seeds_for or {}
  known = [row.slug for row in compared_rows(grids)]
  unknown = sorted(set(seeds_for) - set(known))
  if unknown:
    raise ValueError(f'--seeds_for names unknown methods {unknown}; use {", ".join(known)}')
  count = lambda s: seeds_for.get(method_slug(s.method), len(seeds))
  last = max([len(seeds), *seeds_for.values()])
  return [(s, seed) for seed in range(last) for s in settings(config, grids) if seed < count(s)]


def describe_seeds(plan) -> list[str]:
  """The report's seeds: those of every method, then the methods given more by --seeds_for,
  e.g. ['0', '1', '2 (0-4 for SCL, H-SCL(β))']."""
  by_method: dict[str, set[int]] = {}
  for setting, seed in plan:
    by_method.setdefault(setting.method, set()).add(seed)
  common = sorted(set.intersection(*by_method.values()))
  more = {m: sorted(s) for m, s in by_method.items() if len(s) > len(common)}
  text = [str(seed) for seed in common]
  for count in sorted({len(s) for s in more.values()}):
    methods = [m for m, s in more.items() if len(s) == count]
    seeds = next(s for s in more.values() if len(s) == count)
    text[-1] += f' ({seeds[0]}-{seeds[-1]} for {", ".join(methods)})'
  return text


# The linear evaluation's settings a finished run's linear_eval.json must have been made with.
LINEAR_EVAL_KEYS = ('protocol', 'num_epochs', 'learning_rate', 'weight_decay', 'batch_size')


def finished_run(root: str, setting: Setting, seed: int, linear_eval) -> dict | None:
  """The run's results if it trained every epoch and its last checkpoint was
  linear-evaluated with the settings `linear_eval` (config.linear_eval); None otherwise."""
  workdir = run_dir(root, setting, seed)
  result_path = os.path.join(workdir, linear_evaluation.RESULT_FILE)
  if not os.path.exists(result_path):
    return None
  with open(result_path) as f:
    result = json.load(f)
  history = metrics.read_metrics(workdir)
  num_epochs = versions.read_config(os.path.join(workdir, layout.CONFIG_FILE))['num_epochs']
  last_step = trained_run.resolve_step(workdir, None)
  if not run_records.is_finished(
    history, result, num_epochs, last_step, linear_eval, LINEAR_EVAL_KEYS
  ):
    return None
  return {'setting': setting, 'seed': seed, 'linear': result, 'history': history}


def completed_run(base, setting: Setting, seed: int, root: str, protocol: str, records=None):
  """The run's results from its finished workdir (recorded under RECORDS/runs/ when
  `records` is given: hscl_jax.experiments.run_records) or else from that record; None if
  neither holds the finished run."""
  config = run_config(base, setting, seed, protocol)
  linear_eval = config.linear_eval.to_dict()
  done = finished_run(root, setting, seed, linear_eval)
  if records is None:
    return done
  directory = run_records.record_dir(records, setting.slug, seed)
  if done is not None:
    run_records.write_record(run_dir(root, setting, seed), directory)
    return done
  recorded = run_records.read_record(directory, config, linear_eval, LINEAR_EVAL_KEYS)
  return None if recorded is None else {'setting': setting, 'seed': seed, **recorded}


def run_one(base, setting: Setting, seed: int, root: str, protocol: str, records=None):
  """Trains (or resumes / reuses) one run and linear-evaluates its last checkpoint;
  None if another process holds the run's workdir (it is running it). A run recorded in
  RECORDS/runs/ (`records`) is reused as it is, and a finished one is recorded there."""
  done = completed_run(base, setting, seed, root, protocol, records)
  if done is not None:
    return done
  workdir = run_dir(root, setting, seed)
  config = run_config(base, setting, seed, protocol)
  start = time.time()
  try:
    trained = loop.train_and_evaluate(config, workdir)
    if trained.preempted:
      # The run saved its checkpoint: the grid stops too.
      raise preemption.Preempted(trained.stop_signal)
    # Evaluated under the run's lock, so two workers never evaluate the same run.
    with workdir_lock.WorkdirLock(workdir):
      result = linear_evaluation.linear_evaluate(config, workdir)
  except workdir_lock.WorkdirBusyError:
    return None
  except stored_config.ConfigChangedError as changed:
    # The comparison has no --allow_config_change: its runs follow its config.
    fix = f'use a new --workdir for the comparison, or remove {workdir} to train that run again'
    raise stored_config.ConfigChangedError(changed.problem, fix) from None
  logging.info(
    '%s seed %d: linear top-1 %.4f (%.0f s)',
    setting.label,
    seed,
    result['top1'],
    time.time() - start,
  )
  return completed_run(base, setting, seed, root, protocol, records)


def run_grid(config, root: str, plan: list, protocol: str, records: str | None = None) -> None:
  """Every (setting, seed) of `plan` (plan_runs) not finished (nor recorded in
  RECORDS/runs/) yet, in order; runs that another process holds are left to it."""
  os.makedirs(root, exist_ok=True)
  logging.info('%d runs', len(plan))
  start = time.perf_counter()
  for done, (setting, seed) in enumerate(plan, start=1):
    run = run_one(config, setting, seed, root, protocol, records)
    outcome = 'run by another process' if run is None else f'linear {run["linear"]["top1"]:.4f}'
    elapsed = progress.format_duration(time.perf_counter() - start)
    label = f'{setting.label} seed {seed}'
    logging.info('[%d/%d, %s] %s: %s', done, len(plan), elapsed, label, outcome)


MAX_SEEDS = 20  # seeds looked for in a point's records


def parse_points(values: list[str], field: str, letter: str, example: str):
  """['VALUE=DIR', ...] -> [(VALUE, DIR)] sorted by value; a ValueError names a malformed
  item ('LETTER=REPORT_DIR', e.g. `example`) or a value given twice."""
  points = []
  for item in values:
    value, sep, records = item.partition('=')
    if not sep or not value.strip().isdigit() or not records:
      raise ValueError(f"'{item}' is not {letter}=REPORT_DIR (e.g. {example})")
    points.append((int(value), records))
  if len({value for value, _ in points}) != len(points):
    raise ValueError(f'each {field} may be given once')
  return sorted(points)


def point_config(base: ml_collections.ConfigDict, field: str, value: int):
  """A copy of `base` with `field` set to the point's value."""
  config = ml_collections.ConfigDict(base.to_dict())
  config[field] = value
  return config


def recorded_runs(config, records: str, protocol: str) -> list[dict]:
  """The finished runs of a comparison of `config` recorded in RECORDS/runs/, every
  method at seeds 0 to MAX_SEEDS - 1, read from the records alone."""
  no_workdir = os.path.join(records, 'runs', 'no-workdir')  # records only
  runs = []
  for setting in settings(config, set()):
    for seed in range(MAX_SEEDS):
      run = completed_run(config, setting, seed, no_workdir, protocol, records)
      if run is not None:
        runs.append(run)
  return runs
