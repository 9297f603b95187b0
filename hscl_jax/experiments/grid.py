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

This module is the grid: the settings of the methods table (hscl_jax/config/methods.py),
each run's config and directory, the plan of runs. Running it is experiments/image_runs;
the report is experiments/reports, with the paired differences (image_pairs), the
labels in a batch (image_batches), the plots (plots) and the raw-pixel baseline
(raw_pixels).
"""

from __future__ import annotations

import dataclasses
import itertools
import os

import ml_collections

from hscl_jax.config import methods

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


def settings(config: ml_collections.ConfigDict, grids: set[str]) -> list[Setting]:
  """The methods of Table I, with the β / τ grids where asked and the config's values otherwise."""
  betas = methods.BETA_GRID if 'beta' in grids else (config.beta,)
  taus = (
    list(itertools.product(methods.TAU_STARTS, methods.TAU_ENDS))
    if 'tau' in grids
    else [(config.tau_start, config.tau_end)]
  )
  out = [
    Setting(row.label, row.overrides + point)
    for row in methods.ROWS
    if row.compared
    for point in row.grid(betas, taus)
  ]
  if 'queue' in grids:
    queue = (('queue_size', queue_size_for(config)), ('queue_momentum', QUEUE_MOMENTUM))
    out += [Setting(s.method, s.overrides + queue) for s in out if methods.by_label(s.method).queue]
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


def dataset_label(config) -> str:
  """'cifar10', or for an image folder 'image_folder (<its directory name>)'."""
  if config.dataset == 'image_folder' and config.folder:
    return f'image_folder ({os.path.basename(os.path.normpath(config.folder))})'
  return config.dataset


GRIDS = ('beta', 'tau', 'queue')


def method_slug(method: str) -> str:
  """'H-SCL(β)' -> 'hscl_beta': a method's name as a run directory and --seeds_for spell it."""
  return Setting(method, ()).slug


def plan_runs(config, seeds: list[int], grids: set[str], seeds_for: dict[str, int] | None = None):
  """(setting, seed) pairs, seed by seed (seed 0 of every setting first). `seeds_for` maps
  a method's slug (the methods table's: ucl, hucl, scl, hscl_beta, hscl_tau) to its own
  number of seeds (0, 1, ...), e.g. more seeds for the pair a claim rests on; others get
  `seeds`."""
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
