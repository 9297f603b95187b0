"""graphs/data: the TU reader (labels remapped, one-hot degrees or node labels, one-line
errors naming the file and the fix) and the padded batches (shuffled by seed, every graph
once, within the budget); the toy TU collection the graph tests share."""

from __future__ import annotations

import os

import numpy as np
import pytest

from hscl_jax.graphs import data


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
