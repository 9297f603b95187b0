"""evaluation/inspection, the work of `python -m hscl_jax.inspect` (the program itself:
tests/test_inspect.py): its seeded batches, the figures it draws and the statistic it writes."""

from __future__ import annotations

import json
import sys

import numpy as np
from PIL import Image
import pytest

from hscl_jax import data
from hscl_jax import errors
from hscl_jax.evaluation import figures
from hscl_jax.evaluation import inspection
from hscl_jax.rundir import trained_run


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
