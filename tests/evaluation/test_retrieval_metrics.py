"""Retrieval metrics (precision@1, R-precision, MAP@R, Recall@K) against a float64 NumPy
reference written from their definitions, a tie example worked by hand, and
pytorch-metric-learning's AccuracyCalculator (skipped visibly without torch and
pytorch-metric-learning, the [peers] extra; CI installs it)."""

from __future__ import annotations

from acceptance import accepted
from acceptance import refused
import jax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import numpy as np
import pytest

from hscl_jax import parallel
from hscl_jax.evaluation import retrieval_metrics

KS = (1, 2, 4, 8)
NAMES = ('precision_at_1', 'r_precision', 'map_at_r', *(f'recall_at_{k}' for k in KS))


def reference_metrics(queries, query_labels, reference=None, reference_labels=None, ks=KS):
  """From the definitions, float64, one query at a time: each ranks the reference rows by
  cosine similarity (ties to the lower index), itself left out when there is no separate
  reference; a query with no row of its class to find is not scored."""
  leave_one_out = reference is None
  if leave_one_out:
    reference, reference_labels = queries, query_labels
  unit = lambda x: x / np.linalg.norm(x, axis=1, keepdims=True)
  queries, reference = unit(queries.astype(np.float64)), unit(reference.astype(np.float64))
  scores = []
  for i, (q, label) in enumerate(zip(queries, query_labels)):
    sims = reference @ q
    order = np.lexsort((np.arange(len(sims)), -sims))
    if leave_one_out:
      order = order[order != i]
    hit = reference_labels[order] == label
    r = int(np.sum(hit))
    if r == 0:
      continue
    precision_at = np.cumsum(hit) / np.arange(1, len(hit) + 1)
    scores.append(
      [
        hit[0],
        np.mean(hit[:r]),
        np.sum(precision_at[:r] * hit[:r]) / r,
        *(np.any(hit[:k]) for k in ks),
      ]
    )
  if not scores:
    return dict.fromkeys(NAMES, float('nan'))
  return dict(zip(NAMES, np.mean(np.asarray(scores, np.float64), axis=0)))


def clustered(rng, num, labels, centres, dim):
  return (centres[labels] + 1.2 * rng.normal(size=(num, dim))).astype(np.float32)


def make_data(seed, num_reference=60, num_queries=37, dim=8, num_classes=5, min_gap=1e-5):
  """Clustered random features, every label tied to no other: (reference, its labels,
  queries, theirs). The reference holds a class of one row (class num_classes), the queries
  a class the reference lacks (num_classes + 1). Drawn again until, in every query's
  ranking of the reference and of the queries, consecutive similarities are min_gap apart
  (float32 rounding cannot reorder them, so any tie rule gives the same figures)."""
  rng = np.random.default_rng(seed)
  while True:
    centres = rng.normal(size=(num_classes + 2, dim))
    reference_labels = rng.integers(0, num_classes, num_reference)
    reference_labels[0] = num_classes
    query_labels = rng.integers(0, num_classes, num_queries)
    query_labels[:2] = num_classes + 1
    query_labels[2] = num_classes  # finds the reference's lone row; alone among the queries
    reference = clustered(rng, num_reference, reference_labels, centres, dim)
    queries = clustered(rng, num_queries, query_labels, centres, dim)
    if all(_gaps(queries, x) > min_gap for x in (reference, queries)):
      return reference, reference_labels, queries, query_labels


def _gaps(queries, reference):
  unit = lambda x: x / np.linalg.norm(x.astype(np.float64), axis=1, keepdims=True)
  sims = np.sort(unit(queries) @ unit(reference).T, axis=1)
  return np.min(np.diff(sims, axis=1))


def assert_metrics(got, expected, tolerance=1e-6):
  assert list(got) == list(expected)
  assert all(isinstance(v, float) for v in got.values())
  np.testing.assert_allclose([got[n] for n in expected], list(expected.values()), atol=tolerance)


# --------------------------------------------------------------------------------------
# Against the definitions.


@pytest.mark.parametrize('leave_one_out', [True, False], ids=['query=reference', 'separate'])
@pytest.mark.parametrize('seed,chunk_size', [(0, 7), (1, 16), (2, 1000), (3, 1)])
def test_metrics_match_the_definitions(seed, chunk_size, leave_one_out):
  """37 queries in chunks of 7, 16 (neither divides 37), more than all, and one."""
  reference, reference_labels, queries, query_labels = make_data(seed)
  if leave_one_out:
    expected = reference_metrics(queries, query_labels)
    got = retrieval_metrics.retrieval_metrics(queries, query_labels, chunk_size=chunk_size)
  else:
    expected = reference_metrics(queries, query_labels, reference, reference_labels)
    got = retrieval_metrics.retrieval_metrics(
      queries, query_labels, reference, reference_labels, chunk_size=chunk_size
    )
  assert_metrics(got, expected)
  # The data are neither trivial nor random, and the figures differ from one another.
  assert 0.3 < got['precision_at_1'] < 0.95
  assert got['map_at_r'] < got['r_precision'] < got['precision_at_1'] < got['recall_at_8']


def test_the_tie_example_worked_by_hand():
  """Five 2-d rows, the query set its own reference. Row 1 duplicates row 0 (the only
  member of class 1), row 4 is alone in class 2: rows 1 and 4 are not scored.
  - Row 0 (class 0, R = 2): row 1 (sim 1, itself excluded by index, not by value) is a
    miss, then rows 2, 3 (sim 0) hit: P@1 0, R-precision 1/2, MAP@R (0 + 1/2) / 2 = 1/4,
    Recall@1 0, Recall@2.. 1.
  - Row 2 (class 0): row 3 (sim 1) hits, then rows 0, 1, 4 tie at sim 0 and the lower index
    goes first: row 0 hits. P@1, R-precision, MAP@R and every recall 1 (highest index
    first would give R-precision and MAP@R 1/2).
  - Row 3: as row 2 (row 2 first, then row 0 at the tie).
  Means over rows 0, 2, 3: P@1 = Recall@1 = 2/3, R-precision 5/6, MAP@R 3/4, Recall@2.. 1.
  Against the rows as a separate reference, query row 0 ranks rows 0, 1 (tied at 1, in
  index order), then 2, 3: R = 3, hits 1, 0, 1 in the first 3: P@1 1, R-precision 2/3,
  MAP@R (1 + 0 + 2/3) / 3 = 5/9."""
  x = np.array([[1, 0], [1, 0], [0, 1], [0, 1], [-1, 0]], np.float32)
  labels = np.array([0, 1, 0, 0, 2])
  got = retrieval_metrics.retrieval_metrics(x, labels, chunk_size=2)
  expected = dict(zip(NAMES, [2 / 3, 5 / 6, 3 / 4, 2 / 3, 1.0, 1.0, 1.0]))
  assert_metrics(got, expected, tolerance=1e-7)
  assert_metrics(got, reference_metrics(x, labels), tolerance=1e-7)
  separate = retrieval_metrics.retrieval_metrics(x[:1], labels[:1], x, labels)
  assert_metrics(separate, dict(zip(NAMES, [1.0, 2 / 3, 5 / 9, 1.0, 1.0, 1.0, 1.0])))


def test_masks_drop_padding():
  """Padding rows of the queries and of the reference (garbage features, labels that would
  hit) change nothing, with the query set as its reference and separate."""
  reference, reference_labels, queries, query_labels = make_data(4)
  rng = np.random.default_rng(0)
  pad = lambda x, n: np.concatenate([x, rng.normal(size=(n, x.shape[1])).astype(np.float32)])
  padded_queries, padded_labels = pad(queries, 5), np.concatenate([query_labels, [0] * 5])
  query_mask = np.arange(len(padded_queries)) < len(queries)
  reference_mask = np.arange(len(reference) + 9) >= 9  # padding first
  padded_reference = np.concatenate([pad(reference[:0], 9), reference])
  padded_reference_labels = np.concatenate([[1] * 9, reference_labels])
  got = retrieval_metrics.retrieval_metrics(padded_queries, padded_labels, query_mask=query_mask)
  assert_metrics(got, reference_metrics(queries, query_labels))
  got = retrieval_metrics.retrieval_metrics(
    padded_queries,
    padded_labels,
    padded_reference,
    padded_reference_labels,
    query_mask=query_mask,
    reference_mask=reference_mask,
  )
  assert_metrics(got, reference_metrics(queries, query_labels, reference, reference_labels))
  unmasked = retrieval_metrics.retrieval_metrics(padded_queries, padded_labels)
  assert unmasked != got  # the padding would change the figures


def test_recall_beyond_the_reference_and_unscored_queries():
  """Recall@8 over 5 reference rows takes all 5; no query with a row of its class: NaN."""
  reference, reference_labels, queries, query_labels = make_data(5)
  small = reference[:5], reference_labels[:5]
  names = (*NAMES[:3], 'recall_at_1', 'recall_at_8', 'recall_at_100')
  got = retrieval_metrics.retrieval_metrics(queries, query_labels, *small, metrics=names)
  expected = reference_metrics(queries, query_labels, *small, ks=(1, 8, 100))
  assert list(got) == list(names)
  np.testing.assert_allclose(list(got.values()), list(expected.values()), atol=1e-6)
  distinct = retrieval_metrics.retrieval_metrics(queries, np.arange(len(queries)))
  assert list(distinct) == list(NAMES) and all(np.isnan(v) for v in distinct.values())


def test_a_few_metrics_are_the_full_sets():
  """Any names in any order, each the figure of the full set: without R-precision and MAP@R
  the ranked lists stop at the largest K (here 2 or 4, where R exceeds 8), and they agree."""
  reference, reference_labels, queries, query_labels = make_data(9)
  full = retrieval_metrics.retrieval_metrics(queries, query_labels, reference, reference_labels)
  assert np.bincount(reference_labels).max() > 8
  for names in (('recall_at_2', 'precision_at_1'), ('map_at_r',), ('recall_at_4', 'r_precision')):
    got = retrieval_metrics.retrieval_metrics(
      queries, query_labels, reference, reference_labels, metrics=names
    )
    assert got == {name: full[name] for name in names}
  assert retrieval_metrics.retrieval_metrics(queries, query_labels, metrics='map_at_r') == {
    'map_at_r': retrieval_metrics.retrieval_metrics(queries, query_labels)['map_at_r']
  }


def test_features_are_normalised_inside():
  reference, reference_labels, queries, query_labels = make_data(6)
  scales = np.random.default_rng(1).uniform(0.1, 10.0, (len(reference), 1)).astype(np.float32)
  a = retrieval_metrics.retrieval_metrics(queries, query_labels, reference, reference_labels)
  b = retrieval_metrics.retrieval_metrics(
    3 * queries, query_labels, reference * scales, reference_labels
  )
  assert a == b


@pytest.mark.parametrize('devices', [2, 4])
def test_features_sharded_on_a_mesh_give_the_host_figures(devices):
  """The features as make_feature_fn leaves them (rows split along the mesh's axis) give
  the figures of the same features on the host."""
  assert jax.device_count() >= devices  # 4 fake CPU devices (tests/conftest.py)
  reference, reference_labels, queries, query_labels = make_data(7, num_queries=36)
  sharding = NamedSharding(parallel.make_mesh(jax.devices()[:devices]), P(parallel.AXIS))
  on_mesh = [jax.device_put(x, sharding) for x in (queries, query_labels, reference)]
  for args in ((), (reference, reference_labels)):
    host = retrieval_metrics.retrieval_metrics(queries, query_labels, *args, chunk_size=8)
    mesh_args = (on_mesh[2], jax.device_put(reference_labels, sharding)) if args else ()
    got = retrieval_metrics.retrieval_metrics(*on_mesh[:2], *mesh_args, chunk_size=8)
    assert got == host


def test_bad_arguments():
  reference, reference_labels, queries, query_labels = make_data(8)
  with refused('widths differ'):
    retrieval_metrics.retrieval_metrics(queries, query_labels, reference[:, :3], reference_labels)
  with refused('empty'):
    retrieval_metrics.retrieval_metrics(queries, query_labels, reference[:0], reference_labels[:0])
  with refused('need reference_labels'):
    retrieval_metrics.retrieval_metrics(queries, query_labels, reference)
  with refused('need reference_features'):
    retrieval_metrics.retrieval_metrics(queries, query_labels, reference_labels=reference_labels)
  with accepted('chunk_size=1'):
    retrieval_metrics.retrieval_metrics(queries, query_labels, chunk_size=1)
  with refused(r'Need chunk_size >= 1 and some metrics; got 0\b'):
    retrieval_metrics.retrieval_metrics(queries, query_labels, chunk_size=0)
  with refused(r'Need chunk_size >= 1 and some metrics; got 256, \(\)'):
    retrieval_metrics.retrieval_metrics(queries, query_labels, metrics=())
  with accepted('recall_at_1'):
    retrieval_metrics.retrieval_metrics(queries, query_labels, metrics=['recall_at_1'])
  for name in ('recall_at_0', 'recall_at_08', 'recall_at_k', 'precision_at_2', 'knn_top1'):
    with refused(rf"Unknown retrieval metric '{name}': use precision_at_1, r_precision, "):
      retrieval_metrics.retrieval_metrics(queries, query_labels, metrics=[name])


# --------------------------------------------------------------------------------------
# Against pytorch-metric-learning's AccuracyCalculator.


@pytest.fixture
def pml():
  """(torch, PML's accuracy_calculator, inference and distances modules), or the test
  skipped: the README's test command does not install the [peers] extra."""
  torch = pytest.importorskip('torch', reason='the peer comparisons need torch ([peers] extra)')
  calculator = pytest.importorskip(
    'pytorch_metric_learning.utils.accuracy_calculator',
    reason='needs pytorch-metric-learning ([peers] extra)',
  )
  inference = pytest.importorskip('pytorch_metric_learning.utils.inference')
  distances = pytest.importorskip('pytorch_metric_learning.distances')
  return torch, calculator, inference, distances


def pml_metrics(pml, knn_func, queries, query_labels, *reference):
  """PML's figures, with the papers' Recall@K added as PML adds a metric (a `calculate_`
  method of a subclass) over its neighbours and its scored ("not lone") queries. No
  reference: PML's `get_accuracy(query, labels)`, the query set its own reference."""
  torch, calculator = pml[:2]

  def recall_at(k):
    def calculate(self, knn_labels, query_labels, not_lone_query_mask, **kwargs):
      del self, kwargs
      labels = query_labels[not_lone_query_mask]
      hits = knn_labels[not_lone_query_mask][:, :k] == labels[:, None]
      return torch.any(hits, dim=1).double().mean().item()

    return calculate

  recalls = {f'calculate_recall_at_{k}': recall_at(k) for k in KS}
  requires_knn = lambda self: [*calculator.AccuracyCalculator.requires_knn(self), *recalls]
  with_recall = type('WithRecall', (calculator.AccuracyCalculator,), recalls)
  with_recall.requires_knn = requires_knn
  names = ['precision_at_1', 'r_precision', 'mean_average_precision_at_r']
  names += [f'recall_at_{k}' for k in KS]
  got = with_recall(include=names, device=torch.device('cpu'), knn_func=knn_func).get_accuracy(
    queries, query_labels, *reference
  )
  return dict(zip(NAMES, [got[name] for name in names]))


def pml_torch_knn(pml):
  """PML's own torch kNN (its default, faiss, is no dependency here)."""
  return pml[2].CustomKNN(pml[3].CosineSimilarity())


def index_order_knn(pml):
  """A PML knn_func whose ties go to the lower reference index (torch.topk, which PML's
  CustomKNN uses, leaves the order of ties unspecified; faiss documents none), float64.
  PML's `return_results` then drops each query's own row as all of PML's kNNs do."""
  torch, inference = pml[0], pml[2]

  def knn(query, k, reference, ref_includes_query=False):
    k += int(ref_includes_query)
    unit = lambda x: torch.nn.functional.normalize(x.double(), dim=1)
    sims = unit(query) @ unit(reference).T
    order = torch.sort(-sims, dim=1, stable=True).indices[:, :k]
    return inference.return_results(torch.gather(sims, 1, order), order, ref_includes_query)

  return knn


def tied_data(seed, num, dim=8, num_classes=3):
  """Rows of four ±1 entries (norm 2) and labels with a one-member class: every cosine
  similarity is a multiple of 1/4, exact in float32, so the ranks tie often and exactly,
  duplicated rows included."""
  rng = np.random.default_rng(seed)
  x = np.zeros((num, dim), np.float32)
  for row in x:
    row[rng.choice(dim, 4, replace=False)] = rng.choice([-1.0, 1.0], 4)
  labels = rng.integers(0, num_classes, num)
  labels[0] = num_classes
  return x, labels


@pytest.mark.parametrize('seed', [0, 1, 2])
def test_pml_agrees_without_ties(pml, seed):
  """PML's AccuracyCalculator with its torch kNN, on data no tie rule changes: the query set
  its own reference, and a separate reference. Both hold a class of one member (a query PML
  calls lone) and a query class the reference lacks."""
  reference, reference_labels, queries, query_labels = make_data(seed)
  knn = pml_torch_knn(pml)
  assert_metrics(
    retrieval_metrics.retrieval_metrics(queries, query_labels, chunk_size=16),
    pml_metrics(pml, knn, queries, query_labels),
  )
  assert_metrics(
    retrieval_metrics.retrieval_metrics(
      queries, query_labels, reference, reference_labels, chunk_size=16
    ),
    pml_metrics(pml, knn, queries, query_labels, reference, reference_labels),
  )


@pytest.mark.parametrize('seed', [0, 1])
def test_pml_agrees_on_ties(pml, seed):
  """Exactly tied similarities, PML's neighbours in index order at a tie (ours): the query
  set its own reference and separate, and the worked tie example. The tie rule matters on
  these data: ties broken from the highest index give other figures."""
  x, labels = tied_data(seed, 70)
  queries, query_labels = tied_data(seed + 10, 23)
  knn = index_order_knn(pml)
  ours = retrieval_metrics.retrieval_metrics(x, labels, chunk_size=16)
  assert_metrics(ours, pml_metrics(pml, knn, x, labels))
  separate = retrieval_metrics.retrieval_metrics(queries, query_labels, x, labels, chunk_size=16)
  assert_metrics(separate, pml_metrics(pml, knn, queries, query_labels, x, labels))
  reversed_ties = reference_metrics(queries, query_labels, x[::-1], labels[::-1])
  assert max(abs(reversed_ties[n] - separate[n]) for n in NAMES) > 1e-3
  hand = np.array([[1, 0], [1, 0], [0, 1], [0, 1], [-1, 0]], np.float32), np.array([0, 1, 0, 0, 2])
  assert_metrics(retrieval_metrics.retrieval_metrics(*hand), pml_metrics(pml, knn, *hand))
