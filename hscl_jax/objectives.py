"""The methods table's rows as losses: each row's loss function, the hardening a config
names and τ's schedule at an epoch (the training step, its plan and inspection read them).

config/methods holds the rows' data and imports no loss; this module maps a row to the
loss it trains with, by the row's slug (`LOSSES`). Adding a method is its loss function
here, written with `hscl_jax.losses` and entered in `LOSSES` under the slug of its row,
and that row in config/methods' `ROWS`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
import dataclasses
from typing import Any

import jax.numpy as jnp

from hscl_jax import errors
from hscl_jax import losses
from hscl_jax.config import methods


@dataclasses.dataclass(frozen=True)
class LossOptions:
  """What a loss reads besides the batch and the epoch's hyperparameters: `kernel` is every
  softmax loss's keyword arguments (temperature, M, axis_name, the key encoder's
  projections and the queue's arguments), the rest the config's options of some losses;
  `learned` the loss's own trained parameters (a sigmoid row's {'log_t', 'b'})."""

  kernel: Mapping[str, Any]
  tau_plus: float = 0.0
  stop_gradient_weights: bool = False
  learned: Mapping[str, Any] | None = None


# (normalised projections [b, 2, d], labels [b], the epoch's hyperparameters, options) -> loss
LossFn = Callable[[Any, Any, Mapping[str, Any], LossOptions], Any]


def hardening(kind: str, value) -> losses.Hardening:
  """The hardening η of `kind` ('exp' or 'threshold') at its β or τ."""
  if kind == 'exp':
    return losses.exponential(value)
  return losses.threshold(value)


def config_hardening(config, hyper: Mapping[str, Any]) -> losses.Hardening:
  """The hardening a config trains (H-SCL) or measures (the diagnostics, inspection) with:
  config.hardening at the epoch's hyperparameters."""
  return hardening(config.hardening, hyper[methods.HARDENING_PARAMETER[config.hardening]])


def tau_at(config, epoch):
  """τ of eq. (4) at a 1-based epoch (the threshold hardening's schedule)."""
  return losses.tau_schedule(
    epoch,
    start=config.tau_start,
    end=config.tau_end,
    num_epochs=config.num_epochs,
    temperature=config.temperature,
  )


def _ucl(z, labels, hyper, options: LossOptions):
  return losses.ucl(z, **options.kernel)


def _hucl(z, labels, hyper, options: LossOptions):
  return losses.hucl(
    z,
    beta=hyper['beta'],
    tau_plus=options.tau_plus,
    stop_gradient_weights=options.stop_gradient_weights,
    **options.kernel,
  )


def _scl(z, labels, hyper, options: LossOptions):
  return losses.scl(z, labels, **options.kernel)


def _hscl(kind: str) -> LossFn:
  def loss(z, labels, hyper, options: LossOptions):
    return losses.hscl(
      z,
      labels,
      hardening=hardening(kind, hyper[methods.HARDENING_PARAMETER[kind]]),
      stop_gradient_weights=options.stop_gradient_weights,
      **options.kernel,
    )

  return loss


def _sigmoid(supervised: bool, kind: str | None = None) -> LossFn:
  """The one-tower sigmoid loss (losses.sigmoid_contrastive) at the state's t = e^{log_t}
  and b; the labels give P(i) when `supervised`, `kind` hardens its negatives."""

  def loss(z, labels, hyper, options: LossOptions):
    return losses.sigmoid_contrastive(
      z,
      labels if supervised else None,
      t=jnp.exp(options.learned['log_t']),
      b=options.learned['b'],
      hardening=hardening(kind, hyper[methods.HARDENING_PARAMETER[kind]]) if kind else None,
      stop_gradient_weights=options.stop_gradient_weights,
      axis_name=options.kernel['axis_name'],
    )

  return loss


# Each row's loss, by the row's slug (config/methods.ROWS), in the table's order.
LOSSES: dict[str, LossFn] = {
  'ucl': _ucl,
  'hucl': _hucl,
  'scl': _scl,
  'hscl_beta': _hscl('exp'),
  'hscl_tau': _hscl('threshold'),
  'sig_ucl': _sigmoid(False),
  'sig_scl': _sigmoid(True),
  'sig_hscl_beta': _sigmoid(True, 'exp'),
}


def loss_of(row: methods.Method) -> LossFn:
  """The loss a row of the methods table trains with."""
  if row.slug not in LOSSES:
    errors.fail(
      'method',
      f"the methods table's row {row.label!r} (slug {row.slug!r}) has no loss",
      f"enter its loss function in hscl_jax/objectives.py's LOSSES under {row.slug!r}",
    )
  return LOSSES[row.slug]
