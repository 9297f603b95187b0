"""The reports' plots: the image comparison's kNN accuracy per epoch (Fig. 1), anchors
satisfying Assumption 1 (Fig. 4) and four losses per epoch (Fig. 5); the density sweep's
paired differences against the same-class samples an anchor met."""

from __future__ import annotations

import os

import numpy as np

from hscl_jax.config import methods
from hscl_jax.evaluation import figures
from hscl_jax.experiments import paired

FOUR_LOSSES = ('loss_ucl', 'loss_hucl', 'loss_scl', 'loss_hscl')
PAIRS_PLOT_FILE = 'paired_differences.png'


def curves(runs, key):
  """Mean over seeds of a per-epoch metric (epochs where every seed has it)."""
  per_seed = [{r['epoch']: r[key] for r in run['history'] if key in r} for run in runs]
  epochs = sorted(set.intersection(*(set(c) for c in per_seed))) if per_seed else []
  return epochs, [np.mean([c[e] for c in per_seed]) for e in epochs]


def require_pyplot():
  """matplotlib's pyplot, or one line naming the fix: the comparison calls it before its
  first run, as its report always draws."""
  return figures.pyplot('python -m hscl_jax.experiments.compare')


def plot_report(summary, best, out_dir: str) -> list[str]:
  """Figs. 1, 4, 5 as PNGs; returns their file names."""
  plt = require_pyplot()

  files = []
  fig, ax = plt.subplots(figsize=(6, 4))
  for method in methods.LABELS:
    if method in best:
      ax.plot(*curves(summary[best[method]]['runs'], 'knn_top1'), label=best[method].label)
  ax.set(xlabel='epoch', ylabel='kNN top-1 (test)', title='kNN accuracy per epoch (Fig. 1)')
  ax.legend(fontsize=7)
  files.append(_save(fig, out_dir, 'fig1_knn.png'))

  hard = [best[m] for m in hardened_supervised_labels() if m in best]
  fig, ax = plt.subplots(figsize=(6, 4))
  for setting in hard:
    ax.plot(*curves(summary[setting]['runs'], 'assumption1_fraction'), label=setting.label)
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
      ax.plot(*curves(summary[setting]['runs'], key), label=key.replace('loss_', '').upper())
    ax.set(xlabel='epoch', ylabel='loss (same positives)', title=f'{setting.label} (Fig. 5)')
    ax.legend(fontsize=7)
  files.append(_save(fig, out_dir, 'fig5_losses.png'))
  return files


def hardened_supervised_labels() -> list[str]:
  """The methods table's compared H-SCL rows (supervised, hardened), whose anchors Figs. 4
  and 5 show."""
  return [r.label for r in methods.ROWS if r.compared and r.supervised and r.hardening != 'none']


def plot_pairs(points, out_dir: str) -> str:
  """paired.PAIRS' mean difference (± std over seeds) at each point (x, summary, best): x
  the same-class samples per anchor, linear and kNN side by side; returns the file name."""
  plt = require_pyplot()

  fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharex=True)
  for ax, (key, name) in zip(axes, (('top1', 'linear top-1'), ('knn', 'kNN top-1'))):
    for first, second in paired.PAIRS:
      found = [
        (
          x,
          100
          * np.array(list(paired.paired_differences(summary, best, key, first, second).values())),
        )
        for x, summary, best in points
        if first in best and second in best
      ]
      found = [(x, d) for x, d in found if len(d)]
      if found:
        x = [p[0] for p in found]
        mean = [p[1].mean() for p in found]
        std = [p[1].std(ddof=1) if len(p[1]) > 1 else 0.0 for p in found]
        ax.errorbar(x, mean, yerr=std, marker='o', capsize=3, label=f'{first} − {second}')
    ax.axhline(0, color='grey', lw=0.8)
    ax.set(xscale='log', xlabel='same-class samples per anchor per batch (measured)')
    ax.set(ylabel=f'paired Δ {name} (points)', title=f'Paired differences, {name}')
    ax.legend(fontsize=7)
  return _save(fig, out_dir, PAIRS_PLOT_FILE)


def _save(fig, out_dir, name):
  figures.save(fig, os.path.join(out_dir, name))
  return name
