"""evaluation/features: the kNN monitor's figures of features padded to the extraction's
batch (mask False on the padding) are those of the features alone."""

from __future__ import annotations

import ml_collections
import numpy as np
import pytest

from hscl_jax.evaluation import features as eval_features
from hscl_jax.evaluation import knn
from hscl_jax.evaluation import retrieval_metrics

BATCH = 16  # the extraction's batch: both splits padded to a multiple of it


def _split(rng, size, num_classes=3):
  x = rng.normal(size=(size, 6)).astype(np.float32)
  return x / np.linalg.norm(x, axis=-1, keepdims=True), rng.integers(0, num_classes, size)


def _padded(rng, features, labels):
  """Padded to the batch with rows as close to the split as real ones and labelled with
  its classes (class 0 included): counted, they would change every figure."""
  pad = -len(labels) % BATCH
  mask = np.arange(len(labels) + pad) < len(labels)
  filler = features[rng.integers(0, len(labels), pad)] + 0.01
  filler /= np.linalg.norm(filler, axis=-1, keepdims=True)
  return (
    np.concatenate([features, filler]),
    np.concatenate([labels, rng.integers(0, 3, pad)]),
    mask,
  )


@pytest.fixture(scope='module')
def monitor():
  rng = np.random.default_rng(0)
  bank, queries = _split(rng, 37), _split(rng, 21)
  config = ml_collections.ConfigDict(
    {
      'retrieval': 'precision_at_1,r_precision,map_at_r',
      'chunk_size': 8,
      'k': 5,
      'temperature': 0.5,
    }
  )
  padded = eval_features.MonitorFeatures(bank=_padded(rng, *bank), queries=_padded(rng, *queries))
  return config, bank, queries, padded


def test_the_retrieval_figures_of_a_padded_bank_are_the_banks(monitor):
  config, (bank, bank_labels), (queries, query_labels), padded = monitor
  assert len(padded.bank[0]) == 48 and len(padded.queries[0]) == 32
  got = eval_features.monitor_retrieval(config, padded)
  expected = retrieval_metrics.retrieval_metrics(
    queries,
    query_labels,
    bank,
    bank_labels,
    metrics=('precision_at_1', 'r_precision', 'map_at_r'),
    chunk_size=8,
  )
  assert list(got) == list(expected)
  for name, value in expected.items():
    assert got[name] == pytest.approx(value, abs=1e-6), name


def test_the_knn_top1_of_a_padded_bank_is_the_banks(monitor):
  config, (bank, bank_labels), (queries, query_labels), padded = monitor
  got = eval_features.monitor_knn(config, padded, num_classes=3)
  expected = knn.weighted_knn_accuracy(
    bank, bank_labels, queries, query_labels, num_classes=3, k=5, temperature=0.5, chunk_size=8
  )
  assert got == pytest.approx(expected, abs=1e-6)
