"""The graph experiment: TU reader, batches, GIN encoder, SVM protocol, program, prepare."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import zipfile

from acceptance import accepted
import jax
import jax.numpy as jnp
import numpy as np
from progress_lines import progress_lines
import pytest
from test_models import jit_apply
from test_significance import expected_rows
from transfer_guard import no_implicit_transfers

from configs import graphs as graphs_config
from hscl_jax import losses
from hscl_jax import progress
from hscl_jax.experiments import graph_grid
from hscl_jax.graphs import data
from hscl_jax.graphs import evaluate
from hscl_jax.graphs import model as model_lib
from hscl_jax.graphs import prepare as graph_prepare
from hscl_jax.graphs import train

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The five benchmark datasets beside the repository (or wherever HSCL_TU_DIR points).
SHARED_TU = os.environ.get('HSCL_TU_DIR', os.path.join(REPO, '..', 'shared', 'data', 'tu'))


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


def toy_graphs(num_graphs=40, seed=0):
  """Cycles (label 7) and stars (label -1) of 4..9 nodes: [(edges, label)], 0-based nodes."""
  rng = np.random.default_rng(seed)
  graphs = []
  for i in range(num_graphs):
    n = int(rng.integers(4, 10))
    if i % 2:
      edges = [(k, (k + 1) % n) for k in range(n)]
      label = 7
    else:
      edges = [(0, k) for k in range(1, n)]
      label = -1
    graphs.append((n, edges, label))
  return graphs


def write_tu(folder, name, graphs, node_labels=None):
  """Writes NAME_A / graph_indicator / graph_labels (/ node_labels) as the TU collection does."""
  path = os.path.join(folder, name)
  os.makedirs(path, exist_ok=True)
  rows, indicator, offset = [], [], 0
  for g, (n, edges, _) in enumerate(graphs):
    for a, b in edges:
      rows += [(a + offset + 1, b + offset + 1), (b + offset + 1, a + offset + 1)]
    indicator += [g + 1] * n
    offset += n
  with open(os.path.join(path, f'{name}_A.txt'), 'w') as f:
    f.writelines(f'{a}, {b}\n' for a, b in rows)
  with open(os.path.join(path, f'{name}_graph_indicator.txt'), 'w') as f:
    f.writelines(f'{g}\n' for g in indicator)
  with open(os.path.join(path, f'{name}_graph_labels.txt'), 'w') as f:
    f.writelines(f'{label}\n' for _, _, label in graphs)
  if node_labels is not None:
    with open(os.path.join(path, f'{name}_node_labels.txt'), 'w') as f:
      f.writelines(f'{v}\n' for v in node_labels)
  return path


@pytest.fixture
def toy_dir(tmp_path):
  write_tu(str(tmp_path), 'TOY', toy_graphs())
  return str(tmp_path)


# --------------------------------------------------------------------------------------
# Reader and batches.


def test_reader_remaps_labels_and_uses_one_hot_degrees(toy_dir):
  graphs = toy_graphs()
  ds = data.load_tu('TOY', toy_dir)
  assert ds.num_graphs == 40 and ds.num_classes == 2 and ds.feature_kind == 'degree'
  np.testing.assert_array_equal(ds.labels, [1 if label == 7 else 0 for _, _, label in graphs])
  degrees = []
  for n, edges, _ in graphs:
    degrees += list(np.bincount(np.ravel(edges), minlength=n))
  assert ds.feature_dim == max(degrees) + 1
  np.testing.assert_array_equal(ds.features.argmax(1), degrees)
  np.testing.assert_array_equal(ds.features.sum(1), 1.0)
  np.testing.assert_array_equal(ds.node_counts, [n for n, _, _ in graphs])
  # One edge count per graph: its edges in both directions, as the file lists them.
  np.testing.assert_array_equal(ds.edge_counts, [2 * len(edges) for _, edges, _ in graphs])


def test_reader_uses_node_labels_when_present(tmp_path):
  graphs = toy_graphs(6)
  total = sum(n for n, _, _ in graphs)
  node_labels = np.array([3, 9, 5])[np.arange(total) % 3]
  write_tu(str(tmp_path), 'LAB', graphs, node_labels)
  ds = data.load_tu('LAB', str(tmp_path))
  assert ds.feature_kind == 'node_label' and ds.feature_dim == 3
  np.testing.assert_array_equal(ds.codes, np.searchsorted([3, 5, 9], node_labels))


@pytest.mark.parametrize(
  'broken, expected',
  [
    (
      'missing',
      'TOY_graph_labels.txt: file not found. Fix: download it with  python -m '
      'hscl_jax.prepare --dataset=TOY',
    ),
    ('malformed', "TOY_A.txt:3: expected 2 integer(s) per line, got '5; x'"),
    ('short', "TOY_A.txt:3: expected 2 integer(s) per line, got '5'"),
    ('long', "TOY_A.txt:3: expected 2 integer(s) per line, got '5, 6, 7'"),
    ('count', 'TOY_graph_labels.txt: 39 labels for 40 graphs'),
  ],
)
def test_reader_errors_name_the_file_and_the_fix(toy_dir, broken, expected):
  folder = os.path.join(toy_dir, 'TOY')
  if broken == 'missing':
    os.remove(os.path.join(folder, 'TOY_graph_labels.txt'))
  elif broken in ('malformed', 'short', 'long'):
    with open(os.path.join(folder, 'TOY_A.txt')) as f:
      lines = f.readlines()
    lines[2] = {'malformed': '5; x\n', 'short': '5\n', 'long': '5, 6, 7\n'}[broken]
    with open(os.path.join(folder, 'TOY_A.txt'), 'w') as f:
      f.writelines(lines)
  else:
    with open(os.path.join(folder, 'TOY_graph_labels.txt')) as f:
      lines = f.readlines()
    with open(os.path.join(folder, 'TOY_graph_labels.txt'), 'w') as f:
      f.writelines(lines[:-1])
  with pytest.raises(Exception) as error:  # any exception: the assertion names a wrong one
    data.load_tu('TOY', toy_dir)
  assert isinstance(error.value, data.GraphDataError), repr(error.value)
  message = str(error.value)
  assert expected in message and '\n' not in message and 'Fix:' in message


def test_batches_are_shuffled_by_seed_and_cover_every_graph(toy_dir):
  ds = data.load_tu('TOY', toy_dir)

  def take(seed):
    return data.epoch_batches(np.arange(40), 16, 3, np.random.default_rng(seed))

  a, b, c = take(0), take(0), take(1)
  assert [len(x) for x in a] == [16, 16, 8]
  np.testing.assert_array_equal(np.sort(np.concatenate(a)), np.arange(40))
  np.testing.assert_array_equal(np.concatenate(a), np.concatenate(b))
  assert not np.array_equal(np.concatenate(a), np.concatenate(c))
  budget = data.budget_for(ds, a, 16)
  batch = data.make_batch(ds, a[2], budget)
  assert batch['graph_mask'].sum() == 8
  assert batch['node_mask'].sum() == ds.node_counts[a[2]].sum()
  real_edges = ds.edge_counts[a[2]].sum()
  assert np.all(batch['receivers'][real_edges:] == budget.nodes)  # dropped by segment sums


def test_the_budget_fits_the_largest_planned_batch(toy_dir):
  """The most nodes and the most edges of any batch of the plan (here 16, 16 and 8
  graphs), counted from the toy graphs; rounded up to the multiples asked."""
  graphs = toy_graphs()
  ds = data.load_tu('TOY', toy_dir)
  batches = data.epoch_batches(np.arange(40), 16, 3, np.random.default_rng(0))
  nodes = [sum(graphs[g][0] for g in b) for b in batches]
  edges = [sum(2 * len(graphs[g][1]) for g in b) for b in batches]
  assert min(nodes) < max(nodes) and min(edges) < max(edges)
  exact = data.budget_for(ds, batches, 16, node_multiple=1, edge_multiple=1)
  assert exact == data.Budget(graphs=16, nodes=max(nodes), edges=max(edges))
  rounded = data.budget_for(ds, batches, 16, node_multiple=64, edge_multiple=128)
  assert rounded == data.Budget(16, -(-max(nodes) // 64) * 64, -(-max(edges) // 128) * 128)


# --------------------------------------------------------------------------------------
# Encoder.


def _forward(ds, graphs, budget, variables=None, permute_seed=None):
  batch = data.make_batch(ds, graphs, budget)
  if permute_seed is not None:  # relabel the real nodes of the batch
    n = int(batch['node_mask'].sum())
    perm = np.random.default_rng(permute_seed).permutation(n)
    inverse = np.argsort(perm)
    for key in ('codes', 'node_graph'):
      batch[key][:n] = batch[key][:n][perm]
    e = batch['receivers'] < budget.nodes
    batch['senders'][e] = inverse[batch['senders'][e]]
    batch['receivers'][e] = inverse[batch['receivers'][e]]
  model = model_lib.InfoGraph(feature_dim=ds.feature_dim)
  batch = jax.tree.map(jnp.asarray, batch)
  if variables is None:
    variables = model.init(jax.random.key(0), batch, train=False)

  def loss(params, batch):
    (local, graph), _ = model.apply(
      {**variables, 'params': params}, batch, train=True, mutable=['batch_stats']
    )
    return losses.local_global_jsd(
      local,
      graph,
      batch['node_graph'],
      hardening=losses.exponential(2.0),
      node_mask=batch['node_mask'],
      graph_mask=batch['graph_mask'],
    )

  # Jitted: eagerly, each operation is a program of its own to compile (~30 s in all).
  value, grads = jax.jit(jax.value_and_grad(loss))(variables['params'], batch)
  embedding = jit_apply(model, method=model.embed)(variables, batch)[: len(graphs)]
  return variables, value, grads, embedding


def test_encoder_is_node_permutation_and_padding_invariant(toy_dir):
  ds = data.load_tu('TOY', toy_dir)
  graphs = np.arange(0, 24)
  small = data.Budget(graphs=24, nodes=256, edges=512)
  large = data.Budget(graphs=30, nodes=512, edges=1024)
  variables, value, grads, embedding = _forward(ds, graphs, small)
  assert embedding.shape == (24, 96)
  for budget, permute in ((small, 1), (large, None), (large, 2)):
    _, v, g, e = _forward(ds, graphs, budget, variables, permute)
    np.testing.assert_allclose(v, value, rtol=2e-5)
    np.testing.assert_allclose(e, embedding, rtol=2e-5, atol=2e-5)
    jax.tree.map(_assert_close_at_the_leafs_scale, g, grads)


def test_linear_layers_start_as_pytorchs_uniform_within_one_over_root_fan_in(toy_dir):
  # InfoGraph's layers keep PyTorch's nn.Linear default: weights U(-1/sqrt(fan_in), +...).
  ds = data.load_tu('TOY', toy_dir)
  variables, *_ = _forward(ds, np.arange(0, 24), data.Budget(graphs=24, nodes=256, edges=512))
  kernels = {
    jax.tree_util.keystr(path): np.asarray(leaf)
    for path, leaf in jax.tree_util.tree_leaves_with_path(variables['params'])
    if 'kernel' in jax.tree_util.keystr(path)
  }
  assert len(kernels) == 1 + 2 * 3 - 1 + 2 * 4  # GIN (input, 5 Dense), 2 heads of 4 Dense
  for name, kernel in kernels.items():
    bound = 1 / np.sqrt(kernel.shape[0])
    # Hundreds of draws or more each: their largest magnitude is within 10 % of the bound.
    assert 0.9 * bound < np.abs(kernel).max() <= bound, name


def _assert_close_at_the_leafs_scale(actual, desired):
  """rtol 2e-3, and an atol of 1e-5 of the leaf's largest entry: an entry that is a sum
  of terms of that size cancelling to ~0 keeps their float32 rounding (seen: -1.1e-5 vs
  1.7e-5 in a leaf whose largest entry is 190, after the nodes were permuted)."""
  atol = 1e-5 * float(np.abs(desired).max())
  np.testing.assert_allclose(actual, desired, rtol=2e-3, atol=atol)


# --------------------------------------------------------------------------------------
# Evaluation protocol.


def test_svm_protocol_separates_separable_embeddings_and_not_noise():
  rng = np.random.default_rng(0)
  labels = np.repeat([0, 1, 2], 30)
  separable = rng.normal(size=(90, 8)) + 6.0 * np.eye(8)[labels]
  folds = evaluate.outer_folds(labels, 10, seed=0)
  assert all(np.bincount(labels[test], minlength=3).tolist() == [3, 3, 3] for _, test in folds)
  good = evaluate.cross_validate(separable, labels, folds)
  assert good['accuracy'] == 1.0 and len(good['fold_accuracies']) == 10
  noise = evaluate.cross_validate(rng.normal(size=(90, 8)), labels, folds)
  assert noise['accuracy'] < 0.6
  per_fold = [separable if k % 2 else rng.normal(size=(90, 8)) for k in range(10)]
  mixed = evaluate.cross_validate(per_fold, labels, folds)  # one embedding per fold is used
  np.testing.assert_array_equal(np.array(mixed['fold_accuracies'])[1::2], 1.0)


# --------------------------------------------------------------------------------------
# Program.


def _config(data_dir, **overrides):
  config = graphs_config.get_config()
  config.dataset, config.data_dir = 'TOY', data_dir
  config.num_epochs, config.batch_size = 2, 16
  config.eval.num_folds, config.eval.inner_folds = 4, 2
  config.eval.svm_cs = (1.0, 100.0)
  config.update(overrides)
  return config


def test_config_errors_are_one_line_naming_the_field(toy_dir):
  for field, value in (
    ('method', 'infograph'),
    ('protocol', 'mixed'),
    ('data_dir', None),
    ('batch_size', 0),
    ('beta', -1.0),
  ):
    config = _config(toy_dir, method='hscl')
    config[field] = value
    with pytest.raises(train.GraphConfigError, match=f'^config.{field}: .*Fix: '):
      train.validate_config(config)


@pytest.mark.parametrize(
  'field, bound, past',
  [
    ('beta', 0.0, -1e-6),
    ('learning_rate', 1e-6, 0.0),
    ('learning_rate', 1e-6, -0.01),
    ('batch_size', 1, 0),
    ('num_epochs', 1, 0),
    ('model.hidden', 1, 0),
    ('model.num_layers', 1, 0),
    ('eval.batch_size', 1, 0),
    ('log_every_epochs', 1, 0),
    ('eval.num_folds', 2, 1),
    ('eval.inner_folds', 2, 1),
  ],
)
def test_each_config_bound_is_accepted_and_one_past_it_refused(toy_dir, field, bound, past):
  config = _config(toy_dir, method='hscl')
  section, _, name = field.rpartition('.')
  node = config[section] if section else config
  node[name] = bound
  with accepted(f'config.{field} = {bound}'):
    train.validate_config(config)
  node[name] = past
  reported = 'eval.num_folds' if section == 'eval' and 'folds' in name else field
  with pytest.raises(train.GraphConfigError, match=f'^config.{re.escape(reported)}: .*Fix: '):
    train.validate_config(config)


def test_unknown_estimator_is_one_line_naming_the_valid_values(toy_dir):
  config = _config(toy_dir, estimator='nce')
  with pytest.raises(train.GraphConfigError) as error:
    train.validate_config(config)
  assert str(error.value) == (
    "config.estimator: unknown value 'nce'. Fix: use one of jsd, infonce."
  )


@pytest.mark.parametrize(
  'method, protocol, encoders, estimator',
  [
    ('hucl', 'leak_free', 1, 'jsd'),
    ('hscl', 'leak_free', 4, 'jsd'),
    ('scl', 'transductive', 1, 'jsd'),
    ('hscl', 'transductive', 1, 'infonce'),
  ],
)
def test_end_to_end_tiny_run(toy_dir, tmp_path, monkeypatch, method, protocol, encoders, estimator):
  """Under the transfer guard: every transfer of the graph program explicit."""
  workdir = str(tmp_path / 'run')
  config = _config(toy_dir, method=method, protocol=protocol, estimator=estimator)
  train_encoders = train.train_encoders

  def slower_training(*args, **kwargs):  # at least 1.5 s: its reported time must show it
    time.sleep(1.5)
    return train_encoders(*args, **kwargs)

  monkeypatch.setattr(train, 'train_encoders', slower_training)
  with no_implicit_transfers():
    start = time.perf_counter()
    result = train.run(config, workdir)
    seconds = time.perf_counter() - start
  with open(os.path.join(workdir, 'graph_eval.json')) as f:
    written = json.load(f)
  assert written == result
  assert 1.5 <= result['train_seconds'] < seconds  # the training's, within the run's
  assert result['protocol'] == ('unsupervised' if method == 'hucl' else protocol)
  assert (result['method'], result['dataset'], result['num_encoders']) == (method, 'TOY', encoders)
  assert result['estimator'] == estimator
  assert len(result['fold_accuracies']) == 4
  assert result['accuracy'] == pytest.approx(np.mean(result['fold_accuracies']))
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    records = [json.loads(line) for line in f]
  assert [r['epoch'] for r in records] == [1, 2]
  assert len(records[0]['loss_per_encoder']) == encoders
  if estimator == 'infonce':  # a mean of softplus terms, unlike the JSD estimator
    assert all(r['loss'] > 0 for r in records)


@pytest.mark.parametrize('eval_batch', [16, 39])
def test_embedding_in_several_eval_batches_equals_one_batch(toy_dir, tmp_path, eval_batch):
  """40 graphs in eval batches of 16 (16, 16, 8: padded rows dropped, the rest in order)
  or of 39 (39, 1: a wrong row index for the last graph stays in range and shows as a wrong
  embedding) embed as in one batch of 64; and that batch's rows are each its own graph's:
  the same graphs stored in reverse order embed to the same rows reversed."""
  config = _config(toy_dir, num_epochs=1)
  dataset = data.load_tu('TOY', toy_dir)
  state = train.train_encoders(config, dataset, [np.arange(dataset.num_graphs)], log=False)
  config.eval.batch_size = 64
  whole = train.embed_all(config, dataset, state)
  write_tu(str(tmp_path / 'reversed'), 'TOY', toy_graphs()[::-1])
  backwards = train.embed_all(config, data.load_tu('TOY', str(tmp_path / 'reversed')), state)
  np.testing.assert_allclose(backwards[:, ::-1], whole, rtol=1e-5, atol=1e-6)
  assert np.abs(whole[:, 0] - whole[:, 1]).max() > 0.1  # a star and a cycle: rows differ
  config.eval.batch_size = eval_batch
  split = train.embed_all(config, dataset, state)
  assert whole.shape == split.shape == (1, 40, 96)
  np.testing.assert_allclose(split, whole, rtol=1e-5, atol=1e-6)


def test_progress_lines_report_the_rate_and_eta_of_a_scripted_clock(toy_dir, monkeypatch, caplog):
  """Logged every 2nd epoch and at the last (5): the clock reads 7 s at the start, then 23,
  47 and 57 s, so 40 graphs an epoch run at 5, 4 and 4 graphs/s, with 24, 10 and 0 s to go
  (elapsed / epochs done * epochs left)."""
  clock = iter([7.0, 23.0, 47.0, 57.0])
  monkeypatch.setattr(progress, 'time', type('Clock', (), {'perf_counter': lambda: next(clock)}))
  config = _config(toy_dir, num_epochs=5, log_every_epochs=2)
  dataset = data.load_tu('TOY', toy_dir)
  with caplog.at_level('INFO'):
    train.train_encoders(config, dataset, [np.arange(dataset.num_graphs)], log=True)
  lines = [m for m in caplog.messages if m.startswith('epoch ')]
  assert progress_lines(caplog) == lines
  pattern = r'epoch (\d)/5 \(\d+%\)  loss -?\d+\.\d{4}  (\d+) graphs/s  ETA (\w+)'
  got = [re.fullmatch(pattern, line).groups() for line in lines]
  assert got == [('2', '5', '24s'), ('4', '4', '10s'), ('5', '4', '0s')]


def test_leak_free_encoders_never_see_their_test_graphs(toy_dir, monkeypatch):
  seen = {}
  original = train.train_encoders

  def spy(config, dataset, train_sets, *args, **kwargs):
    seen['sets'] = train_sets
    return original(config, dataset, train_sets, *args, **kwargs)

  monkeypatch.setattr(train, 'train_encoders', spy)
  config = _config(toy_dir, method='scl', num_epochs=1)
  train.run(config, os.path.join(toy_dir, 'spy'))
  folds = evaluate.outer_folds(data.load_tu('TOY', toy_dir).labels, 4, config.seed)
  assert len(seen['sets']) == 4
  for train_set, (_, test) in zip(seen['sets'], folds):
    assert not set(train_set) & set(test) and len(train_set) + len(test) == 40


def test_program_reports_a_bad_config_in_one_line(toy_dir):
  env = {**os.environ, 'PYTHONPATH': REPO, 'JAX_PLATFORMS': 'cpu'}
  proc = subprocess.run(
    [
      sys.executable,
      '-m',
      'hscl_jax.graphs',
      '--config=configs/graphs.py',
      f'--workdir={toy_dir}/w',
      '--config.dataset=NOPE',
      f'--config.data_dir={toy_dir}',
    ],
    cwd=REPO,
    env=env,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert proc.returncode == 1
  errors = [line for line in proc.stderr.splitlines() if line.startswith('E')]
  assert len(errors) == 1 and 'NOPE_A.txt: file not found' in errors[0]
  assert 'Traceback' not in proc.stderr


def test_prepare_downloads_and_unpacks_a_tu_zip(tmp_path):
  source = write_tu(str(tmp_path / 'src'), 'ZIPPED', toy_graphs(12))
  archive = tmp_path / 'ZIPPED.zip'
  with zipfile.ZipFile(archive, 'w') as z:
    for name in os.listdir(source):
      z.write(os.path.join(source, name), f'ZIPPED/{name}')
  target = tmp_path / 'data'
  proc = subprocess.run(
    [
      sys.executable,
      '-m',
      'hscl_jax.prepare',
      '--dataset=ZIPPED',
      f'--data_dir={target}',
      f'--url={archive.as_uri()}',
    ],
    cwd=REPO,
    env={**os.environ, 'PYTHONPATH': REPO},
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert f'ZIPPED is ready in {target / "ZIPPED"}' in proc.stdout
  assert data.load_tu('ZIPPED', str(target)).num_graphs == 12
  with pytest.raises(data.GraphDataError, match='download failed.*Fix: '):
    graph_prepare.prepare_tu('ZIPPED', str(target), (tmp_path / 'absent.zip').as_uri())


@pytest.mark.skipif(
  not os.path.isdir(os.path.join(SHARED_TU, 'MUTAG')), reason='../shared/data/tu/MUTAG not present'
)
def test_short_run_on_mutag(tmp_path):
  config = graphs_config.get_config()
  config.data_dir, config.method, config.num_epochs = SHARED_TU, 'ucl', 3
  result = train.run(config, str(tmp_path))
  assert result['dataset'] == 'MUTAG' and len(result['fold_accuracies']) == 10
  assert result['accuracy'] > 0.7  # the majority class is 0.66


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
  with pytest.raises(train.GraphConfigError, match="^config.estimator: 'infonce', but .*Fix: "):
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


def test_class_aware_batches_are_refused_for_graphs(toy_dir):
  """samples_per_class is the image arm's: in a graph config file or on the command line,
  one line saying so (the graph program's own config has no such field)."""
  config = _config(toy_dir)
  with config.unlocked():
    config.samples_per_class = 4
  with pytest.raises(train.GraphConfigError) as error:
    train.validate_config(config)
  assert str(error.value) == train.CLASS_AWARE_REFUSAL
  assert str(error.value).startswith('config.samples_per_class: class-aware batches are for')
  proc = subprocess.run(
    [sys.executable, '-m', 'hscl_jax.graphs', '--config=configs/graphs.py', '--workdir=/tmp/w']
    + ['--config.samples_per_class=4'],
    cwd=REPO,
    env={**os.environ, 'PYTHONPATH': REPO, 'JAX_PLATFORMS': 'cpu'},
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert (proc.returncode, proc.stderr.strip()) == (1, train.CLASS_AWARE_REFUSAL)


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
