"""The online linear probe (config.probe): a linear classifier trained in every training
step on the detached, L2-normalised backbone features of the step's augmented views, by its
own optimizer (Adam with coupled L2, as linear evaluation's), and its top-1 on the test
split's features at each kNN monitor.

Its input is `jax.lax.stop_gradient` of the features, so neither its loss nor the labels it
reads reach the encoder: the encoder's update is the same with the probe on or off (for
the unsupervised methods the labels reach the probe only). Examples labelled -1
(unlabelled) weigh nothing in its loss.

Online, beside `evaluation/linear_evaluation`: this probe trains with the encoder and
reports as it goes; linear evaluation trains its classifier after, on a frozen encoder.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from hscl_jax import losses
from hscl_jax import optimizers


def enabled(config: ml_collections.ConfigDict) -> bool:
  return bool(config.probe.enabled)


def create_optimizer(config: ml_collections.ConfigDict) -> optax.GradientTransformation:
  return optimizers.adam_coupled_l2(
    config.probe.learning_rate, weight_decay=config.probe.weight_decay
  )


def initial(
  optimizer: optax.GradientTransformation, feature_dim: int, num_classes: int
) -> dict[str, Any]:
  """{'params': {'w', 'b'} at zero, 'opt_state'}: the probe's part of the training state."""
  params = {
    'w': jnp.zeros((feature_dim, num_classes), jnp.float32),
    'b': jnp.zeros((num_classes,), jnp.float32),
  }
  return {'params': params, 'opt_state': optimizer.init(params)}


def inputs(features: jax.Array) -> jax.Array:
  """What the probe sees of the backbone's features: normalised, as the kNN monitor's and
  linear evaluation's, and detached from the encoder."""
  return jax.lax.stop_gradient(losses.l2_normalize(features))


def update(
  optimizer: optax.GradientTransformation,
  probe: dict[str, Any],
  features: jax.Array,
  labels: jax.Array,
  axis_name: str,
) -> tuple[dict[str, Any], jax.Array]:
  """(the probe after one step, its loss): mean cross-entropy over the labelled views of
  the global batch. Written per device: `features` [b, views, d] and `labels` [b] are this
  device's; the gradient of the global mean with respect to the replicated parameters is
  their cross-device sum (as the encoder's in training/step)."""
  views = features.shape[1]
  x = features.reshape(-1, features.shape[-1])
  y = jnp.repeat(labels, views)
  weight = (y >= 0).astype(jnp.float32)
  count = jnp.maximum(jax.lax.psum(weight.sum(), axis_name), 1.0)

  def loss_fn(params):
    logits = x @ params['w'] + params['b']
    per_view = optax.softmax_cross_entropy_with_integer_labels(logits, jnp.maximum(y, 0))
    return jax.lax.psum((per_view * weight).sum(), axis_name) / count

  loss, grads = jax.value_and_grad(loss_fn)(probe['params'])
  updates, opt_state = optimizer.update(grads, probe['opt_state'], probe['params'])
  return {'params': optax.apply_updates(probe['params'], updates), 'opt_state': opt_state}, loss


def top1(params: dict[str, Any], features: np.ndarray, labels: np.ndarray, mask) -> float:
  """Top-1 of the probe (its parameters on the host) on normalised features on the host (the
  kNN monitor's queries; rows with mask False are padding)."""
  w, b = (np.asarray(params[name], np.float32) for name in ('w', 'b'))
  predicted = np.argmax(np.asarray(features, np.float32) @ w + b, axis=1)
  mask = np.asarray(mask, bool)
  return float(np.mean(predicted[mask] == np.asarray(labels)[mask]))
