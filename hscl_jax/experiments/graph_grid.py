r"""Table II's grid: UCL, H-UCL, SCL and H-SCL(β) on graph datasets, and its report.

The library behind `python -m hscl_jax.experiments.compare_graphs`. Runs every setting
(UCL; H-UCL(β) and H-SCL(β) for each β; SCL) for seeds 0..N-1 (repeat k of every setting
before repeat k+1 of any) and writes ROOT/report.md: Table II's shape (accuracy %, mean ± std
over repeats; for the hardened methods the β with the best mean), the paired differences by
seed with their tests of significance, the paper's Table II, and every setting and run.
Finished runs (ROOT/DATASET/SETTING/seed_K/graph_eval.json) are reused; a run whose workdir
lock another process holds is skipped, so several processes can share one grid.
"""

from __future__ import annotations

import json
import os
import time

from absl import logging
import numpy as np

from hscl_jax import errors
from hscl_jax import progress
from hscl_jax.config import methods as method_table
from hscl_jax.experiments import paired
from hscl_jax.graphs import train
from hscl_jax.rundir import atomic
from hscl_jax.rundir import lock as workdir_lock

DATASETS = ('MUTAG', 'PTC', 'ENZYMES', 'IMDB-BINARY', 'IMDB-MULTI')
METHODS = {name: row.label for name, row in method_table.graph_rows().items()}  # name -> label
# Table II of the H-SCL paper (accuracy %), and InfoGraph's own published UCL numbers.
PAPER = {
  'MUTAG': (86.8, 87.2, 86.9, 87.2),
  'ENZYMES': (50.4, 50.4, 50.4, 50.7),
  'PTC': (55.3, 57.3, 55.8, 57.7),
  'IMDB-BINARY': (72.2, 72.8, 72.4, 73.0),
  'IMDB-MULTI': (49.6, 49.6, 49.9, 50.1),
}
INFOGRAPH = {
  'MUTAG': '89.0 ± 1.1',
  'PTC': '61.7 ± 1.4',
  'IMDB-BINARY': '73.0 ± 0.9',
  'IMDB-MULTI': '49.7 ± 0.5',
}


def settings(betas, methods=tuple(METHODS)) -> list[tuple[str, float]]:
  """(method, β) in Table II's order; β is 0 for the unhardened methods."""
  every = [(m, b) for m in METHODS for b in (betas if hardened(m) else [0.0])]
  return [(method, beta) for method, beta in every if method in methods]


def hardened(method: str) -> bool:
  """Whether a graph method's loss is tilted by β (its row's exponential hardening)."""
  return method_table.graph_rows()[method].hardening == 'exp'


def setting_name(method: str, beta: float) -> str:
  return f'{method}_beta{beta:g}' if hardened(method) else method


def run_dir(root: str, dataset: str, method: str, beta: float, seed: int) -> str:
  return os.path.join(root, dataset, setting_name(method, beta), f'seed_{seed}')


def estimator_of(run: dict) -> str:
  """A finished run's local–global estimator (runs written before the option: 'jsd')."""
  return run.get('estimator', 'jsd')


def run_one(base, root, dataset, method, beta, seed, data_dir) -> dict | None:
  """The run's graph_eval.json, training and evaluating it first if it is not finished;
  None if another process is running it (several workers can share one grid). A finished
  run of another estimator than ``base.estimator`` raises: run directories are keyed by
  method and β only, so each estimator needs its own ROOT."""
  workdir = run_dir(root, dataset, method, beta, seed)
  path = os.path.join(workdir, train.EVAL_FILE)
  if os.path.exists(path):
    with open(path) as f:
      result = json.load(f)
    if estimator_of(result) != base.estimator:
      errors.fail(
        'estimator',
        f'{base.estimator!r}, but the finished run {path} used {estimator_of(result)!r}',
        'give each estimator its own --workdir',
      )
    return result
  config = base.copy_and_resolve_references()
  config.unlock()
  config.dataset, config.data_dir, config.method, config.seed = dataset, data_dir, method, seed
  if hardened(method):
    config.beta = beta
  try:
    return train.run(config, workdir)
  except workdir_lock.WorkdirBusyError:
    return None


def collect(root: str, datasets, betas, repeats: int) -> list[dict]:
  runs = []
  for dataset in datasets:
    for method, beta in settings(betas):
      for seed in range(repeats):
        path = os.path.join(run_dir(root, dataset, method, beta, seed), train.EVAL_FILE)
        if os.path.exists(path):
          with open(path) as f:
            runs.append(json.load(f))
  return runs


def _cell(values, repeats: int) -> str:
  """Mean ± std in %; fewer runs than ``repeats`` are marked (n=...)."""
  if not values:
    return '—'
  values = 100 * np.asarray(values)
  cell = (
    f'{values[0]:.1f}' if len(values) == 1 else f'{values.mean():.1f} ± {values.std(ddof=1):.1f}'
  )
  return cell + (f' (n={len(values)})' if len(values) < repeats else '')


def summarise(runs: list[dict]) -> dict[tuple[str, str, float], list[float]]:
  """(dataset, method, β) -> accuracies over repeats."""
  table = {}
  for r in runs:
    table.setdefault((r['dataset'], r['method'], float(r['beta'])), []).append(r['accuracy'])
  return table


def best_beta(table, dataset: str, method: str, betas) -> float | None:
  """The β with the highest mean accuracy (ties: the smaller β)."""
  scored = [
    (np.mean(table[(dataset, method, b)]), -b) for b in betas if (dataset, method, b) in table
  ]
  return -max(scored)[1] if scored else None


def _header(runs, betas, repeats, config) -> list[str]:
  protocols = sorted({r['protocol'] for r in runs})
  estimators = sorted({estimator_of(r) for r in runs}) or [config.estimator]
  epochs = sorted({r['num_epochs'] for r in runs})
  return [
    '# Table II: graph classification accuracy (%)',
    '',
    f"Local–global estimator: {', '.join(estimators)} (jsd = InfoGraph's Jensen–Shannon, as "
    "the paper's Table II; infonce = eq. (3) over the node–graph pairs). "
    f'InfoGraph GIN encoder, {", ".join(map(str, epochs))} epochs, batch '
    f'{config.batch_size}, Adam lr {config.learning_rate}; RBF SVM, C by 5-fold inner search, '
    f'10-fold stratified CV; mean ± std (ddof 1) over up to {repeats} repeats. '
    f'Protocols: {", ".join(protocols)} (SCL/H-SCL leak-free = one encoder per CV fold, '
    "trained on that fold's training graphs only). Hardened rows: the β in "
    f'{{{", ".join(f"{b:g}" for b in betas)}}} with the best mean.',
    '',
  ]


def _table_header(datasets) -> list[str]:
  return ['| method | ' + ' | '.join(datasets) + ' |', '|---' * (len(datasets) + 1) + '|']


def _results_table(runs, datasets, betas, repeats) -> list[str]:
  table = summarise(runs)
  lines = _table_header(datasets)
  for method, label in METHODS.items():
    cells = []
    for dataset in datasets:
      beta = best_beta(table, dataset, method, betas) if hardened(method) else 0.0
      values = table.get((dataset, method, beta), []) if beta is not None else []
      cell = _cell(values, repeats)
      if hardened(method) and values:
        cell += f' (β={beta:g})'
      cells.append(cell)
    lines.append(f'| {label} | ' + ' | '.join(cells) + ' |')
  return lines


# Table II's claims as pairs: the methods table's (paired.PAIRS), by method name.
PAIRS = tuple(
  tuple(method_table.by_label(label).name for label in pair) for pair in method_table.PAIRS
)


def seed_accuracies(runs, dataset: str, method: str, beta: float | None) -> dict[int, float]:
  """Seed -> accuracy of one setting's runs that recorded their seed."""
  return {
    r['seed']: r['accuracy']
    for r in runs
    if 'seed' in r and (r['dataset'], r['method'], float(r['beta'])) == (dataset, method, beta)
  }


def _paired_table(runs, datasets, betas) -> list[str]:
  """PAIRS' per-seed accuracy differences per dataset (each method at the β of its
  Table II row), with their tests of significance (Holm over this table's rows)."""
  table = summarise(runs)
  chosen = lambda dataset, method: (
    best_beta(table, dataset, method, betas) if hardened(method) else 0.0
  )
  rows = []
  for first, second in PAIRS:
    for dataset in datasets:
      a, b = (seed_accuracies(runs, dataset, m, chosen(dataset, m)) for m in (first, second))
      seeds = sorted(set(a) & set(b))
      if seeds:
        pair = f'{METHODS[first]} − {METHODS[second]} | {dataset} | {", ".join(map(str, seeds))}'
        rows.append((pair, [a[s] - b[s] for s in seeds]))
  if not rows:
    return []
  lines, tests = paired.table_lines(rows)
  return [
    '',
    '## Paired differences (same seed; accuracy points)',
    '',
    f'| pair | dataset | seeds | {paired.HEADER} |',
    f'|---|---|---|{paired.ALIGN}|',
    *lines,
    '',
    paired.how_to_read(tests),
  ]


def _paper_table(datasets) -> list[str]:
  lines = ['', "The paper's Table II (10 runs; protocol for SCL/H-SCL not stated):", '']
  lines += _table_header(datasets)
  for i, label in enumerate(METHODS.values()):
    cells = [f'{PAPER[d][i]:.1f}' if d in PAPER else '—' for d in datasets]
    lines.append(f'| {label} | ' + ' | '.join(cells) + ' |')
  infograph = ' | '.join(INFOGRAPH.get(d, '—') for d in datasets)
  return lines + [f'| InfoGraph (its paper) | {infograph} |']


def _every_setting(runs, datasets, betas, repeats) -> list[str]:
  lines = [
    '',
    '## Every setting',
    '',
    '| dataset | setting | runs | accuracy % | train s/run | eval s/run |',
    '|---|---|---|---|---|---|',
  ]
  for dataset in datasets:
    for method, beta in settings(betas):
      group = [
        r
        for r in runs
        if r['dataset'] == dataset and r['method'] == method and float(r['beta']) == beta
      ]
      if not group:
        lines.append(f'| {dataset} | {setting_name(method, beta)} | 0 | — | — | — |')
        continue
      lines.append(
        f'| {dataset} | {setting_name(method, beta)} | {len(group)} | '
        f'{_cell([r["accuracy"] for r in group], repeats)} | '
        f'{np.mean([r["train_seconds"] for r in group]):.0f} | '
        f'{np.mean([r["eval_seconds"] for r in group]):.0f} |'
      )
  return lines


def markdown_report(runs, datasets, betas, repeats, config) -> str:
  lines = _header(runs, betas, repeats, config) + _results_table(runs, datasets, betas, repeats)
  lines += _paired_table(runs, datasets, betas)
  lines += _paper_table(datasets) + _every_setting(runs, datasets, betas, repeats)
  missing = len(datasets) * len(settings(betas)) * repeats - len(runs)
  lines += ['', f'{len(runs)} runs finished' + (f', {missing} missing.' if missing > 0 else '.')]
  return '\n'.join(lines) + '\n'


def write_report(root, datasets, betas, repeats, config) -> str:
  runs = collect(root, datasets, betas, repeats)
  path = os.path.join(root, 'report.md')
  atomic.write_text(path, markdown_report(runs, datasets, betas, repeats, config))
  return path


def run_grid(base, root, datasets, betas, methods, repeats: int, data_dir) -> None:
  """Runs the grid's unfinished runs of `methods`, rewriting the report after each repeat."""
  plan = settings(betas, methods)
  total = len(datasets) * len(plan) * repeats
  done, start = 0, time.perf_counter()
  for seed in range(repeats):
    for dataset in datasets:
      for method, beta in plan:
        result = run_one(base, root, dataset, method, beta, seed, data_dir)
        done += 1
        outcome = 'run by another worker' if result is None else f'{result["accuracy"]:.4f}'
        logging.info(
          '[%d/%d, %s] %s %s seed %d: %s',
          done,
          total,
          progress.format_duration(time.perf_counter() - start),
          dataset,
          setting_name(method, beta),
          seed,
          outcome,
        )
      write_report(root, datasets, betas, repeats, base)
