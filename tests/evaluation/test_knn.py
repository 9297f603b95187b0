"""Weighted kNN monitor against a brute-force float64 NumPy reference."""

from __future__ import annotations

from acceptance import accepted
from acceptance import refused
import jax
from jax.sharding import PartitionSpec as P
import ml_collections
import numpy as np
import pytest

from hscl_jax import data
from hscl_jax import parallel
from hscl_jax.evaluation import features as eval_features
from hscl_jax.evaluation import knn


def reference_predict(bank, bank_labels, queries, num_classes, k, temperature):
  """Brute force, float64, one query at a time."""
  bank = bank.astype(np.float64)
  bank /= np.linalg.norm(bank, axis=1, keepdims=True)
  preds = []
  for q in queries.astype(np.float64):
    sims = bank @ (q / np.linalg.norm(q))
    nearest = np.argsort(-sims)[: min(k, len(bank))]
    votes = np.zeros(num_classes)
    for j in nearest:
      votes[bank_labels[j]] += np.exp(sims[j] / temperature)
    preds.append(np.argmax(votes))
  return np.array(preds)


def make_data(seed, num_bank=300, num_queries=77, dim=16, num_classes=5):
  """Clustered random features: well-separated enough for a non-trivial accuracy."""
  rng = np.random.default_rng(seed)
  centres = rng.normal(size=(num_classes, dim))
  bank_labels = rng.integers(0, num_classes, num_bank)
  query_labels = rng.integers(0, num_classes, num_queries)
  bank = centres[bank_labels] + 1.5 * rng.normal(size=(num_bank, dim))
  queries = centres[query_labels] + 1.5 * rng.normal(size=(num_queries, dim))
  return (bank.astype(np.float32), bank_labels, queries.astype(np.float32), query_labels)


@pytest.mark.parametrize('k', [1, 10, 200])
def test_predictions_match_reference(k):
  bank, bank_labels, queries, query_labels = make_data(0)
  expected = reference_predict(bank, bank_labels, queries, 5, k, 0.5)
  got = knn.weighted_knn_predict(bank, bank_labels, queries, num_classes=5, k=k, chunk_size=32)
  np.testing.assert_array_equal(np.asarray(got), expected)
  acc = knn.weighted_knn_accuracy(
    bank, bank_labels, queries, query_labels, num_classes=5, k=k, chunk_size=32
  )
  assert acc == pytest.approx(np.mean(expected == query_labels))
  assert 0.4 < acc < 1.0  # the data are neither trivial nor random


def test_temperature_changes_weights():
  bank, bank_labels, queries, _ = make_data(1)
  for temperature in (0.05, 2.0):
    expected = reference_predict(bank, bank_labels, queries, 5, 50, temperature)
    got = knn.weighted_knn_predict(
      bank, bank_labels, queries, num_classes=5, k=50, temperature=temperature
    )
    np.testing.assert_array_equal(np.asarray(got), expected)


@pytest.mark.parametrize('chunk_size', [1, 7, 77, 1000])
def test_chunk_size_invariance(chunk_size):
  bank, bank_labels, queries, query_labels = make_data(2)
  expected = reference_predict(bank, bank_labels, queries, 5, 20, 0.5)
  got = knn.weighted_knn_predict(
    bank, bank_labels, queries, num_classes=5, k=20, chunk_size=chunk_size
  )
  np.testing.assert_array_equal(np.asarray(got), expected)


@pytest.mark.parametrize('dim,num_queries,chunk_size', [(2, 12, 3), (3, 24, 4)])
def test_predictions_in_few_dimensions_over_a_multiple_of_dim_chunks(dim, num_queries, chunk_size):
  """When the number of chunks is a multiple of the feature dimension, queries padded
  along the wrong axis (a feature, not rows) still reshape into chunks: only the
  predictions' values can tell."""
  bank, bank_labels, queries, _ = make_data(5, num_queries=num_queries, dim=dim)
  assert (num_queries // chunk_size) % dim == 0
  expected = reference_predict(bank, bank_labels, queries, 5, 10, 0.5)
  got = knn.weighted_knn_predict(
    bank, bank_labels, queries, num_classes=5, k=10, chunk_size=chunk_size
  )
  np.testing.assert_array_equal(np.asarray(got), expected)


def test_k_larger_than_bank_is_clipped():
  bank, bank_labels, queries, query_labels = make_data(3, num_bank=30)
  expected = reference_predict(bank, bank_labels, queries, 5, 30, 0.5)
  acc = knn.weighted_knn_accuracy(bank, bank_labels, queries, query_labels, num_classes=5, k=200)
  assert acc == pytest.approx(np.mean(expected == query_labels))


def test_query_mask_drops_padding():
  bank, bank_labels, queries, query_labels = make_data(4)
  expected = reference_predict(bank, bank_labels, queries, 5, 25, 0.5)
  mask = np.arange(len(queries)) < 50
  # Padding rows: garbage features and labels that must not count.
  queries_padded = queries.copy()
  queries_padded[~mask] = 0.0
  labels_padded = query_labels.copy()
  labels_padded[~mask] = -1
  acc = knn.weighted_knn_accuracy(
    bank,
    bank_labels,
    queries_padded,
    labels_padded,
    num_classes=5,
    k=25,
    chunk_size=16,
    query_mask=mask,
  )
  assert acc == pytest.approx(np.mean(expected[:50] == query_labels[:50]))


def test_bank_mask_excludes_rows():
  bank, bank_labels, queries, _ = make_data(5)
  keep = np.arange(len(bank)) % 3 != 0
  expected = reference_predict(bank[keep], bank_labels[keep], queries, 5, 40, 0.5)
  got = knn.weighted_knn_predict(bank, bank_labels, queries, num_classes=5, k=40, bank_mask=keep)
  np.testing.assert_array_equal(np.asarray(got), expected)
  # k above the number of valid rows: the masked rows add nothing.
  expected = reference_predict(bank[keep], bank_labels[keep], queries, 5, 1000, 0.5)
  got = knn.weighted_knn_predict(bank, bank_labels, queries, num_classes=5, k=1000, bank_mask=keep)
  np.testing.assert_array_equal(np.asarray(got), expected)


def test_features_are_normalised_inside():
  bank, bank_labels, queries, query_labels = make_data(6)
  scales = np.random.default_rng(0).uniform(0.1, 10.0, size=(len(bank), 1)).astype(np.float32)
  a = knn.weighted_knn_predict(bank, bank_labels, queries, num_classes=5, k=30)
  b = knn.weighted_knn_predict(bank * scales, bank_labels, 3.0 * queries, num_classes=5, k=30)
  np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_bad_arguments():
  bank, bank_labels, queries, query_labels = make_data(8)
  with refused('widths differ'):
    knn.weighted_knn_predict(bank, bank_labels, queries[:, :3], num_classes=5)
  with refused('empty'):
    knn.weighted_knn_predict(bank[:0], bank_labels[:0], queries, num_classes=5)
  with accepted('a bank of one row'):  # the bound: every query's neighbour is that row
    one = knn.weighted_knn_predict(bank[:1], bank_labels[:1], queries, num_classes=5)
  np.testing.assert_array_equal(np.asarray(one), np.full(len(queries), bank_labels[0]))
  # Each bound accepted (and predicting as the reference does) and one past it refused,
  # one argument at a time.
  tiny = float(np.nextafter(np.float32(0), np.float32(1)))
  for name, bound, past in (('k', 1, 0), ('chunk_size', 1, 0), ('temperature', tiny, 0.0)):
    with accepted(f'{name}={bound}'):
      got = knn.weighted_knn_predict(bank, bank_labels, queries, num_classes=5, **{name: bound})
    if name != 'temperature':  # exp(sim / tiny) overflows the float64 reference
      args = dict(k=200, temperature=0.5) | {name: bound}
      want = reference_predict(bank, bank_labels, queries, 5, args['k'], args['temperature'])
      np.testing.assert_array_equal(np.asarray(got), want)
    with refused(rf'Need k >= 1, chunk_size >= 1, temperature > 0; got .*\b{past}\b'):
      knn.weighted_knn_predict(bank, bank_labels, queries, num_classes=5, **{name: past})


def test_defaults_are_the_papers():
  """k = 200 and temperature 0.5 when not given, in the predictions and the accuracy
  (0.733): on a bank of 300, k = 199 or 201 and temperature 0.4 or 0.6 give other
  predictions (3, 1, 8 and 10 of the 300 queries) and accuracies."""
  bank, bank_labels, queries, labels = make_data(1, num_bank=300, num_queries=300)
  predict = lambda **kw: np.asarray(
    knn.weighted_knn_predict(bank, bank_labels, queries, num_classes=5, **kw)
  )
  default = predict()
  np.testing.assert_array_equal(default, reference_predict(bank, bank_labels, queries, 5, 200, 0.5))
  accuracy = lambda k, t: np.mean(reference_predict(bank, bank_labels, queries, 5, k, t) == labels)
  top1 = knn.weighted_knn_accuracy(bank, bank_labels, queries, labels, num_classes=5)
  assert top1 == pytest.approx(accuracy(200, 0.5), abs=1e-6)
  for other in (dict(k=199), dict(k=201), dict(temperature=0.4), dict(temperature=0.6)):
    k, t = other.get('k', 200), other.get('temperature', 0.5)
    assert np.any(reference_predict(bank, bank_labels, queries, 5, k, t) != default), other
    assert accuracy(k, t) != pytest.approx(top1, abs=1e-6), other  # 0.740, 0.737, 0.753, 0.720


def test_query_mask_drops_padding_even_when_it_would_be_right():
  """Masked-out queries whose labels match their predictions must not raise the accuracy:
  the figure is the mean over the unmasked queries only, recomputed here directly."""
  bank, bank_labels, queries, query_labels = make_data(5)
  predictions = reference_predict(bank, bank_labels, queries, 5, 25, 0.5)
  mask = np.arange(len(queries)) < 50
  labels = np.where(mask, query_labels, predictions)  # padding: "correct" by construction
  acc = knn.weighted_knn_accuracy(
    bank, bank_labels, queries, labels, num_classes=5, k=25, chunk_size=16, query_mask=mask
  )
  expected = np.mean(predictions[mask] == query_labels[mask])
  assert expected < 1.0  # otherwise the padding could not change the figure
  assert acc == pytest.approx(expected, abs=1e-6)


# --------------------------------------------------------------------------------------
# The training program's monitor (eval_features.knn_accuracy): the figure of metrics.jsonl.


def _pattern_split(seed, num):
  """uint8 4x4 images of 3 classes (colour patterns around grey plus noise)."""
  rng = np.random.default_rng(seed)
  patterns = np.random.default_rng(7).uniform(-1, 1, (3, 4, 4, 3))
  labels = rng.integers(0, 3, num)
  images = 0.5 + 0.15 * patterns[labels] + 0.3 * rng.normal(size=(num, 4, 4, 3))
  return np.clip(np.round(255 * images), 0, 255).astype(np.uint8), labels


def _pixel_features(images):
  """The stand-in encoder: pixels in [0, 1] minus 0.5 (a zero padding image is no zero)."""
  return np.asarray(images, np.float64).reshape(len(images), -1) / 255.0 - 0.5


def test_monitor_accuracy_is_recomputed_from_the_splits():
  """Bank = the train split, queries = the test split, padding rows of neither count:
  recomputed by brute force on splits of 50 and 100 examples, extracted in batches of 32
  over 4 devices (14 padding rows in the bank). Using the test split as the bank, the
  bank's padding rows as neighbours, another k or temperature, or unweighted votes gives
  other figures on these data."""
  (bank, bank_labels), (queries, query_labels) = _pattern_split(0, 50), _pattern_split(1, 100)
  mesh = parallel.make_mesh()

  def per_device(variables, batch):
    features = batch['image'].reshape(batch['image'].shape[0], -1) / 255.0 - variables['centre']
    return features, batch['label'], batch['mask']

  feature_fn = jax.jit(
    jax.shard_map(per_device, mesh=mesh, in_specs=(P(), P('data')), out_specs=P('data'))
  )
  checks = []
  knn_config = ml_collections.ConfigDict(dict(batch_size=32, k=15, temperature=0.1, chunk_size=16))
  top1 = eval_features.knn_accuracy(
    knn_config,
    feature_fn,
    {'centre': np.float32(0.5)},
    data.ArraySource(bank, bank_labels, 3),
    data.ArraySource(queries, query_labels, 3),
    num_classes=3,
    mesh=mesh,
    check=lambda: checks.append(1),
  )
  assert len(checks) == 6  # before each of the 2 bank and 4 query batches

  def accuracy(bank_x, bank_y, k=15, temperature=0.1):  # k below the bank's 50: it matters
    predictions = reference_predict(bank_x, bank_y, _pixel_features(queries), 3, k, temperature)
    return np.mean(predictions == query_labels)

  expected = accuracy(_pixel_features(bank), bank_labels)
  padded = np.concatenate([bank, np.zeros((14, 4, 4, 3), np.uint8)])
  wrong = (
    accuracy(_pixel_features(queries), query_labels),
    accuracy(_pixel_features(padded), np.concatenate([bank_labels, np.zeros(14, int)])),
    # config.knn's k or temperature not the one used (the defaults 200, the whole bank,
    # and 0.5), or the votes unweighted (a temperature so high every weight is 1):
    accuracy(_pixel_features(bank), bank_labels, k=200),
    accuracy(_pixel_features(bank), bank_labels, temperature=0.5),
    accuracy(_pixel_features(bank), bank_labels, temperature=1e6),
  )
  assert expected not in wrong, (expected, wrong)
  assert top1 == pytest.approx(expected, abs=1e-6)
