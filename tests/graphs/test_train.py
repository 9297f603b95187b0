"""graphs/train: a graph run's outer folds follow its config.seed (the leak-free protocol
trains one encoder per fold on that fold's training graphs)."""

from __future__ import annotations

import pathlib
import sys

import numpy as np
import pytest
from test_graphs import toy_graphs
from test_graphs import write_tu

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # `from configs import ...`, as from the repo root

from configs import graphs as graphs_config  # noqa: E402
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
