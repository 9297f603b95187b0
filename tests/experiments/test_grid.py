"""experiments/grid with `--grid=sigmoid`: the methods table's supervised sigmoid rows
join the comparison's settings, in the table's order, with the run directories, slugs
and seeds the sigmoid report reads."""

from __future__ import annotations

import dataclasses
import pathlib
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # `from configs import ...`, as from the repo root

from configs import digits  # noqa: E402
from hscl_jax.config import methods  # noqa: E402
from hscl_jax.config import schema  # noqa: E402
from hscl_jax.experiments import grid  # noqa: E402

PAPER = ['UCL', 'H-UCL', 'SCL', 'H-SCL(β)', 'H-SCL(τ)']


def test_sigmoid_grid_adds_sig_scl_and_sig_hscl_at_the_configs_beta_after_the_papers_rows():
  config = digits.get_config()
  config.beta = 2.0
  plain = grid.settings(config, set())
  with_sigmoid = grid.settings(config, {'sigmoid'})
  assert [s.method for s in plain] == PAPER
  assert with_sigmoid[:5] == plain
  assert [(s.method, s.slug) for s in with_sigmoid[5:]] == [
    ('Sig-SCL', 'sig_scl'),
    ('Sig-H-SCL(β)', 'sig_hscl_beta_beta2.0'),
  ]
  sig_scl, sig_hscl = (dict(s.overrides) for s in with_sigmoid[5:])
  assert sig_scl == {'method': 'sigmoid_scl'}
  assert sig_hscl == {'method': 'sigmoid_hscl', 'hardening': 'exp', 'beta': 2.0}
  for setting in with_sigmoid[5:]:  # each a valid training config of its row
    run = grid.run_config(config, setting, seed=2)
    schema.validate_config(run, num_devices=1, num_processes=1)
    assert methods.of_config(run).label == setting.method


def test_sigmoid_settings_are_those_the_background_runs_were_started_with(tmp_path):
  """The runs of issue 79 were started from `Setting(row.label, row.overrides + point)`
  at β = 1 into ROOT/sig_scl/seed<k> and ROOT/sig_hscl_beta_beta1.0/seed<k>: the grid's
  settings, slugs and run directories are the same, so their records are found."""
  config = digits.get_config()
  config.beta = 1.0
  rows = [methods.by_label('Sig-SCL'), methods.by_label('Sig-H-SCL(β)')]
  started = [
    grid.Setting(r.label, r.overrides + p) for r in rows for p in grid.method_points(r, (1.0,))
  ]
  assert grid.settings(config, {'sigmoid'})[5:] == started
  dirs = [grid.run_dir(str(tmp_path), s, 1) for s in started]
  assert dirs == [
    str(tmp_path / 'sig_scl' / 'seed1'),
    str(tmp_path / 'sig_hscl_beta_beta1.0' / 'seed1'),
  ]


def test_sigmoid_rows_are_read_from_the_table_in_its_order(monkeypatch):
  """The supervised sigmoid rows, whatever the table holds: Sig-UCL (unsupervised) is
  not one; a new supervised sigmoid row placed before SCL in the table sorts there, and
  a queue run still follows its own setting."""
  assert [r.label for r in grid.sigmoid_rows()] == ['Sig-SCL', 'Sig-H-SCL(β)']
  new = dataclasses.replace(
    methods.by_label('Sig-SCL'), name='sigmoid_new', label='Sig-new', slug='sig_new'
  )
  rows = list(methods.ROWS)
  monkeypatch.setattr(methods, 'ROWS', (*rows[:2], new, *rows[2:]))
  config = digits.get_config()
  order = [s.method for s in grid.settings(config, {'sigmoid', 'queue'})]
  assert order == [
    'UCL',
    'H-UCL',
    'Sig-new',
    'SCL',
    'SCL',
    'H-SCL(β)',
    'H-SCL(β)',
    'H-SCL(τ)',
    'Sig-SCL',
    'Sig-H-SCL(β)',
  ]
  queued = [s.queue_size > 0 for s in grid.settings(config, {'sigmoid', 'queue'})]
  assert queued == [False] * 4 + [True, False, True] + [False] * 3


def test_the_sigmoid_reports_seeds_flags_plan_seeds_0_to_2_of_every_row_it_reads():
  """--grid=sigmoid --seeds=3 --seeds_for=ucl=0,hscl_tau=0 (the documented command): seeds
  0-2 of H-UCL, SCL, H-SCL(β), Sig-SCL and Sig-H-SCL(β), seed by seed; --seeds_for takes
  the sigmoid rows' slugs only with the grid."""
  config = digits.get_config()
  plan = grid.plan_runs(config, [0, 1, 2], {'sigmoid'}, {'ucl': 0, 'hscl_tau': 0})
  rows = ['H-UCL', 'SCL', 'H-SCL(β)', 'Sig-SCL', 'Sig-H-SCL(β)']
  assert [(s.method, seed) for s, seed in plan] == [(m, k) for k in range(3) for m in rows]
  assert [s.slug for s, _ in plan[:5]] == [
    'hucl_beta1.0',
    'scl',
    'hscl_beta_beta1.0',
    'sig_scl',
    'sig_hscl_beta_beta1.0',
  ]
  assert grid.describe_seeds(plan) == ['0', '1', '2']
  more = grid.plan_runs(config, [0, 1, 2], {'sigmoid'}, {'ucl': 0, 'hscl_tau': 0, 'sig_scl': 5})
  assert [seed for s, seed in more if s.method == 'Sig-SCL'] == [0, 1, 2, 3, 4]
  with pytest.raises(
    ValueError, match=r"unknown methods \['sig_scl'\]; use ucl, hucl, scl, hscl_beta, hscl_tau$"
  ):
    grid.plan_runs(config, [0], set(), {'sig_scl': 3})


def test_a_report_tests_the_paper_pairs_or_with_the_sigmoid_grid_the_sigmoid_question():
  assert grid.report_pairs(set()) == grid.report_pairs({'beta', 'queue'}) == methods.PAIRS
  assert grid.report_pairs({'sigmoid', 'beta'}) == (
    ('Sig-H-SCL(β)', 'Sig-SCL'),
    ('Sig-H-SCL(β)', 'H-SCL(β)'),
    ('Sig-SCL', 'SCL'),
    ('Sig-H-SCL(β)', 'H-UCL'),
  )
