"""The runs of the image comparison: each trained (or resumed, or reused when finished),
linear-evaluated and recorded; a grid of them shared by several workers."""

from __future__ import annotations

import json
import os
import time

from absl import logging

from hscl_jax import progress
from hscl_jax.evaluation import linear_probe
from hscl_jax.experiments import grid
from hscl_jax.experiments import run_records
from hscl_jax.rundir import layout
from hscl_jax.rundir import lock as workdir_lock
from hscl_jax.rundir import metrics
from hscl_jax.rundir import stored_config
from hscl_jax.rundir import trained_run
from hscl_jax.rundir import versions
from hscl_jax.training import loop
from hscl_jax.training import preemption

Preempted = preemption.Preempted


# The linear evaluation's settings a finished run's linear_eval.json must have been made with.
LINEAR_EVAL_KEYS = ('protocol', 'num_epochs', 'learning_rate', 'weight_decay', 'batch_size')


def finished_run(root: str, setting: grid.Setting, seed: int, linear_eval) -> dict | None:
  """The run's results if it trained every epoch and its last checkpoint was
  linear-evaluated with the settings `linear_eval` (config.linear_eval); None otherwise."""
  workdir = grid.run_dir(root, setting, seed)
  result_path = os.path.join(workdir, linear_probe.RESULT_FILE)
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


def completed_run(base, setting: grid.Setting, seed: int, root: str, protocol: str, records=None):
  """The run's results from its finished workdir (recorded under RECORDS/runs/ when
  `records` is given: hscl_jax.experiments.run_records) or else from that record; None if
  neither holds the finished run."""
  config = grid.run_config(base, setting, seed, protocol)
  linear_eval = config.linear_eval.to_dict()
  done = finished_run(root, setting, seed, linear_eval)
  if records is None:
    return done
  directory = run_records.record_dir(records, setting.slug, seed)
  if done is not None:
    run_records.write_record(grid.run_dir(root, setting, seed), directory)
    return done
  recorded = run_records.read_record(directory, config, linear_eval, LINEAR_EVAL_KEYS)
  return None if recorded is None else {'setting': setting, 'seed': seed, **recorded}


def run_one(base, setting: grid.Setting, seed: int, root: str, protocol: str, records=None):
  """Trains (or resumes / reuses) one run and linear-evaluates its last checkpoint;
  None if another process holds the run's workdir (it is running it). A run recorded in
  RECORDS/runs/ (`records`) is reused as it is, and a finished one is recorded there."""
  done = completed_run(base, setting, seed, root, protocol, records)
  if done is not None:
    return done
  workdir = grid.run_dir(root, setting, seed)
  config = grid.run_config(base, setting, seed, protocol)
  start = time.time()
  try:
    trained = loop.train_and_evaluate(config, workdir)
    if trained.preempted:
      raise Preempted(trained.stop_signal)  # the run saved its checkpoint: the grid stops too
    # Evaluated under the run's lock, so two workers never evaluate the same run.
    with workdir_lock.WorkdirLock(workdir):
      result = linear_probe.linear_evaluate(config, workdir)
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
  """Every (setting, seed) of `plan` (grid.plan_runs) not finished (nor recorded in
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
