"""losses.local_global_jsd and local_global_infonce against float64 NumPy references written
from the formulas."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hscl_jax import losses

LOG2 = np.log(2.0)


def softplus(x):
  return np.logaddexp(0.0, x)


def reference(local, graph, node_graph, labels=None, beta=0.0):
  """Float64, one node at a time: L = (1/N) Σ_v Σ_{G∈N(v)} q_v(G)(sp(s_vG) − log 2)
  − (1/N) Σ_v (log 2 − sp(−s_v,g(v))), q_v ∝ e^{β ŝ} over N(v), ŝ = 2 s / max|s|."""
  s = local.astype(np.float64) @ graph.astype(np.float64).T
  s_hat = 2 * s / np.abs(s).max()
  total = 0.0
  for v in range(len(local)):
    own = node_graph[v]
    negatives = negatives_of(v, node_graph, len(graph), labels)
    if negatives:
      w = np.exp(beta * s_hat[v, negatives])
      q = w / w.sum()
      total += np.sum(q * (softplus(s[v, negatives]) - LOG2))
    total -= LOG2 - softplus(-s[v, own])
  return total / len(local)


def negatives_of(v, node_graph, num_graphs, labels):
  own = node_graph[v]
  return [g for g in range(num_graphs) if g != own and (labels is None or labels[g] != labels[own])]


def reference_infonce(local, graph, node_graph, labels=None, log_eta=None, M=None):
  """Float64, one node at a time: ℓ_v = log(1 + M_v e^{−s_v,g(v)} E_{q_v}[e^{s_vG}]),
  q_v ∝ η(ŝ) over N(v), ŝ = 2 s / max|s|, M_v = |N(v)| unless M is given; L = mean_v ℓ_v."""
  s = local.astype(np.float64) @ graph.astype(np.float64).T
  s_hat = 2 * s / np.abs(s).max()
  total = 0.0
  for v in range(len(local)):
    negatives = negatives_of(v, node_graph, len(graph), labels)
    w = np.array([1.0 if log_eta is None else np.exp(log_eta(s_hat[v, g])) for g in negatives])
    if w.sum() > 0:
      expectation = np.sum(w / w.sum() * np.exp(s[v, negatives]))
      m = len(negatives) if M is None else M
      total += np.log1p(m * np.exp(-s[v, node_graph[v]]) * expectation)
  return total / len(local)


def numeric_grad(f, x, eps=1e-6):
  g = np.zeros_like(x)
  for i in np.ndindex(x.shape):
    d = np.zeros_like(x)
    d[i] = eps
    g[i] = (f(x + d) - f(x - d)) / (2 * eps)
  return g


def problem(seed=0, nodes=13, graphs=5, dim=4, scale=1.5):
  rng = np.random.default_rng(seed)
  local = rng.normal(size=(nodes, dim)) * scale
  graph = rng.normal(size=(graphs, dim)) * scale
  node_graph = np.sort(np.concatenate([np.arange(graphs), rng.integers(0, graphs, nodes - graphs)]))
  labels = np.array([0, 1, 0, 2, 1])[:graphs]
  return local, graph, node_graph, labels


def pad(local, graph, node_graph, labels, extra_nodes, extra_graphs, fill):
  """Inputs with padded nodes and graphs (rows of ``fill``) and the masks marking them."""
  x = np.concatenate([local, np.full((extra_nodes, local.shape[1]), fill)])
  g = np.concatenate([graph, np.full((extra_graphs, graph.shape[1]), fill)])
  ng = np.concatenate([node_graph, np.full(extra_nodes, len(graph) + extra_graphs)])
  lab = None if labels is None else np.concatenate([labels, np.zeros(extra_graphs, int)])
  masks = dict(node_mask=np.arange(len(x)) < len(local), graph_mask=np.arange(len(g)) < len(graph))
  return x, g, ng, lab, masks


def jax_loss(local, graph, node_graph, labels, beta, loss=losses.local_global_jsd, **kwargs):
  hardening = beta if callable(beta) or beta is None else losses.exponential(beta)
  return loss(
    jnp.asarray(local, jnp.float32),
    jnp.asarray(graph, jnp.float32),
    jnp.asarray(node_graph),
    hardening=hardening,
    graph_labels=None if labels is None else jnp.asarray(labels),
    **kwargs,
  )


@pytest.mark.parametrize('supervised', [False, True], ids=['ucl', 'scl'])
@pytest.mark.parametrize('beta', [None, 1.0, 10.0])
def test_matches_float64_reference_values_and_gradients(supervised, beta):
  local, graph, node_graph, labels = problem()
  labels = labels if supervised else None
  b = 0.0 if beta is None else beta
  want = reference(local, graph, node_graph, labels, b)
  got = jax_loss(local, graph, node_graph, labels, beta)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)

  grads = jax.grad(lambda x, g: jax_loss(x, g, node_graph, labels, beta), argnums=(0, 1))(
    jnp.asarray(local, jnp.float32), jnp.asarray(graph, jnp.float32)
  )
  # The maximum in ŝ is a constant: hold it at its value for the numerical gradient.
  peak = np.abs(local @ graph.T).max()

  def ref_fixed_peak(x, g):
    s = x @ g.T
    return reference(x, g, node_graph, labels, b * np.abs(s).max() / peak)

  want_local = numeric_grad(lambda x: ref_fixed_peak(x, graph), local)
  want_graph = numeric_grad(lambda g: ref_fixed_peak(local, g), graph)
  np.testing.assert_allclose(grads[0], want_local, rtol=2e-4, atol=2e-5)
  np.testing.assert_allclose(grads[1], want_graph, rtol=2e-4, atol=2e-5)


def test_beta_zero_is_unhardened_and_ucl_is_infograph_formula():
  local, graph, node_graph, labels = problem(seed=1)
  for supervised_labels in (None, labels):
    np.testing.assert_allclose(
      jax_loss(local, graph, node_graph, supervised_labels, 0.0),
      jax_loss(local, graph, node_graph, supervised_labels, None),
      rtol=1e-6,
    )
  # InfoGraph: E_neg summed over all (node, other graph) pairs / (N (G − 1)), minus E_pos / N.
  s = local @ graph.T
  pos = node_graph[:, None] == np.arange(len(graph))[None, :]
  n, g = s.shape
  e_pos = np.sum(np.where(pos, LOG2 - softplus(-s), 0.0)) / n
  e_neg = np.sum(np.where(pos, 0.0, softplus(-s) + s - LOG2)) / (n * (g - 1))
  np.testing.assert_allclose(
    jax_loss(local, graph, node_graph, None, None), e_neg - e_pos, rtol=1e-5
  )


@pytest.mark.parametrize('loss', [losses.local_global_jsd, losses.local_global_infonce])
def test_padding_invariance_of_value_and_gradients(loss):
  local, graph, node_graph, labels = problem(seed=2)
  beta = 2.0

  def padded(extra_nodes, extra_graphs, fill):
    x, g, ng, lab, masks = pad(local, graph, node_graph, labels, extra_nodes, extra_graphs, fill)
    f = lambda a, b: jax_loss(a, b, ng, lab, beta, loss, **masks)  # noqa: E731
    value, grads = jax.value_and_grad(f, argnums=(0, 1))(
      jnp.asarray(x, jnp.float32), jnp.asarray(g, jnp.float32)
    )
    return value, grads[0][: len(local)], grads[1][: len(graph)]

  base = padded(0, 0, 0.0)
  for extra_nodes, extra_graphs, fill in ((5, 3, 100.0), (17, 1, np.nan)):
    other = padded(extra_nodes, extra_graphs, fill)
    for a, b in zip(base, other):
      np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_node_without_negatives_counts_in_n_and_contributes_only_its_positive():
  local, graph, node_graph, _ = problem(seed=3)
  same = np.zeros(len(graph), int)  # one class: SCL has no negatives at all
  s = local @ graph.T
  want = -np.mean(LOG2 - softplus(-s[np.arange(len(local)), node_graph]))
  np.testing.assert_allclose(jax_loss(local, graph, node_graph, same, 1.0), want, rtol=1e-5)


# --------------------------------------------------------------------------------------
# local_global_infonce: eq. (3) over the node–graph pairs.


@pytest.mark.parametrize('M', [None, 2.5])
@pytest.mark.parametrize('supervised', [False, True], ids=['ucl', 'scl'])
@pytest.mark.parametrize('beta', [None, 1.0, 10.0])
def test_infonce_matches_float64_reference_values_and_gradients(supervised, beta, M):
  local, graph, node_graph, labels = problem(seed=4)
  labels = labels if supervised else None
  b = 0.0 if beta is None else beta
  x, g, ng, lab, masks = pad(local, graph, node_graph, labels, 4, 2, 100.0)

  def f(a, c):
    return jax_loss(a, c, ng, lab, beta, losses.local_global_infonce, M=M, **masks)

  value, grads = jax.value_and_grad(f, argnums=(0, 1))(
    jnp.asarray(x, jnp.float32), jnp.asarray(g, jnp.float32)
  )
  want = reference_infonce(local, graph, node_graph, labels, lambda t: b * t, M)
  np.testing.assert_allclose(value, want, rtol=1e-5, atol=1e-6)
  # The maximum in ŝ is a constant: hold it at its value for the numerical gradient.
  peak = np.abs(local @ graph.T).max()

  def ref_fixed_peak(a, c):
    tilt = b * np.abs(a @ c.T).max() / peak
    return reference_infonce(a, c, node_graph, labels, lambda t: tilt * t, M)

  want_local = numeric_grad(lambda a: ref_fixed_peak(a, graph), local)
  want_graph = numeric_grad(lambda c: ref_fixed_peak(local, c), graph)
  np.testing.assert_allclose(grads[0][: len(local)], want_local, rtol=2e-4, atol=2e-5)
  np.testing.assert_allclose(grads[1][: len(graph)], want_graph, rtol=2e-4, atol=2e-5)
  assert not np.any(grads[0][len(local) :]) and not np.any(grads[1][len(graph) :])


def test_infonce_beta_zero_is_unhardened_and_eta_one_is_cross_entropy():
  local, graph, node_graph, labels = problem(seed=5)
  s = local @ graph.T
  own = node_graph[:, None] == np.arange(len(graph))[None, :]
  for supervised_labels in (None, labels):
    value = jax_loss(local, graph, node_graph, supervised_labels, None, losses.local_global_infonce)
    np.testing.assert_allclose(
      jax_loss(local, graph, node_graph, supervised_labels, 0.0, losses.local_global_infonce),
      value,
      rtol=1e-6,
    )
    # Cross-entropy of the own graph against itself and the negatives: −log softmax.
    keep = own.copy()
    if supervised_labels is None:
      keep[:] = True
    else:
      keep |= supervised_labels[node_graph][:, None] != supervised_labels[None, :]
    logits = np.where(keep, s, -np.inf)
    top = logits.max(axis=1, keepdims=True)
    log_softmax = s - top - np.log(np.sum(np.exp(logits - top), axis=1, keepdims=True))
    np.testing.assert_allclose(value, -np.mean(log_softmax[own]), rtol=1e-5)


def test_infonce_nodes_without_negatives_contribute_zero_and_count_in_n():
  local, graph, node_graph, labels = problem(seed=6)
  # One class: no node has a negative, so the loss and its gradients are 0.
  same = np.zeros(len(graph), int)
  f = lambda a: jax_loss(a, graph, node_graph, same, 1.0, losses.local_global_infonce)  # noqa: E731
  value, grad = jax.value_and_grad(f)(jnp.asarray(local, jnp.float32))
  assert value == 0.0 and not np.any(grad)
  # A threshold leaves some nodes without a negative at or above it, others with some.
  hardening = losses.threshold(np.exp(0.5))
  s_hat = 2 * (local @ graph.T) / np.abs(local @ graph.T).max()
  kept = [
    np.any(s_hat[v, negatives_of(v, node_graph, len(graph), labels)] >= 0.5)
    for v in range(len(local))
  ]
  assert 0 < sum(kept) < len(local)
  np.testing.assert_allclose(
    jax_loss(local, graph, node_graph, labels, hardening, losses.local_global_infonce),
    reference_infonce(local, graph, node_graph, labels, lambda t: 0.0 if t >= 0.5 else -np.inf),
    rtol=1e-5,
  )


@pytest.mark.parametrize('M', [float('nan'), 0, -1.0, float('inf')])
def test_infonce_rejects_a_bad_concrete_m(M):
  local, graph, node_graph, _ = problem()
  with pytest.raises(ValueError, match='^M must be positive and finite'):
    jax_loss(local, graph, node_graph, None, None, losses.local_global_infonce, M=M)


def test_arrays_in_the_wrong_form_are_one_line_naming_the_right_one():
  """Features of other ranks or dims, index arrays of another shape or of floats, masks of
  another length and a hardening that is not a function are refused in one line."""
  local, graph = np.ones((6, 4), np.float32), np.ones((2, 4), np.float32)
  node_graph, labels = np.array([0, 0, 0, 1, 1, 1]), np.array([0, 1])
  features = 'local_features and graph_features must have shapes .* got'
  cases = [
    (dict(local_features=local[None]), ValueError, features + ' \\(1, 6, 4\\) and \\(2, 4\\)'),
    (dict(graph_features=graph[:, :3]), ValueError, features),
    (
      dict(node_graph=node_graph[:4]),
      ValueError,
      'node_graph must have shape \\[nodes\\] = \\(6,\\), got \\(4,\\)',
    ),
    (dict(node_graph=node_graph * 1.0), TypeError, 'node_graph must be integers, got dtype float'),
    (
      dict(graph_labels=node_graph),
      ValueError,
      'graph_labels must have shape \\[graphs\\] = \\(2,\\)',
    ),
    (dict(graph_labels=labels * 1.0), TypeError, 'graph_labels must be integers'),
    (dict(node_mask=np.ones(3, bool)), ValueError, 'node_mask must have shape \\(6,\\)'),
    (dict(graph_mask=np.ones(3, bool)), ValueError, 'graph_mask must have shape \\(2,\\)'),
    (dict(hardening=1.0), TypeError, 'hardening= takes a function g -> log η'),
  ]
  for loss in (losses.local_global_jsd, losses.local_global_infonce):
    for change, error, message in cases:
      args = dict(local_features=local, graph_features=graph, node_graph=node_graph) | change
      with pytest.raises(error, match=message) as raised:
        loss(**args)
      assert '\n' not in str(raised.value)
    assert np.isfinite(loss(local, graph, node_graph, graph_labels=labels, hardening=None))
