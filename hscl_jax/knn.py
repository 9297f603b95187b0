"""Weighted k-nearest-neighbour monitor (InstDisc / the H-SCL paper's protocol).

Every query takes its ``k`` most cosine-similar bank entries; neighbour ``j`` votes for
its label with weight ``exp(sim_j / temperature)``; the class with the largest summed
vote is the prediction (ties go to the smaller class index). The paper uses k = 200 and
temperature 0.5 on L2-normalised backbone features.

Queries are processed on the device in fixed-size chunks (``jax.lax.map``), so the
similarity matrix held in memory is [chunk_size, bank_size], and the function compiles
once per (bank size, query count) and never per chunk.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from hscl_jax import losses


@functools.partial(jax.jit, static_argnames=('num_classes', 'k', 'chunk_size'))
def _predict(bank, bank_labels, bank_mask, queries, *, num_classes, k, chunk_size, temperature):
  """Predictions for `queries` [num_chunks * chunk_size, d] (already padded)."""
  bank = losses.l2_normalize(bank)
  queries = losses.l2_normalize(queries).reshape(-1, chunk_size, bank.shape[-1])

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

  return jax.lax.map(predict_chunk, queries).reshape(-1)


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
  bank_features = jnp.asarray(bank_features)
  query_features = jnp.asarray(query_features)
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
    return jnp.zeros((0,), jnp.int32)
  k = min(k, num_bank)
  chunk_size = min(chunk_size, num_queries)
  padded = -(-num_queries // chunk_size) * chunk_size
  query_features = jnp.pad(query_features, ((0, padded - num_queries), (0, 0)))
  if bank_mask is None:
    bank_mask = jnp.ones((num_bank,), bool)
  preds = _predict(
    bank_features,
    jnp.asarray(bank_labels, jnp.int32),
    jnp.asarray(bank_mask, bool),
    query_features,
    num_classes=num_classes,
    k=k,
    chunk_size=chunk_size,
    temperature=jnp.float32(temperature),
  )
  return preds[:num_queries]


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
  no query is valid).
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
  correct = preds == jnp.asarray(query_labels, jnp.int32)
  if query_mask is None:
    query_mask = jnp.ones(correct.shape, bool)
  query_mask = jnp.asarray(query_mask, bool)
  total = jnp.sum(query_mask)
  hits = jnp.sum(correct & query_mask)
  return float(hits / total) if int(total) else float('nan')
