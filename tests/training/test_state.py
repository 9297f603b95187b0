"""training/state: the initial training state of the tiny config against the model's and the
optimizer's own initialisation, on 1 and 4 devices, its checkpoint form and back; and the parts
a method adds (a sigmoid row's trained log t and b, present only for the sigmoid rows, so
every other run stores the tree it always stored)."""

from __future__ import annotations

import dataclasses
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from training_runs import assert_trees_equal

from hscl_jax import models
from hscl_jax import optimizers
from hscl_jax import parallel
from hscl_jax.training import queue as negative_queue
from hscl_jax.training import state as state_lib

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # `from configs import ...`, as from the repo root

from configs import digits  # noqa: E402

SOFTMAX_TREE = {'step', 'params', 'batch_stats', 'opt_state', 'rng', 'metric_sums'}


def _state(method, **fields):
  config = digits.get_config()
  config.method = method
  config.update(fields)
  model = models.create_model(config.model)
  optimizer = optimizers.create_optimizer(config.optimizer, 1e-3)
  mesh = parallel.make_mesh(jax.devices()[:1])
  return state_lib.create_train_state(config, model, optimizer, 8, mesh), optimizer


@pytest.mark.parametrize('method', ['ucl', 'hucl', 'scl', 'hscl'])
def test_a_softmax_run_stores_the_tree_it_always_stored(method):
  state, _ = _state(method)
  assert state.loss_state is None
  assert set(state_lib.state_to_checkpoint(state)) == SOFTMAX_TREE


@pytest.mark.parametrize('method', ['sigmoid', 'sigmoid_scl', 'sigmoid_hscl'])
def test_a_sigmoid_run_holds_log_t_and_b_from_the_config_with_their_optimizer_state(method):
  state, optimizer = _state(method, sigmoid_log_t=1.5, sigmoid_b=-4.0)
  learned = jax.device_get(state.loss_state['params'])
  assert learned == {'log_t': np.float32(1.5), 'b': np.float32(-4.0)}
  assert all(np.asarray(v).dtype == np.float32 and np.ndim(v) == 0 for v in learned.values())
  expected = optimizer.init(learned)  # the model's optimizer, its own state
  actual = state.loss_state['opt_state']
  assert jax.tree.structure(actual) == jax.tree.structure(expected)
  for x, y in zip(jax.tree.leaves(actual), jax.tree.leaves(expected), strict=True):
    np.testing.assert_array_equal(x, y)
  tree = state_lib.state_to_checkpoint(state)
  assert set(tree) == SOFTMAX_TREE | {'loss_state'}
  back = state_lib.state_from_checkpoint(jax.device_get(tree)).loss_state
  assert jax.tree.structure(back) == jax.tree.structure(state.loss_state)
  for x, y in zip(jax.tree.leaves(back), jax.tree.leaves(state.loss_state), strict=True):
    np.testing.assert_array_equal(x, y)


def test_the_defaults_are_siglips_start():
  state, _ = _state('sigmoid')
  learned = jax.device_get(state.loss_state['params'])
  assert np.exp(learned['log_t']) == pytest.approx(10.0, rel=1e-6)
  assert learned['b'] == -10.0


NUM_CLASSES = 10


def _config(tiny_config, **changes):
  config = tiny_config()
  config.update(changes)
  return config


def _create(config, num_devices=1, probe_classes=None):
  model = models.create_model(config.model, bn_axis_name=parallel.AXIS)
  optimizer = optimizers.create_optimizer(config.optimizer, optax.constant_schedule(1e-3))
  mesh = parallel.make_mesh(jax.devices()[:num_devices])
  state = state_lib.create_train_state(
    config, model, optimizer, config.augment.image_size, mesh, probe_classes=probe_classes
  )
  return state, model, optimizer, mesh


@pytest.fixture(scope='module')
def with_everything(tiny_config):
  """The state of a run with a queue, a key encoder and a probe, on 4 devices."""
  config = _config(tiny_config, queue_size=32, queue_momentum=0.99)
  return config, *_create(config, num_devices=4, probe_classes=NUM_CLASSES)


def test_the_initial_state_is_the_models_and_optimizers_from_the_seeds_keys(with_everything):
  config, state, model, optimizer, _ = with_everything
  init_key, augment_key = jax.random.split(jax.random.key(config.seed))
  variables = models.initialize(model, init_key, (8, 8, 3))
  assert_trees_equal(state.params, variables['params'])
  assert_trees_equal(state.batch_stats, variables['batch_stats'])
  assert_trees_equal(state.opt_state, optimizer.init(variables['params']))
  assert_trees_equal(jax.random.key_data(state.rng), jax.random.key_data(augment_key))
  assert int(state.step) == 0
  # θ_k starts at θ_q.
  assert_trees_equal(state.key_encoder, variables)


def test_the_initial_queue_holds_no_negative_and_no_class(with_everything):
  """Its labels are -1, not class 0: an empty slot is never a same-class key."""
  config, state, *_ = with_everything
  queue = state.queue
  assert queue.keys.shape == (32, config.model.head_out)
  np.testing.assert_array_equal(queue.labels, np.full(32, -1))
  assert not np.any(queue.filled) and int(queue.position) == 0


def test_the_metric_sums_are_the_metrics_named_at_zero(with_everything, tiny_config):
  _, state, *_ = with_everything
  names = ('train_loss', 'grad_norm', 'loss_ucl', 'loss_hucl', 'loss_scl', 'loss_hscl')
  assert set(state.metric_sums) == {*names, 'assumption1_fraction', 'probe_loss'}
  assert all(float(v) == 0.0 for v in state.metric_sums.values())
  quiet = _config(tiny_config, diagnostics=False)
  assert state_lib.metric_names(quiet) == ('train_loss', 'grad_norm')


def test_the_probe_starts_at_zero_over_the_backbones_features(with_everything):
  _, state, *_ = with_everything
  params = state.probe['params']
  features = models.feature_dim('small_cnn')
  assert params['w'].shape == (features, NUM_CLASSES) and params['b'].shape == (NUM_CLASSES,)
  assert not np.any(params['w']) and not np.any(params['b'])


def test_every_leaf_is_replicated_over_the_mesh(with_everything):
  _, state, _, _, mesh = with_everything
  for leaf in jax.tree.leaves(state):
    assert leaf.sharding.is_fully_replicated
    assert leaf.sharding.device_set == set(mesh.devices.flat)


def test_one_device_makes_the_same_state_as_four(with_everything):
  config, state, *_ = with_everything
  one, *_ = _create(config, num_devices=1, probe_classes=NUM_CLASSES)
  assert_trees_equal(
    state_lib.state_to_checkpoint(one), state_lib.state_to_checkpoint(jax.device_get(state))
  )


def test_the_checkpoint_form_is_plain_arrays_and_reads_back_the_same_state(with_everything):
  _, state, *_ = with_everything
  tree = state_lib.state_to_checkpoint(state)
  assert tree['rng'].dtype == jnp.uint32
  assert set(tree['queue']) == {f.name for f in dataclasses.fields(negative_queue.Queue)}
  back = state_lib.state_from_checkpoint(tree)
  assert isinstance(back.queue, negative_queue.Queue)
  assert jax.dtypes.issubdtype(back.rng.dtype, jax.dtypes.prng_key)
  assert_trees_equal(state_lib.state_to_checkpoint(back), tree)
  assert_trees_equal(jax.random.key_data(back.rng), jax.random.key_data(state.rng))


def test_a_run_without_queue_key_encoder_or_probe_stores_none_of_them(tiny_config):
  state, *_ = _create(_config(tiny_config))
  assert (state.queue, state.key_encoder, state.probe) == (None, None, None)
  tree = state_lib.state_to_checkpoint(state)
  assert set(tree) == {'step', 'params', 'batch_stats', 'opt_state', 'rng', 'metric_sums'}
  back = state_lib.state_from_checkpoint(tree)
  assert (back.queue, back.key_encoder, back.probe) == (None, None, None)
  # Another seed, another model and augmentations.
  other, *_ = _create(_config(tiny_config, seed=1))
  assert not np.array_equal(jax.random.key_data(other.rng), jax.random.key_data(state.rng))
  pairs = zip(jax.tree.leaves(other.params), jax.tree.leaves(state.params), strict=True)
  assert all(not np.array_equal(a, b) for a, b in pairs if b.ndim > 1)  # the kernels
