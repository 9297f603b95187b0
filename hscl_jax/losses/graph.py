"""Graph losses: InfoGraph's local–global objective with the four settings (Sec. V-C,
Table II). Scores s_vG = <l_v, g_G> between every node v and every graph G of a batch.

The objective, its hard-negative weights and the rescaled scores are stated in
docs/graphs.md; the docstrings below say what each argument means.

Cross-device: with ``axis_name`` (inside ``jax.shard_map`` or ``jax.pmap`` over that axis,
every argument being the local shard of the global batch's), the graphs, their labels and
mask are all-gathered, so every local node meets every graph of the global batch, and
``node_graph`` indexes that global batch (the devices' graphs in device order: a slice of
the global batch's ``node_graph``); the returned value is the global batch's loss,
identical on every device.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from hscl_jax.losses import image
from hscl_jax.losses import kernel

Array = kernel.Array
Hardening = kernel.Hardening

# NumPy, not jnp: a JAX op at import time would start the backend before jax.distributed.
_LOG2 = float(np.log(2.0))


def _gathered(x, axis_name):
  return x if axis_name is None else jax.lax.all_gather(x, axis_name, axis=0, tiled=True)


def _rescaled_scores(scores: Array, valid: Array, axis_name) -> Array:
  """ŝ = 2·s / max|s| over the valid pairs, in [-2, 2]; the maximum is a constant.

  Graph scores are unbounded (no normalisation, no temperature), so an exponential tilt
  of the raw scores would put all the weight on one negative; HCL (Robinson et al.,
  App. B) tilts the rescaled scores instead.
  """
  peak = jax.lax.stop_gradient(jnp.max(jnp.where(valid, jnp.abs(scores), 0.0)))
  if axis_name is not None:  # the global batch's maximum
    peak = jax.lax.pmax(peak, axis_name)
  return 2.0 * scores / jnp.where(peak > 0, peak, 1.0)


class _NodeGraphPairs(NamedTuple):
  """Every (node, graph) pair of a graph batch, as both local–global losses read them."""

  scores: Array  # [nodes, graphs] s_vG, float32; padding rows and columns are 0
  candidates: Array  # [nodes, graphs] G ∈ N(v), the negatives of node v
  log_w: Array  # [nodes, graphs] log η(ŝ_vG) on the negatives, -inf elsewhere
  own_scores: Array  # [nodes] s_{v,g(v)}; 0 for padding
  node_mask: Array  # [nodes] bool, the real nodes


def _check_graph_inputs(local_features, graph_features, node_graph, graph_labels, masks):
  """Shapes and dtypes of the graph losses' arrays, each refused in one line naming its form."""
  local, graph = jnp.shape(local_features), jnp.shape(graph_features)
  if len(local) != 2 or len(graph) != 2 or local[1] != graph[1]:
    raise ValueError(
      'local_features and graph_features must have shapes [nodes, dim] and [graphs, dim] '
      f'(the same dim), got {local} and {graph}.'
    )
  indices = {
    'node_graph': (node_graph, local[0], 'nodes'),
    'graph_labels': (graph_labels, graph[0], 'graphs'),
  }
  for name, (value, size, axis) in indices.items():
    if value is None:
      continue
    if jnp.shape(value) != (size,):
      raise ValueError(f'{name} must have shape [{axis}] = ({size},), got {jnp.shape(value)}.')
    if not jnp.issubdtype(jnp.result_type(value), jnp.integer):
      raise TypeError(
        f'{name} must be integers, got dtype {jnp.result_type(value)}; '
        'cast them with .astype(jnp.int32).'
      )
  for (name, value), size in zip(masks.items(), (local[0], graph[0])):
    if value is not None and jnp.shape(value) != (size,):
      raise ValueError(
        f'{name} must have shape ({size},), one flag per row, got {jnp.shape(value)}.'
      )


def _node_graph_pairs(
  local_features,
  graph_features,
  node_graph,
  graph_labels,
  hardening,
  node_mask,
  graph_mask,
  axis_name,
) -> _NodeGraphPairs:
  """Scores, negatives and hardening log-weights of every (local) node against every
  (global) graph."""
  masks = {'node_mask': node_mask, 'graph_mask': graph_mask}
  _check_graph_inputs(local_features, graph_features, node_graph, graph_labels, masks)
  image.check_hardening(hardening, optional=True)
  num_nodes, num_graphs = local_features.shape[0], graph_features.shape[0]
  node_mask = jnp.ones(num_nodes, bool) if node_mask is None else node_mask.astype(bool)
  graph_mask = jnp.ones(num_graphs, bool) if graph_mask is None else graph_mask.astype(bool)
  graph_features = _gathered(graph_features, axis_name)
  graph_mask = _gathered(graph_mask, axis_name)
  if graph_labels is not None:
    graph_labels = _gathered(graph_labels, axis_name)
  num_graphs = graph_features.shape[0]
  own = node_graph[:, None] == jnp.arange(num_graphs)[None, :]
  valid = node_mask[:, None] & graph_mask[None, :]
  # Zeroed padding cannot leak NaN/inf into the values or the gradients.
  local = jnp.where(node_mask[:, None], local_features.astype(jnp.float32), 0.0)
  graph = jnp.where(graph_mask[:, None], graph_features.astype(jnp.float32), 0.0)
  scores = kernel.similarity(local, graph, jax.lax.Precision.HIGHEST)
  candidates = valid & ~own
  if graph_labels is not None:
    node_labels = jnp.take(graph_labels, node_graph, mode='clip')
    candidates &= node_labels[:, None] != graph_labels[None, :]
  hardening = kernel.no_hardening if hardening is None else hardening
  log_w = jnp.where(
    candidates, hardening(_rescaled_scores(scores, valid, axis_name)), kernel.NEG_INF
  )
  own_scores = jnp.sum(jnp.where(own, scores, 0.0), axis=1)
  return _NodeGraphPairs(scores, candidates, log_w, own_scores, node_mask)


def _node_mean(per_node: Array, node_mask: Array, axis_name) -> Array:
  """(1/N) Σ_v over the N real nodes of the global batch (0 for a batch without one)."""
  total = jnp.sum(jnp.where(node_mask, per_node, 0.0))
  count = jnp.sum(node_mask, dtype=jnp.float32)
  if axis_name is not None:
    total, count = jax.lax.psum((total, count), axis_name)
  return total / jnp.maximum(count, 1.0)


def local_global_jsd(
  local_features: Array,
  graph_features: Array,
  node_graph: Array,
  *,
  graph_labels: Array | None = None,
  hardening: Hardening | None = None,
  node_mask: Array | None = None,
  graph_mask: Array | None = None,
  axis_name: str | None = None,
) -> Array:
  """InfoGraph's Jensen–Shannon local–global loss with (hard) negatives, Table II.

  L = (1/N) Σ_v Σ_{G∈N(v)} q_v(G)·(sp(s_vG) − log 2) − (1/N) Σ_v (log 2 − sp(−s_{v,g(v)})),

  sp = kernel.softplus, N the number of real nodes, g(v) the graph of node v (its positive) and
  q_v(G) ∝ η(ŝ_vG) over the negatives N(v) (a log-space weighted mean, as eq. (3)'s
  expectation): every other graph of the batch (UCL, H-UCL) or, with ``graph_labels``,
  every graph with another label (SCL, H-SCL). ``hardening`` maps ŝ to log η(ŝ)
  (``exponential(beta)`` for H-UCL / H-SCL(β); None for η ≡ 1) and receives the rescaled
  scores ŝ = 2·s / max|s| (``_rescaled_scores``). With η ≡ 1 this is InfoGraph's objective
  exactly. A node without negatives contributes 0 to the first sum and still counts in N.

  Args:
    local_features: [nodes, dim] node (local) embeddings, after the local head.
    graph_features: [graphs, dim] graph (global) embeddings, after the global head.
    node_graph: [nodes] int, the batch index of each node's graph.
    graph_labels: [graphs] int class labels (SCL / H-SCL), or None (UCL / H-UCL).
    hardening: log η as a function of ŝ, or None.
    node_mask, graph_mask: False marks padding (excluded everywhere); default all real.
    axis_name: inside ``jax.shard_map``/``jax.pmap``, the batch axis: every argument is
      the local shard, ``node_graph`` indexes the global batch's graphs, and the value is
      the global batch's loss (module docstring).
  Returns:
    The scalar loss (float32).
  """
  pairs = _node_graph_pairs(
    local_features,
    graph_features,
    node_graph,
    graph_labels,
    hardening,
    node_mask,
    graph_mask,
    axis_name,
  )
  log_norm, has_negative = kernel.lse_finish(kernel.lse_partial(pairs.log_w))
  q = jnp.exp(pairs.log_w - log_norm[:, None])
  terms = jnp.where(pairs.candidates, q * (jax.nn.softplus(pairs.scores) - _LOG2), 0.0)
  negative = jnp.where(has_negative, jnp.sum(terms, axis=1), 0.0)
  positive = _LOG2 - jax.nn.softplus(-pairs.own_scores)
  return _node_mean(negative - positive, pairs.node_mask, axis_name)


def local_global_infonce(
  local_features: Array,
  graph_features: Array,
  node_graph: Array,
  *,
  graph_labels: Array | None = None,
  hardening: Hardening | None = None,
  node_mask: Array | None = None,
  graph_mask: Array | None = None,
  M=None,
  axis_name: str | None = None,
) -> Array:
  """eq. (3)'s InfoNCE estimator over InfoGraph's node–graph pairs, Table II's settings.

  ℓ_v = log(1 + M_v · e^{−s_{v,g(v)}} · E_{G~q_v}[e^{s_vG}]),  L = (1/N) Σ_v ℓ_v,

  node v the anchor, its graph g(v) the positive, and N(v), q_v(G) ∝ η(ŝ_vG), ``hardening``,
  ``graph_labels``, the masks and ``axis_name`` exactly as in ``local_global_jsd``.
  ``M=None`` takes M_v = |N(v)|, the number of negatives of node v (in the global batch),
  so with η ≡ 1 this is the cross-entropy
  log(1 + Σ_{G∈N(v)} e^{s_vG − s_{v,g(v)}}); otherwise M is the given constant (positive).
  In log space, ℓ_v = kernel.softplus(log M_v + LSE_G(log q_v(G) + s_vG) − s_{v,g(v)}). A node
  without negatives contributes 0 and still counts in N; β = 0 gives the unhardened loss.

  Returns:
    The scalar loss (float32).
  """
  pairs = _node_graph_pairs(
    local_features,
    graph_features,
    node_graph,
    graph_labels,
    hardening,
    node_mask,
    graph_mask,
    axis_name,
  )
  if M is None:
    count = jnp.sum(pairs.candidates, axis=1, dtype=jnp.float32)
    log_m = jnp.log(jnp.maximum(count, 1.0))
  else:
    log_m = kernel.log_given_m(M)
  log_e, has_negative, _, _ = kernel.finish_log_expectation(
    kernel.lse_partial(pairs.log_w + pairs.scores), kernel.lse_partial(pairs.log_w)
  )
  per_node = kernel.infonce_pair_loss(log_m)(pairs.own_scores, log_e, has_negative)
  return _node_mean(per_node, pairs.node_mask, axis_name)
