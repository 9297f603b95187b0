"""Contrastive losses UCL, H-UCL, SCL and H-SCL as pure, jittable JAX functions.

Equation numbers refer to Jiang, Nguyen, Ishwar, Aeron, "Supervised Contrastive
Learning with Hard Negative Samples" (conference version); the H-UCL debiasing
follows Robinson et al., "Contrastive Learning with Hard Negative Samples" (ICLR 2021).

Every loss takes ``features`` of shape ``[batch, views, dim]`` (L2-normalised by the
caller; views >= 2) and, for the supervised ones, integer ``labels`` of shape
``[batch]``. The ``n = batch * views`` rows are flattened sample-major: row
``r`` is view ``r % views`` of sample ``r // views``. With ``g_ij = z_i . z_j / γ``
the loss of a positive pair (i, p) is eq. (3),

    ℓ_ip = log(1 + M e^{-g_ip} E_{j~q_i}[e^{g_ij}]) = softplus(log M - g_ip + log E_i),

where q_i ∝ η(g_ij) over the negatives N(i) of anchor i, and the expectation is taken
in log space, ``log E_i = LSE_j(log η + g) - LSE_j(log η)``, so nothing overflows for
any temperature or β. The loss is the flat mean of ℓ_ip over all ordered positive pairs
of the (global) batch. Hardening functions are given as ``g -> log η(g)``.

Rules for the edge cases (never NaN for finite inputs; non-finite features give NaN, so
a diverged model is not mistaken for a batch without negatives):
  * An anchor with no negative (all labels equal; or, for a threshold hardening, no
    negative at or above the threshold) has an empty negative sum, so E_i := 0 and each
    of its pairs contributes ℓ_ip = log(1 + 0) = 0 (with zero gradient). The pair still
    counts in the mean's denominator, so the normaliser does not jump as anchors cross
    a threshold. A batch with no negative at all has loss 0. (H-UCL applies its floor
    below to the empty mass too; UCL's negatives are empty only for a one-sample batch.)
  * β = 0 gives η ≡ 1 (log η ≡ 0) whether or not the weights are detached: exactly SCL/UCL.
  * H-UCL with τ⁺ > 0: the debiased negative mass can go negative; it is floored at
    M·e^{-1/γ} (HCL's clamp, ``clamp=True``) or at 0 (``clamp=False``, the pair then
    contributes 0). Either way, finite.

Cross-device: with ``axis_name`` (inside ``jax.shard_map`` or ``jax.pmap`` over that
axis, ``features``/``labels`` being the local shard), keys and labels are all-gathered
so every local anchor sees the negatives of the global batch, and the returned value
is the loss of the global batch, identical on every device. Inside ``jax.shard_map``
(default ``check_vma=True``), ``jax.grad`` of it with respect to replicated parameters
is already the gradient of the global-batch loss: JAX inserts the cross-device sum.

Memory: ``block_size=None`` picks the dense form when ``n_local * n_global <=
DENSE_MAX_ENTRIES`` and otherwise streams over key blocks of ``DEFAULT_BLOCK_SIZE``
rows (log-sum-exp accumulated online, tiles rematerialised in the backward pass);
pass an int to force blocks of that size, or 0 to force the dense form. Both forms give
the same value and gradient. The gradient is computed in the forward passes (a custom
VJP): the dense form uses one similarity matrix for value and gradient; the blockwise
form makes three passes over each tile (log-sum-exps, pair losses, gradient).

Precision: ``precision=`` sets the precision of the similarity matmuls (and of their
gradient), as ``jnp.dot``'s argument: a ``jax.lax.Precision`` or its name. The default,
``HIGHEST``, computes them in full float32 on every platform; ``'default'`` lets GPUs
use TF32 and TPUs a single bf16 pass, several times faster for large batches, with the
similarities (and so the loss) accurate to about 3 significant digits.
"""

from __future__ import annotations

from collections.abc import Callable
import dataclasses
import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array
Hardening = Callable[[Array], Array]  # g -> log η(g), η non-negative and non-decreasing
Precision = Any  # a jax.lax.Precision, its name ('highest', 'high', 'default') or a pair

DENSE_MAX_ENTRIES = 1 << 24  # 16.7M similarities: 64 MiB per f32 n×n buffer
DEFAULT_BLOCK_SIZE = 2048
# Similarity matmuls in full float32 by default. DEFAULT lets GPUs use TF32 and TPUs one
# bf16 pass: faster, with g (and so the loss) rounded to ~3 significant digits.
DEFAULT_PRECISION = jax.lax.Precision.HIGHEST
_NEG_INF = -jnp.inf


# --------------------------------------------------------------------------------------
# Checks of values known at trace time (traced values cannot be checked).


def _check_value(name: str, value, valid: Callable[[np.ndarray], np.ndarray], requirement: str):
  """Raises if ``value`` is concrete (a Python or NumPy number, a non-traced array) and
  any of its entries fails ``valid``; NaN fails every requirement."""
  if isinstance(value, jax.core.Tracer):
    return
  try:
    concrete = np.asarray(value, np.float64)
  except (TypeError, ValueError):
    raise TypeError(f'{name} must be a number, got {value!r}.') from None
  with np.errstate(invalid='ignore'):
    if not np.all(valid(concrete)):
      raise ValueError(f'{name} must be {requirement}, got {value}.')


def _finite_at_least_zero(x):
  return np.isfinite(x) & (x >= 0)


def _finite_positive(x):
  return np.isfinite(x) & (x > 0)


# --------------------------------------------------------------------------------------
# Hardening functions and schedules.


def exponential(beta) -> Hardening:
  """η_exp(g) = e^{βg} (Definition 1; H-SCL(β)). ``beta`` may be a traced array."""
  _check_value('beta', beta, _finite_at_least_zero, 'finite and >= 0 (a non-decreasing hardening)')
  return lambda g: beta * g


def threshold(tau) -> Hardening:
  """η_thresh(g) = 1(e^g >= τ) (Sec. IV-A; H-SCL(τ)). ``tau`` may be a traced array.

  τ -> 0 keeps every negative (SCL); see ``tau_schedule`` for eq. (4).
  """
  _check_value('tau', tau, _finite_at_least_zero, 'finite and >= 0 (it thresholds e^g > 0)')
  log_tau = jnp.log(jnp.asarray(tau, jnp.float32))
  return lambda g: jnp.where(g >= log_tau, 0.0, _NEG_INF)


def _no_hardening(g: Array) -> Array:
  return jnp.zeros_like(g)


def tau_schedule(epoch, *, start: float, end: float, num_epochs: int, temperature: float = 0.5):
  """Threshold of H-SCL(τ) at a 1-based ``epoch``, eq. (4): τ = e^{l/γ},

  l = start + (epoch - 1) / (num_epochs - 1) · (end - start). A single-epoch run uses
  ``start``. The paper's grid: start ∈ {-0.5, -0.3, -0.1}, end ∈ {-0.1, 0, 0.1}.
  """
  for name, value in (('start', start), ('end', end)):
    _check_value(name, value, np.isfinite, 'finite')
  _check_temperature(temperature)
  progress = (jnp.asarray(epoch, jnp.float32) - 1.0) / max(num_epochs - 1, 1)
  level = start + progress * (end - start)
  return jnp.exp(level / temperature)


def beta_schedule(epoch, *, beta: float, num_epochs: int, num_steps: int):
  """HCL's annealed β at a 1-based ``epoch`` (Robinson et al., App. D.1).

  β starts at ``beta`` and drops by β/ℓ (ℓ = ``num_steps``) at every epoch that is a
  multiple of num_epochs/ℓ, reaching 0 at the last epoch.
  """
  if num_steps < 1:
    raise ValueError(f'num_steps (ℓ, the number of β changes) must be >= 1, got {num_steps}.')
  _check_value('beta', beta, _finite_at_least_zero, 'finite and >= 0')
  drops = jnp.floor(jnp.asarray(epoch, jnp.float32) * num_steps / num_epochs)
  return beta * jnp.clip(1.0 - drops / num_steps, 0.0, 1.0)


# --------------------------------------------------------------------------------------
# Row bookkeeping: which rows are self / same sample / same label.


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class _Rows:
  """Per-row metadata. ``index`` and ``sample`` are global; padded rows have valid=False."""

  z: Array  # [rows, dim] float32
  index: Array  # [rows] int32
  sample: Array  # [rows] int32
  label: Array  # [rows] int32
  valid: Array  # [rows] bool


def _check_inputs(features, labels):
  """(features, labels) as arrays (array-likes such as lists are accepted), checked."""
  features = jnp.asarray(features)
  labels = None if labels is None else jnp.asarray(labels)
  if features.ndim != 3:
    raise ValueError(
      f'features must have shape [batch, views, dim], got shape {features.shape}; '
      'stack the views on axis 1 (e.g. jnp.stack([z1, z2], axis=1)).'
    )
  if features.shape[1] < 2:
    raise ValueError(
      f'features need at least 2 views per sample (axis 1), got {features.shape[1]}: '
      'a single view has no positive pair.'
    )
  if not jnp.issubdtype(features.dtype, jnp.floating):
    raise TypeError(f'features must be floating point, got dtype {features.dtype}.')
  if labels is None:
    return features, labels
  if labels.ndim != 1:
    raise ValueError(f'labels must have shape [batch], got shape {labels.shape}.')
  if not jnp.issubdtype(labels.dtype, jnp.integer):
    raise TypeError(
      f'labels must be integers (class ids), got dtype {labels.dtype}; '
      'cast them with labels.astype(jnp.int32).'
    )
  if labels.shape[0] != features.shape[0]:
    raise ValueError(
      f'labels has {labels.shape[0]} entries but features has batch size '
      f'{features.shape[0]}: there must be one label per sample (not per view).'
    )
  return features, labels


def _rows(features, labels, axis_name) -> tuple[_Rows, _Rows]:
  """Local anchor rows and global key rows (all-gathered over ``axis_name``)."""
  batch, views, dim = features.shape
  z = features.astype(jnp.float32)
  if labels is None:
    labels = jnp.zeros((batch,), jnp.int32)
  labels = labels.astype(jnp.int32)
  if axis_name is None:
    shard, z_all, labels_all = 0, z, labels
  else:
    shard = jax.lax.axis_index(axis_name)
    z_all = jax.lax.all_gather(z, axis_name, axis=0, tiled=True)
    labels_all = jax.lax.all_gather(labels, axis_name, axis=0, tiled=True)

  def flatten(z_, labels_, first_sample):
    num = z_.shape[0]
    sample = first_sample + jnp.repeat(jnp.arange(num, dtype=jnp.int32), views)
    return _Rows(
      z=z_.reshape(num * views, dim),
      index=sample * views + jnp.tile(jnp.arange(views, dtype=jnp.int32), num),
      sample=sample,
      label=jnp.repeat(labels_, views),
      valid=jnp.ones((num * views,), bool),
    )

  return flatten(z, labels, shard * batch), flatten(z_all, labels_all, 0)


# Candidate sets between anchor rows (queries) and key rows, as boolean tiles.
def _not_self(q: _Rows, k: _Rows):
  return (q.index[:, None] != k.index[None, :]) & q.valid[:, None] & k.valid[None, :]


def _other_sample(q, k):
  return _not_self(q, k) & (q.sample[:, None] != k.sample[None, :])


def _same_sample(q, k):
  return _not_self(q, k) & (q.sample[:, None] == k.sample[None, :])


def _other_label(q, k):
  return _not_self(q, k) & (q.label[:, None] != k.label[None, :])


def _same_label(q, k):
  return _not_self(q, k) & (q.label[:, None] == k.label[None, :])


def _label_collision(q, k):
  """Same label as the anchor among UCL's negatives (the Hcol candidates)."""
  return _other_sample(q, k) & (q.label[:, None] == k.label[None, :])


Mask = Callable[[_Rows, _Rows], Array]


# --------------------------------------------------------------------------------------
# Streaming log-sum-exp: (max, scaled sum) partials that merge exactly.


def _lse_partial(x: Array):
  """Partial log-sum-exp over the last axis; -inf entries are excluded."""
  m = jax.lax.stop_gradient(jnp.max(x, axis=-1))
  m = jnp.where(jnp.isfinite(m), m, jnp.finfo(jnp.float32).min)  # finite shift
  return m, jnp.sum(jnp.exp(x - m[..., None]), axis=-1)


def _lse_merge(a, b):
  (ma, sa), (mb, sb) = a, b
  m = jnp.maximum(ma, mb)
  return m, sa * jnp.exp(ma - m) + sb * jnp.exp(mb - m)


def _lse_finish(partial):
  """-> (lse, nonempty); lse is 0 (not -inf) for an empty set so gradients stay finite."""
  m, s = partial
  nonempty = s != 0  # NaN counts as non-empty, so it propagates instead of reading as "empty"
  return jnp.log(jnp.where(nonempty, s, 1.0)) + jnp.where(nonempty, m, 0.0), nonempty


# --------------------------------------------------------------------------------------
# Tiles of (anchor rows) × (key rows). The loss is a scalar, so its gradient with respect
# to the similarities is computed in the same passes as the value (a custom VJP whose
# backward only scales it): one similarity matmul per tile and pass instead of autodiff's
# recomputed, transposed tile graphs.


def _similarity(q: _Rows, k: _Rows, temperature, precision=DEFAULT_PRECISION) -> Array:
  return jnp.dot(q.z, k.z.T, precision=precision) / temperature


def _similarity_pullback(d_sim, q_z, k_z, precision):
  """(∂/∂q_z, ∂/∂k_z) of g = q_z k_zᵀ from ∂/∂g. The keys' term d_simᵀ q_z is computed as
  (q_zᵀ d_sim)ᵀ behind a barrier: XLA:CPU runs a matmul with the transposed n×n operand
  ~3.5x slower than a plain one (and folds a bare transpose of the result back into it)."""
  d_k = jax.lax.optimization_barrier(jnp.dot(q_z.T, d_sim, precision=precision)).T
  return jnp.dot(d_sim, k_z, precision=precision), d_k


def _log_weights(g, candidates, hardening, stop_gradient_weights):
  log_eta = hardening(g).astype(jnp.float32)
  if stop_gradient_weights:
    log_eta = jax.lax.stop_gradient(log_eta)
  return jnp.where(candidates, log_eta, _NEG_INF)


def _expectation_partials(g, candidates, *, hardening, stop_gradient_weights):
  """Partials of LSE(log η + g) and LSE(log η) over the candidate keys of each anchor."""
  log_w = _log_weights(g, candidates, hardening, stop_gradient_weights)
  return _lse_partial(log_w + g), _lse_partial(log_w)


def _finish_log_expectation(num, den):
  """(log E_i, has_negative_i, lse_num_i, lse_den_i) from the two partial log-sum-exps."""
  (lse_num, _), (lse_den, has_negative) = _lse_finish(num), _lse_finish(den)
  return jnp.where(has_negative, lse_num - lse_den, 0.0), has_negative, lse_num, lse_den


def _log_expectations(q, k, *, candidates: Mask, temperature, precision, **kwargs):
  """(log E_i, has_negative_i) for every anchor row of ``q`` (dense; for monitoring)."""
  g = _similarity(q, k, temperature, precision)
  return _finish_log_expectation(*_expectation_partials(g, candidates(q, k), **kwargs))[:2]


@dataclasses.dataclass(frozen=True)
class _Kernel:
  """One loss's sets, weights and pair loss; tiles take ``q.z`` already divided by γ."""

  candidates: Mask
  positives: Mask
  hardening: Hardening
  pair_loss: Callable
  stop_gradient_weights: bool
  precision: Precision

  def similarity(self, q: _Rows, k: _Rows) -> Array:
    return jnp.dot(q.z, k.z.T, precision=self.precision)

  def similarity_pullback(self, d_sim, q: _Rows, k: _Rows):
    return _similarity_pullback(d_sim, q.z, k.z, self.precision)

  def log_weights(self, g, q, k):
    return _log_weights(g, self.candidates(q, k), self.hardening, False)

  def expectation_partials(self, g, q, k):
    return _expectation_partials(
      g, self.candidates(q, k), hardening=self.hardening, stop_gradient_weights=False
    )  # handled in the gradient

  def pair_terms(self, g, q, k, log_e, has_negative):
    """(Σ ℓ_ip, pair count, ∂Σℓ/∂log E_i, ∂Σℓ/∂g_ip) over the tile's positive keys."""
    positives = self.positives(q, k)

    def pair_sum(g, log_e):
      loss = self.pair_loss(g, log_e[:, None], has_negative[:, None])
      return jnp.sum(jnp.where(positives, loss, 0.0))

    total, pullback = jax.vjp(pair_sum, g, log_e)
    d_g, d_log_e = pullback(jnp.ones_like(total))
    return total, jnp.sum(positives, dtype=jnp.float32), d_log_e, d_g

  def similarity_gradient(self, g, q, k, expectation, d_log_e, d_g_pairs):
    """∂Σℓ/∂g_ij: the pairs' direct term plus ∂Σℓ/∂log E_i · ∂log E_i/∂g_ij, where
    ∂log E_i/∂g_ij = p_ij (1 + ∂log η/∂g) - r_ij ∂log η/∂g, p ∝ η e^g and r ∝ η."""
    _, has_negative, lse_num, lse_den = expectation
    log_w, weights_pullback = jax.vjp(lambda g: self.log_weights(g, q, k), g)
    p = jnp.exp(log_w + g - lse_num[:, None])
    d_expectation = p
    if not self.stop_gradient_weights:
      d_expectation += weights_pullback(p - jnp.exp(log_w - lse_den[:, None]))[0]
    return d_g_pairs + jnp.where(has_negative, d_log_e, 0.0)[:, None] * d_expectation


def _dense_sums(kernel: _Kernel, q: _Rows, k: _Rows, with_gradient: bool):
  """(Σ ℓ_ip, pair count[, ∂/∂q.z, ∂/∂k.z]) from one similarity matrix."""
  g = kernel.similarity(q, k)
  expectation = _finish_log_expectation(*kernel.expectation_partials(g, q, k))
  total, count, d_log_e, d_g = kernel.pair_terms(g, q, k, *expectation[:2])
  if not with_gradient:
    return total, count
  d_sim = kernel.similarity_gradient(g, q, k, expectation, d_log_e, d_g)
  return total, count, *kernel.similarity_pullback(d_sim, q, k)


def _pad_rows(rows: _Rows, multiple: int) -> _Rows:
  pad = -rows.z.shape[0] % multiple
  if pad == 0:
    return rows
  padded = jax.tree.map(
    lambda x: jnp.concatenate([x, jnp.zeros((pad,) + x.shape[1:], x.dtype)]), rows
  )
  return dataclasses.replace(padded, valid=padded.valid.at[-pad:].set(False))


def _blocks(rows: _Rows, size: int) -> _Rows:
  return jax.tree.map(lambda x: x.reshape((-1, size) + x.shape[1:]), rows)


def _blockwise_sums(kernel: _Kernel, q: _Rows, k: _Rows, with_gradient: bool, block: int):
  """As ``_dense_sums``, streaming over key blocks: a log-sum-exp pass, a pair-loss pass
  and (for the gradient) a pass that accumulates the gradient of both row sets."""
  # Blocks no larger than the rows they cut, so small batches are not padded up.
  k_size, q_size = min(block, k.index.shape[0]), min(block, q.index.shape[0])
  key_blocks = _blocks(_pad_rows(k, k_size), k_size)
  query_blocks = _blocks(_pad_rows(q, q_size), q_size)

  def sweep(tile_fn, init):
    """lax.scan of ``tile_fn(keys) -> (increment, output)`` over the key blocks."""

    def step(carry, keys):
      increment, output = tile_fn(keys)
      return jax.tree.map(jnp.add, carry, increment), output

    return jax.lax.scan(step, init, key_blocks)

  def query_block(d_keys, rows):
    # *_like keeps the carries' device-variance (shard_map) equal to the data's.
    empty = (jnp.full_like(rows.z[:, 0], jnp.finfo(jnp.float32).min), jnp.zeros_like(rows.z[:, 0]))

    def lse_step(carry, keys):
      num, den = kernel.expectation_partials(kernel.similarity(rows, keys), rows, keys)
      return (_lse_merge(carry[0], num), _lse_merge(carry[1], den)), None

    partials, _ = jax.lax.scan(lse_step, (empty, empty), key_blocks)
    expectation = _finish_log_expectation(*partials)
    zero = jnp.zeros_like(rows.z[0, 0])
    (total, count, d_log_e), _ = sweep(
      lambda keys: (
        kernel.pair_terms(kernel.similarity(rows, keys), rows, keys, *expectation[:2])[:3],
        None,
      ),
      (zero, zero, jnp.zeros_like(rows.z[:, 0])),
    )
    if not with_gradient:
      return d_keys, (total, count)

    def gradient_tile(keys):
      g = kernel.similarity(rows, keys)
      d_g = kernel.pair_terms(g, rows, keys, *expectation[:2])[3]
      d_sim = kernel.similarity_gradient(g, rows, keys, expectation, d_log_e, d_g)
      return kernel.similarity_pullback(d_sim, rows, keys)

    d_rows, d_key_blocks = sweep(gradient_tile, jnp.zeros_like(rows.z))
    return d_keys + d_key_blocks.reshape(d_keys.shape), (total, count, d_rows)

  d_keys = jnp.zeros_like(key_blocks.z.reshape(-1, key_blocks.z.shape[-1]))
  d_keys, out = jax.lax.scan(query_block, d_keys, query_blocks)
  total, count = jnp.sum(out[0]), jnp.sum(out[1])
  if not with_gradient:
    return total, count
  num_q, num_k = q.index.shape[0], k.index.shape[0]
  return total, count, out[2].reshape(-1, q.z.shape[-1])[:num_q], d_keys[:num_k]


def _resolve_block_size(block_size, num_queries, num_keys):
  if block_size is None:
    return None if num_queries * num_keys <= DENSE_MAX_ENTRIES else DEFAULT_BLOCK_SIZE
  if block_size < 0:
    raise ValueError(f'block_size must be None (auto), 0 (dense) or positive, got {block_size}.')
  return block_size or None


def _loss_sums(kernel: _Kernel, q: _Rows, k: _Rows, block: int | None):
  """(Σ ℓ_ip, pair count) over the anchor rows ``q``, differentiable in q.z and k.z."""

  def sums(q, k, with_gradient):
    if block is None:
      return _dense_sums(kernel, q, k, with_gradient)
    return _blockwise_sums(kernel, q, k, with_gradient, block)

  def split(q_z, k_z, q_meta, k_meta):
    return dataclasses.replace(q_meta, z=q_z), dataclasses.replace(k_meta, z=k_z)

  @jax.custom_vjp
  def value(q_z, k_z, q_meta, k_meta):
    return sums(*split(q_z, k_z, q_meta, k_meta), with_gradient=False)

  def value_and_gradient(q_z, k_z, q_meta, k_meta):
    total, count, d_q, d_k = sums(*split(q_z, k_z, q_meta, k_meta), with_gradient=True)
    return (total, count), (d_q, d_k)

  def backward(gradients, cotangents):
    d_q, d_k = gradients
    d_total = cotangents[0]  # the pair count is piecewise constant
    return d_total * d_q, d_total * d_k, None, None

  value.defvjp(value_and_gradient, backward)
  no_z = lambda rows: dataclasses.replace(rows, z=None)
  return value(q.z, k.z, no_z(q), no_z(k))


def _global_loss(
  features,
  labels,
  *,
  candidates,
  positives,
  hardening,
  pair_loss,
  temperature,
  stop_gradient_weights,
  axis_name,
  block_size,
  precision=DEFAULT_PRECISION,
):
  """Flat mean of ℓ_ip over the ordered positive pairs of the global batch."""
  q, k = _rows(features, labels, axis_name)
  block = _resolve_block_size(block_size, q.index.shape[0], k.index.shape[0])
  kernel = _Kernel(
    candidates=candidates,
    positives=positives,
    hardening=hardening,
    pair_loss=pair_loss,
    stop_gradient_weights=stop_gradient_weights,
    precision=precision,
  )
  # γ folded into the anchors: g = (z_i / γ) · z_j, one scaling of n·d entries, not n².
  total, count = _loss_sums(kernel, dataclasses.replace(q, z=q.z / temperature), k, block)
  # A diverged model must not look like a batch without negatives: NaN in, NaN out
  # (checked on the local rows, before the sum that spreads it to every device).
  total = jnp.where(jnp.all(jnp.isfinite(q.z)), total, jnp.nan)
  if axis_name is not None:
    total, count = jax.lax.psum((total, count), axis_name)
  return total / jnp.maximum(count, 1.0)


# --------------------------------------------------------------------------------------
# Per-pair losses.


def _log_m(M, features, axis_name):
  """log M; M = None means n - 2 with n the number of rows of the global batch."""
  if M is None:
    batch, views, _ = features.shape
    devices = 1 if axis_name is None else jax.lax.axis_size(axis_name)
    M = batch * views * devices - 2
    if M <= 0:
      raise ValueError(f'M = n - 2 = {M} is not positive: the batch has too few rows; pass M.')
    return jnp.log(jnp.asarray(M, jnp.float32))
  return _log_given_m(M)


def _log_given_m(M):
  """log M of a given M (a number or an array; a concrete one must be positive, finite)."""
  _check_value('M', M, _finite_positive, 'positive and finite')
  return jnp.log(jnp.asarray(M, jnp.float32))


def _softplus_and_sigmoid(x):
  """(log(1 + e^x), σ(x)) from one exponential (the pair losses' only transcendentals
  besides a log: over every entry of a tile they cost about as much as the matmuls).

  log1p(t) is a series for small t (XLA folds the usual (1 + t) - 1 correction away):
  relative error below 2e-6; NaN and ±inf as jax.nn.softplus.
  """
  t = jnp.exp(-jnp.abs(x))  # in [0, 1]
  u = 1.0 + t
  series = t * (1.0 - t * (1 / 2 - t * (1 / 3 - t * (1 / 4 - t * (1 / 5 - t / 6)))))
  log1p_t = jnp.where(t < 0.05, series, jnp.log(u))
  return jnp.maximum(x, 0.0) + log1p_t, jnp.where(x >= 0, 1.0, t) / u


@jax.custom_jvp
def _softplus(x):
  return _softplus_and_sigmoid(x)[0]


@_softplus.defjvp
def _softplus_jvp(primals, tangents):
  value, slope = _softplus_and_sigmoid(primals[0])
  return value, slope * tangents[0]


def _infonce_pair_loss(log_m):
  """eq. (3): softplus(log M - g_ip + log E_i); 0 for an anchor without negatives."""

  def pair_loss(g, log_e, has_negative):
    return jnp.where(has_negative, _softplus(log_m - g + log_e), 0.0)

  return pair_loss


def _debiased_pair_loss(log_m, tau_plus, temperature, clamp):
  """HCL's debiased term: Ng = M (E - τ⁺ e^{g_ip}) / (1 - τ⁺), floored;
  ℓ = log(1 + Ng e^{-g_ip})."""
  floor = log_m - 1.0 / temperature if clamp else _NEG_INF

  def pair_loss(g, log_e, has_negative):
    ratio = tau_plus * jnp.exp(jnp.minimum(g - log_e, 80.0))  # τ⁺ e^{g_ip} / E_i
    positive_mass = has_negative & (ratio < 1.0)
    safe_ratio = jnp.where(positive_mass, ratio, 0.0)
    log_ng = log_m + log_e + jnp.log1p(-safe_ratio) - jnp.log1p(-tau_plus)
    log_ng = jnp.maximum(jnp.where(positive_mass, log_ng, _NEG_INF), floor)
    return jnp.where(jnp.isfinite(log_ng), _softplus(log_ng - g), 0.0)

  return pair_loss


def l2_normalize(x: Array, eps: float = 1e-12) -> Array:
  """Rows scaled to unit L2 norm (float32); zero rows stay zero. The losses' inputs."""
  x = jnp.asarray(x, jnp.float32)
  norm = jnp.sqrt(jnp.sum(x * x, axis=-1, keepdims=True))
  return x / jnp.maximum(norm, eps)


def _check_temperature(temperature):
  _check_value('temperature', temperature, _finite_positive, 'positive and finite')


# --------------------------------------------------------------------------------------
# Public losses.


def ucl(
  features: Array,
  *,
  temperature=0.5,
  M=None,
  axis_name: str | None = None,
  block_size: int | None = None,
  precision: Precision = DEFAULT_PRECISION,
) -> Array:
  """UCL (SimCLR / NT-Xent): positives are the other views of the same sample, negatives
  every row of another sample, η ≡ 1; eq. (3). With M = n - 2 this is NT-Xent exactly."""
  features, _ = _check_inputs(features, None)
  _check_temperature(temperature)
  return _global_loss(
    features,
    None,
    candidates=_other_sample,
    positives=_same_sample,
    hardening=_no_hardening,
    pair_loss=_infonce_pair_loss(_log_m(M, features, axis_name)),
    temperature=temperature,
    stop_gradient_weights=False,
    axis_name=axis_name,
    block_size=block_size,
    precision=precision,
  )


def hucl(
  features: Array,
  *,
  beta,
  tau_plus=0.0,
  temperature=0.5,
  M=None,
  clamp: bool = True,
  stop_gradient_weights: bool = False,
  axis_name: str | None = None,
  block_size: int | None = None,
  precision: Precision = DEFAULT_PRECISION,
) -> Array:
  """H-UCL (HCL, Robinson et al. eq. (4)/Fig. 13): UCL's positives and negatives with
  q_i ∝ e^{β g_ij} (Sec. III-C), and τ⁺ debiasing with the negative mass floored at
  M·e^{-1/γ} (``clamp=True``, HCL's rule) or at 0 (``clamp=False``). τ⁺ = 0 and
  β = 0 give UCL (on unit-norm features, where the floor never binds)."""
  features, _ = _check_inputs(features, None)
  _check_temperature(temperature)
  _check_value('tau_plus', tau_plus, lambda x: (x >= 0) & (x < 1), 'in [0, 1) (a class prior)')
  log_m = _log_m(M, features, axis_name)
  return _global_loss(
    features,
    None,
    candidates=_other_sample,
    positives=_same_sample,
    hardening=exponential(beta),
    pair_loss=_debiased_pair_loss(log_m, tau_plus, temperature, clamp),
    temperature=temperature,
    stop_gradient_weights=stop_gradient_weights,
    axis_name=axis_name,
    block_size=block_size,
    precision=precision,
  )


def scl(
  features: Array,
  labels: Array,
  *,
  temperature=0.5,
  M=None,
  axis_name: str | None = None,
  block_size: int | None = None,
  precision: Precision = DEFAULT_PRECISION,
) -> Array:
  """SCL: positives every other row with the anchor's label (including its other views),
  negatives every row with another label, η ≡ 1 (Sec. III-B, eq. (3))."""
  return hscl(
    features,
    labels,
    hardening=_no_hardening,
    temperature=temperature,
    M=M,
    axis_name=axis_name,
    block_size=block_size,
    precision=precision,
  )


def hscl(
  features: Array,
  labels: Array,
  *,
  hardening: Hardening,
  temperature=0.5,
  M=None,
  stop_gradient_weights: bool = False,
  axis_name: str | None = None,
  block_size: int | None = None,
  precision: Precision = DEFAULT_PRECISION,
) -> Array:
  """H-SCL (Sec. III-C, eq. (3)): SCL's positives and negatives with q_i ∝ η(g_ij).

  ``hardening`` maps g to log η(g): ``exponential(beta)`` for H-SCL(β),
  ``threshold(tau)`` for H-SCL(τ), or any function of a non-decreasing η >= 0.
  Gradients flow through the weights unless ``stop_gradient_weights``.
  """
  features, labels = _check_inputs(features, labels)
  _check_temperature(temperature)
  return _global_loss(
    features,
    labels,
    candidates=_other_label,
    positives=_same_label,
    hardening=hardening,
    pair_loss=_infonce_pair_loss(_log_m(M, features, axis_name)),
    temperature=temperature,
    stop_gradient_weights=stop_gradient_weights,
    axis_name=axis_name,
    block_size=block_size,
    precision=precision,
  )


# --------------------------------------------------------------------------------------
# Diagnostics (Sec. IV and V-B; Figs. 4 and 5). Dense: meant for monitoring batches.


def log_alphas(
  features: Array,
  labels: Array,
  *,
  hardening: Hardening,
  temperature=0.5,
  axis_name: str | None = None,
  precision: Precision = DEFAULT_PRECISION,
) -> dict[str, Array]:
  """Per-anchor log α_HUCL, log α_HSCL, log α_Hcol (Prop. 2), each ``[local rows]``.

  α_X = E_{j~q_UCL}[1(j ∈ X) η(g_ij)] with q_UCL uniform over UCL's negatives of the
  anchor (rows of other samples); X is all of them (H-UCL), those with another label
  (H-SCL) or the same label (Hcol), so α_HUCL = α_HSCL + α_Hcol exactly. An empty set
  gives log α = -inf.
  """
  features, labels = _check_inputs(features, labels)
  q, k = _rows(features, labels, axis_name)
  log_eta = hardening(_similarity(q, k, temperature, precision))
  ucl_negatives = _other_sample(q, k)
  log_count = jnp.log(jnp.maximum(jnp.sum(ucl_negatives, axis=1), 1).astype(jnp.float32))

  def log_alpha(mask):
    lse, nonempty = _lse_finish(_lse_partial(jnp.where(mask, log_eta, _NEG_INF)))
    return jnp.where(nonempty, lse - log_count, _NEG_INF)

  return {
    'hucl': log_alpha(ucl_negatives),
    'hscl': log_alpha(_other_label(q, k)),
    'hcol': log_alpha(_label_collision(q, k)),
  }


def assumption1(
  features: Array,
  labels: Array,
  *,
  hardening: Hardening,
  temperature=0.5,
  axis_name: str | None = None,
  precision: Precision = DEFAULT_PRECISION,
) -> Array:
  """Per-anchor indicator of Assumption 1: E_{q_Hcol}[e^g] >= E_{q_HSCL}[e^g].

  q_Hcol ∝ η over label collisions among UCL's negatives, q_HSCL ∝ η over rows of another
  label. Where either set is empty the conclusion of Lemma 1 holds with equality for that
  anchor (E_HUCL = E_HSCL, or ℓ_HSCL = 0), so it counts as satisfied.
  """
  features, labels = _check_inputs(features, labels)
  q, k = _rows(features, labels, axis_name)
  kwargs = dict(
    hardening=hardening, temperature=temperature, stop_gradient_weights=False, precision=precision
  )
  log_e_col, has_col = _log_expectations(q, k, candidates=_label_collision, **kwargs)
  log_e_hscl, has_hscl = _log_expectations(q, k, candidates=_other_label, **kwargs)
  return ~(has_col & has_hscl) | (log_e_col >= log_e_hscl)


def batch_diagnostics(
  features: Array,
  labels: Array,
  *,
  hardening: Hardening,
  temperature=0.5,
  M=None,
  positives: str = 'sample',
  axis_name: str | None = None,
  block_size: int | None = None,
  precision: Precision = DEFAULT_PRECISION,
) -> dict[str, Array]:
  """The four losses of one batch with the same positives, and Assumption 1 (Figs. 4, 5).

  ``positives``: "sample" (other views of the anchor's sample; with label-paired views
  this is the paper's Lemma 1 set-up) or "label" (every other row of the anchor's label).
  H-UCL uses the same hardening as H-SCL and τ⁺ = 0, so Lemma 1 reads
  loss_hscl <= loss_hucl whenever assumption1_fraction == 1. Values carry no gradient.
  """
  features, labels = jax.lax.stop_gradient(_check_inputs(features, labels))
  _check_temperature(temperature)
  positive_set = {'sample': _same_sample, 'label': _same_label}.get(positives)
  if positive_set is None:
    raise ValueError(f"positives must be 'sample' or 'label', got {positives!r}.")
  loss = functools.partial(
    _global_loss,
    features,
    labels,
    positives=positive_set,
    pair_loss=_infonce_pair_loss(_log_m(M, features, axis_name)),
    temperature=temperature,
    stop_gradient_weights=True,
    axis_name=axis_name,
    block_size=block_size,
    precision=precision,
  )
  satisfied = assumption1(
    features,
    labels,
    hardening=hardening,
    temperature=temperature,
    axis_name=axis_name,
    precision=precision,
  )
  fraction = jnp.mean(satisfied.astype(jnp.float32))
  if axis_name is not None:
    fraction = jax.lax.pmean(fraction, axis_name)
  return {
    'loss_ucl': loss(candidates=_other_sample, hardening=_no_hardening),
    'loss_hucl': loss(candidates=_other_sample, hardening=hardening),
    'loss_scl': loss(candidates=_other_label, hardening=_no_hardening),
    'loss_hscl': loss(candidates=_other_label, hardening=hardening),
    'assumption1_fraction': fraction,
  }


# --------------------------------------------------------------------------------------
# Graphs: the local–global objective of InfoGraph with the four settings (Sec. V-C,
# Table II). Scores s_vG = <l_v, g_G> between every node v and every graph G of a batch.

# NumPy, not jnp: a JAX op at import time would start the backend before jax.distributed.
_LOG2 = float(np.log(2.0))


def _rescaled_scores(scores: Array, valid: Array) -> Array:
  """ŝ = 2·s / max|s| over the valid pairs, in [-2, 2]; the maximum is a constant.

  Graph scores are unbounded (no normalisation, no temperature), so an exponential tilt
  of the raw scores would put all the weight on one negative; HCL (Robinson et al.,
  App. B) tilts the rescaled scores instead.
  """
  peak = jax.lax.stop_gradient(jnp.max(jnp.where(valid, jnp.abs(scores), 0.0)))
  return 2.0 * scores / jnp.where(peak > 0, peak, 1.0)


class _NodeGraphPairs(NamedTuple):
  """Every (node, graph) pair of a graph batch, as both local–global losses read them."""

  scores: Array  # [nodes, graphs] s_vG, float32; padding rows and columns are 0
  candidates: Array  # [nodes, graphs] G ∈ N(v), the negatives of node v
  log_w: Array  # [nodes, graphs] log η(ŝ_vG) on the negatives, -inf elsewhere
  own_scores: Array  # [nodes] s_{v,g(v)}; 0 for padding
  node_mask: Array  # [nodes] bool, the real nodes


def _node_graph_pairs(
  local_features, graph_features, node_graph, graph_labels, hardening, node_mask, graph_mask
) -> _NodeGraphPairs:
  """Scores, negatives and hardening log-weights of every node against every graph."""
  num_nodes, num_graphs = local_features.shape[0], graph_features.shape[0]
  node_mask = jnp.ones(num_nodes, bool) if node_mask is None else node_mask.astype(bool)
  graph_mask = jnp.ones(num_graphs, bool) if graph_mask is None else graph_mask.astype(bool)
  own = node_graph[:, None] == jnp.arange(num_graphs)[None, :]
  valid = node_mask[:, None] & graph_mask[None, :]
  # Zeroed padding cannot leak NaN/inf into the values or the gradients.
  local = jnp.where(node_mask[:, None], local_features.astype(jnp.float32), 0.0)
  graph = jnp.where(graph_mask[:, None], graph_features.astype(jnp.float32), 0.0)
  scores = jnp.dot(local, graph.T, precision=jax.lax.Precision.HIGHEST)
  candidates = valid & ~own
  if graph_labels is not None:
    node_labels = jnp.take(graph_labels, node_graph, mode='clip')
    candidates &= node_labels[:, None] != graph_labels[None, :]
  hardening = _no_hardening if hardening is None else hardening
  log_w = jnp.where(candidates, hardening(_rescaled_scores(scores, valid)), _NEG_INF)
  own_scores = jnp.sum(jnp.where(own, scores, 0.0), axis=1)
  return _NodeGraphPairs(scores, candidates, log_w, own_scores, node_mask)


def _node_mean(per_node: Array, node_mask: Array) -> Array:
  """(1/N) Σ_v over the N real nodes (0 for a batch without one)."""
  total = jnp.sum(jnp.where(node_mask, per_node, 0.0))
  return total / jnp.maximum(jnp.sum(node_mask, dtype=jnp.float32), 1.0)


def local_global_jsd(
  local_features: Array,
  graph_features: Array,
  node_graph: Array,
  *,
  graph_labels: Array | None = None,
  hardening: Hardening | None = None,
  node_mask: Array | None = None,
  graph_mask: Array | None = None,
) -> Array:
  """InfoGraph's Jensen–Shannon local–global loss with (hard) negatives, Table II.

  L = (1/N) Σ_v Σ_{G∈N(v)} q_v(G)·(sp(s_vG) − log 2) − (1/N) Σ_v (log 2 − sp(−s_{v,g(v)})),

  sp = softplus, N the number of real nodes, g(v) the graph of node v (its positive) and
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
  Returns:
    The scalar loss (float32).
  """
  pairs = _node_graph_pairs(
    local_features, graph_features, node_graph, graph_labels, hardening, node_mask, graph_mask
  )
  log_norm, has_negative = _lse_finish(_lse_partial(pairs.log_w))
  q = jnp.exp(pairs.log_w - log_norm[:, None])
  terms = jnp.where(pairs.candidates, q * (jax.nn.softplus(pairs.scores) - _LOG2), 0.0)
  negative = jnp.where(has_negative, jnp.sum(terms, axis=1), 0.0)
  positive = _LOG2 - jax.nn.softplus(-pairs.own_scores)
  return _node_mean(negative - positive, pairs.node_mask)


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
) -> Array:
  """eq. (3)'s InfoNCE estimator over InfoGraph's node–graph pairs, Table II's settings.

  ℓ_v = log(1 + M_v · e^{−s_{v,g(v)}} · E_{G~q_v}[e^{s_vG}]),  L = (1/N) Σ_v ℓ_v,

  node v the anchor, its graph g(v) the positive, and N(v), q_v(G) ∝ η(ŝ_vG), ``hardening``,
  ``graph_labels`` and the masks exactly as in ``local_global_jsd``. ``M=None`` takes M_v =
  |N(v)|, the number of negatives of node v, so with η ≡ 1 this is the cross-entropy
  log(1 + Σ_{G∈N(v)} e^{s_vG − s_{v,g(v)}}); otherwise M is the given constant (positive).
  In log space, ℓ_v = softplus(log M_v + LSE_G(log q_v(G) + s_vG) − s_{v,g(v)}). A node
  without negatives contributes 0 and still counts in N; β = 0 gives the unhardened loss.

  Returns:
    The scalar loss (float32).
  """
  pairs = _node_graph_pairs(
    local_features, graph_features, node_graph, graph_labels, hardening, node_mask, graph_mask
  )
  if M is None:
    count = jnp.sum(pairs.candidates, axis=1, dtype=jnp.float32)
    log_m = jnp.log(jnp.maximum(count, 1.0))
  else:
    log_m = _log_given_m(M)
  log_e, has_negative, _, _ = _finish_log_expectation(
    _lse_partial(pairs.log_w + pairs.scores), _lse_partial(pairs.log_w)
  )
  per_node = _infonce_pair_loss(log_m)(pairs.own_scores, log_e, has_negative)
  return _node_mean(per_node, pairs.node_mask)
