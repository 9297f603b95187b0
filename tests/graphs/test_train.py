"""graphs/train: the graph config's one-line refusals and bounds, tiny runs end to end under
the transfer guard, embeddings in several eval batches, the progress lines, and the outer
folds (the leak-free protocol trains one encoder per fold on that fold's training graphs,
which follow its config.seed and never hold its test graphs)."""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys
import time

from acceptance import accepted
import numpy as np
from progress_lines import progress_lines
import pytest
from transfer_guard import no_implicit_transfers

from graphs.test_data import toy_graphs
from graphs.test_data import write_tu

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # `from configs import ...`, as from the repo root
# The five benchmark datasets beside the repository (or wherever HSCL_TU_DIR points).
SHARED_TU = os.environ.get('HSCL_TU_DIR', str(REPO.parent / 'shared' / 'data' / 'tu'))

from configs import graphs as graphs_config  # noqa: E402
from hscl_jax import errors  # noqa: E402
from hscl_jax import progress  # noqa: E402
from hscl_jax.graphs import data  # noqa: E402
from hscl_jax.graphs import evaluate  # noqa: E402
from hscl_jax.graphs import train  # noqa: E402


class _Stop(Exception):
  """Raised once the run's training sets are known: no encoder is trained."""


def _train_sets(tmp_path, monkeypatch, seed):
  seen = []

  def spy(config, dataset, train_sets, *args, **kwargs):
    seen.extend(train_sets)
    raise _Stop

  monkeypatch.setattr(train, 'train_encoders', spy)
  config = graphs_config.get_config()
  config.dataset, config.data_dir, config.method, config.seed = 'TOY', str(tmp_path), 'scl', seed
  config.eval.num_folds, config.eval.inner_folds = 4, 2
  with pytest.raises(_Stop):
    train.run(config, str(tmp_path / f'run_{seed}'))
  return seen


@pytest.mark.parametrize('seed', [0, 5])
def test_the_leak_free_encoders_train_on_the_folds_of_the_runs_seed(tmp_path, monkeypatch, seed):
  write_tu(str(tmp_path), 'TOY', toy_graphs())
  labels = data.load_tu('TOY', str(tmp_path)).labels
  got = _train_sets(tmp_path, monkeypatch, seed)
  expected = [part for part, _ in evaluate.outer_folds(labels, 4, seed)]
  assert len(got) == 4
  for train_set, part in zip(got, expected, strict=True):
    np.testing.assert_array_equal(np.sort(train_set), np.sort(part))
  other = [part for part, _ in evaluate.outer_folds(labels, 4, seed + 1)]  # another seed's
  assert any(not np.array_equal(np.sort(a), np.sort(b)) for a, b in zip(got, other))


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
    with pytest.raises(errors.ConfigError, match=f'^config.{field}: .*Fix: '):
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
  with pytest.raises(errors.ConfigError, match=f'^config.{re.escape(reported)}: .*Fix: '):
    train.validate_config(config)


def test_unknown_estimator_is_one_line_naming_the_valid_values(toy_dir):
  config = _config(toy_dir, estimator='nce')
  with pytest.raises(errors.ConfigError) as error:
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


@pytest.mark.skipif(
  not os.path.isdir(os.path.join(SHARED_TU, 'MUTAG')), reason='../shared/data/tu/MUTAG not present'
)
def test_short_run_on_mutag(tmp_path):
  config = graphs_config.get_config()
  config.data_dir, config.method, config.num_epochs = SHARED_TU, 'ucl', 3
  result = train.run(config, str(tmp_path))
  assert result['dataset'] == 'MUTAG' and len(result['fold_accuracies']) == 10
  assert result['accuracy'] > 0.7  # the majority class is 0.66


def test_class_aware_batches_are_refused_for_graphs(toy_dir):
  """samples_per_class is the image arm's: in a graph config file or on the command line,
  one line saying so (the graph program's own config has no such field)."""
  config = _config(toy_dir)
  with config.unlocked():
    config.samples_per_class = 4
  with pytest.raises(errors.ConfigError) as error:
    train.validate_config(config)
  assert str(error.value) == train.CLASS_AWARE_REFUSAL
  assert str(error.value).startswith('config.samples_per_class: class-aware batches are for')
  proc = subprocess.run(
    [sys.executable, '-m', 'hscl_jax.graphs', '--config=configs/graphs.py', '--workdir=/tmp/w']
    + ['--config.samples_per_class=4'],
    cwd=REPO,
    env={**os.environ, 'PYTHONPATH': str(REPO), 'JAX_PLATFORMS': 'cpu'},
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert (proc.returncode, proc.stderr.strip()) == (1, train.CLASS_AWARE_REFUSAL)
