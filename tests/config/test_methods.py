"""The methods table: a method added as one row (its names) and its loss (objectives.LOSSES)
is validated, trained and planned by the comparison's grid with no other change."""

from __future__ import annotations

import dataclasses
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # `from configs import ...`, as from the repo root

from configs import digits  # noqa: E402
from hscl_jax import errors  # noqa: E402
from hscl_jax import losses  # noqa: E402
from hscl_jax import objectives  # noqa: E402
from hscl_jax.config import methods  # noqa: E402
from hscl_jax.config import schema  # noqa: E402
from hscl_jax.experiments import grid as image_grid  # noqa: E402
from hscl_jax.rundir import metrics  # noqa: E402
from hscl_jax.training import loop  # noqa: E402
from hscl_jax.training import plan as plan_lib  # noqa: E402

SCALE = 2.0  # a power of two: the scaled loss is exactly SCALE times SCL's in float32


def _scaled_scl(z, labels, hyper, options):
  return SCALE * objectives.loss_of(methods.by_label('SCL'))(z, labels, hyper, options)


SCALED_SCL = methods.Method(
  name='scaled_scl',
  label='2·SCL',
  slug='scaled_scl',
  sweep_name='scaled-scl',
  supervised=True,
  hardening='none',
)


@pytest.fixture
def scaled_scl(monkeypatch):
  """The table with SCALED_SCL as its last row and its loss, for one test."""
  monkeypatch.setattr(methods, 'ROWS', (*methods.ROWS, SCALED_SCL))
  monkeypatch.setitem(objectives.LOSSES, SCALED_SCL.slug, _scaled_scl)
  return SCALED_SCL


def _one_step(config):
  """conftest's tiny config for one step, no kNN: the loss recorded is the first step's."""
  config.num_epochs = 1
  config.steps_per_epoch_limit = 1
  config.optimizer.warmup_epochs = 0.0
  return config


def test_the_table_is_what_the_readers_list():
  assert list(schema.METHODS) == [
    'ucl',
    'hucl',
    'scl',
    'hscl',
    'sigmoid',
    'sigmoid_scl',
    'sigmoid_hscl',
  ]
  assert list(methods.SUPERVISED_NAMES) == ['scl', 'hscl', 'sigmoid_scl', 'sigmoid_hscl']
  # The paper's comparison (Table I) runs its own settings, not the sigmoid family.
  assert list(image_grid.METHODS) == ['UCL', 'H-UCL', 'SCL', 'H-SCL(β)', 'H-SCL(τ)']
  assert [methods.by_label(m).slug for m in image_grid.METHODS] == [
    'ucl',
    'hucl',
    'scl',
    'hscl_beta',
    'hscl_tau',
  ]
  assert all(a in image_grid.METHODS and b in image_grid.METHODS for a, b in methods.PAIRS)


def test_a_config_selects_its_row_and_reads_its_hyperparameters():
  config = digits.get_config()
  config.diagnostics = False
  for method, hardening, label, reads in [
    ('ucl', 'threshold', 'UCL', ()),
    ('hucl', 'threshold', 'H-UCL', ('beta',)),
    ('hscl', 'exp', 'H-SCL(β)', ('beta',)),
    ('hscl', 'threshold', 'H-SCL(τ)', ('tau',)),
  ]:
    config.method, config.hardening = method, hardening
    assert methods.of_config(config).label == label
    assert plan_lib.used_hyperparameters(config) == reads


def test_a_row_alone_adds_a_method_to_validation_the_loss_and_the_grid(scaled_scl, tiny_config):
  config = _one_step(tiny_config())
  grid = image_grid.settings(config, {'beta'})
  (setting,) = [s for s in grid if s.method == scaled_scl.label]
  assert grid[-1] == setting  # the table's order: the new row last
  assert setting.slug == 'scaled_scl' and setting.overrides == (('method', 'scaled_scl'),)
  plan = image_grid.plan_runs(config, [0], {'beta'}, {'scaled_scl': 2})
  assert [seed for s, seed in plan if s == setting] == [0, 1]
  run = image_grid.run_config(config, setting, seed=0)
  schema.validate_config(run, num_devices=1)
  assert plan_lib.used_hyperparameters(run) == ('beta',)  # the diagnostics' hardening only


def test_a_one_epoch_run_trains_the_new_rows_loss(scaled_scl, tmp_path, tiny_config):
  """The new method's run records SCALE times the loss of SCL's run on the same seed: the
  same initial parameters and views, so the one step's loss differs by the row alone."""
  config = _one_step(tiny_config())
  by_label = {s.method: s for s in image_grid.settings(config, set())}
  recorded = {}
  for label in ('SCL', scaled_scl.label):
    workdir = tmp_path / methods.by_label(label).slug
    loop.train_and_evaluate(image_grid.run_config(config, by_label[label], seed=0), str(workdir))
    (record,) = metrics.read_metrics(str(workdir))
    recorded[label] = record['train_loss']
  assert recorded[scaled_scl.label] == pytest.approx(SCALE * recorded['SCL'], rel=1e-6)
  assert recorded['SCL'] > 0


def test_the_row_is_gone_after_its_test():
  assert 'scaled_scl' not in schema.METHODS
  assert SCALED_SCL.label not in image_grid.METHODS
  assert SCALED_SCL.slug not in objectives.LOSSES


# ----------------------------------------------------------------------------------------
# The sigmoid family's rows.


@pytest.mark.parametrize(
  'method,hardening,label,supervised,reads',
  [
    ('sigmoid', 'threshold', 'Sig-UCL', False, ()),
    ('sigmoid_scl', 'threshold', 'Sig-SCL', True, ()),
    ('sigmoid_hscl', 'exp', 'Sig-H-SCL(β)', True, ('beta',)),
  ],
)
def test_the_sigmoid_rows_train_log_t_and_b_and_read_their_hyperparameters(
  method, hardening, label, supervised, reads
):
  config = digits.get_config()
  config.method, config.hardening, config.diagnostics = method, hardening, False
  row = methods.of_config(config)
  assert (row.label, row.supervised, row.family, row.compared) == (
    label,
    supervised,
    'sigmoid',
    False,
  )
  assert row.learned == ('log_t', 'b')
  assert plan_lib.used_hyperparameters(config) == reads
  config.sigmoid_log_t, config.sigmoid_b = 0.5, -3.0
  assert methods.learned_initial(config) == {'log_t': 0.5, 'b': -3.0}
  schema.validate_config(config, num_devices=1)
  config.method = 'hscl'
  assert methods.learned_initial(config) is None  # a softmax row trains no loss parameter


@pytest.mark.parametrize('method', ['sigmoid', 'sigmoid_scl', 'sigmoid_hscl'])
def test_a_sigmoid_rows_loss_is_sigmoid_contrastive_at_the_learned_t_and_b(method):
  """The row's loss, at learned {'log_t', 'b'}: the one-tower sigmoid loss with t = e^{log_t}
  (labels for the supervised rows, config.beta's exponential hardening for H-SCL)."""
  z = losses.l2_normalize(jax.random.normal(jax.random.key(0), (8, 2, 16)))
  labels = jnp.array([0, 1, 0, 2, 1, 1, 0, 2])
  learned = {'log_t': jnp.float32(1.2), 'b': jnp.float32(-2.5)}
  hyper = {'beta': np.float32(2.0), 'tau': np.float32(1.0)}
  options = objectives.LossOptions({'axis_name': None}, learned=learned)
  config = digits.get_config()
  config.method = method
  row = methods.of_config(config)
  loss = objectives.loss_of(row)
  expected = losses.sigmoid_contrastive(
    z,
    labels if row.supervised else None,
    t=np.exp(np.float32(1.2)),
    b=-2.5,
    hardening=losses.exponential(2.0) if row.hardening == 'exp' else None,
  )
  np.testing.assert_allclose(loss(z, labels, hyper, options), expected, rtol=1e-6)
  d_log_t, d_b = jax.grad(
    lambda lt, b: loss(
      z, labels, hyper, dataclasses.replace(options, learned={'log_t': lt, 'b': b})
    ),
    argnums=(0, 1),
  )(learned['log_t'], learned['b'])
  assert d_log_t != 0 and d_b != 0


@pytest.mark.parametrize(
  'overrides,field',
  [
    ({'queue_size': 512}, 'queue_size'),
    ({'queue_momentum': 0.99}, 'queue_momentum'),
    ({'tau_plus': 0.1}, 'tau_plus'),
    ({'M': 100}, 'M'),
    ({'method': 'sigmoid_hscl', 'hardening': 'threshold'}, 'hardening'),
  ],
)
def test_a_sigmoid_row_refuses_the_softmax_options_in_one_line(overrides, field):
  config = digits.get_config()
  config.method = 'sigmoid_scl'
  config.update(overrides)
  with pytest.raises(errors.ConfigError) as error:
    schema.validate_config(config, num_devices=1)
  message = str(error.value)
  assert '\n' not in message and message.startswith(f'config.{field}: ')
  assert 'Fix: ' in message
  if field == 'hardening':
    assert '--config.hardening=exp' in message
  else:
    assert f'--config.{field}' in message and config.method in message
    config.method = 'scl'  # the same option is a softmax row's
    schema.validate_config(config, num_devices=1)
