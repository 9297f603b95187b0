"""InfoGraph's encoder: a GIN with sum-pooled layer readouts, and its two projection heads.

Node (local) representation: the concatenation of the GIN layers' outputs; graph (global)
representation: the concatenation over layers of the sum over the graph's nodes. Graphs
come as padded batches (hscl_jax.graphs.data.make_batch): out-of-range receivers and node
graph ids are dropped by the segment sums, and BatchNorm statistics skip padding nodes.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

# PyTorch's default nn.Linear weight init (U(±1/sqrt(fan_in))), as InfoGraph's layers use.
_torch_linear_init = nn.initializers.variance_scaling(1.0 / 3.0, 'fan_in', 'uniform')


def _dense(features: int, name: str | None = None) -> nn.Dense:
  return nn.Dense(features, kernel_init=_torch_linear_init, name=name)


class GIN(nn.Module):
  """GIN layers h ← MLP(h_v + Σ_{u→v} h_u) (ε = 0), each followed by ReLU then BatchNorm.

  Inputs are one-hot codes (``batch['codes']``, ``feature_dim`` long). The first layer's
  first Linear is applied before aggregating (W·x_v + Σ W·x_u + b, the same function as on
  the summed one-hots), so no one-hot array is ever built.
  """

  feature_dim: int
  hidden: int = 32
  num_layers: int = 3
  bn_momentum: float = 0.9  # PyTorch's BatchNorm1d momentum 0.1

  @nn.compact
  def __call__(self, batch: dict[str, jax.Array], *, train: bool):
    """-> (node representations [nodes, L·hidden], graph representations [graphs, L·hidden])."""
    num_nodes, num_graphs = batch['codes'].shape[0], batch['graph_mask'].shape[0]
    node_mask = batch['node_mask'][:, None]
    aggregate = lambda x: (
      x
      + jax.ops.segment_sum(  # noqa: E731
        x[batch['senders']], batch['receivers'], num_nodes
      )
    )
    kernel = self.param('input_kernel', _torch_linear_init, (self.feature_dim, self.hidden))
    bias = self.param('input_bias', nn.initializers.zeros, (self.hidden,))
    h = aggregate(kernel[batch['codes']]) + bias
    layers = []
    for i in range(self.num_layers):
      if i:
        h = _dense(self.hidden)(aggregate(h))
      h = _dense(self.hidden)(nn.relu(h))
      h = nn.BatchNorm(use_running_average=not train, momentum=self.bn_momentum, epsilon=1e-5)(
        nn.relu(h), mask=node_mask
      )
      h = jnp.where(node_mask, h, 0.0)
      layers.append(h)
    local = jnp.concatenate(layers, axis=-1)
    pooled = jax.ops.segment_sum(local, batch['node_graph'], num_graphs)
    return local, pooled


class Head(nn.Module):
  """Three Linear–ReLU layers plus a linear shortcut (InfoGraph's FF discriminator head)."""

  features: int

  @nn.compact
  def __call__(self, x):
    block = x
    for _ in range(3):
      block = nn.relu(_dense(self.features)(block))
    return block + _dense(self.features, name='shortcut')(x)


class InfoGraph(nn.Module):
  """The GIN encoder with a local (node) and a global (graph) head."""

  feature_dim: int
  hidden: int = 32
  num_layers: int = 3
  bn_momentum: float = 0.9

  def setup(self):
    self.encoder = GIN(self.feature_dim, self.hidden, self.num_layers, self.bn_momentum)
    width = self.hidden * self.num_layers
    self.local_head = Head(width)
    self.global_head = Head(width)

  def __call__(self, batch, *, train: bool):
    """-> (local head outputs [nodes, d], global head outputs [graphs, d])."""
    local, pooled = self.encoder(batch, train=train)
    return self.local_head(local), self.global_head(pooled)

  def embed(self, batch):
    """Graph representations for evaluation (encoder output, BatchNorm in eval mode)."""
    return self.encoder(batch, train=False)[1]
