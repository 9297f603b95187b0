"""The image comparison's report: Table I (the best setting of each method), the paired
differences, the speed claim, the queue runs, every setting, run times, the inspect
figures, the plots; written as ROOT/report.md."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np

from hscl_jax.evaluation import inspection
from hscl_jax.experiments import grid
from hscl_jax.experiments import image_batches
from hscl_jax.experiments import image_pairs
from hscl_jax.experiments import image_runs
from hscl_jax.experiments import plots
from hscl_jax.experiments import raw_pixels
from hscl_jax.rundir import atomic


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
  for method in grid.METHODS:
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
  for method in grid.METHODS:
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


def markdown_report(
  summary, best, config, seeds, protocol, grids, plots, raw=None, inspected=()
) -> str:
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
    '## Table I (top-1 %, linear; mean ± std over seeds)',
    '',
    f'| Method | setting | {dataset} linear top-1 | linear top-5 | kNN top-1 (last epoch) |',
    '|---|---|---|---|---|',
  ]
  for method in grid.METHODS:
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
    [m for m in grid.METHODS if m in best], lambda m: np.mean(summary[best[m]]['top1'])
  )
  lines += ['', f'Ranking by mean linear top-1: {ranking}.', '']
  lines += image_pairs.paired_table(summary, best)
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


REPORT_FILE = 'report.md'


def write_report(config, root: str, plan, grids, protocol: str, report_dir: str | None = None):
  """ROOT/report.md (or REPORT_DIR/report.md) and its plots from the finished runs of
  `plan` (grid.plan_runs), in ROOT or recorded in the report's directory (each finished run in
  ROOT is recorded there); returns the report's text (None while no run has finished)."""
  out_dir = report_dir or root
  runs = [
    run
    for s, seed in plan
    if (run := image_runs.completed_run(config, s, seed, root, protocol, out_dir)) is not None
  ]
  if not runs:
    return None
  os.makedirs(out_dir, exist_ok=True)
  summary = summarise(runs)
  best = best_per_method(summary)
  plot_files = plots.plot_report(summary, best, out_dir)
  raw = raw_pixels.raw_pixel_knn(config, out_dir)
  seeds = sorted({seed for _, seed in plan})
  inspected = inspect_links(root, best, seeds[0], out_dir)
  described = grid.describe_seeds(plan)
  report = markdown_report(
    summary, best, config, described, protocol, grids, plot_files, raw, inspected
  )
  report += '\n' + '\n'.join(image_batches.batch_composition(config, plan))
  missing = len(plan) - len(runs)
  report += f'\n{len(runs)} runs finished' + (f', {missing} missing.' if missing else '.') + '\n'
  atomic.write_text(os.path.join(out_dir, REPORT_FILE), report)
  return report
