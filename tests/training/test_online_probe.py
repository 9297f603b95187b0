"""The online linear probe (training/online_probe): it leaves the encoder's update as it is, it
learns what an independent reference says, its state is checkpointed only where it runs,
and a run stored without one resumes without one."""

from __future__ import annotations

import json
import pathlib
import sys

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P
import numpy as np
import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # `from configs import ...`, as from the repo root

from configs import digits  # noqa: E402
from hscl_jax import errors  # noqa: E402
from hscl_jax import models  # noqa: E402
from hscl_jax import optimizers  # noqa: E402
from hscl_jax import parallel  # noqa: E402
from hscl_jax.data import augment  # noqa: E402
from hscl_jax.rundir import layout  # noqa: E402
from hscl_jax.rundir import stored_config  # noqa: E402
from hscl_jax.rundir import versions  # noqa: E402
from hscl_jax.training import log_lines  # noqa: E402
from hscl_jax.training import online_probe  # noqa: E402
from hscl_jax.training import plan as plan_lib  # noqa: E402
from hscl_jax.training import state as state_lib  # noqa: E402
from hscl_jax.training import step as step_lib  # noqa: E402

NUM_CLASSES = 10


def _config(method):
  config = digits.get_config()
  config.method = method
  config.batch_size = 16
  config.model.head_hidden, config.model.head_out = 32, 16
  return config


def _batch(seed=0, size=16):
  rng = np.random.default_rng(seed)
  return {
    'image': rng.integers(0, 256, (size, 2, 8, 8, 3), dtype=np.uint8),
    'label': rng.integers(0, NUM_CLASSES, (size,), dtype=np.int32),
  }


def _steps(config, num_devices, probe_classes, num_steps=3):
  """The host copy of the state after `num_steps` steps on `num_devices` devices."""
  mesh = parallel.make_mesh(jax.devices()[:num_devices])
  model = models.create_model(config.model, bn_axis_name=parallel.AXIS)
  optimizer = optimizers.create_optimizer(config.optimizer, lambda count: 1e-2)
  params = augment.AugmentParams.from_config(config.augment)
  state = state_lib.create_train_state(
    config, model, optimizer, params.image_size, mesh, probe_classes=probe_classes
  )
  step = step_lib.make_train_step(config, model, optimizer, params, mesh)
  hyper = plan_lib.loss_hyperparameters(config, 1)
  for seed in range(num_steps):
    batch = parallel.global_batch(_batch(seed), mesh, ('image', 'label'))
    state, _ = step(state, batch, hyper)
  return jax.device_get(state)


def _assert_bitwise_equal(a, b):
  leaves_a, leaves_b = jax.tree.leaves(a), jax.tree.leaves(b)
  assert len(leaves_a) == len(leaves_b)
  for x, y in zip(leaves_a, leaves_b):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.parametrize('num_devices', [1, 4])
@pytest.mark.parametrize('method', ['ucl', 'hucl'])
def test_the_encoder_update_is_bitwise_the_same_with_the_probe_on_and_off(method, num_devices):
  """The labels reach the probe only (ucl, hucl), and its loss never the encoder."""
  config = _config(method)
  with_probe = _steps(config, num_devices, NUM_CLASSES)
  without = _steps(config, num_devices, None)
  assert without.probe is None and 'probe_loss' not in without.metric_sums
  for part in ('params', 'batch_stats', 'opt_state', 'step'):
    _assert_bitwise_equal(getattr(with_probe, part), getattr(without, part))
  for name, value in without.metric_sums.items():
    np.testing.assert_array_equal(with_probe.metric_sums[name], value)
  # The probe itself did learn: its weights moved off zero, its loss was summed.
  assert np.abs(with_probe.probe['params']['w']).max() > 0
  assert with_probe.metric_sums['probe_loss'] > 0


@pytest.mark.parametrize('chunks', [1, 2])
def test_the_chunked_step_trains_the_same_probe_and_leaves_the_encoder_alone(chunks):
  """Gradient caching (config.chunk_size, 16 samples per device): the encoder's update is
  bitwise the same with the probe on and off, and the probe reads the features of the
  chunked forward pass: in one chunk the unchunked step's probe (to rounding), in two a
  probe trained on per-chunk BatchNorm's features, so another one."""
  config = _config('hucl')
  whole = _steps(config, 1, NUM_CLASSES)
  config.chunk_size = 16 // chunks
  with_probe = _steps(config, 1, NUM_CLASSES)
  without = _steps(config, 1, None)
  for part in ('params', 'batch_stats', 'opt_state', 'step'):
    _assert_bitwise_equal(getattr(with_probe, part), getattr(without, part))
  gap = max(
    float(np.abs(np.asarray(a) - np.asarray(b)).max())
    for a, b in zip(jax.tree.leaves(with_probe.probe), jax.tree.leaves(whole.probe))
  )
  assert (gap < 1e-5) == (chunks == 1), gap
  assert np.abs(with_probe.probe['params']['w']).max() > 0


def _first_update_reference(features, labels, learning_rate):
  """The probe's first step from zero, by hand in float64: the cross-entropy gradient of the
  labelled views' mean (softmax - one-hot), then Adam's first step, lr * g / (|g| + eps)
  (its bias-corrected moments are g and g^2); the L2 term of zero weights is zero."""
  x = features.reshape(-1, features.shape[-1]).astype(np.float64)
  y = np.repeat(labels, features.shape[1])
  keep = y >= 0
  x, y = x[keep], y[keep]
  p = np.full((len(y), NUM_CLASSES), 1 / NUM_CLASSES)  # softmax of zero logits
  d_logits = (p - np.eye(NUM_CLASSES)[y]) / len(y)
  grads = {'w': x.T @ d_logits, 'b': d_logits.sum(0)}
  return {name: -learning_rate * g / (np.abs(g) + 1e-8) for name, g in grads.items()}


def test_one_probe_step_on_four_devices_is_the_global_batch_reference():
  """Per device, on its shard; the gradient is the global batch's mean; unlabelled (-1)
  examples weigh nothing."""
  mesh = parallel.make_mesh(jax.devices()[:4])
  rng = np.random.default_rng(0)
  features = rng.normal(size=(16, 2, 12)).astype(np.float32)
  labels = rng.integers(0, NUM_CLASSES, 16).astype(np.int32)
  labels[[1, 6, 11]] = -1
  optimizer = optimizers.adam_coupled_l2(0.05, weight_decay=1e-6)
  probe = online_probe.initial(optimizer, 12, NUM_CLASSES)
  update = jax.jit(
    jax.shard_map(
      lambda probe, x, y: online_probe.update(optimizer, probe, x, y, parallel.AXIS),
      mesh=mesh,
      in_specs=(P(), P(parallel.AXIS), P(parallel.AXIS)),
      out_specs=(P(), P()),
    )
  )
  new, loss = jax.device_get(update(probe, features, labels))
  np.testing.assert_allclose(loss, np.log(NUM_CLASSES), rtol=1e-6)
  reference = _first_update_reference(features, labels, 0.05)
  for name in ('w', 'b'):
    np.testing.assert_allclose(new['params'][name], reference[name], rtol=1e-4, atol=1e-7)


def test_top1_counts_the_unpadded_rows():
  params = {'w': np.eye(3, dtype=np.float32), 'b': np.zeros(3, np.float32)}
  features = np.array([[1, 0, 0], [0, 0, 1], [0, 1, 0], [1, 0, 0]], np.float32)
  labels = np.array([0, 2, 0, 1])
  mask = np.array([True, True, True, False])
  assert online_probe.top1(params, features, labels, mask) == pytest.approx(2 / 3)


def test_a_run_without_the_probe_stores_the_tree_it_stored_before():
  config = _config('hscl')
  mesh = parallel.make_mesh(jax.devices()[:1])
  model = models.create_model(config.model, bn_axis_name=parallel.AXIS)
  optimizer = optimizers.create_optimizer(config.optimizer, lambda count: 1e-3)

  def tree(probe_classes):
    state = state_lib.create_train_state(
      config, model, optimizer, 8, mesh, probe_classes=probe_classes
    )
    return state_lib.state_to_checkpoint(state)

  without, with_probe = tree(None), tree(NUM_CLASSES)
  assert sorted(without) == ['batch_stats', 'metric_sums', 'opt_state', 'params', 'rng', 'step']
  assert sorted(without['metric_sums']) == sorted(state_lib.metric_names(config))
  assert sorted(with_probe) == sorted([*without, 'probe'])
  variables = models.initialize(model, jax.random.key(0), (8, 8, 3))
  width = model.apply(variables, jnp.zeros((1, 8, 8, 3)), method=models.ContrastiveModel.features)
  assert with_probe['probe']['params']['w'].shape == (width.shape[-1], NUM_CLASSES)
  restored = state_lib.state_from_checkpoint(with_probe)
  _assert_bitwise_equal(restored.probe, with_probe['probe'])


def test_a_stored_config_without_the_probe_resumes_without_it(tmp_path):
  config = digits.get_config()
  assert config.probe.enabled
  stored = json.loads(json.dumps(config.to_dict()))
  del stored['probe']
  (tmp_path / layout.CONFIG_FILE).write_text(json.dumps(versions.stamped(stored)))
  resumed = stored_config.as_resumed(str(tmp_path), config)
  assert not resumed.probe.enabled and config.probe.enabled  # the caller's is left as it was
  held = {f: v for f, v in versions.absent_values(stored).items() if f.startswith('probe.')}
  assert held == {'probe.enabled': False}
  stored_config.check_unchanged(str(tmp_path), resumed)  # nothing differs
  # A run stored with the probe keeps the config it is given.
  (tmp_path / layout.CONFIG_FILE).write_text(json.dumps(versions.stamped(config.to_dict())))
  assert stored_config.as_resumed(str(tmp_path), config) is config
  off = digits.get_config()
  off.probe.enabled = False
  with pytest.raises(stored_config.ConfigChangedError, match='probe.enabled'):
    stored_config.check_unchanged(str(tmp_path), off)


def test_an_unlabelled_training_split_is_refused_with_the_probe_on():
  config = digits.get_config()
  config.dataset, config.train_split = 'stl10', 'unlabelled'
  with pytest.raises(errors.ConfigError, match=r'config\.probe\.enabled: .*unlabelled'):
    plan_lib.validate_dataset(config, num_classes=10)
  config.probe.enabled = False
  plan_lib.validate_dataset(config, num_classes=10)


def test_the_epoch_line_shows_the_probe_beside_the_knn():
  record = {
    'epoch': 3,
    'train_loss': 1.0,
    'knn_top1': 0.9,
    'probe_top1': 0.875,
    'learning_rate': 1e-3,
    'samples_per_second': 10.0,
    'images_per_second': 20.0,
    'epoch_time': 1.0,
  }
  assert '  kNN 0.9000  probe 0.8750  ' in log_lines.epoch_line(record, num_epochs=3)


def test_probe_features_are_detached_and_normalised():
  h = jnp.array([[3.0, 4.0]])
  np.testing.assert_allclose(online_probe.inputs(h), [[0.6, 0.8]], rtol=1e-6)
  grad = jax.grad(lambda h: online_probe.inputs(h).sum())(h)
  np.testing.assert_array_equal(grad, np.zeros_like(h))
