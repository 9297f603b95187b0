"""`python -m hscl_jax.experiments.compare`, the program: a grid run and reported end to
end, and what it refuses in one line (no finished run, no matplotlib, bad --seeds_for,
unknown grids)."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # `from configs import ...`, as from the repo root

import json
import shutil

from configs import digits  # noqa: E402
from hscl_jax.experiments import grid  # noqa: E402
from hscl_jax.experiments import grid as image_grid  # noqa: E402
from hscl_jax.experiments import run_records  # noqa: E402
from hscl_jax.rundir import metrics  # noqa: E402


@pytest.mark.slow  # the fast tests above cover each piece; this runs them end to end
def test_compare_end_to_end(tmp_path):
  out = subprocess.run(
    [
      sys.executable,
      '-m',
      'hscl_jax.experiments.compare',
      '--config=configs/digits.py',
      '--config.num_epochs=1',
      '--config.optimizer.warmup_epochs=0',
      '--config.steps_per_epoch_limit=2',
      '--config.linear_eval.num_epochs=2',
      '--seeds=1',
      f'--workdir={tmp_path}',
    ],
    cwd=REPO,
    env={**os.environ, 'JAX_TRANSFER_GUARD': 'disallow'},  # every transfer explicit
    capture_output=True,
    text=True,
    timeout=900,
  )
  assert out.returncode == 0, out.stderr[-3000:]
  report = (tmp_path / 'report.md').read_text()
  for method in image_grid.METHODS:
    assert f'| {method} |' in report
  assert out.stdout == report + '\n'  # the program prints the report it wrote


def test_compare_with_no_finished_run_says_so(tmp_path):
  out = subprocess.run(
    [
      sys.executable,
      '-m',
      'hscl_jax.experiments.compare',
      '--config=configs/digits.py',
      '--report_only',
      f'--workdir={tmp_path}',
    ],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert (out.returncode, out.stdout) == (0, f'No finished run in {tmp_path} yet.\n')
  assert list(tmp_path.iterdir()) == []  # nothing written


def test_compare_without_matplotlib_stops_before_its_first_run(tmp_path):
  """The report always draws: a missing matplotlib is one line before any training."""
  program = (
    "import runpy, sys; sys.modules['matplotlib'] = None; "
    f"sys.argv = ['compare', '--config=configs/digits.py', '--workdir={tmp_path}']; "
    "runpy.run_module('hscl_jax.experiments.compare', run_name='__main__')"
  )
  out = subprocess.run(
    [sys.executable, '-c', program], cwd=REPO, capture_output=True, text=True, timeout=300
  )
  assert out.returncode == 1, out.stderr[-3000:]
  assert 'python -m hscl_jax.experiments.compare draws with matplotlib' in out.stderr
  assert "Fix: pip install -e '.[train]'" in out.stderr
  assert list(tmp_path.iterdir()) == []  # no run started


def test_compare_refuses_a_bad_seeds_for_in_one_line():
  out = subprocess.run(
    [
      sys.executable,
      '-m',
      'hscl_jax.experiments.compare',
      '--config=configs/digits.py',
      '--seeds_for=scl:5',
      '--report_only',
    ],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert out.returncode != 0
  assert '--seeds_for=scl:5' in out.stderr and 'e.g. --seeds_for=scl=5,hscl_beta=5' in out.stderr


def test_compare_refuses_unknown_grids_naming_them_in_order():
  out = subprocess.run(
    [sys.executable, '-m', 'hscl_jax.experiments.compare', '--config=configs/digits.py',
     '--grid=zeta,beta,alpha', '--report_only'],
    cwd=REPO, capture_output=True, text=True, timeout=300,
  )  # fmt: skip
  assert out.returncode != 0
  assert "--grid takes beta, tau, queue and/or sigmoid, got ['alpha', 'zeta']." in out.stderr


# The `compare` program's --records: a finished run of its workdir is recorded in
# RECORDS/runs/ and the report, written to --report_dir, reads it from there and says so;
# without --records the records live in --report_dir as before. The finished run is made
# of files (the stored digits workdir's metrics), so nothing trains.

SLUG = 'hscl_beta_beta1.0'  # the stored workdir's method: H-SCL(β) at β = 1 (digits.py's)
EPOCHS = 2


def _finished_workdir(root: pathlib.Path) -> pathlib.Path:
  """A finished run of the comparison's H-SCL(β) seed 0 on digits.py with EPOCHS: that
  run's config, the stored workdir's metrics (epochs 1 and 2, steps 5 and 10), its last
  step's checkpoint (a name: its content is never read) linear-evaluated with digits.py's
  settings."""
  workdir = root / SLUG / 'seed0'
  (workdir / 'checkpoints' / '10').mkdir(parents=True)
  shutil.copy(REPO / 'tests' / 'fixtures' / 'digits_workdir' / 'metrics.jsonl', workdir)
  config = digits.get_config()
  config.num_epochs = EPOCHS
  (setting,) = [s for s in grid.settings(config, set()) if s.slug == SLUG]
  metrics.write_config(str(workdir), grid.run_config(config, setting, 0, 'features'))
  linear = {key: config.linear_eval[key] for key in grid.LINEAR_EVAL_KEYS}
  linear.update(top1=0.875, top5=0.99, checkpoint_step=10)
  (workdir / 'linear_eval.json').write_text(json.dumps(linear))
  return workdir


def _compare(*flags):
  args = ['--config=configs/digits.py', f'--config.num_epochs={EPOCHS}', '--seeds=1']
  args += ['--report_only', '--grid=sigmoid']
  args.append('--seeds_for=ucl=0,hucl=0,scl=0,hscl_tau=0,sig_scl=0,sig_hscl_beta=0')
  out = subprocess.run(
    [sys.executable, '-m', 'hscl_jax.experiments.compare', *args, *flags],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert out.returncode == 0, out.stderr[-3000:]
  return out.stdout


def test_records_go_where_given_and_by_default_beside_the_report(tmp_path):
  workdir = _finished_workdir(tmp_path / 'root')
  given = tmp_path / 'records'
  report = _compare(
    f'--workdir={tmp_path / "root"}', f'--report_dir={tmp_path / "a"}', f'--records={given}'
  )
  record = pathlib.Path(run_records.record_dir(str(given), SLUG, 0))
  for name in run_records.FILES:
    assert (record / name).read_bytes() == (workdir / name).read_bytes()
  assert not (tmp_path / 'a' / run_records.RECORDS_DIR).exists()
  assert (tmp_path / 'a' / 'report.md').read_text() + '\n' == report
  assert '| H-SCL(β) | H-SCL(β) (beta=1.0) | 87.50 | 99.00 |' in report
  assert (
    'The runs are read from their records in ../records/runs/ (one record per run, which '
    '[the report there](../records/report.md) reads too); written by `python -m '
    'hscl_jax.experiments.compare --config=configs/digits.py --config.num_epochs=2 --seeds=1 '
    '--grid=sigmoid '
    '--seeds_for=ucl=0,hucl=0,scl=0,hscl_tau=0,sig_scl=0,sig_hscl_beta=0 '
    f'--report_dir={tmp_path / "a"} --records={given}`.'
  ) in report.splitlines()
  # From the records alone (no workdir), and by default in the report's directory.
  shutil.copytree(given, tmp_path / 'b')
  again = _compare(f'--workdir={tmp_path / "gone"}', f'--report_dir={tmp_path / "b"}')
  assert 'The runs are read from' not in again
  source = [line for line in report.splitlines() if line.startswith('The runs are read')]
  assert again == report.replace(source[0] + '\n\n', '')
