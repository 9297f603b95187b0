"""Backbone features of whole splits on the mesh, and the kNN monitor over them.

Shared by training (the per-epoch kNN monitor) and linear evaluation (features of the
frozen encoder): evaluation never imports training.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
from jax.sharding import PartitionSpec as P
import ml_collections
import numpy as np

from hscl_jax import data
from hscl_jax import losses
from hscl_jax import models
from hscl_jax import parallel
from hscl_jax.data import augment
from hscl_jax.evaluation import knn
from hscl_jax.evaluation import retrieval_metrics


def make_feature_fn(
  model: models.ContrastiveModel,
  augment_params: augment.AugmentParams,
  mesh: jax.sharding.Mesh,
  *,
  projections: bool = False,
):
  """jit(shard_map): (variables, eval batch) -> (normalised features, labels, mask), sharded.

  The features are the backbone's (the kNN monitor's), or with `projections` the projection
  head's outputs (what the loss sees; `variables` must then hold the head's entries too).
  """

  def per_device(variables, batch):
    x = augment.preprocess_eval(batch['image'], augment_params)
    if projections:
      _, h = model.apply(variables, x, train=False)
    else:
      h = model.apply(variables, x, train=False, method=models.ContrastiveModel.features)
    return losses.l2_normalize(h), batch['label'], batch['mask']

  return jax.jit(
    jax.shard_map(
      per_device, mesh=mesh, in_specs=(P(), P(parallel.AXIS)), out_specs=P(parallel.AXIS)
    )
  )


def extract_features(
  feature_fn,
  variables,
  source,
  batch_size: int,
  mesh: jax.sharding.Mesh,
  check: Callable[[], None] | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(features, labels, mask) of a whole split on the host (padded rows have mask False).

  `feature_fn` is `make_feature_fn`'s; `variables` need only the encoder's entries.
  `check` is called before each batch: it may raise to abandon the extraction (the
  training loop's preemption check does).
  """
  loader = data.EvalLoader(
    source,
    global_batch_size=batch_size,
    shard_index=jax.process_index(),
    shard_count=jax.process_count(),
  )
  parts = []
  for batch in loader:
    if check is not None:
      check()
    parts.append(
      feature_fn(variables, parallel.global_batch(batch, mesh, ('image', 'label', 'mask')))
    )
  return tuple(np.concatenate([parallel.to_host(p[i]) for p in parts]) for i in range(3))


class MonitorFeatures(NamedTuple):
  """The kNN monitor's features of both splits on the host: each a (features, labels,
  mask) triple whose mask is False on padding rows."""

  bank: tuple[np.ndarray, np.ndarray, np.ndarray]
  queries: tuple[np.ndarray, np.ndarray, np.ndarray]


def monitor_features(
  knn_config: ml_collections.ConfigDict,
  feature_fn,
  variables,
  bank_source,
  query_source,
  *,
  mesh: jax.sharding.Mesh,
  check: Callable[[], None] | None = None,
) -> MonitorFeatures:
  """Features of the bank (training) and query (test) splits, extracted once for every
  figure of the monitor: the kNN, the retrieval metrics, training's online probe.

  `check` is called before each batch of the extraction (it may raise).
  """
  extract = lambda source: extract_features(
    feature_fn, variables, source, knn_config.batch_size, mesh, check
  )
  return MonitorFeatures(bank=extract(bank_source), queries=extract(query_source))


def monitor_knn(
  knn_config: ml_collections.ConfigDict, features: MonitorFeatures, *, num_classes: int
) -> float:
  """Weighted-kNN top-1 of the monitor's queries against its bank (config.knn's settings)."""
  (bank, bank_labels, bank_mask), (queries, query_labels, query_mask) = features
  return knn.weighted_knn_accuracy(
    bank,
    bank_labels,
    queries,
    query_labels,
    num_classes=num_classes,
    k=knn_config.k,
    temperature=knn_config.temperature,
    chunk_size=knn_config.chunk_size,
    query_mask=query_mask,
    bank_mask=bank_mask,
  )


def knn_accuracy(
  knn_config: ml_collections.ConfigDict,
  feature_fn,
  variables,
  bank_source,
  query_source,
  *,
  num_classes: int,
  mesh: jax.sharding.Mesh,
  check: Callable[[], None] | None = None,
) -> float:
  """Weighted-kNN top-1 of `query_source` against `bank_source` (config.knn's settings).

  `check` is called before each batch of the feature extraction (it may raise).
  """
  features = monitor_features(
    knn_config, feature_fn, variables, bank_source, query_source, mesh=mesh, check=check
  )
  return monitor_knn(knn_config, features, num_classes=num_classes)


def monitor_retrieval(
  knn_config: ml_collections.ConfigDict, features: MonitorFeatures
) -> dict[str, float]:
  """The retrieval metrics named by config.knn.retrieval (evaluation/retrieval_metrics) of the
  monitor's queries ranked against its bank; {} when it names none."""
  names = retrieval_metrics.metric_names(knn_config.retrieval)
  if not names:
    return {}
  (bank, bank_labels, bank_mask), (queries, query_labels, query_mask) = features
  return retrieval_metrics.retrieval_metrics(
    queries,
    query_labels,
    bank,
    bank_labels,
    metrics=names,
    query_mask=query_mask,
    reference_mask=bank_mask,
    chunk_size=knn_config.chunk_size,
  )
