"""Figures of what a trained run learned, and its false-negative statistic (the library
behind `python -m hscl_jax.inspect`; docs/inspect.md describes each file).

Writes into OUT: `tsne.png` (a 2-D t-SNE map of the test split's backbone features by
class), `neighbours.png` (seeded test queries and their nearest training images),
`hardest_negatives.png` (the negatives a hardening weights most, as H-UCL and as H-SCL
see them: the paper's Fig. 2 on data) and `false_negatives.json` (the fraction of
same-class samples among each anchor's top-k weighted negatives under H-UCL, over the
whole test split in batches of the run's batch size). Similarities for the map and the
neighbours are the kNN monitor's (backbone features); hardness uses the projection head's
outputs, which is what the loss sees.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from absl import logging
from ml_collections import config_dict
import numpy as np

from hscl_jax import data
from hscl_jax import errors
from hscl_jax import losses
from hscl_jax import objectives
from hscl_jax.config import methods
from hscl_jax.evaluation import embedding
from hscl_jax.evaluation import figures
from hscl_jax.evaluation import hard_negatives
from hscl_jax.rundir import atomic
from hscl_jax.rundir import trained_run

TSNE_FILE = 'tsne.png'
NEIGHBOURS_FILE = 'neighbours.png'
HARDEST_FILE = 'hardest_negatives.png'
STATISTIC_FILE = 'false_negatives.json'
FILES = (TSNE_FILE, NEIGHBOURS_FILE, HARDEST_FILE, STATISTIC_FILE)
NUM_QUERIES = 8  # rows of neighbours.png
NUM_NEIGHBOURS = 8
NUM_ANCHORS = 4  # anchors of hardest_negatives.png, two rows each
NUM_SHOWN_NEGATIVES = 8


class InspectError(errors.UserError, ValueError):
  """A hardening or setting that inspection cannot use (names the value and the fix)."""


@dataclasses.dataclass(frozen=True)
class HardeningChoice:
  """A hardening and how to describe it: name 'exp' (β) or 'threshold' (τ)."""

  name: str
  value: float

  def function(self) -> losses.Hardening:
    try:
      return objectives.hardening(self.name, self.value)
    except ValueError as error:
      flag = methods.HARDENING_PARAMETER[self.name]
      raise InspectError(f'--{flag}={self.value}: {error} Fix: pass e.g. --{flag}=1.') from None

  def describe(self) -> str:
    if self.name == 'exp':
      return f'η(g) = exp(βg), β = {self.value:g}'
    return f'η(g) = 1(exp(g) ≥ τ), τ = {self.value:.3g}'

  def as_json(self) -> dict[str, Any]:
    return {'hardening': self.name, methods.HARDENING_PARAMETER[self.name]: self.value}


def run_hardening(
  config: config_dict.ConfigDict,
  name: str | None = None,
  beta: float | None = None,
  tau: float | None = None,
) -> HardeningChoice:
  """The given hardening, or the run's (config.hardening; config.beta, or τ of eq. (4) at
  the last epoch). UCL and SCL runs train without one: theirs is the one their
  diagnostics use, from the same fields."""
  name = name or config.hardening
  if name not in methods.HARDENINGS:
    raise InspectError(f'--hardening={name!r} is not a hardening; use exp or threshold.')
  if name == 'exp':
    return HardeningChoice('exp', float(config.beta if beta is None else beta))
  if tau is None:
    tau = objectives.tau_at(config, config.num_epochs)
  return HardeningChoice('threshold', float(tau))


@dataclasses.dataclass(frozen=True)
class Embedded:
  """The run's splits and what its encoder makes of them (rows in the sources' order)."""

  train: Any
  test: Any
  class_names: list[str]
  train_features: np.ndarray
  train_labels: np.ndarray
  test_features: np.ndarray
  test_labels: np.ndarray
  test_projections: np.ndarray


def embed_splits(
  workdir: str, config, checkpoint_step: trained_run.Checkpoint
) -> tuple[int, Embedded]:
  """(checkpoint step, Embedded): backbone features of both splits, projections of the test
  split."""
  trained_run.resolve_step(workdir, checkpoint_step)  # no checkpoint: one line, now
  train, test = data.run_sources(config)
  encoder = embedding.restore(workdir, config, checkpoint_step=checkpoint_step, with_head=True)
  train_features, train_labels = embedding.compute_features(encoder, train)
  test_features, test_labels = embedding.compute_features(encoder, test)
  test_projections, _ = embedding.compute_features(encoder, test, projections=True)
  names = data.class_names(config.dataset, test)
  return encoder.step, Embedded(
    train, test, names, train_features, train_labels, test_features, test_labels, test_projections
  )


def seeded_batches(num_examples: int, batch_size: int, seed: int) -> list[np.ndarray]:
  """Indices 0..num_examples-1 (the test split), shuffled by `seed` and cut into batches of
  `batch_size` (the last one shorter; dropped if it holds one sample: no negative)."""
  order = np.random.default_rng(seed).permutation(num_examples)
  batches = [order[i : i + batch_size] for i in range(0, num_examples, batch_size)]
  return [b for b in batches if len(b) > 1]


def false_negative_report(
  embedded: Embedded, choice: HardeningChoice, config, k: int, seed: int
) -> dict[str, Any]:
  """false_negatives.json's content: H-UCL's and H-SCL's fractions over the test split."""
  batches = seeded_batches(len(embedded.test_labels), config.batch_size, seed)
  pairs = [(embedded.test_projections[b], embedded.test_labels[b]) for b in batches]
  hardening = choice.function()
  by_set = {
    negatives: hard_negatives.false_negative_fraction(
      pairs, hardening, config.temperature, k, negatives
    )
    for negatives in hard_negatives.NEGATIVE_SETS
  }
  return {
    'k': k,
    **choice.as_json(),
    'temperature': config.temperature,
    'batch_size': config.batch_size,
    'num_batches': len(batches),
    'num_anchors': by_set['hucl']['num_anchors'],
    'hucl_false_negative_fraction': by_set['hucl']['fraction'],
    'hucl_same_class_fraction_of_all_negatives': by_set['hucl']['unweighted'],
    'hscl_false_negative_fraction': by_set['hscl']['fraction'],
    'features': 'projection-head outputs, L2-normalised (what the loss sees)',
    'seed': seed,
  }


def set_phrases(method: methods.Method) -> dict[str, str]:
  """Per negative set, how a run of `method` relates to its weights: 'as H-SCL does' for
  the set the run trained with hardened, 'as H-UCL would' for the other (and for both when
  the run trained without a hardening): inspection measures one encoder under both."""
  trained = 'hscl' if method.supervised else 'hucl'
  phrases = {}
  for negatives, label in hard_negatives.SET_LABELS.items():
    does = method.hardening != 'none' and negatives == trained
    phrases[negatives] = f'as {label} ' + ('does' if does else 'would')
  return phrases


def summary_line(result: dict[str, Any]) -> str:
  """What `inspect` prints from false_negatives.json's content: whose encoder was measured,
  and its false negatives under each set's weights (one run, never two models)."""
  method = methods.by_label(result['method_label'])
  phrases = set_phrases(method)
  choice = HardeningChoice(
    result['hardening'], result[methods.HARDENING_PARAMETER[result['hardening']]]
  )
  percent = lambda name: f'{100 * result[name]:.1f} %'
  return (
    f"This {method.label} run's encoder, its negatives weighted by {choice.describe()}: "
    f'{phrases["hucl"]} (every other sample a negative), '
    f"{percent('hucl_false_negative_fraction')} of each anchor's top-{result['k']} are "
    f'same-class ({percent("hucl_same_class_fraction_of_all_negatives")} of all its '
    f'negatives; {result["num_anchors"]} anchors); {phrases["hscl"]} (other classes only), '
    f'{percent("hscl_false_negative_fraction")}.'
  )


def inspect_run(
  workdir: str,
  out_dir: str,
  *,
  hardening: str | None = None,
  beta: float | None = None,
  tau: float | None = None,
  k: int = NUM_SHOWN_NEGATIVES,
  seed: int = 0,
  checkpoint_step: trained_run.Checkpoint = None,
) -> dict[str, Any]:
  """Writes the three PNGs and the JSON into `out_dir`; returns the JSON's content."""
  if k < 1:
    raise InspectError(f'--k={k} must be >= 1 (the top-k negatives counted); e.g. --k=8.')
  figures.pyplot()  # no matplotlib: one line, before any work
  config = trained_run.load_run_config(workdir)
  choice = run_hardening(config, hardening, beta, tau)
  choice.function()  # a bad β or τ is refused before any work
  step, embedded = embed_splits(workdir, config, checkpoint_step)
  os.makedirs(out_dir, exist_ok=True)
  result = false_negative_report(embedded, choice, config, k, seed)
  method = methods.of_config(config)
  result.update(
    checkpoint_step=step, method=config.method, method_label=method.label, dataset=config.dataset
  )
  atomic.write_json(os.path.join(out_dir, STATISTIC_FILE), result, newline=True)
  rng = np.random.default_rng(seed)
  title = f'{config.method} on {config.dataset}, checkpoint step {step}'
  figures.tsne_map(embedded, os.path.join(out_dir, TSNE_FILE), title, seed)
  num_test = len(embedded.test_labels)
  queries = np.sort(rng.choice(num_test, min(NUM_QUERIES, num_test), replace=False))
  figures.nearest_neighbours(
    embedded, queries, NUM_NEIGHBOURS, os.path.join(out_dir, NEIGHBOURS_FILE)
  )
  batch = seeded_batches(len(embedded.test_labels), config.batch_size, seed)[0]
  figures.hardest_negatives(
    embedded,
    batch,
    min(NUM_ANCHORS, len(batch)),
    choice,
    config.temperature,
    os.path.join(out_dir, HARDEST_FILE),
    NUM_SHOWN_NEGATIVES,
    method.label,
    set_phrases(method),
  )
  logging.info('wrote %s into %s', ', '.join(FILES), out_dir)
  return result
