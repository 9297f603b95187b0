"""The sigmoid (SigLIP) family: one binary term per pair, with labels and hardening.

SigLIP (Zhai, Mustafa, Kolesnikov, Beyer, ICCV 2023) replaces the softmax over negatives
with a logistic term per pair. With the logit ``l_ij = t·s_ij + b`` (s_ij the cosine
similarity of two L2-normalised rows, t > 0 a scale, b a bias) anchor i's loss is

    L_i = Σ_{p∈P(i)} softplus(-l_ip) + Σ_{j∈N(i)} w_ij softplus(l_ij),   L = (1/n) Σ_i L_i,

the mean over the n anchor rows of the global batch. Two towers (``siglip``: x rows are the
anchors, y rows the keys) pair rows across the towers only, positives on the diagonal
(SigLIP) or by equal labels; one tower (``sigmoid_contrastive``: the package's
``[batch, views, dim]``) pairs rows i != j, positives the same sample or the same label.
Every other pair is a negative.

Hardening tilts each anchor's negatives as H-UCL/H-SCL tilt theirs, with importance
weights of mean 1 over N(i): ``w_ij = |N(i)| η(g_ij) / Σ_{k∈N(i)} η(g_ik)``, g_ij = t·s_ij
(the bias does not enter), η given as ``g -> log η(g)`` (``exponential(β)``,
``threshold(τ)`` or your own). ``hardening=None`` is w ≡ 1 (SigLIP's loss); β = 0 gives
w ≡ 1 too. The weighted sum is kept in log space: per anchor, the largest log η shifts
both Σ η and Σ η·softplus(l), so nothing overflows for any β.

Edge cases (never NaN for finite inputs): an anchor without negatives contributes its
positive terms alone, one without positives its negative terms alone; an anchor whose
negatives all have η = 0 (a threshold above all of them) takes no weights, so its negative
term is 0. Every anchor counts in the mean.

The scale ``t`` is the multiplier itself (SigLIP's e^{t'}); train ``t' = log t`` and pass
``t=jnp.exp(t_prime)`` as SigLIP does. SigLIP initialises t' = log 10 and b = -10
(``SIGLIP_T``, ``SIGLIP_B``). ``t`` and ``b`` may be traced arrays with exact gradients.

Memory and speed: below ``DENSE_MAX_ENTRIES`` similarities one tile gives value and
gradient; above it (or with ``block_size``) anchors and keys stream in blocks: memory
O((n + m)·d + block²), never the n×m matrix. Without hardening one pass per tile gives the
value and the gradient; with it a first pass gives each anchor's normaliser.

Across devices (``axis_name``, inside ``jax.shard_map``/``jax.pmap``; x, y, z and labels
the local shards): ``collective='all_gather'`` gathers the keys (and their labels) as the
softmax losses do; ``collective='ring'`` passes the key shards around a ring of
``ppermute``s as SigLIP chunks it (D - 1 permutes for the value, the keys' gradient
travelling with them and brought home by one more), holding at most the shard in use and
the one arriving. Either way the value (the same on every device) and every gradient are
those of the global batch.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from hscl_jax.losses import image
from hscl_jax.losses import kernel

Array = kernel.Array
Hardening = kernel.Hardening

SIGLIP_T = 10.0  # SigLIP's initial scale t = e^{t'}, t' = log 10
SIGLIP_B = -10.0  # SigLIP's initial bias
COLLECTIVES = ('all_gather', 'ring')

# --------------------------------------------------------------------------------------
# Per-anchor sums over the keys seen so far; they merge exactly, tile by tile.


class Stats(NamedTuple):
  """An anchor's sums over the keys seen so far (per anchor: arrays of the anchors' rows)."""

  positive: Array  # Σ_{P(i)} softplus(-l)
  negatives: Array  # |N(i)|
  # Σ_{N(i)} softplus(l); with hardening Σ_{N(i)} e^{log η - shift} softplus(l)
  negative: Array
  shift: Array | None = None  # with hardening: the largest log η over N(i)
  weight: Array | None = None  # with hardening: Σ_{N(i)} e^{log η - shift}


def merge(a: Stats, b: Stats) -> Stats:
  if a.shift is None:
    return jax.tree.map(jnp.add, a, b)
  shift, weight = kernel.lse_merge((a.shift, a.weight), (b.shift, b.weight))
  _, negative = kernel.lse_merge((a.shift, a.negative), (b.shift, b.negative))
  return Stats(a.positive + b.positive, a.negatives + b.negatives, negative, shift, weight)


class Weights(NamedTuple):
  """An anchor's hardening, known once every key is seen."""

  mean: Array  # Σ_N w softplus(l) / |N(i)|: the weighted mean of the negative terms
  log_scale: Array  # log(|N(i)| / Σ_N η): w_ij = e^{log η_ij + log_scale_i}


def anchor_losses(stats: Stats) -> tuple[Array, Weights | None]:
  """(L_i, the hardening's weights or None without hardening) from complete sums."""
  if stats.shift is None:
    return stats.positive + stats.negative, None
  nonempty = stats.weight != 0  # NaN counts as non-empty, so it propagates
  weight = jnp.where(nonempty, stats.weight, 1.0)
  mean = jnp.where(nonempty, stats.negative / weight, 0.0)
  log_scale = jnp.log(jnp.maximum(stats.negatives, 1.0)) - jnp.log(weight) - stats.shift
  log_scale = jnp.where(nonempty, log_scale, kernel.NEG_INF)
  return stats.positive + stats.negatives * mean, Weights(mean, log_scale)


# --------------------------------------------------------------------------------------
# One tile of (anchor rows) × (key rows): its sums and its gradient.


@dataclasses.dataclass(frozen=True)
class Sigmoid:
  """One loss's sets and hardening; tiles take ``rows.z`` already scaled by t."""

  positives: kernel.Mask
  negatives: kernel.Mask
  hardening: Hardening | None
  stop_gradient_weights: bool
  precision: kernel.Precision

  def similarity(self, rows: kernel.Rows, keys: kernel.Rows) -> Array:
    return kernel.similarity(rows.z, keys.z, self.precision)

  def empty(self, rows: kernel.Rows) -> Stats:
    # *_like keeps the carries' device-variance (shard_map) equal to the data's.
    zero = jnp.zeros_like(rows.z[:, 0])
    if self.hardening is None:
      return Stats(zero, zero, zero)
    return Stats(zero, zero, zero, jnp.full_like(zero, jnp.finfo(jnp.float32).min), zero)

  def log_weights(self, g, negative):
    return kernel.log_weights(g, negative, self.hardening, self.stop_gradient_weights)

  def stats(self, g, b, rows, keys) -> Stats:
    """The tile's sums, from g = t·s (``similarity``)."""
    positive, negative = self.positives(rows, keys), self.negatives(rows, keys)
    logit = g + b
    _, _, log1p_t = kernel.logistic_parts(logit)
    positive_sum = jnp.sum(jnp.where(positive, jnp.maximum(-logit, 0.0) + log1p_t, 0.0), axis=1)
    count = jnp.sum(negative, axis=1, dtype=jnp.float32)
    softplus = jnp.maximum(logit, 0.0) + log1p_t
    if self.hardening is None:
      return Stats(positive_sum, count, jnp.sum(jnp.where(negative, softplus, 0.0), axis=1))
    log_eta = self.log_weights(g, negative)
    shift, weight = kernel.lse_partial(log_eta)
    negative_sum = jnp.sum(jnp.exp(log_eta - shift[:, None]) * softplus, axis=1)
    return Stats(positive_sum, count, negative_sum, shift, weight)

  def gradient(self, g, b, rows, keys, weights: Weights | None):
    """(the tile's sums, ∂Σ_i L_i/∂g, ∂Σ_i L_i/∂b per anchor) given the anchors' complete
    ``weights`` (None without hardening: then the sums are complete per tile)."""
    positive, negative = self.positives(rows, keys), self.negatives(rows, keys)
    logit = g + b
    t, u, log1p_t = kernel.logistic_parts(logit)
    sigmoid, sigmoid_of_minus = jnp.where(logit >= 0, 1.0, t) / u, jnp.where(logit >= 0, t, 1.0) / u
    d_l = jnp.where(positive, -sigmoid_of_minus, 0.0)
    if weights is None:
      d_l += jnp.where(negative, sigmoid, 0.0)
      return self.stats(g, b, rows, keys), d_l, jnp.sum(d_l, axis=1)
    log_eta, pullback = jax.vjp(lambda g: self.log_weights(g, negative), g)
    w = jnp.exp(log_eta + weights.log_scale[:, None])
    d_l += w * sigmoid
    d_g = d_l
    if not self.stop_gradient_weights:  # ∂/∂log η_ij = w_ij (softplus(l_ij) - mean_i)
      softplus = jnp.maximum(logit, 0.0) + log1p_t
      d_g = d_g + pullback(w * (softplus - weights.mean[:, None]))[0]
    return self.stats(g, b, rows, keys), d_g, jnp.sum(d_l, axis=1)


# --------------------------------------------------------------------------------------
# Passes of the anchors over one set of keys: one tile, or blocks of both.


def per_block(tree, size: int):
  """Per-anchor arrays padded to a multiple of ``size`` and cut into blocks."""
  return jax.tree.map(lambda x: jnp.pad(x, (0, -x.shape[0] % size)).reshape(-1, size), tree)


def unblock(tree, num: int):
  return jax.tree.map(lambda x: x.reshape((-1,) + x.shape[2:])[:num], tree)


def stats_pass(sig: Sigmoid, q, k, b, block) -> Stats:
  """Every anchor's sums over the keys ``k``."""
  if block is None:
    return sig.stats(sig.similarity(q, k), b, q, k)
  key_blocks = kernel.key_blocks_of(k, 0, k.index.shape[0], block)

  def query_block(_, rows):
    def step(carry, keys):
      return merge(carry, sig.stats(sig.similarity(rows, keys), b, rows, keys)), None

    return None, jax.lax.scan(step, sig.empty(rows), key_blocks)[0]

  num = q.index.shape[0]
  return unblock(jax.lax.scan(query_block, None, kernel.key_blocks_of(q, 0, num, block))[1], num)


def gradient_pass(sig: Sigmoid, q, k, b, block, weights):
  """(sums, ∂/∂q.z, ∂/∂k.z, ∂/∂b) of the anchors over the keys ``k`` (see ``gradient``)."""
  if block is None:
    stats, d_g, d_b = sig.gradient(sig.similarity(q, k), b, q, k, weights)
    d_q, d_k = kernel.similarity_pullback(d_g, q.z, k.z, sig.precision)
    return stats, d_q, d_k, jnp.sum(d_b)
  num_q, num_k = q.index.shape[0], k.index.shape[0]
  key_blocks = kernel.key_blocks_of(k, 0, num_k, block)
  query_blocks = kernel.key_blocks_of(q, 0, num_q, block)

  def query_block(d_keys, block_inputs):
    rows, block_weights = block_inputs

    def step(carry, keys):
      stats, d_g, d_b = sig.gradient(sig.similarity(rows, keys), b, rows, keys, block_weights)
      d_rows, d_key = kernel.similarity_pullback(d_g, rows.z, keys.z, sig.precision)
      return (merge(carry[0], stats), carry[1] + d_rows, carry[2] + d_b), d_key

    init = (sig.empty(rows), jnp.zeros_like(rows.z), jnp.zeros_like(rows.z[:, 0]))
    (stats, d_rows, d_b), d_key_blocks = jax.lax.scan(step, init, key_blocks)
    return d_keys + d_key_blocks.reshape(d_keys.shape), (stats, d_rows, d_b)

  d_keys = jnp.zeros_like(key_blocks.z.reshape(-1, key_blocks.z.shape[-1]))
  block_weights = None if weights is None else per_block(weights, query_blocks.index.shape[1])
  d_keys, (stats, d_q, d_b) = jax.lax.scan(query_block, d_keys, (query_blocks, block_weights))
  return unblock(stats, num_q), unblock(d_q, num_q), d_keys[:num_k], jnp.sum(d_b)


# --------------------------------------------------------------------------------------
# The keys of the global batch: all-gathered, or passed around a ring.


def totals(stats: Stats, q) -> tuple[Array, Array]:
  losses, _ = anchor_losses(stats)
  return jnp.sum(jnp.where(q.valid, losses, 0.0)), jnp.sum(q.valid, dtype=jnp.float32)


def local_sums(sig, q, k, b, block, with_gradient):
  """(Σ_i L_i, anchors[, ∂/∂q.z, ∂/∂k.z, ∂/∂b]) of the local anchors over the keys ``k``."""
  if not with_gradient:
    return totals(stats_pass(sig, q, k, b, block), q)
  weights = None
  if sig.hardening is not None:
    weights = anchor_losses(stats_pass(sig, q, k, b, block))[1]
  stats, d_q, d_k, d_b = gradient_pass(sig, q, k, b, block, weights)
  return *totals(stats, q), d_q, d_k, d_b


def ring_sums(sig, q, k, b, block, with_gradient, axis_name):
  """As ``local_sums`` with ``k`` this device's shard of the keys, the shards passed around
  the ring; ∂/∂k.z is the global loss's gradient of this shard (every device's anchors)."""
  devices = jax.lax.axis_size(axis_name)
  ring = [(r, (r + 1) % devices) for r in range(devices)]
  shift = lambda tree: jax.tree.map(lambda x: jax.lax.ppermute(x, axis_name, ring), tree)
  k = jax.tree.map(lambda x: varying(x, axis_name), k)  # as the shards that arrive

  def stats_ring():
    def step(carry, _):
      stats, keys = carry
      keys = shift(keys)
      return (merge(stats, stats_pass(sig, q, keys, b, block)), keys), None

    init = (stats_pass(sig, q, k, b, block), k)
    return jax.lax.scan(step, init, None, length=devices - 1)[0][0]

  if not with_gradient:
    return totals(stats_ring(), q)
  weights = None if sig.hardening is None else anchor_losses(stats_ring())[1]

  def step(carry, _):
    stats, d_q, d_b, keys, d_keys = carry
    keys, d_keys = shift((keys, d_keys))
    more_stats, more_d_q, more_d_keys, more_d_b = gradient_pass(sig, q, keys, b, block, weights)
    carry = (merge(stats, more_stats), d_q + more_d_q, d_b + more_d_b, keys, d_keys + more_d_keys)
    return carry, None

  stats, d_q, d_k, d_b = gradient_pass(sig, q, k, b, block, weights)
  init = (stats, d_q, d_b, k, d_k)
  stats, d_q, d_b, _, d_k = jax.lax.scan(step, init, None, length=devices - 1)[0]
  return *totals(stats, q), d_q, shift(d_k), d_b  # the last shift brings d_k home


def varying(x, axis_name):
  """``x`` typed as varying over ``axis_name`` inside shard_map (a scan's carry of keys
  that start alike on every device, unlabelled ones' labels, must match the shards that
  arrive); as it is elsewhere."""
  axis_type = getattr(jax.typeof(x), 'manual_axis_type', None)
  if axis_type is not None and axis_name in axis_type.varying:
    return x
  return jax.lax.pcast(x, axis_name, to='varying')


def gather_rows(rows: kernel.Rows, axis_name) -> kernel.Rows:
  return jax.tree.map(lambda x: jax.lax.all_gather(x, axis_name, axis=0, tiled=True), rows)


def mean_loss(sig: Sigmoid, q, k, b, *, axis_name, collective, block_size):
  """L = (1/n) Σ_i L_i over the global batch; ``q``: the local anchors (z scaled by t),
  ``k``: the local keys (global indices), ``b`` the bias."""
  ring = axis_name is not None and collective == 'ring'
  if axis_name is not None and not ring:
    k = gather_rows(k, axis_name)
  num_keys = k.index.shape[0] * (jax.lax.axis_size(axis_name) if ring else 1)
  block = kernel.resolve_block_size(block_size, q.index.shape[0], num_keys)

  def sums(with_gradient):
    def rows_sums(q_z, k_z, b, q_meta, k_meta):
      q_rows, k_rows = dataclasses.replace(q_meta, z=q_z), dataclasses.replace(k_meta, z=k_z)
      if ring:
        return ring_sums(sig, q_rows, k_rows, b, block, with_gradient, axis_name)
      return local_sums(sig, q_rows, k_rows, b, block, with_gradient)

    return rows_sums

  no_z = lambda rows: dataclasses.replace(rows, z=None)
  b = jnp.asarray(b, jnp.float32)
  total, count = kernel.gradient_in_forward(sums, (q.z, k.z, b), (no_z(q), no_z(k)))
  # A diverged model must not look like finite sums (checked on the local rows).
  total = jnp.where(jnp.all(jnp.isfinite(q.z)), total, jnp.nan)
  if axis_name is not None:
    total, count = jax.lax.psum((total, count), axis_name)
  return total / jnp.maximum(count, 1.0)


# --------------------------------------------------------------------------------------
# Checks and rows.


def check_options(t, b, collective, hardening, stop_gradient_weights):
  image.check_hardening(hardening, optional=True)
  kernel.check_flag('stop_gradient_weights', stop_gradient_weights)
  kernel.check_value('t', t, kernel.finite_positive, "positive and finite (t = e^{t'})")
  kernel.check_value('b', b, np.isfinite, 'finite')
  if collective not in COLLECTIVES:
    raise ValueError(f'collective must be one of {COLLECTIVES}, got {collective!r}.')


def check_tower(name, x):
  x = jnp.asarray(x)
  if x.ndim != 2:
    raise ValueError(f'{name} must have shape [rows, dim], got shape {x.shape}.')
  if not jnp.issubdtype(x.dtype, jnp.floating):
    raise TypeError(f'{name} must be floating point, got dtype {x.dtype}.')
  return x


def check_tower_labels(name, labels, rows):
  labels = jnp.asarray(labels)
  if labels.shape != (rows,):
    raise ValueError(f'{name} must have shape [{rows}] (one per row), got {labels.shape}.')
  if not jnp.issubdtype(labels.dtype, jnp.integer):
    raise TypeError(f'{name} must be integers (class ids), got dtype {labels.dtype}.')
  return labels.astype(jnp.int32)


def tower_rows(z, labels, axis_name, scale=1.0) -> kernel.Rows:
  """Rows of one tower's local shard (float32 times ``scale``), their indices global
  (shards of equal size)."""
  num = z.shape[0]
  first = 0 if axis_name is None else jax.lax.axis_index(axis_name) * num
  index = first + jnp.arange(num, dtype=jnp.int32)
  label = jnp.zeros((num,), jnp.int32) if labels is None else labels
  return kernel.Rows(
    z=z.astype(jnp.float32) * jnp.asarray(scale, jnp.float32),
    index=index,
    sample=index,
    label=label,
    valid=jnp.ones((num,), bool),
  )


def checked_towers(x, y, labels_x, labels_y):
  """(x, y, labels_x, labels_y) as arrays, checked."""
  x, y = check_tower('x', x), check_tower('y', y)
  if x.shape[1] != y.shape[1]:
    raise ValueError(f'x and y must have the same dim, got shapes {x.shape} and {y.shape}.')
  if (labels_x is None) != (labels_y is None):
    raise ValueError('labels_x and labels_y go together: pass both (or neither).')
  labelled = labels_x is not None
  if labelled:
    labels_x = check_tower_labels('labels_x', labels_x, x.shape[0])
    labels_y = check_tower_labels('labels_y', labels_y, y.shape[0])
  elif x.shape[0] != y.shape[0]:
    raise ValueError(
      f'without labels the positives are the diagonal: x and y need as many rows, got '
      f'{x.shape[0]} and {y.shape[0]}; pass labels_x and labels_y to pair them by label.'
    )
  return x, y, labels_x, labels_y


def two_tower_sets(labelled: bool) -> tuple[kernel.Mask, kernel.Mask]:
  """(positives, negatives) across the towers: equal labels, or the diagonal."""
  key = 'label' if labelled else 'index'

  def positives(q, k):
    both = q.valid[:, None] & k.valid[None, :]
    return both & (getattr(q, key)[:, None] == getattr(k, key)[None, :])

  def negatives(q, k):
    both = q.valid[:, None] & k.valid[None, :]
    return both & (getattr(q, key)[:, None] != getattr(k, key)[None, :])

  return positives, negatives


# --------------------------------------------------------------------------------------
# Public losses.


def siglip(
  x: Array,
  y: Array,
  *,
  t,
  b,
  labels_x: Array | None = None,
  labels_y: Array | None = None,
  hardening: Hardening | None = None,
  stop_gradient_weights: bool = False,
  axis_name: str | None = None,
  collective: str = 'all_gather',
  block_size: int | None = None,
  precision: kernel.Precision = kernel.DEFAULT_PRECISION,
) -> Array:
  """The two-tower sigmoid loss (SigLIP), with labels and hardening optional:

  L = (1/n) Σ_i [Σ_{p∈P(i)} softplus(-l_ip) + Σ_{j∈N(i)} w_ij softplus(l_ij)],
  l_ij = t·x_i·y_j + b, over the n rows of x (anchors) and the m rows of y (keys).
  Without labels P(i) = {i} (n = m; SigLIP's loss with w ≡ 1); with labels of both towers
  P(i) is every y row of x_i's label. N(i) is every other y row. w: see the module.

  Args:
    x: [n, dim] L2-normalised rows of the first tower (the anchors).
    y: [m, dim] L2-normalised rows of the second tower (the keys).
    t: the logit scale, positive (a number or a traced scalar): SigLIP's e^{t'}, which it
      initialises to 10 (``SIGLIP_T``).
    b: the logit bias (a number or a traced scalar); SigLIP initialises -10 (``SIGLIP_B``).
    labels_x, labels_y: [n] and [m] integer class ids, both or neither; None: the
      diagonal pairs are the positives (n = m).
    hardening: g -> log η(g) over g = t·s (``exponential(beta)``, ``threshold(tau)`` or
      your own); None: no hardening (w ≡ 1).
    stop_gradient_weights: detach the hardening weights (same value, other gradient).
    axis_name: inside ``jax.shard_map``/``jax.pmap``, the batch axis (x, y and the labels
      are the local shards, of equal size without labels): the loss of the global batch.
    collective: 'all_gather' (gather y) or 'ring' (pass y's shards around, SigLIP's
      chunking): the same value and gradients; without ``axis_name``, the plain loss.
    block_size: None = automatic (dense up to 2^24 logits, then blocks of 2048 rows);
      an int forces blocks of that many rows, 0 the dense form.
    precision: of the similarity matmuls (``'highest'``: full float32).

  Returns:
    The loss, a float32 scalar (the same on every device with ``axis_name``).

  Example:
    >>> import jax
    >>> from hscl_jax import losses
    >>> kx, ky = jax.random.split(jax.random.key(0))
    >>> x = losses.l2_normalize(jax.random.normal(kx, (8, 16)))
    >>> y = losses.l2_normalize(jax.random.normal(ky, (8, 16)))
    >>> loss = losses.siglip(x, y, t=losses.SIGLIP_T, b=losses.SIGLIP_B)
    >>> loss.shape, str(loss.dtype), bool(loss > 0)
    ((), 'float32', True)
  """
  x, y, labels_x, labels_y = checked_towers(x, y, labels_x, labels_y)
  check_options(t, b, collective, hardening, stop_gradient_weights)
  positives, negatives = two_tower_sets(labelled=labels_x is not None)
  q, k = tower_rows(x, labels_x, axis_name, t), tower_rows(y, labels_y, axis_name)  # g = t·s
  sig = Sigmoid(positives, negatives, hardening, stop_gradient_weights, precision)
  return mean_loss(sig, q, k, b, axis_name=axis_name, collective=collective, block_size=block_size)


def sigmoid_contrastive(
  features: Array,
  labels: Array | None = None,
  *,
  t,
  b,
  hardening: Hardening | None = None,
  stop_gradient_weights: bool = False,
  axis_name: str | None = None,
  collective: str = 'all_gather',
  block_size: int | None = None,
  precision: kernel.Precision = kernel.DEFAULT_PRECISION,
) -> Array:
  """The one-tower sigmoid loss over views: the n = batch·views rows pair with every other
  row, L = (1/n) Σ_i [Σ_{p∈P(i)} softplus(-l_ip) + Σ_{j∈N(i)} w_ij softplus(l_ij)].
  Without labels P(i) is the other views of the sample (UCL's sets), with labels every
  other row of its label (SCL's sets); N(i) the rest. w: see the module.

  Args:
    features: [batch, views, dim] L2-normalised projections (views >= 2).
    labels: optional [batch] integer class ids (one per sample, not per view).
    t, b, hardening, stop_gradient_weights, axis_name, collective, block_size, precision:
      as in ``siglip``.

  Returns:
    The loss, a float32 scalar (the same on every device with ``axis_name``).

  Example:
    >>> import jax, jax.numpy as jnp
    >>> from hscl_jax import losses
    >>> z = losses.l2_normalize(jax.random.normal(jax.random.key(0), (8, 2, 16)))
    >>> plain = losses.sigmoid_contrastive(z, t=10.0, b=-10.0)
    >>> hard = losses.sigmoid_contrastive(z, t=10.0, b=-10.0, hardening=losses.exponential(0.0))
    >>> bool(jnp.isclose(plain, hard, rtol=1e-6))  # β = 0: the unhardened loss
    True
  """
  features, labels = kernel.check_inputs(features, labels)
  check_options(t, b, collective, hardening, stop_gradient_weights)
  q, _ = kernel.anchor_and_key_rows(features, labels, None)
  if axis_name is not None:  # global sample and row indices
    batch, views, _ = features.shape
    first = jax.lax.axis_index(axis_name) * batch
    q = dataclasses.replace(q, index=q.index + first * views, sample=q.sample + first)
  if labels is None:
    positives, negatives = kernel.same_sample, kernel.other_sample
  else:
    positives, negatives = kernel.same_label, kernel.other_label
  sig = Sigmoid(positives, negatives, hardening, stop_gradient_weights, precision)
  scaled = dataclasses.replace(q, z=q.z * jnp.asarray(t, jnp.float32))  # g = t·s
  return mean_loss(
    sig, scaled, q, b, axis_name=axis_name, collective=collective, block_size=block_size
  )
