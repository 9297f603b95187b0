"""The comparison's plan with per-method seeds, its paired differences and its count of
same-class samples per batch, each against a computation by hand."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import numpy as np
import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # `from configs import ...`, as from the repo root

from configs import digits  # noqa: E402
from hscl_jax import data  # noqa: E402
from hscl_jax.experiments import grid as image_grid  # noqa: E402
from hscl_jax.experiments import reports as image_batches  # noqa: E402
from hscl_jax.experiments import reports as image_report  # noqa: E402

sys.path.insert(0, str(REPO / 'tests'))
from experiments.test_paired import expected_rows  # noqa: E402


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


def _run(setting, seed, top1, knn):
  return {
    'setting': setting,
    'seed': seed,
    'history': [{'epoch': 1, 'knn_top1': knn}],
    'linear': {'top1': top1, 'top5': 1.0},
  }


# linear top-1, kNN top-1 per method and seed; SCL and H-SCL(β) have 4. H-UCL lacks seed
# 0, not the last: its runs sit at positions 0, 1 with seeds 1, 2, so pairing runs by
# position instead of by seed gives other differences.
GRID = {
  'UCL': {0: (0.40, 0.30), 1: (0.42, 0.33), 2: (0.41, 0.31)},
  'H-UCL': {1: (0.44, 0.32), 2: (0.40, 0.36)},
  'SCL': {0: (0.45, 0.35), 1: (0.44, 0.34), 2: (0.47, 0.38), 3: (0.46, 0.36)},
  'H-SCL(β)': {0: (0.47, 0.36), 1: (0.43, 0.37), 2: (0.50, 0.38), 3: (0.49, 0.39)},
}


def test_paired_table_matches_a_hand_computation():
  config = digits.get_config()
  by_method = {s.method: s for s in image_grid.settings(config, set())}
  runs = [
    _run(by_method[m], seed, *values) for m, seeds in GRID.items() for seed, values in seeds.items()
  ]
  summary = image_report.summarise(runs)
  best = image_report.best_per_method(summary)
  table = image_report.paired_table(summary, best)
  # Per seed, first − second over the seeds both finished (by position instead, H-UCL's
  # seeds 1, 2 would pair with 0, 1): linear then kNN, Holm over the table's 8 rows.
  rows = [
    ('H-SCL(β) − SCL | 0, 1, 2, 3 | linear', [0.02, -0.01, 0.03, 0.03]),
    ('H-SCL(β) − SCL | 0, 1, 2, 3 | kNN', [0.01, 0.03, 0.0, 0.03]),  # the zero is dropped
    ('H-SCL(β) − H-UCL | 1, 2 | linear', [-0.01, 0.10]),
    ('H-SCL(β) − H-UCL | 1, 2 | kNN', [0.05, 0.02]),
    ('SCL − UCL | 0, 1, 2 | linear', [0.05, 0.02, 0.06]),
    ('SCL − UCL | 0, 1, 2 | kNN', [0.05, 0.01, 0.07]),
    ('H-UCL − UCL | 1, 2 | linear', [0.02, -0.01]),
    ('H-UCL − UCL | 1, 2 | kNN', [-0.01, 0.05]),
  ]
  want = expected_rows(rows)
  assert [line for line in table if line.startswith('| H-') or line.startswith('| SCL')] == [
    want[prefix] for prefix, _ in rows
  ]
  assert 'over the 8 t-tests of this report' in table[-2]


def test_same_class_count_is_that_of_the_loaders_batches():
  """Counted in the batches the training loader really gives, per seed and epoch."""
  labels = np.random.default_rng(0).integers(0, 7, size=50).astype(np.int32)
  source = data.ArraySource(np.zeros((50, 2, 2, 3), np.uint8), labels, 7)
  for seed in (0, 3):
    loader = data.TrainLoader(source, global_batch_size=16, seed=seed, shard_index=0, shard_count=1)
    others = []
    for _ in range(2 * 3):  # 2 epochs of 3 batches (2 of the 50 examples dropped per epoch)
      batch = next(loader)['label']
      others += [int((batch == label).sum()) - 1 for label in batch]
    mean, with_one = image_batches.same_class_per_anchor(labels, 16, seed, num_epochs=2)
    assert mean == pytest.approx(np.mean(others)) and 0 < mean < 15
    assert with_one == pytest.approx(np.mean(np.array(others) > 0)) and 0 < with_one < 1


def counted_in_loader(labels, batch_size, seeds, num_epochs, samples_per_class=0):
  """(Same-class samples per anchor, fraction of anchors with one), counted in the training
  loader's own batches of every seed and epoch."""
  source = data.ArraySource(np.zeros((len(labels), 1, 1, 3), np.uint8), labels, labels.max() + 1)
  others = []
  for seed in seeds:
    loader = data.TrainLoader(
      source,
      global_batch_size=batch_size,
      seed=seed,
      samples_per_class=samples_per_class,
      shard_index=0,
      shard_count=1,
    )
    for _ in range(num_epochs * loader.steps_per_epoch):
      batch = next(loader)['label']
      others += [int((batch == label).sum()) - 1 for label in batch]
  return np.mean(others), np.mean(np.array(others) > 0)


def test_labels_in_a_batch_table_has_every_setting_from_its_own_runs():
  """One row per setting over its own seeds, from the run's config (batch, sampling): a
  setting counted over another's seeds, or the uniform order for a class-aware run, shows."""
  config = digits.get_config()
  config.batch_size, config.num_epochs = 64, 2
  by_method = {s.method: s for s in image_grid.settings(config, set())}
  plan = [(by_method['UCL'], 0), (by_method['UCL'], 1), (by_method['SCL'], 2)]
  labels = data.run_sources(config)[0].labels()

  counted = lambda seeds: counted_in_loader(labels, 64, seeds, num_epochs=2)
  table = '\n'.join(image_batches.batch_composition(config, plan))
  ucl, scl = counted([0, 1]), counted([2])
  assert f'| UCL | 0, 1 | 64 | uniform | {ucl[0]:.2f} | {100 * ucl[1]:.1f} % |' in table
  assert f'| SCL | 2 | 64 | uniform | {scl[0]:.2f} | {100 * scl[1]:.1f} % |' in table
  assert f'{ucl[0]:.2f}' != f'{counted([0])[0]:.2f}'  # both seeds count
  config.samples_per_class = 16
  table = '\n'.join(image_batches.batch_composition(config, plan[:1]))
  assert '| UCL | 0 | 64 | class-aware, 16 per class | 15.00 | 100.0 % |' in table


def test_compare_refuses_unknown_grids_naming_them_in_order():
  out = subprocess.run(
    [sys.executable, '-m', 'hscl_jax.experiments.compare', '--config=configs/digits.py',
     '--grid=zeta,beta,alpha', '--report_only'],
    cwd=REPO, capture_output=True, text=True, timeout=300,
  )  # fmt: skip
  assert out.returncode != 0
  assert "--grid takes beta, tau, queue and/or sigmoid, got ['alpha', 'zeta']." in out.stderr
