"""How many samples of an anchor's class its batches hold, measured in each run's batches."""

from __future__ import annotations

import ml_collections
import numpy as np

from hscl_jax import data
from hscl_jax.experiments import grid


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
