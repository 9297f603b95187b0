"""Weighted k-nearest-neighbour monitor (InstDisc / the H-SCL paper's protocol).

Every query takes its ``k`` most cosine-similar bank entries; neighbour ``j`` votes for
its label with weight ``exp(sim_j / temperature)``; the class with the largest summed
vote is the prediction (ties go to the smaller class index). The paper uses k = 200 and
temperature 0.5 on L2-normalised backbone features.

Queries are processed on the device in fixed-size chunks (``jax.lax.map``), so the
similarity matrix held in memory is [chunk_size, bank_size], and the function compiles
once per (bank size, query count) and never per chunk. Host inputs reach the device by an
explicit ``jax.device_put`` and the accuracy is counted on the host, so the monitor runs
under ``jax.transfer_guard('disallow')`` as one compiled program.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from hscl_jax import losses


@functools.partial(jax.jit, static_argnames=('num_classes', 'k', 'chunk_size'))
def _predict(bank, bank_labels, bank_mask, queries, *, num_classes, k, chunk_size, temperature):
  """Predictions for `queries` [num_queries, d], padded here to whole chunks."""
  num_queries = queries.shape[0]
  padding = -num_queries % chunk_size
  bank_labels = bank_labels.astype(jnp.int32)
  bank_mask = jnp.ones(bank.shape[:1], bool) if bank_mask is None else bank_mask.astype(bool)
  bank = losses.l2_normalize(bank)
  queries = jnp.pad(losses.l2_normalize(queries), ((0, padding), (0, 0)))
  queries = queries.reshape(-1, chunk_size, bank.shape[-1])

  def predict_chunk(q):
    sims = q @ bank.T  # [chunk, bank]
    sims = jnp.where(bank_mask[None, :], sims, -jnp.inf)
    top_sims, top_idx = jax.lax.top_k(sims, k)  # [chunk, k]
    # Subtracting each query's best similarity rescales all its votes by the same
    # factor: the prediction is unchanged and exp never overflows for small temperatures.
    weights = jnp.exp((top_sims - top_sims[:, :1]) / temperature)
    weights = jnp.where(jnp.isfinite(top_sims), weights, 0.0)  # masked-out bank rows
    votes = jnp.einsum(
      'qk,qkc->qc', weights, jax.nn.one_hot(bank_labels[top_idx], num_classes, dtype=weights.dtype)
    )
    return jnp.argmax(votes, axis=-1).astype(jnp.int32)

  return jax.lax.map(predict_chunk, queries).reshape(-1)[:num_queries]


def _on_device(x):
  """A JAX array as it is; anything else (NumPy, lists) by an explicit transfer."""
  return x if x is None or isinstance(x, jax.Array) else jax.device_put(np.asarray(x))


def weighted_knn_predict(
  bank_features,
  bank_labels,
  query_features,
  *,
  num_classes: int,
  k: int = 200,
  temperature: float = 0.5,
  chunk_size: int = 256,
  bank_mask=None,
) -> jax.Array:
  """Weighted-kNN class predictions int32[num_queries].

  Args:
    bank_features: [bank, d] features of the labelled bank (normalised inside).
    bank_labels: int [bank] labels in [0, num_classes).
    query_features: [queries, d] features to classify (normalised inside).
    num_classes: number of classes.
    k: neighbours per query; clipped to the bank size.
    temperature: vote weight exp(cosine similarity / temperature).
    chunk_size: queries per device step (memory ~ chunk_size x bank floats).
    bank_mask: optional bool [bank]; False rows (padding) are never neighbours.
  """
  bank_features, query_features = _on_device(bank_features), _on_device(query_features)
  if bank_features.ndim != 2 or query_features.ndim != 2:
    raise ValueError('bank_features and query_features must be [n, d] arrays.')
  if bank_features.shape[1] != query_features.shape[1]:
    raise ValueError(
      f'Feature widths differ: bank {bank_features.shape[1]}, queries {query_features.shape[1]}.'
    )
  num_bank, num_queries = bank_features.shape[0], query_features.shape[0]
  if num_bank == 0:
    raise ValueError('The kNN bank is empty.')
  if k < 1 or chunk_size < 1 or temperature <= 0:
    raise ValueError(
      f'Need k >= 1, chunk_size >= 1, temperature > 0; got {k}, {chunk_size}, {temperature}.'
    )
  if num_queries == 0:
    return jax.device_put(np.zeros((0,), np.int32))
  return _predict(
    bank_features,
    _on_device(bank_labels),
    _on_device(bank_mask),
    query_features,
    num_classes=num_classes,
    k=min(k, num_bank),
    chunk_size=min(chunk_size, num_queries),
    temperature=jax.device_put(np.float32(temperature)),  # traced: no recompilation
  )


def weighted_knn_accuracy(
  bank_features,
  bank_labels,
  query_features,
  query_labels,
  *,
  num_classes: int,
  k: int = 200,
  temperature: float = 0.5,
  chunk_size: int = 256,
  query_mask=None,
  bank_mask=None,
) -> float:
  """Top-1 accuracy of the weighted kNN classifier over the (unmasked) queries.

  `query_mask` (bool [queries]) drops padded queries from the average; see
  `weighted_knn_predict` for the other arguments. Returns a Python float (NaN when
  no query is valid), counted on the host.
  """
  preds = weighted_knn_predict(
    bank_features,
    bank_labels,
    query_features,
    num_classes=num_classes,
    k=k,
    temperature=temperature,
    chunk_size=chunk_size,
    bank_mask=bank_mask,
  )
  preds, query_labels, query_mask = jax.device_get((preds, query_labels, query_mask))
  correct = preds == np.asarray(query_labels, np.int32)
  query_mask = np.ones(correct.shape, bool) if query_mask is None else np.asarray(query_mask, bool)
  total, hits = np.sum(query_mask), np.sum(correct & query_mask)
  # The float32 quotient, as earlier runs recorded it.
  return float(np.float32(hits) / np.float32(total)) if total else float('nan')
