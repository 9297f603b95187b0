"""experiments/grid: the paper's grids and their settings, a run's config from the base, its
settings, overrides, seed and protocol, each method's seeds, and the runs shared by workers
(a signal stops the grid, a run of another config is refused)."""

from __future__ import annotations

import pathlib
import shutil
import signal
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # `from configs import ...`, as from the repo root

import dataclasses

from configs import digits  # noqa: E402
from hscl_jax.config import methods  # noqa: E402
from hscl_jax.config import schema  # noqa: E402
from hscl_jax.experiments import grid  # noqa: E402
from hscl_jax.experiments import grid as image_grid  # noqa: E402
from hscl_jax.experiments import grid as image_runs  # noqa: E402
from hscl_jax.rundir import stored_config  # noqa: E402
from hscl_jax.training import loop  # noqa: E402
from hscl_jax.training import preemption  # noqa: E402


def test_settings_cover_the_paper_grids():
  config = digits.get_config()
  plain = image_grid.settings(config, set())
  assert [s.method for s in plain] == list(image_grid.METHODS)
  grid = image_grid.settings(config, {'beta', 'tau'})
  by_method = {m: [s for s in grid if s.method == m] for m in image_grid.METHODS}
  assert len(by_method['H-SCL(β)']) == len(by_method['H-UCL']) == 5
  assert len(by_method['H-SCL(τ)']) == 9
  assert len({s.slug for s in grid}) == len(grid)  # one workdir per setting
  for setting in grid:  # every setting is a valid training config
    schema.validate_config(
      image_grid.run_config(config, setting, seed=1), num_devices=1, num_processes=1
    )


@pytest.mark.parametrize('signum', [signal.SIGTERM, signal.SIGINT], ids=['sigterm', 'sigint'])
def test_a_run_stopped_by_a_signal_stops_the_grid_with_it(tmp_path, monkeypatch, signum):
  """A run that saved and stopped at a SIGTERM or Ctrl-C stops the grid, which carries the
  signal for `compare`'s exit status (143 or 130), and nothing is linear-evaluated."""
  config = digits.get_config()
  stopped = loop.TrainResult(state=None, stop_signal=signum, last_record=None)
  monkeypatch.setattr(loop, 'train_and_evaluate', lambda *args: stopped)
  monkeypatch.setattr(image_runs.linear_evaluation, 'linear_evaluate', pytest.fail)
  setting = image_grid.settings(config, set())[0]
  with pytest.raises(preemption.Preempted) as stop:
    image_runs.run_one(config, setting, 0, str(tmp_path), config.linear_eval.protocol)
  assert stop.value.signum == signum


def test_a_runs_config_is_the_base_with_its_settings_overrides_seed_and_protocol():
  config = digits.get_config()
  base = config.to_dict()
  grid = image_grid.settings(config, {'beta', 'tau', 'queue'})
  assert all(s.overrides for s in grid)
  for setting in grid:
    run = image_grid.run_config(config, setting, 3, protocol='augmented')
    for key, value in setting.overrides:
      assert run[key] == value, (setting.label, key)
    assert (run.seed, run.linear_eval.protocol) == (3, 'augmented')
    untouched = {k for k, _ in setting.overrides} | {'seed', 'linear_eval'}
    assert {k: v for k, v in run.to_dict().items() if k not in untouched} == {
      k: v for k, v in base.items() if k not in untouched
    }
  assert config.to_dict() == base  # the base is not modified
  kept = image_grid.run_config(config, grid[0], 0)
  assert kept.linear_eval.protocol == config.linear_eval.protocol


def test_the_grids_are_the_papers():
  """β ∈ {0.1, 0.5, 1, 2, 5} for H-UCL and H-SCL(β); τ schedules from start ∈ {−0.5, −0.3,
  −0.1} to end ∈ {−0.1, 0, 0.1} for H-SCL(τ) (written out, not read from the module)."""
  grid = image_grid.settings(digits.get_config(), {'beta', 'tau'})
  overrides = {m: [dict(s.overrides) for s in grid if s.method == m] for m in image_grid.METHODS}
  for method in ('H-UCL', 'H-SCL(β)'):
    assert sorted(o['beta'] for o in overrides[method]) == [0.1, 0.5, 1.0, 2.0, 5.0]
  taus = sorted((o['tau_start'], o['tau_end']) for o in overrides['H-SCL(τ)'])
  assert taus == [(s, e) for s in (-0.5, -0.3, -0.1) for e in (-0.1, 0.0, 0.1)]


def test_a_run_of_another_config_is_refused_with_the_comparisons_own_flags(tmp_path):
  """A grid's run directory holding a run of another config (the stored digits run): the
  refusal names the run and --workdir, a flag of compare, not training's
  --allow_config_change, which compare lacks (its runs follow its config)."""
  from test_main import is_a_flag_of
  from test_main import named_flags

  config = digits.get_config()
  setting = image_grid.settings(config, set())[0]
  workdir = image_grid.run_dir(str(tmp_path), setting, 0)
  shutil.copytree(REPO / 'tests' / 'fixtures' / 'digits_workdir', workdir)
  with pytest.raises(stored_config.ConfigChangedError) as refused:
    image_runs.run_one(config, setting, 0, str(tmp_path), 'features')
  message = str(refused.value)
  assert message.startswith(f'workdir {workdir} holds a run trained '), message
  assert message.endswith(
    f'Fix: use a new --workdir for the comparison, or remove {workdir} to train that run again'
  )
  flags = named_flags(message, 'hscl_jax.experiments.compare')
  assert flags == [('hscl_jax.experiments.compare', 'workdir')]
  assert all(is_a_flag_of(*flag) for flag in flags)


def test_plan_gives_the_named_methods_their_own_seeds_seed_by_seed():
  config = digits.get_config()
  plan = image_grid.plan_runs(config, [0, 1, 2], set(), {'scl': 5, 'hscl_beta': 5})
  labels = [(s.method, seed) for s, seed in plan]
  assert len(plan) == 3 * 5 + 2 * 2
  assert labels[:5] == [(m, 0) for m in image_grid.METHODS]  # seed 0 of every method first
  assert labels[-4:] == [('SCL', 3), ('H-SCL(β)', 3), ('SCL', 4), ('H-SCL(β)', 4)]
  assert image_grid.plan_runs(config, [0], set(), {'ucl': 0}) == [
    (s, 0) for s in image_grid.settings(config, set()) if s.method != 'UCL'
  ]
  assert image_grid.describe_seeds(plan) == ['0', '1', '2 (0-4 for SCL, H-SCL(β))']
  assert image_grid.describe_seeds(image_grid.plan_runs(config, [0, 1], set())) == ['0', '1']
  with pytest.raises(ValueError, match=r"unknown methods \['h-scl'\]; use ucl, hucl, scl"):
    image_grid.plan_runs(config, [0], set(), {'h-scl': 5})
  with pytest.raises(ValueError, match=r"unknown methods \['beta', 'scl2', 'ucl '\]; use"):
    image_grid.plan_runs(config, [0], set(), {'ucl ': 2, 'scl': 3, 'scl2': 5, 'beta': 1})


# experiments/grid with `--grid=sigmoid`: the methods table's supervised sigmoid rows
# join the comparison's settings, in the table's order, with the run directories, slugs
# and seeds the sigmoid report reads.

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
