"""Exact gradient caching for losses over a batch larger than one forward pass can hold.

Gao et al. (2021), "Scaling Deep Contrastive Learning Batch Size under Memory Limited
Setup": a contrastive loss couples every sample of the batch, but its gradient with
respect to the parameters factors through the encoder outputs,

    ∂L/∂θ = Σ_chunks J_chunk(θ)ᵀ ∂L/∂z_chunk,

so the encoder can run chunk by chunk: (1) a forward pass per chunk without keeping
activations, collecting the outputs z; (2) the loss and ∂L/∂z for the whole batch at once;
(3) per chunk, the forward pass again under ``jax.vjp``, pulling ∂L/∂z_chunk back into the
parameter gradient, summed in a ``lax.scan`` (memory: one chunk's activations, whatever
the number of chunks). The result equals the unchunked gradient whenever the encoder
treats samples independently; a layer that mixes samples (BatchNorm in training mode)
sees one chunk at a time instead, identically in passes (1) and (3).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

PyTree = Any


def value_and_grad(
  forward: Callable,
  loss_fn: Callable,
  params: PyTree,
  state: PyTree,
  chunks: PyTree,
  *,
  axis_name: str | None = None,
  unroll: bool = False,
):
  """``loss_fn`` of the concatenated chunk outputs, and its gradient w.r.t. ``params``.

  Args:
    forward: ``(params, state, chunk) -> (outputs, new_state)``; ``outputs`` is a pytree of
      arrays with the chunk's samples on axis 0; ``state`` (e.g. BatchNorm running
      statistics, ``{}`` if none) is threaded from chunk to chunk in pass (1).
    loss_fn: ``outputs of the whole batch -> (loss, aux)``, a scalar loss.
    params: the parameters to differentiate.
    state: the state before the first chunk.
    chunks: a pytree whose leaves have the chunk index on axis 0.
    axis_name: inside ``jax.shard_map`` with ``params`` replicated over this axis: the
      per-device parameter gradients are accumulated locally and summed over the axis
      once at the end (one all-reduce per step, not one per chunk).
    unroll: unroll the two loops over chunks instead of ``lax.scan``. XLA:CPU runs
      convolutions inside a loop body on a slow path (jax-ml/jax#12868): unrolled, the
      chunked step costs about 1.2x the unchunked one there instead of ~15-30x, for a
      compile time and a peak memory that grow with the number of chunks. Keep the
      default (a scan: memory flat in the number of chunks) on GPUs and TPUs.

  Returns:
    ``((loss, aux, outputs, new_state), grads)``; ``outputs`` has the whole batch on axis 0.
  """

  outputs, new_state, chunk_states = _forward(forward, params, state, chunks, unroll)
  (loss, aux), d_outputs = jax.value_and_grad(loss_fn, has_aux=True)(_merge(outputs))
  d_outputs = jax.tree.map(lambda d, x: d.reshape(x.shape), d_outputs, outputs)

  grads = _pull_back(forward, params, (chunk_states, chunks, d_outputs), axis_name, unroll)
  return (loss, aux, _merge(outputs), new_state), grads


def forward_only(forward: Callable, params: PyTree, state: PyTree, chunks: PyTree, *, unroll=False):
  """Pass (1) alone, ``(outputs of the whole batch, new_state)``: an encoder that is not
  differentiated (e.g. a momentum key encoder) run chunk by chunk, as the online one is."""
  outputs, new_state, _ = _forward(forward, params, state, chunks, unroll)
  return _merge(outputs), new_state


def _forward(forward, params, state, chunks, unroll):
  """Pass (1): (per-chunk outputs, the state after the last chunk, each chunk's state)."""

  def encode(state, chunk):
    outputs, new_state = forward(params, state, chunk)
    return new_state, (outputs, state)

  new_state, (outputs, chunk_states) = jax.lax.scan(encode, state, chunks, unroll=unroll)
  return outputs, new_state, chunk_states


def _merge(chunked: PyTree) -> PyTree:
  return jax.tree.map(lambda x: x.reshape((-1,) + x.shape[2:]), chunked)


def _pull_back(forward, params, per_chunk, axis_name, unroll):
  """Pass (2): per chunk, the forward again and its backward, gradients accumulated."""
  # Per-device gradients: differentiate a device-varying copy of the parameters, so the
  # pull-back does not all-reduce chunk by chunk.
  local_params = params if axis_name is None else jax.lax.pcast(params, axis_name, to='varying')

  def pull_back(grads, inputs):
    # The barrier makes the recomputation wait for the loss's gradient and the previous
    # chunk's pull-back: unrolled, XLA would otherwise merge it with pass (1)'s identical
    # forward (keeping every chunk's activations) or run all chunks' forwards at once.
    grads, params_, (chunk_state, chunk, d_chunk) = jax.lax.optimization_barrier(
      (grads, local_params, inputs)
    )
    _, vjp = jax.vjp(lambda p: forward(p, chunk_state, chunk)[0], params_)
    return jax.tree.map(jnp.add, grads, vjp(d_chunk)[0]), None

  zeros = jax.tree.map(jnp.zeros_like, local_params)
  grads, _ = jax.lax.scan(pull_back, zeros, per_chunk, unroll=unroll)
  return grads if axis_name is None else jax.lax.psum(grads, axis_name)


def split(tree: PyTree, num_chunks: int) -> PyTree:
  """Leaves [batch, ...] -> [num_chunks, batch // num_chunks, ...] (consecutive samples)."""
  return jax.tree.map(lambda x: x.reshape((num_chunks, -1) + x.shape[1:]), tree)
