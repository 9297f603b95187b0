"""evaluation/retrieval_evaluation's `retrieval_over_trained_run` (the program
`python -m hscl_jax.retrieval` itself: tests/test_retrieval.py) on a stored trained run
(tests/fixtures/digits_workdir): the figures are those of the retrieval metrics over the
run's own features of its splits, written beside the run."""

from __future__ import annotations

import json
import pathlib
import shutil
import sys

from acceptance import refused
import pytest

from hscl_jax import data
from hscl_jax.evaluation import embedding
from hscl_jax.evaluation import retrieval_evaluation
from hscl_jax.evaluation import retrieval_metrics
from hscl_jax.rundir import trained_run

REPO = pathlib.Path(__file__).resolve().parents[2]
FIXTURE = REPO / 'tests' / 'fixtures' / 'digits_workdir'
pytestmark = pytest.mark.skipif(not FIXTURE.is_dir(), reason=f'no {FIXTURE}')


def stored_run(tmp_path_factory):
  """(a copy of the stored run, its test and train features and labels)."""
  workdir = pathlib.Path(shutil.copytree(FIXTURE, tmp_path_factory.mktemp('run') / 'run'))
  config = trained_run.load_run_config(str(workdir))
  encoder = embedding.restore(str(workdir), config)
  train, test = data.run_sources(config)
  return (
    workdir,
    embedding.compute_features(encoder, test),
    embedding.compute_features(encoder, train),
  )


@pytest.fixture(scope='module')
def run(tmp_path_factory):
  return stored_run(tmp_path_factory)


def test_the_figures_are_the_metrics_of_the_runs_splits(run):
  """Against the train split (the kNN monitor's bank) and against the test split itself:
  each the retrieval metrics of those features, recorded with what they were made from in
  DIR/retrieval_<reference>.json; the two differ."""
  workdir, (test_x, test_y), (train_x, train_y) = run
  results = {}
  for reference, ranked in (('train', (train_x, train_y)), ('test', ())):
    result = retrieval_evaluation.retrieval_over_trained_run(str(workdir), reference=reference)
    expected = retrieval_metrics.retrieval_metrics(test_x, test_y, *ranked, chunk_size=256)
    assert {name: result[name] for name in retrieval_metrics.METRICS} == expected
    stored = json.loads((workdir / f'retrieval_{reference}.json').read_text())
    assert stored == result
    assert (result['reference'], result['checkpoint_step']) == (reference, 12)
    assert result['num_queries'] == len(test_y) == 359
    assert result['num_reference'] == (len(train_y) if ranked else 359)
    assert 0.3 < result['precision_at_1'] < 1.0
    results[reference] = expected
  assert results['train'] != results['test']


def test_a_reference_that_is_no_split_is_refused(run):
  with refused(r"--reference='val' is no split of the run; use train or test"):
    retrieval_evaluation.retrieval_over_trained_run(str(run[0]), reference='val')


# --------------------------------------------------------------------------------------
# The figures of training's kNN monitor (config.knn.retrieval): those of the program above
# over the same checkpoint.


def test_the_monitors_figures_are_the_programs_over_the_same_checkpoint(tmp_path, caplog):
  """Digits' default config for one epoch on the session's devices, another list of
  metrics than the default: its epoch record, TensorBoard and epoch line hold the figures
  that `retrieval_over_trained_run` computes against the train split (the bank) from the
  checkpoint of that epoch, by another feature extraction; the test split ranked against
  itself gives other figures, so the bank is the train split."""
  if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # `from configs import ...`, as from the repo root
  import tensorboard_events

  from configs import digits
  from hscl_jax.rundir import layout
  from hscl_jax.rundir import metrics
  from hscl_jax.training import loop

  config = digits.get_config()
  config.num_epochs = 1
  config.knn.retrieval = 'recall_at_2, map_at_r,precision_at_1,r_precision'
  names = ('recall_at_2', 'map_at_r', 'precision_at_1', 'r_precision')
  caplog.set_level('INFO', logger='absl')
  loop.train_and_evaluate(config, str(tmp_path))
  (record,) = metrics.read_metrics(str(tmp_path))
  assert [name for name in record if retrieval_metrics.is_metric(name)] == list(names)
  for reference in ('train', 'test'):
    program = retrieval_evaluation.retrieval_over_trained_run(
      str(tmp_path), reference=reference, metrics=names
    )
    close = all(abs(program[n] - record[n]) <= 1e-6 for n in names)
    assert close == (reference == 'train'), (reference, program, record)
  events = tensorboard_events.scalars(tmp_path / layout.EVENTS_DIR)
  assert {n: events[n][record['step']] for n in names} == pytest.approx(
    {n: record[n] for n in names}, abs=1e-6
  )
  # The epoch line keeps to its headline figures; the closing line names every one.
  line = next(m for m in caplog.messages if 'final kNN top-1' in m)
  assert (
    f'kNN top-1 {record["knn_top1"]:.4f}, R@2 {record["recall_at_2"]:.4f}, MAP@R '
    f'{record["map_at_r"]:.4f}, P@1 {record["precision_at_1"]:.4f}, R-precision '
    f'{record["r_precision"]:.4f}, probe top-1 {record["probe_top1"]:.4f}'
  ) in line
