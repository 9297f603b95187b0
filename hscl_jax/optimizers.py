"""Optimizers and learning-rate schedules (config.optimizer), for training and linear eval.

'adam' is the paper's: torch.optim.Adam's weight_decay, i.e. an L2 term added to the
gradient before the Adam moments (coupled), unlike AdamW's decoupled decay.
"""

from __future__ import annotations

import jax
import ml_collections
import optax


def create_learning_rate_schedule(
  opt: ml_collections.ConfigDict, *, steps_per_epoch: int, total_steps: int
) -> optax.Schedule:
  """Optional linear warm-up from 0, then constant or cosine decay to 0 at the last step."""
  warmup_steps = int(round(opt.warmup_epochs * steps_per_epoch))
  if opt.schedule == 'cosine':
    main = optax.cosine_decay_schedule(opt.learning_rate, max(total_steps - warmup_steps, 1))
  else:
    main = optax.constant_schedule(opt.learning_rate)
  if warmup_steps == 0:
    return main
  warmup = optax.linear_schedule(0.0, opt.learning_rate, warmup_steps)
  return optax.join_schedules([warmup, main], [warmup_steps])


def _rank1_mask(params):
  """True for weights with more than one dimension (kernels), False for biases/BN."""
  return jax.tree.map(lambda p: p.ndim > 1, params)


def adam_coupled_l2(
  learning_rate: float | optax.Schedule,
  *,
  weight_decay: float,
  b1: float = 0.9,
  b2: float = 0.999,
  eps: float = 1e-8,
  mask=None,
) -> optax.GradientTransformation:
  """Adam with L2 added to the gradient, as torch.optim.Adam(weight_decay=...)."""
  return optax.chain(
    optax.add_decayed_weights(weight_decay, mask),
    optax.scale_by_adam(b1=b1, b2=b2, eps=eps),
    optax.scale_by_learning_rate(learning_rate),
  )


def create_optimizer(
  opt: ml_collections.ConfigDict, learning_rate: optax.Schedule
) -> optax.GradientTransformation:
  """The optimizer config.optimizer names, stepping with `learning_rate`."""
  mask = _rank1_mask if opt.exclude_rank1_from_decay else None
  if opt.name == 'adam':
    return adam_coupled_l2(
      learning_rate, weight_decay=opt.weight_decay, b1=opt.b1, b2=opt.b2, eps=opt.eps, mask=mask
    )
  if opt.name == 'adamw':
    return optax.adamw(
      learning_rate, b1=opt.b1, b2=opt.b2, eps=opt.eps, weight_decay=opt.weight_decay, mask=mask
    )
  if opt.name == 'sgd':
    return optax.chain(
      optax.add_decayed_weights(opt.weight_decay, mask),
      optax.sgd(learning_rate, momentum=opt.momentum or None, nesterov=opt.nesterov),
    )
  return optax.lars(
    learning_rate,
    weight_decay=opt.weight_decay,
    weight_decay_mask=mask or True,
    trust_ratio_mask=mask or True,
    trust_coefficient=opt.trust_coefficient,
    momentum=opt.momentum,
  )
