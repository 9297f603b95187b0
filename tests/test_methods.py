"""The methods table: a method added as one row (its loss and its names) is validated,
trained and planned by the comparison's grid with no other change."""

from __future__ import annotations

import pathlib
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # `from configs import ...`, as from the repo root

from configs import digits  # noqa: E402
from hscl_jax.config import methods  # noqa: E402
from hscl_jax.config import schema  # noqa: E402
from hscl_jax.experiments import image_grid  # noqa: E402
from hscl_jax.rundir import metrics  # noqa: E402
from hscl_jax.training import loop  # noqa: E402
from hscl_jax.training import plan as plan_lib  # noqa: E402

SCALE = 2.0  # a power of two: the scaled loss is exactly SCALE times SCL's in float32


def _scaled_scl(z, labels, hyper, options):
  return SCALE * methods.by_label('SCL').loss(z, labels, hyper, options)


SCALED_SCL = methods.Method(
  name='scaled_scl',
  label='2·SCL',
  slug='scaled_scl',
  sweep_name='scaled-scl',
  supervised=True,
  hardening='none',
  loss=_scaled_scl,
)


@pytest.fixture
def scaled_scl(monkeypatch):
  """The table with SCALED_SCL as its last row, for one test."""
  monkeypatch.setattr(methods, 'ROWS', (*methods.ROWS, SCALED_SCL))
  return SCALED_SCL


def tiny_config():
  """One step of 32 digits, no kNN: the loss recorded is the first step's."""
  config = digits.get_config()
  config.batch_size = 32
  config.num_epochs = 1
  config.steps_per_epoch_limit = 1
  config.optimizer.warmup_epochs = 0.0
  config.knn.every_epochs = 0
  return config


def test_the_table_is_what_the_readers_list():
  assert list(schema.METHODS) == ['ucl', 'hucl', 'scl', 'hscl']
  assert list(methods.SUPERVISED_NAMES) == ['scl', 'hscl']
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


def test_a_row_alone_adds_a_method_to_validation_the_loss_and_the_grid(scaled_scl):
  config = tiny_config()
  grid = image_grid.settings(config, {'beta'})
  (setting,) = [s for s in grid if s.method == scaled_scl.label]
  assert grid[-1] == setting  # the table's order: the new row last
  assert setting.slug == 'scaled_scl' and setting.overrides == (('method', 'scaled_scl'),)
  plan = image_grid.plan_runs(config, [0], {'beta'}, {'scaled_scl': 2})
  assert [seed for s, seed in plan if s == setting] == [0, 1]
  run = image_grid.run_config(config, setting, seed=0)
  schema.validate_config(run, num_devices=1)
  assert plan_lib.used_hyperparameters(run) == ('beta',)  # the diagnostics' hardening only


def test_a_one_epoch_run_trains_the_new_rows_loss(scaled_scl, tmp_path):
  """The new method's run records SCALE times the loss of SCL's run on the same seed: the
  same initial parameters and views, so the one step's loss differs by the row alone."""
  config = tiny_config()
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
