"""experiments/graph_grid: Table II's grid and report: every cell recomputed from the runs,
each setting's pairs by seed with their tests, the best β picked and finished runs reused,
the settings in the table's order, and the header listing what the runs used."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from configs import graphs as graphs_config
from experiments.test_paired import expected_rows
from hscl_jax import errors
from hscl_jax.experiments import graph_grid
from hscl_jax.graphs import train


def _graph_cell(values, repeats):
  """Mean ± std (ddof 1) in % to 0.1, (n=...) when fewer runs than repeats: by hand."""
  percent = 100 * np.asarray(values, np.float64)
  if len(percent) == 1:
    text = f'{percent[0]:.1f}'
  else:
    std = np.sqrt(((percent - percent.mean()) ** 2).sum() / (len(percent) - 1))
    text = f'{percent.mean():.1f} ± {std:.1f}'
  return text + (f' (n={len(percent)})' if len(percent) < repeats else '')


def test_table_report_cells_are_recomputed_from_the_runs():
  """Both tables of the report, every cell recomputed from the runs: per dataset and method
  the best mean β (a tie goes to the smaller β), mean ± std and the run count, and per
  setting the mean training and evaluation seconds (different figures here)."""
  datasets, betas, repeats = ['MUTAG', 'PTC'], [1.0, 2.0], 3
  rng = np.random.default_rng(3)
  runs = []
  for d, dataset in enumerate(datasets):
    for method, beta in graph_grid.settings(betas):
      for seed in range(3 if (method, beta) != ('scl', 0.0) else 2):  # SCL: 2 of 3 repeats
        accuracy = 0.5 + 0.1 * rng.random()
        if method == 'hucl' and dataset == 'PTC':
          accuracy = (0.61, 0.70, 0.79)[seed]  # both β: the same mean, a tie
        runs.append(
          {
            'dataset': dataset,
            'method': method,
            'beta': beta,
            'accuracy': accuracy,
            'protocol': 'unsupervised',
            'num_epochs': 20,
            'train_seconds': 10.0 + 7 * seed + d,
            'eval_seconds': 2.0 + seed,
          }
        )
  config = graphs_config.get_config()
  report = graph_grid.markdown_report(runs, datasets, betas, repeats, config)
  lines = report.splitlines()
  group = lambda dataset, method, beta: [
    r for r in runs if (r['dataset'], r['method'], r['beta']) == (dataset, method, beta)
  ]
  for method, label in graph_grid.METHODS.items():
    cells = []
    for dataset in datasets:
      candidates = [b for m, b in graph_grid.settings(betas) if m == method]
      means = [np.mean([r['accuracy'] for r in group(dataset, method, b)]) for b in candidates]
      beta = candidates[int(np.argmax(means))]  # argmax: the first (smaller β) of a tie
      cell = _graph_cell([r['accuracy'] for r in group(dataset, method, beta)], repeats)
      cells.append(cell + (f' (β={beta:g})' if method in ('hucl', 'hscl') else ''))
    assert f'| {label} | ' + ' | '.join(cells) + ' |' == next(
      line for line in lines if line.startswith(f'| {label} |')
    )
  assert '(β=1)' in next(line for line in lines if line.startswith('| H-UCL |')).split(' | ')[2]
  for dataset in datasets:
    for method, beta in graph_grid.settings(betas):
      own = group(dataset, method, beta)
      train_s = np.mean([r['train_seconds'] for r in own])
      eval_s = np.mean([r['eval_seconds'] for r in own])
      row = (
        f'| {dataset} | {graph_grid.setting_name(method, beta)} | {len(own)} | '
        f'{_graph_cell([r["accuracy"] for r in own], repeats)} | {train_s:.0f} | {eval_s:.0f} |'
      )
      assert row in lines
  assert f'{len(runs)} runs finished, 2 missing.' in report


def test_report_pairs_each_tables_setting_by_seed_with_its_tests():
  """Paired differences per dataset between the settings of Table II's rows (the hardened
  methods at their best-mean β), by seed over the seeds both have, with their tests (Holm
  over the table): H-SCL(β) at β = 1 (the best mean), not β = 2, and SCL lacks seed 0."""
  accuracy = {  # (method, β) -> seed -> accuracy
    ('ucl', 0.0): {0: 0.70, 1: 0.72, 2: 0.71},
    ('hucl', 1.0): {0: 0.73, 1: 0.72, 2: 0.76},
    ('hucl', 2.0): {0: 0.60, 1: 0.61, 2: 0.62},
    ('scl', 0.0): {1: 0.74, 2: 0.70},
    ('hscl', 1.0): {0: 0.75, 1: 0.77, 2: 0.74},
    ('hscl', 2.0): {0: 0.79, 1: 0.69, 2: 0.70},
  }
  runs = [
    {'dataset': 'MUTAG', 'method': m, 'beta': b, 'seed': seed, 'accuracy': a}
    | {'protocol': 'unsupervised', 'num_epochs': 20, 'train_seconds': 1.0, 'eval_seconds': 1.0}
    for (m, b), seeds in accuracy.items()
    for seed, a in seeds.items()
  ]
  report = graph_grid.markdown_report(runs, ['MUTAG'], [1.0, 2.0], 3, graphs_config.get_config())
  diff = lambda a, b, seeds: [accuracy[a][s] - accuracy[b][s] for s in seeds]
  hscl, hucl, scl, ucl = ('hscl', 1.0), ('hucl', 1.0), ('scl', 0.0), ('ucl', 0.0)
  rows = [
    ('H-SCL(β) − SCL | MUTAG | 1, 2', diff(hscl, scl, [1, 2])),
    ('H-SCL(β) − H-UCL | MUTAG | 0, 1, 2', diff(hscl, hucl, [0, 1, 2])),
    ('SCL − UCL | MUTAG | 1, 2', diff(scl, ucl, [1, 2])),
    ('H-UCL − UCL | MUTAG | 0, 1, 2', diff(hucl, ucl, [0, 1, 2])),
  ]
  want = expected_rows(rows)
  lines = report.splitlines()
  start = lines.index('## Paired differences (same seed; accuracy points)')
  assert lines[start + 4 : start + 8] == [want[prefix] for prefix, _ in rows]
  assert 'over the 4 t-tests of this report' in report
  # Runs that did not record their seed (older graph_eval.json) are not paired.
  unseeded = [{k: v for k, v in r.items() if k != 'seed'} for r in runs]
  assert 'Paired differences' not in graph_grid.markdown_report(
    unseeded, ['MUTAG'], [1.0, 2.0], 3, graphs_config.get_config()
  )


def test_table_report_picks_the_best_beta_and_reuses_finished_runs(tmp_path):
  config = graphs_config.get_config()
  accuracies = {
    ('ucl', 0.0): [0.80, 0.84],
    ('hucl', 1.0): [0.70, 0.72],
    ('hucl', 2.0): [0.90],
    ('scl', 0.0): [0.5, 0.6],
    ('hscl', 1.0): [0.6, 0.62],
  }
  for (method, beta), values in accuracies.items():
    for seed, accuracy in enumerate(values):
      workdir = graph_grid.run_dir(str(tmp_path), 'MUTAG', method, beta, seed)
      os.makedirs(workdir)
      record = {
        'dataset': 'MUTAG',
        'method': method,
        'beta': beta,
        'accuracy': accuracy,
        'protocol': 'unsupervised' if method in ('ucl', 'hucl') else 'leak_free',
        'num_epochs': 20,
        'train_seconds': 1.0,
        'eval_seconds': 2.0,
      }
      with open(os.path.join(workdir, train.EVAL_FILE), 'w') as f:
        json.dump(record, f)
  # A finished run is read back, not retrained (no data_dir needed).
  assert graph_grid.run_one(config, str(tmp_path), 'MUTAG', 'ucl', 0.0, 1, None)['accuracy'] == 0.84
  runs = graph_grid.collect(str(tmp_path), ['MUTAG'], [1.0, 2.0], 2)
  report = graph_grid.markdown_report(runs, ['MUTAG'], [1.0, 2.0], 2, config)
  rows = {}  # the first table (ours); the paper's table repeats the row names
  for line in report.splitlines():
    if line.startswith('| '):
      rows.setdefault(line.split(' | ')[0], line)
  assert '| UCL | 82.0 ± 2.8 |' in report  # mean ± std (ddof 1) of 80 and 84
  assert '90.0 (n=1) (β=2)' in rows['| H-UCL']  # best mean β, marked as one run of two
  assert '61.0 ± 1.4 (β=1)' in rows['| H-SCL(β)']
  assert '| 86.8 |' in report  # the paper's UCL on MUTAG
  assert '9 runs finished, 3 missing.' in report
  assert 'Local–global estimator: jsd (' in report  # runs without the field are JSD runs
  # Run directories are keyed by method and β: another estimator's finished run is no match.
  config.estimator = 'infonce'
  with pytest.raises(errors.ConfigError, match="^config.estimator: 'infonce', but .*Fix: "):
    graph_grid.run_one(config, str(tmp_path), 'MUTAG', 'ucl', 0.0, 1, None)


def test_run_grid_trains_only_unfinished_runs_and_writes_the_report(tmp_path, monkeypatch):
  """run_grid over MUTAG, betas (1, 2), methods ucl and hucl, 2 repeats: the run finished
  beforehand is read back, one held by another worker is skipped (None), every other run
  is trained once with the setting's method, β (the hardened methods only), seed and
  data_dir; report.md, rewritten after each repeat, is the report of the runs on disk."""
  config = graphs_config.get_config()
  calls = []

  def write_record(workdir, dataset, method, beta, seed):
    record = {
      'dataset': dataset,
      'method': method,
      'beta': beta if method == 'hucl' else 0.0,
      'accuracy': 0.5 + 0.1 * seed + 0.01 * beta,
      'protocol': 'unsupervised',
      'num_epochs': config.num_epochs,
      'train_seconds': 1.0,
      'eval_seconds': 2.0,
    }
    os.makedirs(workdir, exist_ok=True)
    with open(os.path.join(workdir, train.EVAL_FILE), 'w') as f:
      json.dump(record, f)
    return record

  def fake_run(run_config, workdir):
    key = (run_config.dataset, run_config.method, float(run_config.beta), run_config.seed)
    calls.append((key, run_config.data_dir, workdir))
    if key == ('MUTAG', 'hucl', 2.0, 1):
      raise graph_grid.workdir_lock.WorkdirBusyError('held by another worker')
    return write_record(workdir, *key)

  monkeypatch.setattr(graph_grid.train, 'run', fake_run)
  write_record(graph_grid.run_dir(str(tmp_path), 'MUTAG', 'ucl', 0.0, 0), 'MUTAG', 'ucl', 0.0, 0)
  graph_grid.run_grid(config, str(tmp_path), ['MUTAG'], [1.0, 2.0], ['ucl', 'hucl'], 2, '/tu')
  trained = [key for key, _, _ in calls]
  assert trained == [
    ('MUTAG', 'hucl', 1.0, 0),
    ('MUTAG', 'hucl', 2.0, 0),
    ('MUTAG', 'ucl', config.beta, 1),
    ('MUTAG', 'hucl', 1.0, 1),
    ('MUTAG', 'hucl', 2.0, 1),
  ]
  for (dataset, method, beta, seed), data_dir, workdir in calls:
    assert data_dir == '/tu'
    assert workdir == graph_grid.run_dir(
      str(tmp_path), dataset, method, beta if method == 'hucl' else 0.0, seed
    )
  runs = graph_grid.collect(str(tmp_path), ['MUTAG'], [1.0, 2.0], 2)
  assert len(runs) == 5  # 6 settings x seeds of ucl/hucl, less the busy one
  with open(tmp_path / 'report.md') as f:
    report = f.read()
  assert report == graph_grid.markdown_report(runs, ['MUTAG'], [1.0, 2.0], 2, config)
  path = graph_grid.write_report(str(tmp_path), ['MUTAG'], [1.0, 2.0], 2, config)
  assert path == str(tmp_path / 'report.md')


def test_grid_settings_follow_table_order_and_method_filter():
  every = graph_grid.settings([1.0, 10.0])
  assert [graph_grid.setting_name(m, b) for m, b in every] == [
    'ucl',
    'hucl_beta1',
    'hucl_beta10',
    'scl',
    'hscl_beta1',
    'hscl_beta10',
  ]
  assert graph_grid.settings([1.0, 10.0], ['scl', 'ucl']) == [('ucl', 0.0), ('scl', 0.0)]


def test_table_iis_header_lists_its_protocols_estimators_and_epochs_in_order():
  """Runs of two protocols, estimators and epoch counts, met in no order: the header names
  each once, in ascending order."""
  runs = [
    dict(protocol='paper', num_epochs=20, estimator='jsd'),
    dict(protocol='leak_free', num_epochs=5, estimator='infonce'),
    dict(protocol='paper', num_epochs=5),  # written before the option: jsd
  ]
  config = graphs_config.get_config()
  text = ' '.join(graph_grid._header(runs, [1.0, 2.0], 3, config))
  assert 'Local–global estimator: infonce, jsd (' in text
  assert 'InfoGraph GIN encoder, 5, 20 epochs,' in text
  assert 'Protocols: leak_free, paper (' in text


# experiments/graph_grid's grid: Table II's settings in order, each run's directory, a
# finished run reused (and one of another estimator refused) without training, and the
# finished runs a report reads. Its report's tables against the runs: above.


def test_settings_are_table_ii_rows_each_hardened_one_per_beta():
  assert graph_grid.settings([1.0, 0.5]) == [
    ('ucl', 0.0),
    ('hucl', 1.0),
    ('hucl', 0.5),
    ('scl', 0.0),
    ('hscl', 1.0),
    ('hscl', 0.5),
  ]
  assert graph_grid.settings([2.0], methods=('hscl', 'ucl')) == [('ucl', 0.0), ('hscl', 2.0)]
  names = [graph_grid.setting_name(m, b) for m, b in graph_grid.settings([1.0, 0.5])]
  assert names == ['ucl', 'hucl_beta1', 'hucl_beta0.5', 'scl', 'hscl_beta1', 'hscl_beta0.5']
  assert graph_grid.run_dir('R', 'MUTAG', 'hscl', 0.5, 2) == os.path.join(
    'R', 'MUTAG', 'hscl_beta0.5', 'seed_2'
  )


def _finish(root, dataset, method, beta, seed, **fields):
  """A finished run's graph_eval.json, as graphs/train writes it (the fields a report reads)."""
  run = dict(dataset=dataset, method=method, beta=beta, seed=seed, accuracy=0.5, **fields)
  workdir = graph_grid.run_dir(str(root), dataset, method, beta, seed)
  os.makedirs(workdir)
  with open(os.path.join(workdir, train.EVAL_FILE), 'w') as f:
    json.dump(run, f)
  return run


def test_a_finished_run_is_reused_and_one_of_another_estimator_refused(tmp_path, monkeypatch):
  monkeypatch.setattr(train, 'run', lambda *args: pytest.fail('trained a finished run'))
  base = graphs_config.get_config()
  jsd = _finish(tmp_path, 'MUTAG', 'hscl', 2.0, 0)  # written before the option: 'jsd'
  assert graph_grid.run_one(base, str(tmp_path), 'MUTAG', 'hscl', 2.0, 0, 'data') == jsd
  other = _finish(tmp_path, 'PTC', 'ucl', 0.0, 1, estimator='infonce')
  base.estimator = 'infonce'
  assert graph_grid.run_one(base, str(tmp_path), 'PTC', 'ucl', 0.0, 1, 'data') == other
  with pytest.raises(errors.ConfigError, match=r"^config\.estimator: 'infonce', but the"):
    graph_grid.run_one(base, str(tmp_path), 'MUTAG', 'hscl', 2.0, 0, 'data')


def test_a_report_reads_the_finished_runs_of_its_datasets_betas_and_repeats(tmp_path):
  wanted = [
    _finish(tmp_path, 'MUTAG', 'ucl', 0.0, 0),
    _finish(tmp_path, 'MUTAG', 'hucl', 1.0, 1),
    _finish(tmp_path, 'PTC', 'hscl', 1.0, 0),
  ]
  _finish(tmp_path, 'MUTAG', 'ucl', 0.0, 2)  # past the repeats
  _finish(tmp_path, 'MUTAG', 'hucl', 10.0, 0)  # another β
  _finish(tmp_path, 'ENZYMES', 'ucl', 0.0, 0)  # another dataset
  runs = graph_grid.collect(str(tmp_path), ['MUTAG', 'PTC'], [1.0], repeats=2)
  assert sorted(runs, key=json.dumps) == sorted(wanted, key=json.dumps)
