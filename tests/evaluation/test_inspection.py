"""`python -m hscl_jax.inspect`: the figures, and the false-negative fraction against NumPy."""

from __future__ import annotations

import json
import sys

import numpy as np
from PIL import Image
import pytest

from hscl_jax import data
from hscl_jax import errors
from hscl_jax import losses
from hscl_jax.evaluation import figures
from hscl_jax.evaluation import hard_negatives
from hscl_jax.evaluation import inspection
from hscl_jax.rundir import trained_run


def _batch(n=18, dim=4, num_classes=3, seed=0):
  """Unit vectors clustered by class (so same-class samples are often, not always, the
  most similar) and their labels."""
  rng = np.random.default_rng(seed)
  labels = np.arange(n) % num_classes
  centres = rng.normal(size=(num_classes, dim))
  z = centres[labels] + 1.2 * rng.normal(size=(n, dim))
  return (z / np.linalg.norm(z, axis=1, keepdims=True)).astype(np.float32), labels


def _numpy_fractions(z, labels, weight_of, k):
  """Per anchor: among the k other samples of largest weight_of(g) > 0 (ties: larger g),
  the fraction of the anchor's class; written from the definition, one anchor at a time."""
  z = np.asarray(z, np.float64)
  fractions = []
  for i in range(len(z)):
    candidates = []
    for j in range(len(z)):
      g = z[i] @ z[j] / 0.5
      if j != i and weight_of(g) > 0:
        candidates.append((weight_of(g), g, j))
    top = [j for _, _, j in sorted(candidates, reverse=True)[:k]]
    if top:
      fractions.append(np.mean([labels[j] == labels[i] for j in top]))
  return np.asarray(fractions)


@pytest.mark.parametrize('num_examples,batch_size,sizes', [(10, 4, [4, 4, 2]), (9, 4, [4, 4])])
def test_seeded_batches_cut_one_seeded_permutation_and_drop_a_last_single(
  num_examples, batch_size, sizes
):
  """Consecutive slices of the seed's permutation; a last batch of one (no negative) is
  dropped, a last batch of two kept."""
  batches = inspection.seeded_batches(num_examples, batch_size, seed=3)
  assert [len(b) for b in batches] == sizes
  order = np.random.default_rng(3).permutation(num_examples)
  np.testing.assert_array_equal(np.concatenate(batches), order[: sum(sizes)])
  assert not np.array_equal(np.concatenate(inspection.seeded_batches(10, 4, seed=4)), order)


def test_exponential_hardening_fraction_equals_numpy():
  z, labels = _batch()
  beta = 2.0
  expected = _numpy_fractions(z, labels, lambda g: np.exp(beta * g), k=4)
  result = hard_negatives.false_negative_fraction(
    [(z, labels)], losses.exponential(beta), temperature=0.5, k=4
  )
  assert 0.2 < expected.mean() < 0.9  # neither trivially 0 nor 1
  assert result['fraction'] == pytest.approx(expected.mean(), abs=1e-12)
  assert result['num_anchors'] == 18
  assert result['unweighted'] == pytest.approx(5 / 17)  # 5 of the 17 others share the class


def test_threshold_hardening_counts_only_weighted_negatives_over_batches():
  """Under a threshold some anchors weight fewer than k negatives, some none (not
  counted); two batches are averaged over their anchors."""
  (z1, y1), (z2, y2) = _batch(seed=1), _batch(n=12, seed=2)
  tau = np.exp(1.2)  # e^g >= tau  <=>  g >= 1.2, i.e. z.z' >= 0.6
  weight_of = lambda g: float(g >= np.log(np.float32(tau)))  # noqa: E731
  per_anchor = np.concatenate(
    [_numpy_fractions(z, y, weight_of, k=3) for z, y in ((z1, y1), (z2, y2))]
  )
  result = hard_negatives.false_negative_fraction(
    [(z1, y1), (z2, y2)], losses.threshold(tau), temperature=0.5, k=3
  )
  assert 0 < len(per_anchor) < 30  # some anchors have no weighted negative
  top, _ = hard_negatives.top_negatives(z1, y1, losses.threshold(tau), 0.5, 'hucl', 3)
  _, chosen = hard_negatives.false_negative_counts(top, y1)
  assert chosen.min() == 0 and 0 < np.mean(chosen < 3) < 1 and chosen.max() == 3
  assert result['num_anchors'] == len(per_anchor)
  assert result['fraction'] == pytest.approx(per_anchor.mean(), abs=1e-12)


def test_weights_are_the_normalised_hardening_and_hscl_never_picks_the_same_class():
  z, labels = _batch()
  hardening = losses.exponential(1.5)
  q, g = hard_negatives.hardening_weights(z, labels, hardening, 0.5, 'hscl')
  z64 = np.asarray(z, np.float64)
  eta = np.exp(1.5 * (z64 @ z64.T) / 0.5) * (labels[:, None] != labels[None, :])
  np.testing.assert_allclose(q, eta / eta.sum(axis=1, keepdims=True), rtol=1e-6)
  indices, weights = hard_negatives.top_negatives(z, labels, hardening, 0.5, 'hscl', 8)
  assert np.all(indices >= 0) and np.all(np.diff(weights, axis=1) <= 0)
  assert not np.any(labels[indices] == labels[:, None])
  same, chosen = hard_negatives.false_negative_counts(indices, labels)
  assert np.all(same == 0) and np.all(chosen == 8)
  assert hard_negatives.false_negative_fraction([(z, labels)], hardening, 0.5, 8, 'hscl') == {
    'fraction': 0.0,
    'unweighted': 0.0,
    'num_anchors': 18,
  }


def test_weights_stay_finite_where_the_hardening_overflows_float64():
  """β = 50 at τ = 0.05: β·z·z′/τ reaches 1000, past float64's exp (709). The weights are
  still each row's softmax over its negatives (shifted by the row's largest), here
  from scipy's logsumexp."""
  from scipy import special

  z, labels = _batch()
  q, g = hard_negatives.hardening_weights(z, labels, losses.exponential(50.0), 0.05, 'hscl')
  log_eta = np.where(labels[:, None] != labels[None, :], 50.0 * g, -np.inf)
  assert log_eta.max() > 709
  expected = np.exp(log_eta - special.logsumexp(log_eta, axis=1, keepdims=True))
  assert np.all(np.isfinite(q))
  np.testing.assert_allclose(q, expected, rtol=1e-3, atol=1e-12)


def test_negative_sets_are_the_definitions_and_an_unknown_one_is_refused():
  labels = np.array([0, 1, 0, 2, 1])
  others = ~np.eye(5, dtype=bool)
  np.testing.assert_array_equal(hard_negatives.negative_mask(labels, 'hucl'), others)
  np.testing.assert_array_equal(
    hard_negatives.negative_mask(labels, 'hscl'), others & (labels[:, None] != labels)
  )
  fresh = lambda text: ''.join(list(text))  # as parsed from a flag: no interned literal
  for name in ('hucl', 'hscl'):
    np.testing.assert_array_equal(
      hard_negatives.negative_mask(labels, fresh(name)), hard_negatives.negative_mask(labels, name)
    )
  # One class: H-SCL's anchors have no negative at all; their weights are 0, not 0/0.
  z, _ = _batch()
  q, _ = hard_negatives.hardening_weights(
    z, np.zeros(len(z), int), losses.exponential(1.0), 0.5, 'hscl'
  )
  np.testing.assert_array_equal(q, np.zeros_like(q))
  for name in ('scl', 'HSCL', ''):
    with pytest.raises(ValueError, match=r"negatives must be one of \('hucl', 'hscl'\), got"):
      hard_negatives.negative_mask(labels, name)
    with pytest.raises(ValueError, match='negatives must be one of'):
      hard_negatives.false_negative_fraction([_batch()], losses.exponential(1.0), 0.5, 3, name)


def test_inspect_writes_every_figure_and_the_statistic(digits_run, tmp_path, monkeypatch):
  workdir, config, _ = digits_run
  out = tmp_path / 'inspect'
  drawn = {}

  def spy_on(name):
    draw = getattr(figures, name)

    def spy(*args):
      drawn[name] = args
      draw(*args)

    monkeypatch.setattr(figures, name, spy)

  spy_on('nearest_neighbours')
  spy_on('hardest_negatives')
  result = inspection.inspect_run(str(workdir), str(out))
  # What docs/inspect.md says the figures show: 8 seeded test queries with 8 neighbours
  # each; 4 anchors of one test batch of the run's batch size, with 8 negatives each, the
  # run (H-SCL(β)) named with the set it trained with.
  embedded, queries, k, _ = drawn['nearest_neighbours']
  assert k == 8 and len(set(queries)) == 8 and list(queries) == sorted(queries)
  # Drawn from the whole test split (8 of 359: all below 9 has odds ~1e-17), neighbours
  # searched among the training split's 1438 features, each split with its own labels.
  train, test = data.run_sources(config)
  assert max(queries) < len(test) == 359 and max(queries) > 8
  assert embedded.train_features.shape[0] == len(train) == 1438
  np.testing.assert_array_equal(embedded.train_labels, train.labels())
  np.testing.assert_array_equal(embedded.test_labels, test.labels())
  _, batch, num_anchors, _, temperature, _, shown, run, phrases = drawn['hardest_negatives']
  assert (len(batch), num_anchors, shown, temperature) == (256, 4, 8, config.temperature)
  assert (run, phrases) == ('H-SCL(β)', {'hucl': 'as H-UCL would', 'hscl': 'as H-SCL does'})
  assert sorted(p.name for p in out.iterdir()) == sorted(inspection.FILES)
  for name in inspection.FILES:
    if name.endswith('.png'):
      with Image.open(out / name) as image:
        assert min(image.size) > 500, (name, image.size)
  saved = json.loads((out / inspection.STATISTIC_FILE).read_text())
  assert saved == result
  assert saved['k'] == 8 and saved['hardening'] == 'exp' and saved['beta'] == config.beta
  assert (saved['method'], saved['method_label']) == ('hscl', 'H-SCL(β)')
  assert saved['num_anchors'] == len(test) == 359
  assert saved['num_batches'] == 2 and saved['batch_size'] == 256
  assert saved['hscl_false_negative_fraction'] == 0.0
  assert 0.0 < saved['hucl_false_negative_fraction'] <= 1.0
  assert 0.05 < saved['hucl_same_class_fraction_of_all_negatives'] < 0.15  # ~1/10


# false_negatives.json's content, the figures of a run such as the issue's.
STATISTIC = dict(
  k=8,
  hardening='exp',
  beta=1.0,
  num_anchors=359,
  hucl_false_negative_fraction=0.966,
  hucl_same_class_fraction_of_all_negatives=0.1,
  hscl_false_negative_fraction=0.0,
)


@pytest.mark.parametrize(
  'label, as_hucl, as_hscl',
  [
    ('H-SCL(β)', 'would', 'does'),
    ('H-SCL(τ)', 'would', 'does'),
    ('H-UCL', 'does', 'would'),
    ('SCL', 'would', 'would'),  # trained without a hardening: neither weighting is its own
    ('UCL', 'would', 'would'),
  ],
)
def test_the_summary_names_the_one_run_measured_and_the_weighting_it_trained_with(
  label, as_hucl, as_hscl
):
  """The printed line says whose encoder was measured and which set's weighting that run
  trained with ('does') or not ('would'), never reading as two trained models."""
  line = inspection.summary_line(dict(STATISTIC, method_label=label))
  assert line == (
    f"This {label} run's encoder, its negatives weighted by η(g) = exp(βg), β = 1: "
    f"as H-UCL {as_hucl} (every other sample a negative), 96.6 % of each anchor's top-8 "
    'are same-class (10.0 % of all its negatives; 359 anchors); '
    f'as H-SCL {as_hscl} (other classes only), 0.0 %.'
  )


def test_run_hardening_defaults_to_the_runs_and_takes_flags(digits_run):
  _, config, _ = digits_run
  assert inspection.run_hardening(config) == inspection.HardeningChoice('exp', config.beta)
  assert inspection.run_hardening(config, 'exp', beta=3.0).value == 3.0
  threshold = inspection.run_hardening(config, 'threshold')
  only_tau = np.exp(config.tau_start / config.temperature)  # eq. (4): one epoch uses start
  assert threshold.name == 'threshold' and threshold.value == pytest.approx(only_tau, rel=1e-6)
  longer = config.copy_and_resolve_references()
  longer.num_epochs = 10
  last_tau = np.exp(config.tau_end / config.temperature)  # eq. (4) at the last epoch
  assert inspection.run_hardening(longer, 'threshold').value == pytest.approx(last_tau, rel=1e-6)


@pytest.mark.parametrize(
  'kwargs, error, message',
  [
    (dict(beta=-1.0), inspection.InspectError, r'--beta=-1.0: beta must be finite and >= 0'),
    (dict(hardening='cosine'), inspection.InspectError, "--hardening='cosine' is not a"),
    (dict(k=0), inspection.InspectError, '--k=0 must be >= 1'),
  ],
)
def test_bad_settings_are_one_line_before_any_work(digits_run, tmp_path, kwargs, error, message):
  workdir, _, _ = digits_run
  with pytest.raises(error, match=message):
    inspection.inspect_run(str(workdir), str(tmp_path / 'out'), **kwargs)
  assert not (tmp_path / 'out').exists()


def test_workdir_without_checkpoint_is_one_line(digits_run, tmp_path):
  workdir, _, _ = digits_run
  (tmp_path / 'config.json').write_text((workdir / 'config.json').read_text())
  with pytest.raises(trained_run.LinearEvalError, match='no checkpoint in .*: train first'):
    inspection.inspect_run(str(tmp_path), str(tmp_path / 'out'))


def test_missing_matplotlib_is_one_line_with_the_fix(monkeypatch):
  monkeypatch.setitem(sys.modules, 'matplotlib', None)  # `import matplotlib` now fails
  with pytest.raises(errors.UserError, match=r"Fix: pip install -e '\.\[train\]'"):
    figures.pyplot()
