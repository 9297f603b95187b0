"""The comparison's reports, written as report.md from the runs (or their records alone).

The image comparison's report (`compare`): Table I (the best setting of each method), the
paired differences, the speed claim, the queue runs, every setting, run times, the inspect
figures, the plots, the raw pixels' weighted kNN and the labels an anchor meets in a batch.
A sweep's report (`compare --sweep=FIELD`, SWEEPS): several comparisons of one config that
differ in one field, each read back from its records alone; against label density
(`samples_per_class`: Table I per density, the pairs against the same-class samples an
anchor met, each class-aware run against its uniform run, inspect's false-negative
fraction) or against the training budget (`num_epochs`: over the seeds of every budget,
Table I per budget, the pairs at each budget, each method's longer runs against its
shortest, each pair's move, Fig. 1's measure per budget). Every paired difference is a row
of experiments/paired, with its tests (Holm over the report).
"""

from __future__ import annotations

from collections.abc import Callable
import dataclasses
import json
import os
import shutil

import ml_collections
import numpy as np

from hscl_jax import data
from hscl_jax.config import methods
from hscl_jax.evaluation import inspection
from hscl_jax.evaluation import knn
from hscl_jax.experiments import grid
from hscl_jax.experiments import paired
from hscl_jax.experiments import plots
from hscl_jax.experiments import run_records
from hscl_jax.rundir import atomic

REPORT_FILE = 'report.md'


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


def summarise(runs: list[dict]) -> dict[grid.Setting, dict]:
  """Per setting: linear top-1/top-5 and final kNN over seeds."""
  by_setting: dict[grid.Setting, list] = {}
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


def best_per_method(summary) -> dict[str, grid.Setting]:
  """Table I's setting per method (runs with a queue are compared apart)."""
  best = {}
  for setting, stats in summary.items():
    if setting.queue_size:
      continue
    current = best.get(setting.method)
    if current is None or np.mean(stats['top1']) > np.mean(summary[current]['top1']):
      best[setting.method] = setting
  return best


def first_epoch_reaching(runs, target: float) -> int | None:
  """The first epoch at which the mean kNN accuracy over `runs` reaches `target`."""
  epochs, curve = plots.curves(runs, 'knn_top1')
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
  for method in methods.LABELS:
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
  for method in methods.LABELS:
    if method not in best:
      continue
    folder = os.path.join(out_dir, grid.INSPECT_DIR, f'{best[method].slug}_seed{seed}')
    source = os.path.join(grid.run_dir(root, best[method], seed), grid.INSPECT_DIR)
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


SIGMOID_QUESTION = [
  "With the methods table's supervised sigmoid rows (`--grid=sigmoid`), paired by seed with "
  'the softmax rows: does hardening help the supervised sigmoid loss as it helps the softmax '
  'one?',
  '',
]


def markdown_report(
  summary, best, config, seeds, protocol, grids, plots, raw=None, inspected=(), source=()
) -> str:
  """The report's text; `source`: lines on where its runs were read from, after the header."""
  dataset = grid.dataset_label(config)
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
    *source,
    *(SIGMOID_QUESTION if 'sigmoid' in grids else []),
    '## Table I (top-1 %, linear; mean ± std over seeds)',
    '',
    f'| Method | setting | {dataset} linear top-1 | linear top-5 | kNN top-1 (last epoch) |',
    '|---|---|---|---|---|',
  ]
  for method in methods.LABELS:
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
  ranking = _ranking(
    [m for m in methods.LABELS if m in best], lambda m: np.mean(summary[best[m]]['top1'])
  )
  lines += ['', f'Ranking by mean linear top-1: {ranking}.', '']
  lines += paired_table(summary, best, grid.report_pairs(grids))
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


def write_report(
  config, root: str, plan, grids, protocol: str, report_dir=None, records=None, command=None
):
  """ROOT/report.md (or REPORT_DIR/report.md) and its plots from the finished runs of
  `plan` (grid.plan_runs), in ROOT or recorded in RECORDS (default: the report's
  directory; each finished run in ROOT is recorded there), which also caches the raw
  pixels' kNN; returns the report's text (None while no run has finished). A report
  whose records lie elsewhere says where, and the `command` that writes it."""
  out_dir = report_dir or root
  records = records or out_dir
  runs = [
    run
    for s, seed in plan
    if (run := grid.completed_run(config, s, seed, root, protocol, records)) is not None
  ]
  if not runs:
    return None
  os.makedirs(out_dir, exist_ok=True)
  summary = summarise(runs)
  best = best_per_method(summary)
  plot_files = plots.plot_report(summary, best, out_dir)
  raw = raw_pixel_knn(config, records)
  seeds = sorted({seed for _, seed in plan})
  inspected = inspect_links(root, best, seeds[0], out_dir)
  described = grid.describe_seeds(plan)
  source = records_source(records, out_dir, command)
  report = markdown_report(
    summary, best, config, described, protocol, grids, plot_files, raw, inspected, source
  )
  report += '\n' + '\n'.join(batch_composition(config, plan))
  missing = len(plan) - len(runs)
  report += f'\n{len(runs)} runs finished' + (f', {missing} missing.' if missing else '.') + '\n'
  atomic.write_text(os.path.join(out_dir, REPORT_FILE), report)
  return report


def records_source(records: str, out_dir: str, command: str | None) -> list[str]:
  """The report's lines on its runs read from records elsewhere (none when they lie
  beside it): where, and the command that writes the report."""
  if os.path.abspath(records) == os.path.abspath(out_dir):
    return []
  where = os.path.relpath(records, out_dir)
  by = f'; written by `{command}`' if command else ''
  return [
    f'The runs are read from their records in {where}/{run_records.RECORDS_DIR}/ (one record '
    f'per run, which [the report there]({where}/{REPORT_FILE}) reads too){by}.',
    '',
  ]


def stated_command(argv: list[str]) -> str:
  """The command as a report states it: `python -m hscl_jax.experiments.compare` with the
  flags of its `argv` as given, less those of this machine (--workdir; a dataset's
  location as DIR/<its name>) and --report_only (the same command trains what is
  missing, then reports)."""
  kept, args = [], iter(argv[1:])
  for arg in args:
    name, _, value = arg.partition('=')
    if arg == '--workdir':
      next(args, None)  # its value, given apart
    if name in ('--workdir', '--report_only', '--noreport_only'):
      continue
    if name in [f'--config.{field}' for field in run_records.LOCATION_FIELDS]:
      arg = f'{name}=DIR/{os.path.basename(os.path.normpath(value))}'
    kept.append(arg)
  return ' '.join(['python -m hscl_jax.experiments.compare', *kept])


def paired_table(summary, best, pairs=paired.PAIRS) -> list[str]:
  """Per-seed paired differences of linear and kNN top-1 for `pairs` (the paper's
  paired.PAIRS by default) with their tests of significance (Holm over this table's rows)."""
  rows = paired.pair_rows([((), summary, best)], pairs)
  if not rows:
    return []
  (table,), tests = paired.tables([(['pair'], rows)])
  return [
    '## Paired differences (same seed: same subset, same data order)',
    '',
    'Per seed, the first method minus the second (points of top-1), over the seeds both '
    'finished: their mean ± std, the seeds in which the difference is positive, and the '
    'tests of significance.',
    '',
    *table,
    '',
    paired.how_to_read(tests),
    '',
  ]


# The labels in a batch.


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
  seeds_of: dict[grid.Setting, list[int]] = {}
  for setting, seed in plan:
    seeds_of.setdefault(setting, []).append(seed)
  rows = []
  for setting, seeds in seeds_of.items():
    runs = [grid.run_config(config, setting, seed) for seed in seeds]
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


# The raw-pixel baseline.


RAW_PIXELS_FILE = 'raw_pixel_knn.json'


def raw_pixel_knn(config, root: str) -> dict:
  """Weighted kNN (config.knn's k and temperature) on raw pixels, train split (the run's
  subset) as the bank, test split as queries: pixels in [0, 1], centred by the bank's
  mean image, L2-normalised. Cached in ROOT/raw_pixel_knn.json per split definition."""
  key = {
    'dataset': grid.dataset_label(config),
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
  atomic.write_json(path, result)
  return result


# The sweeps.


def sweep_method_tables(columns, what: str) -> list[str]:
  """Table I per point: linear and kNN top-1 of each method (mean ± std, seeds), one
  column per (header, summary, best) of `columns`; `what` names the columns' quantity."""
  lines = []
  for key, name in (('top1', 'Linear top-1'), ('knn', 'kNN top-1')):
    lines += [
      f'### {name} (%), per {what}',
      '',
      f'| method | {" | ".join(header for header, _, _ in columns)} |',
      '|---|' + '---|' * len(columns),
    ]
    for method in grid.METHODS:
      cells = []
      for _, summary, best in columns:
        stats = summary.get(best.get(method))
        cells.append('' if stats is None else f'{mean_std(stats[key])} (n={len(stats[key])})')
      if any(cells):
        lines.append(f'| {method} | {" | ".join(cells)} |')
    lines.append('')
  return lines


MAX_SEEDS = grid.MAX_SEEDS  # seeds looked for in a point's records


@dataclasses.dataclass(frozen=True)
class Density:
  """One comparison of the sweep: its samples_per_class and its report directory."""

  samples_per_class: int
  records: str

  @property
  def label(self) -> str:
    m = self.samples_per_class
    return 'uniform' if not m else f'{m} per class'


def parse_densities(values: list[str]) -> list[Density]:
  """['0=DIR', '4=DIR', ...] -> Densities (a ValueError names a malformed item)."""
  points = grid.parse_points(values, 'samples_per_class', 'M', '4=docs/results/x/m4')
  return [Density(m, records) for m, records in points]


def density_config(base: ml_collections.ConfigDict, density: Density):
  return grid.point_config(base, 'samples_per_class', density.samples_per_class)


def density_runs(base, density: Density, protocol: str) -> list[dict]:
  """The density's finished runs, read from its records alone (every method, seeds
  0 to MAX_SEEDS - 1)."""
  return grid.recorded_runs(density_config(base, density), density.records, protocol)


@dataclasses.dataclass
class MeasuredDensity:
  """One density's finished runs and what its batches held."""

  density: Density
  summary: dict  # summarise
  best: dict  # best_per_method
  same_class: float  # other samples of an anchor's class per batch, mean over its seeds
  seeds: list[int]


def measure_density(
  base, density: Density, protocol: str, labels: np.ndarray
) -> MeasuredDensity | None:
  """The density's runs (None while none has finished) and its measured same-class count,
  counted in the batches its runs' seeds trained on (`labels`: the training subset's)."""
  runs = density_runs(base, density, protocol)
  if not runs:
    return None
  config = density_config(base, density)
  seeds = sorted({run['seed'] for run in runs})
  counts = [
    same_class_per_anchor(
      labels, config.batch_size, seed, config.num_epochs, density.samples_per_class
    )[0]
    for seed in seeds
  ]
  summary = summarise(runs)
  best = best_per_method(summary)
  return MeasuredDensity(density, summary, best, float(np.mean(counts)), seeds)


def density_method_tables(measured: list[MeasuredDensity]) -> list[str]:
  """Table I per density: linear and kNN top-1 of each method (mean ± std, seeds)."""
  columns = [(f'{m.density.label} ({m.same_class:.2f})', m.summary, m.best) for m in measured]
  return sweep_method_tables(columns, 'density (same-class samples per anchor)')


def density_tables(measured: list[MeasuredDensity]) -> tuple[list[str], list[str], str]:
  """The pairs' table, the against-uniform table and the sentence on reading their tests,
  Holm-adjusted over the rows of both (one family: every test of the report)."""
  points = [([m.density.label, f'{m.same_class:.2f}'], m.summary, m.best) for m in measured]
  uniform = uniform_rows(measured)
  parts = [(['pair', 'batches', 'same-class per anchor'], paired.pair_rows(points))]
  (pair_table, uniform_table), tests = paired.tables(parts + [(['method', 'batches'], uniform)])
  if not uniform:
    uniform_table = ['No class-aware run has a uniform run of its method and seed yet.']
  return [*pair_table, ''], [*uniform_table, ''], paired.how_to_read(tests) if tests else ''


def uniform_rows(measured: list[MeasuredDensity]) -> list[tuple[str, list[float]]]:
  """Each class-aware run minus the uniform run of its method and seed:
  ('method | batches | seeds | measure' cells, differences) rows."""
  uniform = next((m for m in measured if not m.density.samples_per_class), None)
  rows = []
  for m in measured if uniform is not None else []:
    for method in grid.METHODS:
      if m is uniform or method not in m.best or method not in uniform.best:
        continue
      for key, measure in paired.MEASURES:
        diff = paired.seed_differences(
          paired.seed_values(m.summary[m.best[method]], key),
          paired.seed_values(uniform.summary[uniform.best[method]], key),
        )
        if diff:
          rows.append(paired.row([method, m.density.label], diff, measure))
  return rows


def false_negatives(measured: list[MeasuredDensity]) -> list[str]:
  """inspect's false-negative fraction on each density's H-UCL encoder (seed 0), where the
  comparison copied it into REPORT/inspect/."""
  rows = []
  for m in measured:
    if 'H-UCL' not in m.best:
      continue
    folder = f'{m.best["H-UCL"].slug}_seed0'
    path = os.path.join(m.density.records, grid.INSPECT_DIR, folder, inspection.STATISTIC_FILE)
    if not os.path.isfile(path):
      continue
    with open(path) as f:
      statistic = json.load(f)
    rows.append(
      f'| {m.density.label} | {m.same_class:.2f} | '
      f'{100 * statistic["hucl_false_negative_fraction"]:.2f} % (k = {statistic["k"]}) | '
      f'{100 * statistic["hucl_same_class_fraction_of_all_negatives"]:.2f} % |'
    )
  if not rows:
    return []
  return [
    "| batches (training) | same-class per anchor | H-UCL's top-k negatives that are same-class "
    '| same-class share of all negatives |',
    '|---|---|---|---|',
    *rows,
    '',
  ]


def write_density_report(base, densities: list[Density], protocol: str, report_dir: str):
  """REPORT_DIR/report.md and its plot from the densities' records; returns the text
  (None while no density has a finished run)."""
  labels = training_labels(base)
  measured = [m for d in densities if (m := measure_density(base, d, protocol, labels)) is not None]
  if not measured:
    return None
  os.makedirs(report_dir, exist_ok=True)
  plot = plots.plot_pairs([(m.same_class, m.summary, m.best) for m in measured], report_dir)
  pair_table, uniform_table, reading = density_tables(measured)
  lines = [
    f'# The comparison against label density: {grid.dataset_label(base)}',
    '',
    f'Batch {base.batch_size}, {base.num_epochs} epochs, model {base.model.name}, linear '
    f'evaluation protocol {protocol}. Each density is one comparison (its report: '
    + ', '.join(
      f'[{m.density.label}]({os.path.relpath(m.density.records, report_dir)}/report.md)'
      for m in measured
    )
    + "); a density's same-class count is measured in the batches its runs trained on.",
    '',
    *density_method_tables(measured),
    '## Paired differences against the density (points; same seed: same subset)',
    '',
    reading,
    '',
    *pair_table,
    f'![paired differences]({plot})',
    '',
    '## Each class-aware run against the uniform run of its method and seed',
    '',
    *uniform_table,
  ]
  fn = false_negatives(measured)
  if fn:
    lines += ["## H-UCL's hardest negatives (`python -m hscl_jax.inspect`, seed 0)", '', *fn]
  report = '\n'.join(lines) + '\n'
  atomic.write_text(os.path.join(report_dir, REPORT_FILE), report)
  return report


@dataclasses.dataclass(frozen=True)
class Budget:
  """One comparison of the sweep: its epoch count, its records and their summary."""

  epochs: int
  records: str
  summary: dict  # summarise, over the seeds of every budget
  best: dict  # best_per_method

  @property
  def label(self) -> str:
    return f'{self.epochs} epochs'


def parse_budgets(values: list[str]) -> list[tuple[int, str]]:
  """['3=DIR', '9=DIR', ...] -> [(epochs, DIR)] (a ValueError names a malformed item)."""
  budgets = grid.parse_points(values, 'num_epochs', 'E', '9=docs/results/x/e9')
  if any(epochs < 1 for epochs, _ in budgets):
    raise ValueError('a budget needs at least 1 epoch')
  return budgets


def shared_seeds(runs_per_budget: list[list[dict]]) -> dict[str, set[int]]:
  """Method -> the seeds it finished at every budget (methods missing at one are left out)."""
  seeds = [{} for _ in runs_per_budget]
  for found, runs in zip(seeds, runs_per_budget):
    for run in runs:
      found.setdefault(run['setting'].method, set()).add(run['seed'])
  methods = set.intersection(*(set(found) for found in seeds))
  return {m: set.intersection(*(found[m] for found in seeds)) for m in methods}


def measure_budgets(base, budgets: list[tuple[int, str]], protocol: str) -> list[Budget]:
  """Each budget's recorded runs of the shared seeds, summarised ([] while none)."""
  runs_per_budget = [
    grid.recorded_runs(grid.point_config(base, 'num_epochs', epochs), records, protocol)
    for epochs, records in budgets
  ]
  seeds = shared_seeds(runs_per_budget)
  measured = []
  for (epochs, records), runs in zip(budgets, runs_per_budget):
    kept = [run for run in runs if run['seed'] in seeds.get(run['setting'].method, ())]
    if kept:
      summary = summarise(kept)
      measured.append(Budget(epochs, records, summary, best_per_method(summary)))
  return measured if len(measured) == len(budgets) else []


def _seed_values(b: Budget, method: str, key: str) -> dict[int, float]:
  return paired.seed_values(b.summary[b.best[method]], key)


def longer_rows(measured: list[Budget]) -> list[tuple[str, list[float]]]:
  """Each method at a longer budget minus at the shortest, per seed."""
  shortest, rows = measured[0], []
  for method in grid.METHODS:
    for b in measured[1:]:
      if method not in b.best or method not in shortest.best:
        continue
      for key, name in paired.MEASURES:
        diff = paired.seed_differences(
          _seed_values(b, method, key), _seed_values(shortest, method, key)
        )
        rows.append(paired.row([method, f'{b.label} − {shortest.label}'], diff, name))
  return rows


def moved_rows(measured: list[Budget]) -> list[tuple[str, list[float]]]:
  """How each pair's per-seed difference moved: at a longer budget minus at the shortest."""
  shortest, rows = measured[0], []
  for first, second in paired.PAIRS:
    for b in measured[1:]:
      both = (first in m.best and second in m.best for m in (shortest, b))
      if not all(both):
        continue
      for key, name in paired.MEASURES:
        longer, short = (
          paired.paired_differences(m.summary, m.best, key, first, second) for m in (b, shortest)
        )
        diff = paired.seed_differences(longer, short)
        cells = [f'{first} − {second}', f'{b.label} − {shortest.label}']
        rows.append(paired.row(cells, diff, name))
  return rows


def speed_rows(measured: list[Budget]) -> list[str]:
  """Fig. 1's measure per budget: the first epoch at which a method's kNN top-1 (mean over
  its seeds) reaches SCL's final kNN top-1 (mean) of the same budget."""
  if any('SCL' not in b.best for b in measured):
    return []
  targets = [float(np.mean(b.summary[b.best['SCL']]['knn'])) for b in measured]
  header = ' | '.join(f'{b.label} (SCL {100 * t:.2f} %)' for b, t in zip(measured, targets))
  lines = ['| method | ' + header + ' |', '|---|' + '---|' * len(measured)]
  for method in grid.METHODS:
    if not all(method in b.best for b in measured):
      continue
    cells = []
    for b, target in zip(measured, targets):
      epoch = first_epoch_reaching(b.summary[b.best[method]]['runs'], target)
      cells.append('not reached' if epoch is None else f'{epoch} of {b.epochs}')
    lines.append(f'| {method} | {" | ".join(cells)} |')
  return lines + ['']


def budget_tables(measured: list[Budget]) -> tuple[list[str], str]:
  """The three tables of paired differences (pairs per budget, each method against its
  shortest budget, each pair's move) with their tests, one Holm family; and the sentence
  on reading them."""
  points = [([b.label], b.summary, b.best) for b in measured]
  parts = [
    (
      '## Paired differences at each budget (points; same seed: same subset, same order)',
      ['pair', 'budget'],
      paired.pair_rows(points),
    ),
    (
      '## Each method at a longer budget against its runs of the same seeds at the shortest',
      ['method', 'budgets'],
      longer_rows(measured),
    ),
    (
      "## How each pair's difference moved with the budget (its per-seed difference at the "
      'longer budget minus at the shortest)',
      ['pair', 'budgets'],
      moved_rows(measured),
    ),
  ]
  if not any(rows for _, _, rows in parts):
    return [], ''
  tables, tests = paired.tables([(columns, rows) for _, columns, rows in parts])
  out = []
  for (title, _, rows), table in zip(parts, tables):
    out += [title, '', *table, ''] if rows else []
  return out, paired.how_to_read(tests)


def write_budget_report(base, budgets: list[tuple[int, str]], protocol: str, report_dir: str):
  """REPORT_DIR/report.md from the budgets' records; returns its text (None while a
  budget has no finished run of a seed that every budget finished)."""
  measured = measure_budgets(base, budgets, protocol)
  if not measured:
    return None
  os.makedirs(report_dir, exist_ok=True)
  links = ', '.join(
    f'[{b.label}]({os.path.relpath(b.records, report_dir)}/report.md)' for b in measured
  )
  seeds = {
    m: sorted({r['seed'] for r in measured[0].summary[s]['runs']})
    for m, s in measured[0].best.items()
  }
  table_lines, reading = budget_tables(measured)
  lines = [
    f'# The comparison against the training budget: {grid.dataset_label(base)}',
    '',
    f'Batch {base.batch_size}, model {base.model.name}, samples per class '
    f'{base.samples_per_class or "0 (uniform batches)"}, linear evaluation protocol '
    f'{protocol}. Each budget is one comparison (its report: {links}); every figure here is '
    'over the seeds a method finished at every budget: '
    + '; '.join(f'{m} {", ".join(map(str, s))}' for m, s in seeds.items())
    + '.',
    '',
    *sweep_method_tables([(b.label, b.summary, b.best) for b in measured], 'budget'),
    reading,
    '',
    *table_lines,
  ]
  speed = speed_rows(measured)
  if speed:
    lines += [
      "## Fig. 1's measure: the first epoch reaching SCL's final kNN of the same budget",
      '',
      *speed,
    ]
  report = '\n'.join(lines) + '\n'
  atomic.write_text(os.path.join(report_dir, REPORT_FILE), report)
  return report


@dataclasses.dataclass(frozen=True)
class Sweep:
  """A sweep's report: the config field its points differ in, its points parsed from
  'VALUE=REPORT_DIR' items (a ValueError names a malformed one), the report's writer
  ((base, points, protocol, report_dir) -> its text, or None) and what is printed while it
  has nothing to report."""

  field: str
  parse: Callable
  write: Callable
  nothing_yet: str


SWEEPS = {
  sweep.field: sweep
  for sweep in (
    Sweep(
      'samples_per_class',
      parse_densities,
      write_density_report,
      'No finished run recorded for any density yet.',
    ),
    Sweep(
      'num_epochs', parse_budgets, write_budget_report, 'No seed is finished at every budget yet.'
    ),
  )
}
