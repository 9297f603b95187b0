"""The retrieval evaluation of a trained run (the work of `python -m hscl_jax.retrieval`),
as `linear_evaluation` is linear evaluation's: its checkpoint restored, the backbone
features (the kNN monitor's: `evaluation/embedding`) of its test split ranked against its
train split (the monitor's bank) or against the test split itself (each query leaving
itself out, the metric-learning papers' protocol), the figures of `evaluation/retrieval_metrics`,
written to DIR/retrieval_<reference>.json."""

from __future__ import annotations

import os
import time
from typing import Any

from absl import logging

from hscl_jax import data
from hscl_jax import errors
from hscl_jax.evaluation import embedding
from hscl_jax.evaluation import retrieval_metrics
from hscl_jax.rundir import atomic
from hscl_jax.rundir import trained_run

REFERENCES = ('train', 'test')  # what the test split's queries are ranked against


class RetrievalError(errors.UserError, ValueError):
  """A request the retrieval evaluation cannot serve (names the value and the fix)."""


def result_file(reference: str) -> str:
  """The file name, in the run's workdir, of the figures against `reference`."""
  return f'retrieval_{reference}.json'


def retrieval_over_trained_run(
  workdir: str,
  *,
  reference: str = 'train',
  checkpoint_step: trained_run.Checkpoint = None,
  metrics=retrieval_metrics.METRICS,
) -> dict[str, Any]:
  """The run's retrieval figures (`metrics`, fractions in [0, 1]) with what they were made
  from, written to DIR/retrieval_<reference>.json; the queries are the test split, in
  chunks of `config.knn.chunk_size`."""
  if reference not in REFERENCES:
    raise RetrievalError(f'--reference={reference!r} is no split of the run; use train or test.')
  start = time.perf_counter()
  config = trained_run.load_run_config(workdir)
  trained_run.resolve_step(workdir, checkpoint_step)  # no checkpoint: one line, now
  encoder = embedding.restore(workdir, config, checkpoint_step=checkpoint_step)
  train_source, test_source = data.run_sources(config)
  logging.info('retrieval of %s step %d against its %s split', workdir, encoder.step, reference)
  queries, query_labels = embedding.compute_features(encoder, test_source)
  ranked = () if reference == 'test' else embedding.compute_features(encoder, train_source)
  figures = retrieval_metrics.retrieval_metrics(
    queries, query_labels, *ranked, metrics=metrics, chunk_size=config.knn.chunk_size
  )
  result = {
    **figures,
    'checkpoint_step': encoder.step,
    'reference': reference,
    'train_split': config.train_split,
    'test_split': config.test_split,
    'num_queries': int(len(query_labels)),
    'num_reference': int(len(ranked[1]) if ranked else len(query_labels)),
    'dataset': config.dataset,
    'method': config.method,
    'seconds': time.perf_counter() - start,
  }
  atomic.write_json(os.path.join(workdir, result_file(reference)), result, newline=True)
  return result
