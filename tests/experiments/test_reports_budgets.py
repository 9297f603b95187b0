"""The training-budget report: every figure it prints recomputed by hand from records
written here, on grids where a seed missing at one budget, pairing by position instead of
by seed, or a pair's move taken as a difference of means would change the answer."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import numpy as np
import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / 'tests'))

from acceptance import accepted  # noqa: E402
from acceptance import refused  # noqa: E402

from experiments.test_paired import expected_rows  # noqa: E402
from experiments.test_reports_densities import PROTOCOL  # noqa: E402
from experiments.test_reports_densities import base_config  # noqa: E402
from experiments.test_reports_densities import write_grid  # noqa: E402
from hscl_jax.experiments import grid as image_grid  # noqa: E402
from hscl_jax.experiments import reports as budget_grid  # noqa: E402

# (linear top-1, final kNN top-1) per budget, method and seed. Shared seeds: H-UCL 0-2
# (seed 3 only at 2 epochs), H-SCL(β) 0, 2, 3 (seed 1 only at 2 epochs), SCL 0-2; UCL never
# ran at 4 epochs, so it is in no table.
SHORT = {
  'UCL': {0: (0.30, 0.20), 1: (0.31, 0.22)},
  'H-UCL': {0: (0.40, 0.30), 1: (0.42, 0.33), 2: (0.41, 0.31), 3: (0.90, 0.90)},
  'SCL': {0: (0.41, 0.34), 1: (0.40, 0.31), 2: (0.44, 0.32)},
  'H-SCL(β)': {0: (0.43, 0.33), 1: (0.10, 0.10), 2: (0.42, 0.35), 3: (0.45, 0.36)},
}
LONG = {
  'H-UCL': {0: (0.46, 0.40), 1: (0.47, 0.38), 2: (0.45, 0.42)},
  'SCL': {0: (0.48, 0.41), 1: (0.44, 0.39), 2: (0.49, 0.37)},
  'H-SCL(β)': {0: (0.52, 0.45), 2: (0.47, 0.39), 3: (0.50, 0.44)},
}
SHARED = {'H-UCL': [0, 1, 2], 'SCL': [0, 1, 2], 'H-SCL(β)': [0, 2, 3]}
PAIRS = (('H-SCL(β)', 'SCL'), ('H-SCL(β)', 'H-UCL'))  # UCL's pairs: UCL has no shared seed
MEASURES = ((0, 'linear'), (1, 'kNN'))


def write_budget(records, epochs, grid):
  write_grid(records, grid, num_epochs=epochs)


def diff(grid, first, second, seeds, column):
  return {s: grid[first][s][column] - grid[second][s][column] for s in seeds}


def report_rows():
  """Every tested row by hand, in the report's order (one Holm family)."""
  rows = []
  for first, second in PAIRS:
    seeds = sorted(set(SHARED[first]) & set(SHARED[second]))
    for label, grid in (('2 epochs', SHORT), ('4 epochs', LONG)):
      for column, name in MEASURES:
        d = diff(grid, first, second, seeds, column)
        rows.append((f'{first} − {second} | {label} | {", ".join(map(str, seeds))} | {name}', d))
  for method in image_grid.METHODS:
    if method in SHARED:
      seeds = SHARED[method]
      for column, name in MEASURES:
        d = {s: LONG[method][s][column] - SHORT[method][s][column] for s in seeds}
        rows.append((f'{method} | 4 epochs − 2 epochs | {", ".join(map(str, seeds))} | {name}', d))
  for first, second in PAIRS:
    seeds = sorted(set(SHARED[first]) & set(SHARED[second]))
    for column, name in MEASURES:
      long, short = (diff(g, first, second, seeds, column) for g in (LONG, SHORT))
      moved = {s: long[s] - short[s] for s in seeds}
      prefix = f'{first} − {second} | 4 epochs − 2 epochs | {", ".join(map(str, seeds))} | {name}'
      rows.append((prefix, moved))
  return [(prefix, list(d.values())) for prefix, d in rows]


@pytest.fixture(scope='module')
def report(tmp_path_factory):
  root = tmp_path_factory.mktemp('budgets')
  write_budget(str(root / 'e4'), 4, LONG)  # written first: the order given is not the order
  write_budget(str(root / 'e2'), 2, SHORT)
  budgets = budget_grid.parse_budgets([f'4={root / "e4"}', f'2={root / "e2"}'])
  text = budget_grid.write_budget_report(base_config(), budgets, PROTOCOL, str(root / 'report'))
  return root, text


def test_every_paired_row_is_by_seed_over_the_seeds_of_every_budget(report):
  _, text = report
  rows = report_rows()
  want = expected_rows(rows)
  tested = [line for line in text.splitlines() if ' | linear | ' in line or ' | kNN | ' in line]
  assert tested == [want[prefix] for prefix, _ in rows]
  assert len(rows) == 18 and 'over the 18 t-tests of this report' in text
  # e.g. H-SCL(β) − H-UCL at 2 epochs over seeds 0, 2: linear +3, +1 (seed 1 and 3 would
  # give −32 and −45 had the unshared seeds been kept).
  assert '| H-SCL(β) − H-UCL | 2 epochs | 0, 2 | linear | 2 | +2.00 ± 1.41 |' in text
  assert 'UCL | ' not in text.replace('H-UCL', '')  # UCL has no seed at 4 epochs


def test_the_header_names_each_methods_shared_seeds_in_ascending_order(report):
  """The header's seeds are each method's seeds finished at every budget, lowest first
  (H-SCL(β): 0, 2, 3; its seed 1 ran only at 2 epochs); UCL, with none, is not named."""
  _, text = report
  header = next(line for line in text.splitlines() if 'finished at every budget: ' in line)
  named = header.split('finished at every budget: ', 1)[1].rstrip('.').split('; ')
  want = {f'{method} {", ".join(map(str, seeds))}' for method, seeds in SHARED.items()}
  assert set(named) == want


def test_table_one_per_budget_is_over_the_shared_seeds(report):
  _, text = report
  for method, seeds in SHARED.items():
    for column, key in ((0, 'Linear'), (1, 'kNN')):
      cells = []
      for grid in (SHORT, LONG):
        values = 100 * np.array([grid[method][s][column] for s in seeds])
        cells.append(f'{values.mean():.2f} ± {values.std(ddof=1):.2f} (n={len(seeds)})')
      assert f'| {method} | {" | ".join(cells)} |' in text, (method, key)
  assert 'H-SCL(β) 0, 2, 3' in text and 'H-UCL 0, 1, 2' in text


def first_epoch(final_knn, epochs, target):
  """write_record's kNN history: epoch e holds final − 0.1 (epochs − e); the mean over
  seeds first reaching `target`."""
  for epoch in range(1, epochs + 1):
    if np.mean(final_knn) - 0.1 * (epochs - epoch) >= target - 1e-12:
      return f'{epoch} of {epochs}'
  return 'not reached'


def test_fig1_measure_is_each_budgets_scl_final_knn(report):
  _, text = report
  cells = {m: [] for m in SHARED}
  targets = []
  for grid, epochs in ((SHORT, 2), (LONG, 4)):
    target = np.mean([grid['SCL'][s][1] for s in SHARED['SCL']])
    targets.append(f'{epochs} epochs (SCL {100 * target:.2f} %)')
    for method, seeds in SHARED.items():
      cells[method].append(first_epoch([grid[method][s][1] for s in seeds], epochs, target))
  assert f'| method | {" | ".join(targets)} |' in text
  for method in image_grid.METHODS:
    if method in cells:
      assert f'| {method} | {" | ".join(cells[method])} |' in text
  assert cells['H-UCL'] == ['not reached', '4 of 4']  # a case where the budgets differ


def test_a_budget_without_a_shared_seed_gives_no_report(tmp_path):
  write_budget(str(tmp_path / 'e2'), 2, {'SCL': {0: (0.4, 0.3)}})
  write_budget(str(tmp_path / 'e4'), 4, {'SCL': {1: (0.4, 0.3)}})
  budgets = [(2, str(tmp_path / 'e2')), (4, str(tmp_path / 'e4'))]
  assert (
    budget_grid.write_budget_report(base_config(), budgets, PROTOCOL, str(tmp_path / 'r')) is None
  )
  assert not (tmp_path / 'r').exists()


def test_budgets_are_parsed_or_refused_naming_the_item():
  with accepted('two budgets, one of a single epoch'):
    parsed = budget_grid.parse_budgets(['9=b', '1=a'])
  assert parsed == [(1, 'a'), (9, 'b')]
  for bad in (['9'], ['x=a'], ['9='], ['=a']):
    with refused(f"'{bad[0]}' is not E=REPORT_DIR"):
      budget_grid.parse_budgets(bad)
  with refused('each num_epochs may be given once'):
    budget_grid.parse_budgets(['3=a', '9=c', '3=b'])
  with refused('a budget needs at least 1 epoch'):
    budget_grid.parse_budgets(['0=a', '3=b'])


def test_the_program_writes_the_report_from_records(report, tmp_path):
  root, text = report
  out = subprocess.run(
    [sys.executable, '-m', 'hscl_jax.experiments.compare', '--config=configs/digits.py']
    + ['--config.batch_size=32', '--sweep=num_epochs', f'--points=2={root / "e2"},4={root / "e4"}']
    + [f'--report_dir={tmp_path}'],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert out.returncode == 0, out.stderr
  written = (tmp_path / budget_grid.REPORT_FILE).read_text()
  # The same tables as the library's (the links differ: relative to another directory).
  assert written.split('### Linear')[1] == text.split('### Linear')[1]


def test_a_sweep_without_its_points_or_report_dir_is_refused_naming_both():
  """compare --sweep reads records only: without --points or --report_dir it stops in one
  line naming both flags, before reading anything."""
  out = subprocess.run(
    [sys.executable, '-m', 'hscl_jax.experiments.compare', '--config=configs/digits.py']
    + ['--sweep=num_epochs', '--points=3=a'],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert out.returncode != 0
  assert (
    '--sweep=num_epochs needs --points=VALUE=REPORT_DIR,... and --report_dir=DIR.' in out.stderr
  )
  assert 'Traceback' not in out.stderr
