"""The paper's diagnostics (Sec. IV and V-B; Figs. 4 and 5): Prop. 2's α's, Assumption 1,
and the four losses of one batch with the same positives.

Dense: meant for monitoring batches. The α's and Assumption 1 take q_UCL to be UCL's
in-batch negative distribution (the rows of other samples), so Prop. 2, Assumption 1 and
Lemma 1 hold exactly within a batch.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from hscl_jax.losses import image
from hscl_jax.losses import kernel

Array = kernel.Array
Hardening = kernel.Hardening


def _checked(features, labels, hardening, axis_name, precision):
  """(features, labels) checked as the supervised losses check them, with the options."""
  kernel.require_labels(labels)
  image.check_hardening(hardening)
  kernel.check_options(axis_name=axis_name, precision=precision)
  return kernel.check_inputs(features, labels)


def log_alphas(
  features: Array,
  labels: Array,
  *,
  hardening: Hardening,
  temperature=0.5,
  axis_name: str | None = None,
  precision: kernel.Precision = kernel.DEFAULT_PRECISION,
) -> dict[str, Array]:
  """Per-anchor log α_HUCL, log α_HSCL, log α_Hcol (Prop. 2), each ``[local rows]``.

  α_X = E_{j~q_UCL}[1(j ∈ X) η(g_ij)] with q_UCL uniform over UCL's negatives of the
  anchor (rows of other samples); X is all of them (H-UCL), those with another label
  (H-SCL) or the same label (Hcol), so α_HUCL = α_HSCL + α_Hcol exactly. An empty set
  gives log α = -inf.
  """
  features, labels = _checked(features, labels, hardening, axis_name, precision)
  q, k = kernel.anchor_and_key_rows(features, labels, axis_name)
  log_eta = hardening(kernel.similarity(q.z / temperature, k.z, precision))
  ucl_negatives = kernel.other_sample(q, k)
  log_count = jnp.log(jnp.maximum(jnp.sum(ucl_negatives, axis=1), 1).astype(jnp.float32))

  def log_alpha(mask):
    lse, nonempty = kernel.lse_finish(kernel.lse_partial(jnp.where(mask, log_eta, kernel.NEG_INF)))
    return jnp.where(nonempty, lse - log_count, kernel.NEG_INF)

  return {
    'hucl': log_alpha(ucl_negatives),
    'hscl': log_alpha(kernel.other_label(q, k)),
    'hcol': log_alpha(kernel.label_collision(q, k)),
  }


def assumption1(
  features: Array,
  labels: Array,
  *,
  hardening: Hardening,
  temperature=0.5,
  axis_name: str | None = None,
  precision: kernel.Precision = kernel.DEFAULT_PRECISION,
) -> Array:
  """Per-anchor indicator of Assumption 1: E_{q_Hcol}[e^g] >= E_{q_HSCL}[e^g].

  q_Hcol ∝ η over label collisions among UCL's negatives, q_HSCL ∝ η over rows of another
  label. Where either set is empty the conclusion of Lemma 1 holds with equality for that
  anchor (E_HUCL = E_HSCL, or ℓ_HSCL = 0), so it counts as satisfied.
  """
  features, labels = _checked(features, labels, hardening, axis_name, precision)
  q, k = kernel.anchor_and_key_rows(features, labels, axis_name)
  kwargs = dict(
    hardening=hardening, temperature=temperature, stop_gradient_weights=False, precision=precision
  )
  log_e_col, has_col = kernel.log_expectations(q, k, candidates=kernel.label_collision, **kwargs)
  log_e_hscl, has_hscl = kernel.log_expectations(q, k, candidates=kernel.other_label, **kwargs)
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
  precision: kernel.Precision = kernel.DEFAULT_PRECISION,
) -> dict[str, Array]:
  """The four losses of one batch with the same positives, and Assumption 1 (Figs. 4, 5).

  ``positives``: "sample" (other views of the anchor's sample; with label-paired views
  this is the paper's Lemma 1 set-up) or "label" (every other row of the anchor's label).
  H-UCL uses the same hardening as H-SCL and τ⁺ = 0, so Lemma 1 reads
  loss_hscl <= loss_hucl whenever assumption1_fraction == 1. Values carry no gradient.
  """
  features, labels = _checked(features, labels, hardening, axis_name, precision)
  features, labels = jax.lax.stop_gradient((features, labels))
  kernel.check_temperature(temperature)
  positive_set = {'sample': kernel.same_sample, 'label': kernel.same_label}.get(positives)
  if positive_set is None:
    raise ValueError(f"positives must be 'sample' or 'label', got {positives!r}.")
  loss = functools.partial(
    kernel.global_loss,
    features,
    labels,
    positives=positive_set,
    pair_loss=kernel.infonce_pair_loss(image.log_m(M, features, axis_name)),
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
    'loss_ucl': loss(candidates=kernel.other_sample, hardening=kernel.no_hardening),
    'loss_hucl': loss(candidates=kernel.other_sample, hardening=hardening),
    'loss_scl': loss(candidates=kernel.other_label, hardening=kernel.no_hardening),
    'loss_hscl': loss(candidates=kernel.other_label, hardening=hardening),
    'assumption1_fraction': fraction,
  }
