"""UCL, H-UCL, SCL and H-SCL on batches of views, with their hardenings and schedules.

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
    negative at or above the threshold) contributes ℓ_ip = 0 (with zero gradient) and
    still counts in the mean's denominator, so the normaliser does not jump as anchors
    cross a threshold. A batch with no negative at all has loss 0.
  * β = 0 gives η ≡ 1 (log η ≡ 0) whether or not the weights are detached: exactly SCL/UCL.
  * H-UCL with τ⁺ > 0: the debiased negative mass can go negative; it is floored at
    M·e^{-1/γ} (HCL's clamp, ``clamp=True``) or at 0 (``clamp=False``, the pair then
    contributes 0). Either way, finite.

Cross-device: with ``axis_name`` (inside ``jax.shard_map`` or ``jax.pmap`` over that
axis, ``features``/``labels`` being the local shard), keys and labels are all-gathered
so every local anchor sees the negatives of the global batch, and the returned value
is the loss of the global batch, identical on every device. Inside ``jax.shard_map``,
``jax.grad`` of it with respect to replicated parameters is the gradient of the
global-batch loss: JAX inserts the cross-device sum.

Queue (``queue``, ``queue_labels``, ``queue_filled``): K extra keys, e.g. a MoCo-style
memory of earlier batches' projections. Every filled slot is a negative of every anchor
(UCL/H-UCL), or of the anchors of another label (SCL/H-SCL; an unlabelled slot, -1, never
is); a slot is never a positive. The hardening weights and the expectation run over the
in-batch and queue negatives together, M defaults to n - 2 + (filled slots), and the queue
gets no gradient. With ``axis_name`` the queue is the same on every device and is not
all-gathered. An empty queue (K = 0) gives the loss without one.

Keys (``keys``): features of the same rows from another encoder (MoCo's momentum key
encoder). Each anchor keeps its own feature; every other row of the batch, positive or
negative, enters as its key, detached: the gradient flows through the anchors only.

Memory and precision (``block_size``, ``precision``): see ``hscl_jax.losses.kernel``.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from hscl_jax.losses import kernel

Array = kernel.Array
Hardening = kernel.Hardening

# --------------------------------------------------------------------------------------
# Hardening functions and schedules.


def exponential(beta) -> Hardening:
  """η_exp(g) = e^{βg} (Definition 1; H-SCL(β)). ``beta`` may be a traced array."""
  kernel.check_value(
    'beta', beta, kernel.finite_at_least_zero, 'finite and >= 0 (a non-decreasing hardening)'
  )
  return lambda g: beta * g


def threshold(tau) -> Hardening:
  """η_thresh(g) = 1(e^g >= τ) (Sec. IV-A; H-SCL(τ)). ``tau`` may be a traced array.

  τ -> 0 keeps every negative (SCL); see ``tau_schedule`` for eq. (4).
  """
  kernel.check_value(
    'tau', tau, kernel.finite_at_least_zero, 'finite and >= 0 (it thresholds e^g > 0)'
  )
  log_tau = jnp.log(jnp.asarray(tau, jnp.float32))
  return lambda g: jnp.where(g >= log_tau, 0.0, kernel.NEG_INF)


HARDENING_FORM = 'hardening= takes a function g -> log η(g), e.g. losses.exponential(1.0)'


def check_hardening(hardening, *, optional: bool = False) -> None:
  """Refuses a hardening that is not a function g -> log η(g) (None allowed if ``optional``),
  naming the factory call it should have been."""
  if hardening is exponential or hardening is threshold:
    name = hardening.__name__
    raise TypeError(f'hardening=losses.{name} is the factory: call it, e.g. losses.{name}(1.0).')
  if callable(hardening) or (optional and hardening is None):
    return
  if isinstance(hardening, (int, float, np.number)) and not isinstance(hardening, bool):
    raise TypeError(
      f'{HARDENING_FORM}, got the number {hardening!r}; for H-SCL(β) at β = {hardening!r} '
      f'pass hardening=losses.exponential({hardening!r}).'
    )
  raise TypeError(f'{HARDENING_FORM}, got {hardening!r}.')


def tau_schedule(epoch, *, start: float, end: float, num_epochs: int, temperature: float = 0.5):
  """Threshold τ of H-SCL(τ) at a 1-based ``epoch`` in [1, num_epochs], eq. (4): τ = e^{l/γ},

  l = start + (epoch - 1) / (num_epochs - 1) · (end - start). ``start`` and ``end`` are
  the levels l of the first and the last epoch, not τ: τ runs from e^{start/γ} to
  e^{end/γ} (γ = ``temperature``; 0.368 to 1.221 for start = -0.5, end = 0.1, γ = 0.5).
  A single-epoch run uses ``start``. The paper's grid: start ∈ {-0.5, -0.3, -0.1},
  end ∈ {-0.1, 0, 0.1}. A JAX ``epoch`` (traced or not) gives a JAX array, a Python or
  NumPy one a NumPy float32 (host arithmetic: no device work). A concrete epoch outside
  [1, num_epochs] is refused; a traced one cannot be checked.
  """
  for name, value in (('start', start), ('end', end)):
    kernel.check_value(name, value, np.isfinite, 'finite')
  kernel.check_temperature(temperature)
  _check_epoch(epoch, num_epochs)
  xp, dtype = _array_module(epoch)
  progress = (xp.asarray(epoch, dtype) - 1.0) / max(num_epochs - 1, 1)
  level = start + progress * (end - start)
  return xp.exp(level / temperature).astype(np.float32)


def beta_schedule(epoch, *, beta: float, num_epochs: int, num_steps: int):
  """HCL's annealed β at a 1-based ``epoch`` in [1, num_epochs] (Robinson et al., App. D.1).

  β starts at ``beta`` and drops by β/ℓ (ℓ = ``num_steps``) at every epoch that is a
  multiple of num_epochs/ℓ, reaching 0 at the last epoch. Array type and the epoch's
  check as ``tau_schedule``.
  """
  if num_steps < 1:
    raise ValueError(f'num_steps (ℓ, the number of β changes) must be >= 1, got {num_steps}.')
  kernel.check_value('beta', beta, kernel.finite_at_least_zero, 'finite and >= 0')
  _check_epoch(epoch, num_epochs)
  xp, dtype = _array_module(epoch)
  drops = xp.floor(xp.asarray(epoch, dtype) * num_steps / num_epochs)
  return (beta * xp.clip(1.0 - drops / num_steps, 0.0, 1.0)).astype(np.float32)


def _check_epoch(epoch, num_epochs) -> None:
  """The schedules' epochs are 1-based (eq. (4): epoch 1 gives ``start``, epoch num_epochs
  ``end``); a traced epoch cannot be checked."""
  if isinstance(num_epochs, bool) or not isinstance(num_epochs, (int, np.integer)):
    raise TypeError(f"num_epochs must be an int (the run's epochs), got {num_epochs!r}.")
  if num_epochs < 1:
    raise ValueError(f"num_epochs must be >= 1 (the run's epochs), got {num_epochs}.")
  kernel.check_value(
    'epoch',
    epoch,
    lambda e: (e >= 1) & (e <= num_epochs),
    f'1-based, in [1, num_epochs = {num_epochs}] (epoch 1 is the first)',
  )


def _array_module(epoch):
  """(jax.numpy, float32) for a JAX array or tracer; (NumPy, float64) for a host number,
  the training loop's epoch: no device transfer, no compilation, and a float32 result
  rounded once from float64 (NumPy's and XLA's float32 exp differ in the last bit)."""
  return (jnp, jnp.float32) if isinstance(epoch, jax.Array) else (np, np.float64)


# --------------------------------------------------------------------------------------
# Per-pair losses.


def log_m(M, features, axis_name, queue_filled=None):
  """log M; M = None means n - 2 with n the number of rows of the global batch, plus the
  number of filled queue slots with a queue (UCL's count of candidate negatives)."""
  if M is None:
    batch, views, _ = features.shape
    devices = 1 if axis_name is None else jax.lax.axis_size(axis_name)
    M = batch * views * devices - 2
    if M <= 0:
      raise ValueError(f'M = n - 2 = {M} is not positive: the batch has too few rows; pass M.')
    if queue_filled is not None:
      M = M + jnp.sum(queue_filled, dtype=jnp.int32)
    return jnp.log(jnp.asarray(M, jnp.float32))
  return kernel.log_given_m(M)


def debiased_pair_loss(log_m, tau_plus, temperature, clamp):
  """HCL's debiased term: Ng = M (E - τ⁺ e^{g_ip}) / (1 - τ⁺), floored;
  ℓ = log(1 + Ng e^{-g_ip})."""
  floor = log_m - 1.0 / temperature if clamp else kernel.NEG_INF

  def pair_loss(g, log_e, has_negative):
    ratio = tau_plus * jnp.exp(jnp.minimum(g - log_e, 80.0))  # τ⁺ e^{g_ip} / E_i
    positive_mass = has_negative & (ratio < 1.0)
    safe_ratio = jnp.where(positive_mass, ratio, 0.0)
    log_ng = log_m + log_e + jnp.log1p(-safe_ratio) - jnp.log1p(-tau_plus)
    log_ng = jnp.maximum(jnp.where(positive_mass, log_ng, kernel.NEG_INF), floor)
    return jnp.where(jnp.isfinite(log_ng), kernel.softplus(log_ng - g), 0.0)

  return pair_loss


# --------------------------------------------------------------------------------------
# Public losses: each names its sets, its hardening and its pair loss; `_Options` carries
# the keyword arguments they share.


@dataclasses.dataclass(frozen=True)
class _Options:
  temperature: object
  M: object
  axis_name: str | None
  block_size: int | None
  precision: kernel.Precision
  stop_gradient_weights: bool = False
  queue: object = None
  queue_labels: object = None
  queue_filled: object = None
  keys: object = None


def _checked_queue(options: _Options, dim: int, supervised: bool):
  """(queue, queue_labels, queue_filled) as arrays, checked; (None, None, None) without a
  queue or with an empty one (K = 0: exactly the loss without a queue)."""
  queue, labels, filled = options.queue, options.queue_labels, options.queue_filled
  if queue is None:
    for name, value in (('queue_labels', labels), ('queue_filled', filled)):
      if value is not None:
        raise ValueError(f'{name} was given without queue; pass queue= too (or neither).')
    return None, None, None
  queue = jnp.asarray(queue)
  if queue.ndim != 2 or queue.shape[1] != dim:
    raise ValueError(f'queue must have shape [K, {dim}] (dim as features), got {queue.shape}.')
  if not jnp.issubdtype(queue.dtype, jnp.floating):
    raise TypeError(f'queue must be floating point, got dtype {queue.dtype}.')
  if labels is None and supervised:
    raise ValueError('queue_labels is required with a queue for scl/hscl (-1 = unlabelled).')
  num = queue.shape[0]
  labels = jnp.full((num,), -1, jnp.int32) if labels is None else jnp.asarray(labels)
  filled = jnp.ones((num,), bool) if filled is None else jnp.asarray(filled)
  for name, value in (('queue_labels', labels), ('queue_filled', filled)):
    if value.shape != (num,):
      raise ValueError(f'{name} must have shape [K] = ({num},), got {value.shape}.')
  if not jnp.issubdtype(labels.dtype, jnp.integer):
    raise TypeError(f'queue_labels must be integers (-1 = unlabelled), got {labels.dtype}.')
  return (None, None, None) if num == 0 else (queue, labels, filled.astype(bool))


def _loss(features, labels, *, candidates, positives, hardening, pair_loss, options: _Options):
  """Checks the inputs and the temperature, then eq. (3)'s flat mean over the batch (the
  filled queue slots join the negatives; for the supervised losses only labelled ones)."""
  features, labels = kernel.check_inputs(features, labels)
  kernel.check_temperature(options.temperature)
  kernel.check_options(axis_name=options.axis_name, precision=options.precision)
  kernel.check_flag('stop_gradient_weights', options.stop_gradient_weights)
  queue, queue_labels, filled = _checked_queue(options, features.shape[-1], labels is not None)
  if queue is not None:
    counted = filled if labels is None else filled & (queue_labels >= 0)
    queue = kernel.queue_rows(queue, queue_labels, counted)
  return kernel.global_loss(
    features,
    labels,
    candidates=candidates,
    positives=positives,
    hardening=hardening,
    pair_loss=pair_loss(log_m(options.M, features, options.axis_name, filled)),
    temperature=options.temperature,
    stop_gradient_weights=options.stop_gradient_weights,
    axis_name=options.axis_name,
    block_size=options.block_size,
    precision=options.precision,
    queue=queue,
    keys=options.keys,
  )


def ucl(
  features: Array,
  *,
  temperature=0.5,
  M=None,
  axis_name: str | None = None,
  block_size: int | None = None,
  precision: kernel.Precision = kernel.DEFAULT_PRECISION,
  queue: Array | None = None,
  queue_labels: Array | None = None,
  queue_filled: Array | None = None,
  keys: Array | None = None,
) -> Array:
  """UCL (SimCLR / NT-Xent), eq. (3): positives are the other views of the same sample,
  negatives every row of another sample, η ≡ 1. With M = n - v (the rows of the other
  samples) this is NT-Xent exactly; for two views that is the default M = n - 2.

  Args:
    features: [batch, views, dim] L2-normalised projections (views >= 2).
    temperature: γ, positive (a number or a traced scalar).
    M: the constant M of eq. (3); None = n - 2 (n rows of the global batch) plus the
      number of filled queue slots; an explicit M is used as given.
    axis_name: inside ``jax.shard_map``/``jax.pmap``, the batch axis: negatives and the
      mean are those of the global batch.
    block_size: None = automatic (dense up to 2^24 similarities, then key blocks of 2048;
      key blocks always with a queue);
      an int forces blocks of that many rows, 0 the dense form (same value and gradient).
    precision: of the similarity matmuls (``'highest'``: full float32).
    queue: optional [K, dim] L2-normalised keys (a MoCo-style memory, the same on every
      device: not all-gathered): every filled slot joins every anchor's negatives (never a
      positive) and the hardening weights; it gets no gradient (stop_gradient).
    queue_labels: [K] integer labels of the slots, -1 = unlabelled (unused by UCL/H-UCL).
    queue_filled: [K] bool, the slots that hold a key; None = all of them.
    keys: optional [batch, views, dim] L2-normalised features of the same rows from a
      key encoder (MoCo's momentum encoder): every row other than the anchor (its
      positives and in-batch negatives) enters as its key, the anchor as its feature;
      no gradient reaches the keys. None = the features themselves.

  Returns:
    The loss, a float32 scalar (the same on every device with ``axis_name``).

  Example:
    >>> import jax
    >>> from hscl_jax import losses
    >>> z = losses.l2_normalize(jax.random.normal(jax.random.key(0), (8, 2, 16)))
    >>> loss = losses.ucl(z, temperature=0.5)
    >>> loss.shape, str(loss.dtype), bool(loss > 0)
    ((), 'float32', True)
  """
  queue_args = dict(queue=queue, queue_labels=queue_labels, queue_filled=queue_filled, keys=keys)
  options = _Options(temperature, M, axis_name, block_size, precision, **queue_args)
  return _loss(
    features,
    None,
    candidates=kernel.other_sample,
    positives=kernel.same_sample,
    hardening=kernel.no_hardening,
    pair_loss=kernel.infonce_pair_loss,
    options=options,
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
  precision: kernel.Precision = kernel.DEFAULT_PRECISION,
  queue: Array | None = None,
  queue_labels: Array | None = None,
  queue_filled: Array | None = None,
  keys: Array | None = None,
) -> Array:
  """H-UCL (HCL; Robinson et al. eq. (4), Fig. 13): UCL's positives and negatives with
  q_i ∝ e^{β g_ij} (Sec. III-C), and τ⁺ debiasing of the negative mass
  Ng = M (E - τ⁺ e^{g_ip}) / (1 - τ⁺). τ⁺ = 0 and β = 0 give UCL (on unit-norm features,
  where the floor never binds).

  Args:
    features: [batch, views, dim] L2-normalised projections (views >= 2).
    beta: hardening strength β >= 0 (a number or a traced scalar).
    tau_plus: class prior τ⁺ in [0, 1) of the debiasing; 0 = plain H-UCL.
    temperature, M, axis_name, block_size, precision: as in ``ucl``.
    queue, queue_labels, queue_filled, keys: extra negatives and key features, as in
      ``ucl``.
    clamp: floor the debiased mass at M·e^{-1/γ} (HCL's rule); False floors it at 0.
    stop_gradient_weights: detach the hardening weights (same value, other gradient).

  Returns:
    The loss, a float32 scalar.

  Example:
    >>> import jax
    >>> from hscl_jax import losses
    >>> z = losses.l2_normalize(jax.random.normal(jax.random.key(0), (8, 2, 16)))
    >>> bool(losses.hucl(z, beta=0.0) == losses.ucl(z))  # β = 0, τ⁺ = 0: UCL
    True
  """
  kernel.check_value(
    'tau_plus', tau_plus, lambda x: (x >= 0) & (x < 1), 'in [0, 1) (a class prior)'
  )
  kernel.check_flag('clamp', clamp)
  queue_args = dict(queue=queue, queue_labels=queue_labels, queue_filled=queue_filled, keys=keys)
  options = _Options(
    temperature, M, axis_name, block_size, precision, stop_gradient_weights, **queue_args
  )
  return _loss(
    features,
    None,
    candidates=kernel.other_sample,
    positives=kernel.same_sample,
    hardening=exponential(beta),
    pair_loss=lambda log_m: debiased_pair_loss(log_m, tau_plus, temperature, clamp),
    options=options,
  )


def scl(
  features: Array,
  labels: Array,
  *,
  temperature=0.5,
  M=None,
  axis_name: str | None = None,
  block_size: int | None = None,
  precision: kernel.Precision = kernel.DEFAULT_PRECISION,
  queue: Array | None = None,
  queue_labels: Array | None = None,
  queue_filled: Array | None = None,
  keys: Array | None = None,
) -> Array:
  """SCL (Sec. III-B, eq. (3)): positives every other row with the anchor's label
  (including its other views), negatives every row with another label, η ≡ 1.

  Args:
    features: [batch, views, dim] L2-normalised projections (views >= 2).
    labels: [batch] integer class ids (one per sample, not per view).
    temperature, M, axis_name, block_size, precision: as in ``ucl``.
    queue, queue_filled, keys: extra negatives and key features, as in ``ucl``.
    queue_labels: required with a queue: a slot is a negative of the anchors of another
      label; an unlabelled slot (-1) is never one.

  Returns:
    The loss, a float32 scalar; 0 for a batch whose labels are all equal.

  Example:
    >>> import jax, jax.numpy as jnp
    >>> from hscl_jax import losses
    >>> z = losses.l2_normalize(jax.random.normal(jax.random.key(0), (8, 2, 16)))
    >>> bool(jnp.isclose(losses.scl(z, jnp.arange(8)), losses.ucl(z)))  # distinct labels
    True
  """
  return hscl(
    features,
    labels,
    hardening=kernel.no_hardening,
    temperature=temperature,
    M=M,
    axis_name=axis_name,
    block_size=block_size,
    precision=precision,
    queue=queue,
    queue_labels=queue_labels,
    queue_filled=queue_filled,
    keys=keys,
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
  precision: kernel.Precision = kernel.DEFAULT_PRECISION,
  queue: Array | None = None,
  queue_labels: Array | None = None,
  queue_filled: Array | None = None,
  keys: Array | None = None,
) -> Array:
  """H-SCL (Sec. III-C, eq. (3)): SCL's positives and negatives with q_i ∝ η(g_ij).

  Args:
    features: [batch, views, dim] L2-normalised projections (views >= 2).
    labels: [batch] integer class ids (one per sample, not per view).
    hardening: g -> log η(g) for a non-decreasing η >= 0: ``exponential(beta)`` for
      H-SCL(β), ``threshold(tau)`` for H-SCL(τ), or your own.
    temperature, M, axis_name, block_size, precision: as in ``ucl``.
    stop_gradient_weights: detach the hardening weights (same value, other gradient;
      by default gradients flow through them, as the authors' code).
    queue, queue_labels, queue_filled, keys: extra negatives and key features, as in
      ``scl``.

  Returns:
    The loss, a float32 scalar.

  Example:
    >>> import jax, jax.numpy as jnp
    >>> from hscl_jax import losses
    >>> z = losses.l2_normalize(jax.random.normal(jax.random.key(0), (8, 2, 16)))
    >>> labels = jnp.array([0, 1, 2, 3, 0, 1, 2, 3])
    >>> hard = losses.hscl(z, labels, hardening=losses.exponential(1.0))
    >>> bool(losses.hscl(z, labels, hardening=losses.exponential(0.0)) == losses.scl(z, labels))
    True
  """
  kernel.require_labels(labels)
  check_hardening(hardening)
  queue_args = dict(queue=queue, queue_labels=queue_labels, queue_filled=queue_filled, keys=keys)
  options = _Options(
    temperature, M, axis_name, block_size, precision, stop_gradient_weights, **queue_args
  )
  return _loss(
    features,
    labels,
    candidates=kernel.other_label,
    positives=kernel.same_label,
    hardening=hardening,
    pair_loss=kernel.infonce_pair_loss,
    options=options,
  )
