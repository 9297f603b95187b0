"""The train state's parts that a method adds: a sigmoid row's trained log t and b, present
only for the sigmoid rows, so every other run stores the tree it always stored."""

from __future__ import annotations

import pathlib
import sys

import jax
import numpy as np
import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # `from configs import ...`, as from the repo root

from configs import digits  # noqa: E402
from hscl_jax import models  # noqa: E402
from hscl_jax import optimizers  # noqa: E402
from hscl_jax import parallel  # noqa: E402
from hscl_jax.training import state as state_lib  # noqa: E402

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
