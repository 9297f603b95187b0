"""Backbone features of whole splits on the mesh, and the kNN monitor over them.

Shared by training (the per-epoch kNN monitor) and linear evaluation (features of the
frozen encoder): evaluation never imports training.
"""

from __future__ import annotations

from collections.abc import Callable

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
  return knn_with_queries(
    knn_config,
    feature_fn,
    variables,
    bank_source,
    query_source,
    num_classes=num_classes,
    mesh=mesh,
    check=check,
  )[0]


def knn_with_queries(
  knn_config: ml_collections.ConfigDict,
  feature_fn,
  variables,
  bank_source,
  query_source,
  *,
  num_classes: int,
  mesh: jax.sharding.Mesh,
  check: Callable[[], None] | None = None,
) -> tuple[float, tuple[np.ndarray, np.ndarray, np.ndarray]]:
  """(`knn_accuracy`'s top-1, the queries' (features, labels, mask) on the host it was
  computed on), for other figures of the same features (training's online probe)."""
  bank, bank_labels, bank_mask = extract_features(
    feature_fn, variables, bank_source, knn_config.batch_size, mesh, check
  )
  queries, query_labels, query_mask = extract_features(
    feature_fn, variables, query_source, knn_config.batch_size, mesh, check
  )
  top1 = knn.weighted_knn_accuracy(
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
  return top1, (queries, query_labels, query_mask)
