"""TU Dortmund graph datasets: reading, node features, and padded batches.

A dataset NAME is a folder DATA_DIR/NAME holding NAME_A.txt ("row, col" edges, 1-based
node ids), NAME_graph_indicator.txt (the graph of each node), NAME_graph_labels.txt (one
label per graph) and, optionally, NAME_node_labels.txt (one label per node). Node inputs
follow InfoGraph: one-hot node label where the dataset has node labels, else one-hot node
degree (capped at MAX_ONE_HOT_DEGREE).

Batches hold a fixed number of graphs, nodes and edges (padding marked by masks), so a
training run compiles its step once.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from hscl_jax import errors

MAX_ONE_HOT_DEGREE = 1000  # InfoGraph's limit for one-hot degrees; higher degrees are capped


class GraphDataError(errors.UserError, ValueError):
  """A TU dataset file is missing or malformed; the message names the file and the fix."""


@dataclasses.dataclass(frozen=True)
class GraphDataset:
  """All graphs of a dataset, nodes and edges concatenated graph after graph."""

  name: str
  codes: np.ndarray  # [nodes] int32: the one-hot position of each node's input
  feature_dim: int  # length of the one-hot node inputs
  labels: np.ndarray  # [graphs] int32 in 0..num_classes-1
  node_offsets: np.ndarray  # [graphs + 1]: graph i owns nodes node_offsets[i]:node_offsets[i+1]
  edge_offsets: np.ndarray  # [graphs + 1]: the same for edges
  senders: np.ndarray  # [edges] node index within the edge's graph
  receivers: np.ndarray  # [edges]
  num_classes: int
  feature_kind: str  # 'node_label' | 'degree'

  @property
  def num_graphs(self) -> int:
    return len(self.labels)

  @property
  def features(self) -> np.ndarray:
    """[nodes, feature_dim] float32 one-hot node inputs."""
    return np.eye(self.feature_dim, dtype=np.float32)[self.codes]

  @property
  def node_counts(self) -> np.ndarray:
    return np.diff(self.node_offsets)

  @property
  def edge_counts(self) -> np.ndarray:
    return np.diff(self.edge_offsets)


def _fix(name: str, data_dir: str) -> str:
  return (
    f'Fix: download it with  python -m hscl_jax.prepare --dataset={name} '
    f'--data_dir={data_dir}  or point --config.data_dir at the folder holding {name}/'
  )


def _read_ints(path: str, columns: int, name: str, data_dir: str) -> np.ndarray:
  if not os.path.isfile(path):
    raise GraphDataError(f'{path}: file not found. {_fix(name, data_dir)}')
  rows = []
  with open(path) as f:
    for number, line in enumerate(f, 1):
      if not line.strip():
        continue
      fields = line.replace(',', ' ').split()
      try:
        values = [int(float(v)) for v in fields]
      except ValueError:
        values = None
      if values is None or len(values) != columns:
        raise GraphDataError(
          f'{path}:{number}: expected {columns} integer(s) per line, got {line.strip()!r}. '
          f'Fix: restore the file from the TU Dortmund zip ({_fix(name, data_dir)})'
        )
      rows.append(values)
  if not rows:
    raise GraphDataError(f'{path}: file is empty. {_fix(name, data_dir)}')
  return np.asarray(rows, np.int64).reshape(-1, columns)


def _node_codes(node_labels_path, edges, num_nodes, name, data_dir):
  """(input code of each node, its kind): the node label when the dataset has them, else
  the degree (capped), InfoGraph's choice."""
  if not os.path.isfile(node_labels_path):
    degree = np.bincount(edges[:, 0], minlength=num_nodes)
    return np.minimum(degree, MAX_ONE_HOT_DEGREE - 1), 'degree'
  node_labels = _read_ints(node_labels_path, 1, name, data_dir)[:, 0]
  if len(node_labels) != num_nodes:
    raise GraphDataError(
      f'{node_labels_path}: {len(node_labels)} labels for {num_nodes} '
      'nodes. Fix: use the files of one TU Dortmund zip'
    )
  return np.unique(node_labels, return_inverse=True)[1], 'node_label'


def load_tu(name: str, data_dir: str) -> GraphDataset:
  """Reads DATA_DIR/NAME/NAME_*.txt; raises GraphDataError naming a bad file and the fix."""
  folder = os.path.join(data_dir, name)
  path = lambda suffix: os.path.join(folder, f'{name}_{suffix}.txt')  # noqa: E731
  edges = _read_ints(path('A'), 2, name, data_dir) - 1
  indicator = _read_ints(path('graph_indicator'), 1, name, data_dir)[:, 0]
  raw_labels = _read_ints(path('graph_labels'), 1, name, data_dir)[:, 0]

  graph_values, graph_of_node = np.unique(indicator, return_inverse=True)
  if len(graph_values) != len(raw_labels):
    raise GraphDataError(
      f'{path("graph_labels")}: {len(raw_labels)} labels for {len(graph_values)} graphs in '
      f'{path("graph_indicator")}. Fix: use the files of one TU Dortmund zip'
    )
  if np.any(np.diff(graph_of_node) < 0):
    raise GraphDataError(
      f'{path("graph_indicator")}: nodes are not grouped by graph. '
      'Fix: use the files of one TU Dortmund zip'
    )
  num_nodes = len(indicator)
  if edges.size and (edges.min() < 0 or edges.max() >= num_nodes):
    raise GraphDataError(
      f'{path("A")}: node ids outside 1..{num_nodes}. Fix: use the files of one TU Dortmund zip'
    )
  if np.any(graph_of_node[edges[:, 0]] != graph_of_node[edges[:, 1]]):
    raise GraphDataError(
      f'{path("A")}: an edge joins two graphs. Fix: use the files of one TU Dortmund zip'
    )

  num_graphs = len(graph_values)
  node_offsets = np.concatenate([[0], np.cumsum(np.bincount(graph_of_node, minlength=num_graphs))])
  edge_graph = graph_of_node[edges[:, 0]]
  order = np.argsort(edge_graph, kind='stable')
  edges, edge_graph = edges[order], edge_graph[order]
  edge_offsets = np.concatenate([[0], np.cumsum(np.bincount(edge_graph, minlength=num_graphs))])
  local = edges - node_offsets[edge_graph][:, None]

  classes, labels = np.unique(raw_labels, return_inverse=True)
  codes, kind = _node_codes(path('node_labels'), edges, num_nodes, name, data_dir)
  return GraphDataset(
    name=name,
    codes=codes.astype(np.int32),
    feature_dim=int(codes.max()) + 1,
    labels=labels.astype(np.int32),
    node_offsets=node_offsets.astype(np.int64),
    edge_offsets=edge_offsets.astype(np.int64),
    senders=local[:, 0].astype(np.int32),
    receivers=local[:, 1].astype(np.int32),
    num_classes=len(classes),
    feature_kind=kind,
  )


# --------------------------------------------------------------------------------------
# Padded batches.


@dataclasses.dataclass(frozen=True)
class Budget:
  """Fixed batch shapes: graphs, nodes and edges per batch."""

  graphs: int
  nodes: int
  edges: int


def _round_up(value: int, multiple: int) -> int:
  return -(-max(value, 1) // multiple) * multiple


def budget_for(
  dataset: GraphDataset,
  batches,
  batch_size: int,
  *,
  node_multiple: int = 512,
  edge_multiple: int = 4096,
) -> Budget:
  """The smallest shapes, rounded up, that fit every listed batch of graph indices.

  Planning a run's batches first and sizing for them pads far less than sizing for the
  largest graphs together; the rounding lets runs of one dataset share compiled steps.
  """
  nodes = max(int(dataset.node_counts[b].sum()) for b in batches)
  edges = max(int(dataset.edge_counts[b].sum()) for b in batches)
  return Budget(
    graphs=batch_size, nodes=_round_up(nodes, node_multiple), edges=_round_up(edges, edge_multiple)
  )


def _ranges(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
  """Concatenation of arange(s, s + c) for each (s, c)."""
  total = int(counts.sum())
  shift = np.repeat(starts - (np.cumsum(counts) - counts), counts)
  return shift + np.arange(total)


def make_batch(dataset: GraphDataset, graphs: np.ndarray, budget: Budget) -> dict[str, np.ndarray]:
  """Packs the listed graphs into padded arrays.

  Padding nodes point at graph index ``budget.graphs`` and padding edges at node index
  ``budget.nodes`` (out of range: segment sums drop them); masks mark the real entries.
  """
  graphs = np.asarray(graphs, np.int64)
  node_counts = dataset.node_counts[graphs]
  edge_counts = dataset.edge_counts[graphs]
  num_nodes, num_edges = int(node_counts.sum()), int(edge_counts.sum())
  if len(graphs) > budget.graphs or num_nodes > budget.nodes or num_edges > budget.edges:
    raise ValueError(
      f'batch of {len(graphs)} graphs, {num_nodes} nodes, {num_edges} edges '
      f'exceeds the budget {budget}'
    )
  nodes = _ranges(dataset.node_offsets[graphs], node_counts)
  edges = _ranges(dataset.edge_offsets[graphs], edge_counts)
  batch_start = np.cumsum(node_counts) - node_counts
  edge_shift = np.repeat(batch_start, edge_counts)

  codes = np.zeros(budget.nodes, np.int32)
  codes[:num_nodes] = dataset.codes[nodes]
  node_graph = np.full(budget.nodes, budget.graphs, np.int32)
  node_graph[:num_nodes] = np.repeat(np.arange(len(graphs)), node_counts)
  senders = np.zeros(budget.edges, np.int32)
  senders[:num_edges] = dataset.senders[edges] + edge_shift
  receivers = np.full(budget.edges, budget.nodes, np.int32)
  receivers[:num_edges] = dataset.receivers[edges] + edge_shift
  labels = np.zeros(budget.graphs, np.int32)
  labels[: len(graphs)] = dataset.labels[graphs]
  return {
    'codes': codes,
    'node_graph': node_graph,
    'senders': senders,
    'receivers': receivers,
    'labels': labels,
    'node_mask': np.arange(budget.nodes) < num_nodes,
    'graph_mask': np.arange(budget.graphs) < len(graphs),
  }


def epoch_batches(
  graphs: np.ndarray, batch_size: int, num_batches: int, rng: np.random.Generator
) -> list[np.ndarray]:
  """One epoch of a shuffled graph list as ``num_batches`` batches (trailing ones may be
  short or empty, so sets of different sizes give the same number of steps)."""
  order = rng.permutation(np.asarray(graphs))
  return [order[i * batch_size : (i + 1) * batch_size] for i in range(num_batches)]


def stack_batches(batches: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
  return {key: np.stack([b[key] for b in batches]) for key in batches[0]}
