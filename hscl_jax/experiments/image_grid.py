"""The paper's comparison (Table I, Figs. 1, 4, 5) on any config: runs, table, plots.

The library behind `python -m hscl_jax.experiments.compare`. Trains UCL, H-UCL, SCL,
H-SCL(β) and H-SCL(τ) with the same budget (the config's), runs the linear evaluation on
each, and writes ROOT/report.md (mean ± std over seeds, the best setting of each method
when a grid is searched, and every run) with PNG plots: kNN accuracy per epoch (Fig. 1),
the fraction of anchors satisfying Assumption 1 (Fig. 4) and the four losses per epoch
(Fig. 5), beside the weighted kNN of the raw pixels on the same split and the first epoch
at which each method's kNN accuracy reaches SCL's final one (Fig. 1's speed claim). The β
grid is {0.1, 0.5, 1, 2, 5} for H-UCL and H-SCL(β); the τ grid is eq. (4)'s start × end
grid for H-SCL(τ). Runs already finished in ROOT are reused (each run resumes from its
checkpoints); a run whose workdir another process holds is skipped, so several processes
can share one grid.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import shutil
import time

from absl import logging
import ml_collections
import numpy as np

from hscl_jax import data
from hscl_jax.evaluation import inspection
from hscl_jax.evaluation import knn
from hscl_jax.evaluation import linear_probe
from hscl_jax.experiments import run_records
from hscl_jax.experiments import significance
from hscl_jax.rundir import lock as workdir_lock
from hscl_jax.rundir import metrics
from hscl_jax.rundir import trained_run
from hscl_jax.training import loop
from hscl_jax.training import preemption

BETA_GRID = (0.1, 0.5, 1.0, 2.0, 5.0)
Preempted = preemption.Preempted
TAU_STARTS = (-0.5, -0.3, -0.1)
TAU_ENDS = (-0.1, 0.0, 0.1)
METHODS = ('UCL', 'H-UCL', 'SCL', 'H-SCL(β)', 'H-SCL(τ)')
FOUR_LOSSES = ('loss_ucl', 'loss_hucl', 'loss_scl', 'loss_hscl')
INSPECT_DIR = 'inspect'  # RUN/inspect: where the report looks for a run's inspect figures


@dataclasses.dataclass(frozen=True)
class Setting:
  """One method with one hyperparameter choice; `overrides` are config fields."""

  method: str
  overrides: tuple[tuple[str, object], ...]

  @property
  def label(self) -> str:
    hyper = [f'{k}={v}' for k, v in self.overrides if k in ('beta', 'tau_start', 'tau_end')]
    if self.queue_size:
      hyper.append(f'queue {self.queue_size}, m={self.queue_momentum}')
    return f'{self.method} ({", ".join(hyper)})' if hyper else self.method

  @property
  def slug(self) -> str:
    parts = [self.method.lower().replace('(β)', '_beta').replace('(τ)', '_tau').replace('-', '')]
    parts += [f'{k}{v}' for k, v in self.overrides if k in ('beta', 'tau_start', 'tau_end')]
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
QUEUE_METHODS = ('SCL', 'H-SCL(β)')
QUEUE_FIELDS = ('queue_size', 'queue_momentum')


def queue_size_for(config: ml_collections.ConfigDict) -> int:
  rows = 2 * config.batch_size
  return rows * max(1, round(QUEUE_NEGATIVES / rows))


def settings(config: ml_collections.ConfigDict, grids: set[str]) -> list[Setting]:
  """The methods of Table I, with the β / τ grids where asked and the config's values otherwise."""
  betas = BETA_GRID if 'beta' in grids else (config.beta,)
  taus = (
    list(itertools.product(TAU_STARTS, TAU_ENDS))
    if 'tau' in grids
    else [(config.tau_start, config.tau_end)]
  )
  out = [Setting('UCL', (('method', 'ucl'),)), Setting('SCL', (('method', 'scl'),))]
  out += [Setting('H-UCL', (('method', 'hucl'), ('beta', b))) for b in betas]
  out += [
    Setting('H-SCL(β)', (('method', 'hscl'), ('hardening', 'exp'), ('beta', b))) for b in betas
  ]
  out += [
    Setting(
      'H-SCL(τ)', (('method', 'hscl'), ('hardening', 'threshold'), ('tau_start', s), ('tau_end', e))
    )
    for s, e in taus
  ]
  if 'queue' in grids:
    queue = (('queue_size', queue_size_for(config)), ('queue_momentum', QUEUE_MOMENTUM))
    out += [Setting(s.method, s.overrides + queue) for s in out if s.method in QUEUE_METHODS]
  return sorted(out, key=lambda s: METHODS.index(s.method))  # stable: a queue run after its own


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


# The linear evaluation's settings a finished run's linear_eval.json must have been made with.
LINEAR_EVAL_KEYS = ('protocol', 'num_epochs', 'learning_rate', 'weight_decay', 'batch_size')


def finished_run(root: str, setting: Setting, seed: int, linear_eval) -> dict | None:
  """The run's results if it trained every epoch and its last checkpoint was
  linear-evaluated with the settings `linear_eval` (config.linear_eval); None otherwise."""
  workdir = run_dir(root, setting, seed)
  result_path = os.path.join(workdir, linear_probe.RESULT_FILE)
  if not os.path.exists(result_path):
    return None
  with open(result_path) as f:
    result = json.load(f)
  history = metrics.read_metrics(workdir)
  with open(os.path.join(workdir, metrics.CONFIG_FILE)) as f:
    num_epochs = json.load(f)['num_epochs']
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
    if loop.train_and_evaluate(config, workdir).preempted:
      raise Preempted()  # the run saved its checkpoint: the grid stops too
    # Evaluated under the run's lock, so two workers never evaluate the same run.
    with workdir_lock.WorkdirLock(workdir):
      result = linear_probe.linear_evaluate(config, workdir)
  except workdir_lock.WorkdirBusyError:
    return None
  logging.info(
    '%s seed %d: linear top-1 %.4f (%.0f s)',
    setting.label,
    seed,
    result['top1'],
    time.time() - start,
  )
  return completed_run(base, setting, seed, root, protocol, records)


def mean_std(values) -> str:
  """'mean ± std' in %, or just the value for a single seed (no spread to show)."""
  values = 100 * np.asarray(values, np.float64)
  if len(values) == 1:
    return f'{values[0]:.2f}'
  return f'{values.mean():.2f} ± {values.std(ddof=1):.2f}'


def _ranking(methods, score) -> str:
  """'A > B = C': methods by decreasing score, ties (equal to 1e-9) joined by '='."""
  ordered = sorted(methods, key=lambda m: -score(m))
  text = ordered[0]
  for previous, method in zip(ordered, ordered[1:]):
    text += (' = ' if abs(score(previous) - score(method)) < 1e-9 else ' > ') + method
  return text


def _final(run, key):
  history = [r for r in run['history'] if key in r]
  return history[-1][key] if history else float('nan')


def summarise(runs: list[dict]) -> dict[Setting, dict]:
  """Per setting: linear top-1/top-5 and final kNN over seeds."""
  by_setting: dict[Setting, list] = {}
  for run in runs:
    by_setting.setdefault(run['setting'], []).append(run)
  return {
    s: {
      'top1': [r['linear']['top1'] for r in rs],
      'top5': [r['linear']['top5'] for r in rs],
      'knn': [_final(r, 'knn_top1') for r in rs],
      'runs': rs,
    }
    for s, rs in by_setting.items()
  }


def best_per_method(summary) -> dict[str, Setting]:
  """Table I's setting per method (runs with a queue are compared apart)."""
  best = {}
  for setting, stats in summary.items():
    if setting.queue_size:
      continue
    current = best.get(setting.method)
    if current is None or np.mean(stats['top1']) > np.mean(summary[current]['top1']):
      best[setting.method] = setting
  return best


def _curves(runs, key):
  """Mean over seeds of a per-epoch metric (epochs where every seed has it)."""
  per_seed = [{r['epoch']: r[key] for r in run['history'] if key in r} for run in runs]
  epochs = sorted(set.intersection(*(set(c) for c in per_seed))) if per_seed else []
  return epochs, [np.mean([c[e] for c in per_seed]) for e in epochs]


def plot_report(summary, best, out_dir: str) -> list[str]:
  """Figs. 1, 4, 5 as PNGs; returns their file names."""
  import matplotlib

  matplotlib.use('Agg')
  import matplotlib.pyplot as plt

  files = []
  fig, ax = plt.subplots(figsize=(6, 4))
  for method in METHODS:
    if method in best:
      ax.plot(*_curves(summary[best[method]]['runs'], 'knn_top1'), label=best[method].label)
  ax.set(xlabel='epoch', ylabel='kNN top-1 (test)', title='kNN accuracy per epoch (Fig. 1)')
  ax.legend(fontsize=7)
  files.append(_save(fig, out_dir, 'fig1_knn.png'))

  hard = [best[m] for m in ('H-SCL(β)', 'H-SCL(τ)') if m in best]
  fig, ax = plt.subplots(figsize=(6, 4))
  for setting in hard:
    ax.plot(*_curves(summary[setting]['runs'], 'assumption1_fraction'), label=setting.label)
  ax.set(
    xlabel='epoch',
    ylabel='fraction of anchors',
    ylim=(0, 1.02),
    title='Anchors satisfying Assumption 1 (Fig. 4)',
  )
  if hard:  # no H-SCL run finished yet: an empty plot, without a legend warning
    ax.legend(fontsize=7)
  files.append(_save(fig, out_dir, 'fig4_assumption1.png'))

  fig, axes = plt.subplots(1, max(len(hard), 1), figsize=(6 * max(len(hard), 1), 4), squeeze=False)
  for ax, setting in zip(axes[0], hard):
    for key in FOUR_LOSSES:
      ax.plot(*_curves(summary[setting]['runs'], key), label=key.replace('loss_', '').upper())
    ax.set(xlabel='epoch', ylabel='loss (same positives)', title=f'{setting.label} (Fig. 5)')
    ax.legend(fontsize=7)
  files.append(_save(fig, out_dir, 'fig5_losses.png'))
  return files


def _save(fig, out_dir, name):
  fig.tight_layout()
  fig.savefig(os.path.join(out_dir, name), dpi=110)
  return name


def dataset_label(config) -> str:
  """'cifar10', or for an image folder 'image_folder (<its directory name>)'."""
  if config.dataset == 'image_folder' and config.folder:
    return f'image_folder ({os.path.basename(os.path.normpath(config.folder))})'
  return config.dataset


RAW_PIXELS_FILE = 'raw_pixel_knn.json'


def raw_pixel_knn(config, root: str) -> dict:
  """Weighted kNN (config.knn's k and temperature) on raw pixels, train split (the run's
  subset) as the bank, test split as queries: pixels in [0, 1], centred by the bank's
  mean image, L2-normalised. Cached in ROOT/raw_pixel_knn.json per split definition."""
  key = {
    'dataset': dataset_label(config),
    'train_examples': config.train_examples or None,
    'split_seed': config.split_seed,
    'image_size': config.augment.image_size,
    'k': config.knn.k,
    'temperature': config.knn.temperature,
  }
  path = os.path.join(root, RAW_PIXELS_FILE)
  if os.path.exists(path):
    with open(path) as f:
      cached = json.load(f)
    if cached['key'] == key:
      return cached
  bank, queries = data.run_sources(config)
  pixels = lambda source: (
    np.stack([source[i]['image'] for i in range(len(source))])
    .reshape(len(source), -1)
    .astype(np.float32)
    / 255.0
  )
  bank_x, query_x = pixels(bank), pixels(queries)
  mean = bank_x.mean(axis=0)
  top1 = knn.weighted_knn_accuracy(
    bank_x - mean,
    bank.labels(),
    query_x - mean,
    queries.labels(),
    num_classes=bank.num_classes,
    k=config.knn.k,
    temperature=config.knn.temperature,
  )
  result = {'key': key, 'top1': float(top1), 'bank': len(bank), 'queries': len(queries)}
  with open(path, 'w') as f:
    json.dump(result, f, indent=2)
  return result


def first_epoch_reaching(runs, target: float) -> int | None:
  """The first epoch at which the mean kNN accuracy over `runs` reaches `target`."""
  epochs, curve = _curves(runs, 'knn_top1')
  return next((e for e, value in zip(epochs, curve) if value >= target), None)


def speed_table(summary, best) -> list[str]:
  """Fig. 1's claim as a table: per method, the first epoch its kNN reaches SCL's final."""
  if 'SCL' not in best:
    return []
  scl = summary[best['SCL']]
  target = float(np.mean(scl['knn']))
  num_epochs = max(r['epoch'] for run in scl['runs'] for r in run['history'])
  lines = [
    "## Fig. 1's claim: epochs to reach SCL's final kNN accuracy",
    '',
    f"First epoch at which a method's kNN top-1 (mean over seeds) reaches SCL's final "
    f'{100 * target:.2f} % (epoch {num_epochs}), with the same budget for every method.',
    '',
    '| Method | setting | first epoch reaching it |',
    '|---|---|---|',
  ]
  for method in METHODS:
    if method in best:
      epoch = first_epoch_reaching(summary[best[method]]['runs'], target)
      cell = 'not reached' if epoch is None else f'{epoch} of {num_epochs}'
      lines.append(f'| {method} | {best[method].label} | {cell} |')
  return lines + ['']


def queue_table(summary) -> list[str]:
  """Each run with a queue beside the same setting without one (same seeds, same steps)."""
  pairs = [(s.without_queue(), s) for s in summary if s.queue_size]
  pairs = [(plain, queued) for plain, queued in pairs if plain in summary]
  if not pairs:
    return []
  lines = [
    '## Negatives from a queue',
    '',
    "The same runs with a queue of earlier batches' keys from a momentum key encoder (m), "
    'whose slots of another label are extra negatives; seeds of both columns: those finished '
    'for the run with a queue.',
    '',
    '| setting | seeds | linear top-1 without | with queue | kNN top-1 without | with queue |',
    '|---|---|---|---|---|---|',
  ]
  for plain, queued in pairs:
    seeds = [run['seed'] for run in summary[queued]['runs']]
    same = [i for i, run in enumerate(summary[plain]['runs']) if run['seed'] in seeds]
    base = {key: [summary[plain][key][i] for i in same] for key in ('top1', 'knn')}
    if len(base['top1']) != len(seeds):
      continue  # a seed of the queue run has no plain run yet
    lines.append(
      f'| {queued.label} | {", ".join(map(str, seeds))} | {mean_std(base["top1"])} | '
      f'{mean_std(summary[queued]["top1"])} | {mean_std(base["knn"])} | '
      f'{mean_std(summary[queued]["knn"])} |'
    )
  return lines + ['']


# The pairs of the paper's claims: hardening with labels against labels alone and against
# hardening alone; labels and hardening each against UCL.
PAIRS = (('H-SCL(β)', 'SCL'), ('H-SCL(β)', 'H-UCL'), ('SCL', 'UCL'), ('H-UCL', 'UCL'))


def paired_differences(summary, best, key: str, first: str, second: str) -> dict[int, float]:
  """Seed -> `first` − `second` of a per-run figure (`key`: 'top1' or 'knn' of summarise),
  over the seeds both methods' Table I settings finished: the seeds of a comparison share
  the subset and the data order, so a per-seed difference cancels what they share."""
  return seed_differences(
    seed_values(summary[best[first]], key), seed_values(summary[best[second]], key)
  )


def seed_values(stats, key: str) -> dict[int, float]:
  """Seed -> a per-run figure (`key`) of one setting's summarise() entry."""
  return {run['seed']: value for run, value in zip(stats['runs'], stats[key])}


def seed_differences(first: dict[int, float], second: dict[int, float]) -> dict[int, float]:
  """Seed -> first − second, over the seeds both have."""
  return {seed: first[seed] - second[seed] for seed in sorted(set(first) & set(second))}


# The per-run figures a paired difference is taken of, as the tables name them.
MEASURES = (('top1', 'linear'), ('knn', 'kNN'))


def paired_rows(summary, best) -> list[tuple[str, list[float]]]:
  """('pair | seeds | measure' cells, per-seed differences) of PAIRS, linear then kNN."""
  rows = []
  for first, second in [(a, b) for a, b in PAIRS if a in best and b in best]:
    for key, measure in MEASURES:
      differences = paired_differences(summary, best, key, first, second)
      if differences:
        seeds = ', '.join(map(str, differences))
        rows.append((f'{first} − {second} | {seeds} | {measure}', list(differences.values())))
  return rows


def paired_table(summary, best) -> list[str]:
  """Per-seed paired differences of linear and kNN top-1 for PAIRS with their tests of
  significance (hscl_jax.experiments.significance; Holm over this table's rows)."""
  rows = paired_rows(summary, best)
  if not rows:
    return []
  lines, tests = significance.table_lines(rows)
  return [
    '## Paired differences (same seed: same subset, same data order)',
    '',
    'Per seed, the first method minus the second (points of top-1), over the seeds both '
    'finished: their mean ± std, the seeds in which the difference is positive, and the '
    'tests of significance.',
    '',
    f'| pair | seeds | top-1 | {significance.HEADER} |',
    f'|---|---|---|{significance.ALIGN}|',
    *lines,
    '',
    significance.how_to_read(tests),
    '',
  ]


def same_class_per_anchor(
  labels: np.ndarray, batch_size: int, seed: int, num_epochs: int, samples_per_class: int = 0
):
  """Measured in the batches a run trains on (the loader's order for `seed`, uniform or
  class-aware): the mean number of other samples of an anchor's class in its batch, and
  the fraction of anchors with at least one."""
  order = data.EpochOrder(
    len(labels),
    labels=labels,
    global_batch_size=batch_size,
    seed=seed,
    samples_per_class=samples_per_class,
  )
  counts = []
  for epoch in range(num_epochs):
    batches = labels[order(epoch)].reshape(order.steps_per_epoch, batch_size)
    same = (batches[:, :, None] == batches[:, None, :]).sum(axis=-1) - 1
    counts.append(same.ravel())
  counts = np.concatenate(counts)
  return float(counts.mean()), float((counts > 0).mean())


def training_labels(config) -> np.ndarray:
  """The training subset's labels, as the runs drew it (read lazily: no image decoded)."""
  lazy = ml_collections.ConfigDict(config.to_dict())
  lazy.decode_cache_gib = 0.0
  return np.asarray(data.run_sources(lazy)[0].labels())


def batch_composition(config, plan) -> list[str]:
  """The report's table of how many same-class samples an anchor meets per batch, for
  every setting of `plan` over its seeds, from each run's own config."""
  labels = training_labels(config)
  if labels.min() < 0:
    return []  # unlabelled training data: no classes to count
  seeds_of: dict[Setting, list[int]] = {}
  for setting, seed in plan:
    seeds_of.setdefault(setting, []).append(seed)
  rows = []
  for setting, seeds in seeds_of.items():
    runs = [run_config(config, setting, seed) for seed in seeds]
    measured = [
      same_class_per_anchor(
        labels, run.batch_size, run.seed, run.num_epochs, run.get('samples_per_class', 0)
      )
      for run in runs
    ]
    mean, with_one = np.mean(measured, axis=0)
    rows.append(
      f'| {setting.label} | {", ".join(map(str, seeds))} | {runs[0].batch_size} | '
      f'{_sampling(runs[0].get("samples_per_class", 0))} | {mean:.2f} | {100 * with_one:.1f} % |'
    )
  return [
    '## Labels in a batch',
    '',
    "Other samples of an anchor's class in its batch, measured in the training batches of "
    f"each setting's seeds (every epoch; {len(np.unique(labels))} classes in the training "
    'subset), and the anchors that meet at least one.',
    '',
    '| setting | seeds | batch | batches | same-class samples per anchor | anchors with one |',
    '|---|---|---|---|---|---|',
    *rows,
    '',
  ]


def _sampling(samples_per_class: int) -> str:
  if not samples_per_class:
    return 'uniform'
  return f'class-aware, {samples_per_class} per class'


def run_times(summary) -> list[str]:
  """Wall time of each setting's runs: training epochs, kNN, and linear evaluation."""
  lines = [
    '## Time per run',
    '',
    '| setting | runs | training s | kNN s | linear eval s |',
    '|---|---|---|---|---|',
  ]
  for setting, stats in summary.items():
    runs = stats['runs']
    train_s = np.mean([sum(r.get('epoch_time', 0.0) for r in run['history']) for run in runs])
    knn_s = np.mean([sum(r.get('knn_time', 0.0) for r in run['history']) for run in runs])
    eval_s = np.mean([run['linear'].get('seconds', float('nan')) for run in runs])
    lines.append(f'| {setting.label} | {len(runs)} | {train_s:.0f} | {knn_s:.0f} | {eval_s:.0f} |')
  return lines + ['']


def inspect_links(root: str, best, seed: int, out_dir: str) -> list[str]:
  """The report's section linking the figures `python -m hscl_jax.inspect --workdir=RUN
  --out=RUN/inspect` wrote for the best setting of each method (seed `seed`), with their
  H-UCL false-negative fraction; empty when no run has them. The figures are copied to
  OUT_DIR/inspect/<setting>_seed<k>/ (the report's directory stands alone) and linked
  there; a copy already there is linked when the run's workdir is gone."""
  rows = []
  figures = [f for f in inspection.FILES if f.endswith('.png')]
  complete = lambda folder: all(os.path.isfile(os.path.join(folder, f)) for f in figures)
  for method in METHODS:
    if method not in best:
      continue
    folder = os.path.join(out_dir, INSPECT_DIR, f'{best[method].slug}_seed{seed}')
    source = os.path.join(run_dir(root, best[method], seed), INSPECT_DIR)
    if complete(source) and os.path.abspath(source) != os.path.abspath(folder):
      shutil.copytree(source, folder, dirs_exist_ok=True)
    if not complete(folder):
      continue
    links = [f'[{f[:-4]}]({os.path.relpath(os.path.join(folder, f), out_dir)})' for f in figures]
    with open(os.path.join(folder, inspection.STATISTIC_FILE)) as f:
      statistic = json.load(f)
    fraction = f'{100 * statistic["hucl_false_negative_fraction"]:.1f} % (k = {statistic["k"]})'
    rows.append(f'| {best[method].label} | {" · ".join(links)} | {fraction} |')
  if not rows:
    return []
  return [
    f'## What the encoders learned (seed {seed}; `python -m hscl_jax.inspect`, docs/inspect.md)',
    '',
    "| setting | figures | same-class share of H-UCL's top-k negatives |",
    '|---|---|---|',
    *rows,
    '',
  ]


def markdown_report(
  summary, best, config, seeds, protocol, grids, plots, raw=None, inspected=()
) -> str:
  dataset = dataset_label(config)
  subset = (
    f'a class-balanced subset of {config.train_examples} training examples (bank of the kNN '
    'and of the linear evaluation too; the test split whole), '
    if config.train_examples
    else ''
  )
  lines = [
    f'# H-SCL comparison on {dataset}',
    '',
    f'Seeds: {", ".join(map(str, seeds))}; {subset}{config.num_epochs} epochs, batch '
    f'{config.batch_size}, model {config.model.name}, temperature {config.temperature}, '
    f'{config.optimizer.name} lr {config.optimizer.learning_rate} ({config.optimizer.schedule}); '
    f'linear evaluation: `{protocol}` protocol, {config.linear_eval.num_epochs} epochs. '
    f'Grids searched: {", ".join(sorted(grids)) or "none"} (best setting by mean linear '
    'top-1; ties go to the first in grid order).',
    '',
    '## Table I (top-1 %, linear; mean ± std over seeds)',
    '',
    f'| Method | setting | {dataset} linear top-1 | linear top-5 | kNN top-1 (last epoch) |',
    '|---|---|---|---|---|',
  ]
  for method in METHODS:
    if method in best:
      stats = summary[best[method]]
      lines.append(
        f'| {method} | {best[method].label} | {mean_std(stats["top1"])} | '
        f'{mean_std(stats["top5"])} | {mean_std(stats["knn"])} |'
      )
  if raw is not None:
    lines.append(
      f'| raw pixels | weighted kNN, k={config.knn.k} | — | — | {100 * raw["top1"]:.2f} |'
    )
  ranking = _ranking([m for m in METHODS if m in best], lambda m: np.mean(summary[best[m]]['top1']))
  lines += ['', f'Ranking by mean linear top-1: {ranking}.', '']
  lines += paired_table(summary, best)
  lines += speed_table(summary, best)
  lines += queue_table(summary)
  if len(summary) > len(best):
    lines += ['## Every setting', '', '| setting | linear top-1 | kNN top-1 |', '|---|---|---|']
    for setting, stats in summary.items():
      lines.append(f'| {setting.label} | {mean_std(stats["top1"])} | {mean_std(stats["knn"])} |')
    lines.append('')
  lines += run_times(summary)
  lines += list(inspected)
  lines += ['## Plots', ''] + [f'![{p}]({p})' for p in plots]
  return '\n'.join(lines) + '\n'


GRIDS = ('beta', 'tau', 'queue')
REPORT_FILE = 'report.md'


def method_slug(method: str) -> str:
  """'H-SCL(β)' -> 'hscl_beta': a method's name as a run directory and --seeds_for spell it."""
  return Setting(method, ()).slug


def plan_runs(config, seeds: list[int], grids: set[str], seeds_for: dict[str, int] | None = None):
  """(setting, seed) pairs, seed by seed (seed 0 of every setting first). `seeds_for` maps
  a method's slug (ucl, hucl, scl, hscl_beta, hscl_tau) to its own number of seeds
  (0, 1, ...), e.g. more seeds for the pair a claim rests on; others get `seeds`."""
  seeds_for = seeds_for or {}
  unknown = sorted(set(seeds_for) - {method_slug(m) for m in METHODS})
  if unknown:
    raise ValueError(
      f'--seeds_for names unknown methods {unknown}; use {", ".join(map(method_slug, METHODS))}'
    )
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


def run_grid(config, root: str, plan: list, protocol: str, records: str | None = None) -> None:
  """Every (setting, seed) of `plan` (plan_runs) not finished (nor recorded in RECORDS/runs/)
  yet, in order; runs that another process holds are left to it."""
  os.makedirs(root, exist_ok=True)
  logging.info('%d runs', len(plan))
  start = time.perf_counter()
  for done, (setting, seed) in enumerate(plan, start=1):
    run = run_one(config, setting, seed, root, protocol, records)
    outcome = 'run by another process' if run is None else f'linear {run["linear"]["top1"]:.4f}'
    elapsed = metrics.format_duration(time.perf_counter() - start)
    label = f'{setting.label} seed {seed}'
    logging.info('[%d/%d, %s] %s: %s', done, len(plan), elapsed, label, outcome)


def write_report(config, root: str, plan, grids, protocol: str, report_dir: str | None = None):
  """ROOT/report.md (or REPORT_DIR/report.md) and its plots from the finished runs of
  `plan` (plan_runs), in ROOT or recorded in the report's directory (each finished run in
  ROOT is recorded there); returns the report's text (None while no run has finished)."""
  out_dir = report_dir or root
  runs = [
    run
    for s, seed in plan
    if (run := completed_run(config, s, seed, root, protocol, out_dir)) is not None
  ]
  if not runs:
    return None
  os.makedirs(out_dir, exist_ok=True)
  summary = summarise(runs)
  best = best_per_method(summary)
  plots = plot_report(summary, best, out_dir)
  raw = raw_pixel_knn(config, out_dir)
  seeds = sorted({seed for _, seed in plan})
  inspected = inspect_links(root, best, seeds[0], out_dir)
  described = describe_seeds(plan)
  report = markdown_report(summary, best, config, described, protocol, grids, plots, raw, inspected)
  report += '\n' + '\n'.join(batch_composition(config, plan))
  missing = len(plan) - len(runs)
  report += f'\n{len(runs)} runs finished' + (f', {missing} missing.' if missing else '.') + '\n'
  with open(os.path.join(out_dir, REPORT_FILE), 'w') as f:
    f.write(report)
  return report
