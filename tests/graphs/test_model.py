"""graphs/model: the GIN encoder's loss, gradients and embeddings invariant to a relabelling
of the nodes and to the batch's padding; its linear layers start as PyTorch's."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from models.test_factory import jit_apply
import numpy as np

from hscl_jax import losses
from hscl_jax.graphs import data
from hscl_jax.graphs import model as model_lib


def _forward(ds, graphs, budget, variables=None, permute_seed=None):
  batch = data.make_batch(ds, graphs, budget)
  if permute_seed is not None:  # relabel the real nodes of the batch
    n = int(batch['node_mask'].sum())
    perm = np.random.default_rng(permute_seed).permutation(n)
    inverse = np.argsort(perm)
    for key in ('codes', 'node_graph'):
      batch[key][:n] = batch[key][:n][perm]
    e = batch['receivers'] < budget.nodes
    batch['senders'][e] = inverse[batch['senders'][e]]
    batch['receivers'][e] = inverse[batch['receivers'][e]]
  model = model_lib.InfoGraph(feature_dim=ds.feature_dim)
  batch = jax.tree.map(jnp.asarray, batch)
  if variables is None:
    variables = model.init(jax.random.key(0), batch, train=False)

  def loss(params, batch):
    (local, graph), _ = model.apply(
      {**variables, 'params': params}, batch, train=True, mutable=['batch_stats']
    )
    return losses.local_global_jsd(
      local,
      graph,
      batch['node_graph'],
      hardening=losses.exponential(2.0),
      node_mask=batch['node_mask'],
      graph_mask=batch['graph_mask'],
    )

  # Jitted: eagerly, each operation is a program of its own to compile (~30 s in all).
  value, grads = jax.jit(jax.value_and_grad(loss))(variables['params'], batch)
  embedding = jit_apply(model, method=model.embed)(variables, batch)[: len(graphs)]
  return variables, value, grads, embedding


def test_encoder_is_node_permutation_and_padding_invariant(toy_dir):
  ds = data.load_tu('TOY', toy_dir)
  graphs = np.arange(0, 24)
  small = data.Budget(graphs=24, nodes=256, edges=512)
  large = data.Budget(graphs=30, nodes=512, edges=1024)
  variables, value, grads, embedding = _forward(ds, graphs, small)
  assert embedding.shape == (24, 96)
  for budget, permute in ((small, 1), (large, None), (large, 2)):
    _, v, g, e = _forward(ds, graphs, budget, variables, permute)
    np.testing.assert_allclose(v, value, rtol=2e-5)
    np.testing.assert_allclose(e, embedding, rtol=2e-5, atol=2e-5)
    jax.tree.map(_assert_close_at_the_leafs_scale, g, grads)


def test_linear_layers_start_as_pytorchs_uniform_within_one_over_root_fan_in(toy_dir):
  # InfoGraph's layers keep PyTorch's nn.Linear default: weights U(-1/sqrt(fan_in), +...).
  ds = data.load_tu('TOY', toy_dir)
  variables, *_ = _forward(ds, np.arange(0, 24), data.Budget(graphs=24, nodes=256, edges=512))
  kernels = {
    jax.tree_util.keystr(path): np.asarray(leaf)
    for path, leaf in jax.tree_util.tree_leaves_with_path(variables['params'])
    if 'kernel' in jax.tree_util.keystr(path)
  }
  assert len(kernels) == 1 + 2 * 3 - 1 + 2 * 4  # GIN (input, 5 Dense), 2 heads of 4 Dense
  for name, kernel in kernels.items():
    bound = 1 / np.sqrt(kernel.shape[0])
    # Hundreds of draws or more each: their largest magnitude is within 10 % of the bound.
    assert 0.9 * bound < np.abs(kernel).max() <= bound, name


def _assert_close_at_the_leafs_scale(actual, desired):
  """rtol 2e-3, and an atol of 1e-5 of the leaf's largest entry: an entry that is a sum
  of terms of that size cancelling to ~0 keeps their float32 rounding (seen: -1.1e-5 vs
  1.7e-5 in a leaf whose largest entry is 190, after the nodes were permuted)."""
  atol = 1e-5 * float(np.abs(desired).max())
  np.testing.assert_allclose(actual, desired, rtol=2e-3, atol=atol)
