"""The paper's comparison (Table I, Figs. 1, 4, 5) on any config: runs, table, plots.

The library behind `python -m hscl_jax.experiments.compare`. Trains UCL, H-UCL, SCL,
H-SCL(β) and H-SCL(τ) with the same budget (the config's), runs the linear evaluation on
each, and writes ROOT/report.md (mean ± std over seeds, the best setting of each method
when a grid is searched, and every run) with PNG plots: kNN accuracy per epoch (Fig. 1),
the fraction of anchors satisfying Assumption 1 (Fig. 4) and the four losses per epoch
(Fig. 5). The β grid is {0.1, 0.5, 1, 2, 5} for H-UCL and H-SCL(β); the τ grid is eq. (4)'s
start × end grid for H-SCL(τ). Runs already finished in ROOT are reused (each run resumes
from its checkpoints).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import time

from absl import logging
import ml_collections
import numpy as np

from hscl_jax import linear_probe
from hscl_jax import metrics
from hscl_jax import train

BETA_GRID = (0.1, 0.5, 1.0, 2.0, 5.0)
TAU_STARTS = (-0.5, -0.3, -0.1)
TAU_ENDS = (-0.1, 0.0, 0.1)
METHODS = ('UCL', 'H-UCL', 'SCL', 'H-SCL(β)', 'H-SCL(τ)')
FOUR_LOSSES = ('loss_ucl', 'loss_hucl', 'loss_scl', 'loss_hscl')


@dataclasses.dataclass(frozen=True)
class Setting:
  """One method with one hyperparameter choice; `overrides` are config fields."""

  method: str
  overrides: tuple[tuple[str, object], ...]

  @property
  def label(self) -> str:
    hyper = ', '.join(
      f'{k}={v}' for k, v in self.overrides if k in ('beta', 'tau_start', 'tau_end')
    )
    return f'{self.method} ({hyper})' if hyper else self.method

  @property
  def slug(self) -> str:
    parts = [self.method.lower().replace('(β)', '_beta').replace('(τ)', '_tau').replace('-', '')]
    parts += [f'{k}{v}' for k, v in self.overrides if k in ('beta', 'tau_start', 'tau_end')]
    return '_'.join(parts)


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
  return sorted(out, key=lambda s: METHODS.index(s.method))


def run_config(base: ml_collections.ConfigDict, setting: Setting, seed: int):
  config = ml_collections.ConfigDict(base.to_dict())
  for key, value in setting.overrides:
    config[key] = value
  config.seed = seed
  return config


def run_one(base, setting: Setting, seed: int, root: str, protocol: str) -> dict:
  """Trains (or resumes / reuses) one run and linear-evaluates its last checkpoint."""
  workdir = os.path.join(root, setting.slug, f'seed{seed}')
  config = run_config(base, setting, seed)
  config.linear_eval.protocol = protocol
  start = time.time()
  train.train_and_evaluate(config, workdir)
  result_path = os.path.join(workdir, linear_probe.RESULT_FILE)
  last_step = linear_probe.resolve_step(workdir, None)
  result = None
  if os.path.exists(result_path):
    with open(result_path) as f:
      result = json.load(f)
  if not result or result['checkpoint_step'] != last_step or result['protocol'] != protocol:
    result = linear_probe.linear_evaluate(config, workdir)
  logging.info(
    '%s seed %d: linear top-1 %.4f (%.0f s)',
    setting.label,
    seed,
    result['top1'],
    time.time() - start,
  )
  return {
    'setting': setting,
    'seed': seed,
    'linear': result,
    'history': metrics.read_metrics(workdir),
  }


def _mean_std(values) -> str:
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
  best = {}
  for setting, stats in summary.items():
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


def markdown_report(summary, best, config, seeds, protocol, grids, plots) -> str:
  dataset = config.dataset
  lines = [
    f'# H-SCL comparison on {dataset}',
    '',
    f'Seeds: {", ".join(map(str, seeds))}; {config.num_epochs} epochs, batch '
    f'{config.batch_size}, model {config.model.name}, temperature {config.temperature}; '
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
        f'| {method} | {best[method].label} | {_mean_std(stats["top1"])} | '
        f'{_mean_std(stats["top5"])} | {_mean_std(stats["knn"])} |'
      )
  ranking = _ranking([m for m in METHODS if m in best], lambda m: np.mean(summary[best[m]]['top1']))
  lines += ['', f'Ranking by mean linear top-1: {ranking}.', '']
  if len(summary) > len(best):
    lines += ['## Every setting', '', '| setting | linear top-1 | kNN top-1 |', '|---|---|---|']
    for setting, stats in summary.items():
      lines.append(f'| {setting.label} | {_mean_std(stats["top1"])} | {_mean_std(stats["knn"])} |')
    lines.append('')
  lines += ['## Plots', ''] + [f'![{p}]({p})' for p in plots]
  return '\n'.join(lines) + '\n'


GRIDS = ('beta', 'tau')
REPORT_FILE = 'report.md'


def compare(config, root: str, seeds: list[int], grids: set[str], protocol: str) -> str:
  """Every setting × seed (finished runs reused), then ROOT/report.md and its plots;
  returns the report."""
  os.makedirs(root, exist_ok=True)
  plan = settings(config, grids)
  logging.info('%d runs: %d settings × %d seeds', len(plan) * len(seeds), len(plan), len(seeds))
  runs = [run_one(config, s, seed, root, protocol) for s in plan for seed in seeds]
  summary = summarise(runs)
  best = best_per_method(summary)
  plots = plot_report(summary, best, root)
  report = markdown_report(summary, best, config, seeds, protocol, grids, plots)
  with open(os.path.join(root, REPORT_FILE), 'w') as f:
    f.write(report)
  return report
