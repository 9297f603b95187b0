"""Retrieval metrics of features: precision@1, R-precision, MAP@R and Recall@K (the
figures only: `evaluation/retrieval_evaluation` computes them for a trained run, the work of
`python -m hscl_jax.retrieval`; the kNN monitor, for each epoch).

Every query ranks the reference rows by cosine similarity (features normalised inside) and
is scored on its ranked list; the figures are the means over the scored queries, fractions
in [0, 1] as the kNN monitor's `knn_top1` is. With R the number of reference rows of the
query's class (the query itself not counted) and `hit_i` whether the i-th nearest shares
that class:

- precision@1 = hit_1;
- R-precision = (1/R) sum_{i<=R} hit_i;
- MAP@R = (1/R) sum_{i<=R} hit_i * (sum_{j<=i} hit_j) / i (Musgrave et al., "A Metric
  Learning Reality Check", 2020, as pytorch-metric-learning's AccuracyCalculator computes it);
- Recall@K = 1 if any of hit_1..hit_K, else 0 (the retrieval papers' definition, Song et
  al. 2016; not the information-retrieval recall). Recall@1 equals precision@1.

Conventions (docs/method.md, "Retrieval metrics"): with no separate reference set the
queries are the reference and each excludes itself (by index: a duplicate of the query is
a neighbour); a query with R = 0 (its class has no other reference row) is left out of
every mean, as pytorch-metric-learning leaves out its "lone" queries; NaN when no query is
scored. Ties in similarity go to the lower reference index (`jax.lax.top_k`'s documented
order).

Cost: queries are processed on the device in fixed-size chunks (`jax.lax.map`), as the
kNN monitor's are. Each chunk holds its [chunk_size, num_reference] similarities and takes
their top k = min(max(max R, max K), num_reference) with `jax.lax.top_k`. Max R is the
largest class's reference count, so k can be a tenth of the reference set (CIFAR-10: 5,000
of 50,000), and XLA then sorts each row: O(num_queries * num_reference * log
num_reference) time besides the similarities' matmul, and memory ~ chunk_size x
num_reference floats for the similarities (and the sort's workspace) plus chunk_size x k
for the ranked lists. Without R-precision and MAP@R in `metrics`, k is the largest K.
Only the per-query figures [num_queries, 3 + number of K] leave the device (a measured
time: docs/method.md, "Retrieval metrics"). The similarities are float32 products at the
highest matmul precision (TF32 would reorder near ties on GPUs). The function compiles
once per (reference size, query count, k) and never per chunk.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from hscl_jax import losses
from hscl_jax.config import choices

_RANKED = choices.RANKED_RETRIEVAL_METRICS  # the kernel's first columns
metric_names = choices.retrieval_metric_names  # config.knn.retrieval's, checked there
_NEED_R = ('r_precision', 'map_at_r')  # the figures whose ranked lists run to R
METRICS = (*_RANKED, 'recall_at_1', 'recall_at_2', 'recall_at_4', 'recall_at_8')


@functools.partial(jax.jit, static_argnames=('k', 'ks', 'chunk_size', 'exclude_self'))
def _per_query(
  reference,
  reference_labels,
  reference_mask,
  queries,
  query_labels,
  r,
  *,
  k,
  ks,
  chunk_size,
  exclude_self,
):
  """float32 [num_queries, 3 + len(ks)]: each query's precision@1, R-precision, MAP@R and
  Recall@K for K in `ks`; `r` int32 [num_queries] is each query's R (0 where unscored)."""
  num_queries = queries.shape[0]
  padding = -num_queries % chunk_size

  def chunked(x):
    x = jnp.pad(x, ((0, padding),) + ((0, 0),) * (x.ndim - 1))
    return x.reshape(-1, chunk_size, *x.shape[1:])

  reference = losses.l2_normalize(reference)
  reference_index = jnp.arange(reference.shape[0])
  rank = jnp.arange(1, k + 1, dtype=jnp.float32)

  def per_chunk(chunk):
    q, labels, r, index = chunk
    sims = jnp.matmul(q, reference.T, precision=jax.lax.Precision.HIGHEST)
    excluded = ~reference_mask[None, :]
    if exclude_self:
      excluded = excluded | (reference_index[None, :] == index[:, None])
    top_sims, top_idx = jax.lax.top_k(jnp.where(excluded, -jnp.inf, sims), k)
    # A -inf entry is an excluded row, reached only when k exceeds the rows left.
    hit = (reference_labels[top_idx] == labels[:, None]) & jnp.isfinite(top_sims)
    in_r = hit & (rank[None, :] <= r[:, None])
    per_r = 1.0 / jnp.maximum(r, 1).astype(jnp.float32)
    precision_at_i = jnp.cumsum(in_r, axis=1, dtype=jnp.float32) / rank[None, :]
    columns = [
      hit[:, 0].astype(jnp.float32),
      jnp.sum(in_r, axis=1, dtype=jnp.float32) * per_r,
      jnp.sum(jnp.where(in_r, precision_at_i, 0.0), axis=1) * per_r,
      *(jnp.any(hit[:, : min(K, k)], axis=1).astype(jnp.float32) for K in ks),
    ]
    return jnp.stack(columns, axis=1)

  chunks = (
    chunked(losses.l2_normalize(queries)),
    chunked(query_labels),
    chunked(r),
    chunked(jnp.arange(num_queries)),
  )
  out = jax.lax.map(per_chunk, chunks)
  return out.reshape(-1, out.shape[-1])[:num_queries]


def _on_device(x):
  """A JAX array as it is; anything else (NumPy, lists) by an explicit transfer."""
  return x if isinstance(x, jax.Array) else jax.device_put(np.asarray(x))


def is_metric(name: str) -> bool:
  """Whether `name` is a retrieval metric's (an epoch record's key of one, say)."""
  try:
    choices.recall_ks((name,))
  except ValueError:
    return False
  return True


def short_name(name: str) -> str:
  """The epoch line's label of a metric: P@1, R-precision, MAP@R, R@K."""
  head, _, k = name.rpartition('_')
  return _SHORT.get(name) or (f'R@{k}' if head == 'recall_at' else name)


_SHORT = {'precision_at_1': 'P@1', 'r_precision': 'R-precision', 'map_at_r': 'MAP@R'}


def _check(queries, reference, metrics, chunk_size) -> None:
  if queries.ndim != 2 or reference.ndim != 2:
    raise ValueError('query and reference features must be [n, d] arrays.')
  if queries.shape[1] != reference.shape[1]:
    raise ValueError(
      f'Feature widths differ: reference {reference.shape[1]}, queries {queries.shape[1]}.'
    )
  if reference.shape[0] == 0:
    raise ValueError('The reference set is empty.')
  if chunk_size < 1 or not metrics:
    raise ValueError(f'Need chunk_size >= 1 and some metrics; got {chunk_size}, {metrics}.')


def _class_sizes(query_labels, query_valid, reference_labels, reference_valid, exclude_self):
  """Each query's R: the valid reference rows of its class, itself not counted; 0 where the
  query is not valid."""
  classes, counts = np.unique(reference_labels[reference_valid], return_counts=True)
  position = np.searchsorted(classes, query_labels)
  found = position < len(classes)
  found[found] = classes[position[found]] == query_labels[found]
  r = np.zeros(len(query_labels), np.int64)
  r[found] = counts[position[found]]
  if exclude_self:  # the query is its own reference row when it is valid
    r -= query_valid
  return np.where(query_valid, r, 0).astype(np.int32)


def _host(labels, mask):
  """(labels int64, valid bool) on the host: labels are small, and R is counted there."""
  labels = np.asarray(jax.device_get(labels)).astype(np.int64)
  return labels, np.ones(len(labels), bool) if mask is None else np.asarray(
    jax.device_get(mask), bool
  )


def _sets(query_features, query_labels, reference_features, reference_labels, masks):
  """(queries, reference) on the device and ((labels, valid) of each) on the host; with
  no reference features, the queries are the reference."""
  if reference_features is None:
    if reference_labels is not None or masks[1] is not None:
      raise ValueError('reference_labels and reference_mask need reference_features.')
    queries = _on_device(query_features)
    query_rows = _host(query_labels, masks[0])
    return (queries, queries), (query_rows, query_rows)
  if reference_labels is None:
    raise ValueError('reference_features need reference_labels.')
  features = (_on_device(query_features), _on_device(reference_features))
  return features, (_host(query_labels, masks[0]), _host(reference_labels, masks[1]))


def retrieval_metrics(
  query_features,
  query_labels,
  reference_features=None,
  reference_labels=None,
  *,
  metrics=METRICS,
  query_mask=None,
  reference_mask=None,
  chunk_size: int = 256,
) -> dict[str, float]:
  """{name: figure} for the names in `metrics`, in their order.

  Args:
    query_features: [queries, d] features (normalised inside).
    query_labels: int [queries] class labels.
    reference_features: [reference, d] features ranked for each query; None: the queries
      themselves, each query excluding itself.
    reference_labels: int [reference] labels (required with reference_features).
    metrics: names among 'precision_at_1', 'r_precision', 'map_at_r', 'recall_at_K' (any
      integer K >= 1). Without the R figures the ranked lists stop at the largest K.
    query_mask: optional bool [queries]; False rows (padding) are not scored, and with no
      separate reference they are no neighbours either.
    reference_mask: optional bool [reference]; False rows are never neighbours.
    chunk_size: queries per device step (memory ~ chunk_size x reference floats).

  Returns Python floats in [0, 1], means over the scored queries (module docstring),
  averaged on the host in float64; NaN when no query is scored.
  """
  exclude_self = reference_features is None
  (queries, reference), ((q_labels, q_valid), (ref_labels, ref_valid)) = _sets(
    query_features, query_labels, reference_features, reference_labels, (query_mask, reference_mask)
  )
  metrics = (metrics,) if isinstance(metrics, str) else tuple(metrics)
  _check(queries, reference, metrics, chunk_size)
  ks = choices.recall_ks(metrics)
  r = _class_sizes(q_labels, q_valid, ref_labels, ref_valid, exclude_self)
  if not np.any(r > 0):
    return dict.fromkeys(metrics, float('nan'))
  reach = max(ks, default=1)
  if any(name in _NEED_R for name in metrics):
    reach = max(reach, int(r.max()))
  per_query = _per_query(
    reference,
    *jax.device_put((ref_labels.astype(np.int32), ref_valid)),
    queries,
    *jax.device_put((q_labels.astype(np.int32), r)),
    k=min(reach, reference.shape[0]),
    ks=ks,
    chunk_size=min(chunk_size, queries.shape[0]),
    exclude_self=exclude_self,
  )
  means = np.asarray(jax.device_get(per_query), np.float64)[r > 0].mean(axis=0)
  columns = [*_RANKED, *(f'recall_at_{k}' for k in ks)]
  return {name: float(means[columns.index(name)]) for name in metrics}
