"""InfoGraph's evaluation protocol: an RBF SVM on frozen graph representations.

10-fold stratified cross-validation; inside each fold, C is chosen from {1e-3, ..., 1e3}
by a 5-fold grid search on that fold's training graphs. The score is the mean test
accuracy over the folds.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent import futures
import os

import numpy as np
from sklearn import model_selection
from sklearn import svm

SVM_CS = tuple(10.0**k for k in range(-3, 4))


def outer_folds(
  labels: np.ndarray, num_folds: int, seed: int
) -> list[tuple[np.ndarray, np.ndarray]]:
  """(train, test) graph indices of a shuffled stratified K-fold split."""
  splitter = model_selection.StratifiedKFold(num_folds, shuffle=True, random_state=seed)
  return list(splitter.split(np.zeros(len(labels)), labels))


def fold_accuracy(
  embeddings: np.ndarray,
  labels: np.ndarray,
  train: np.ndarray,
  test: np.ndarray,
  *,
  cs: Sequence[float] = SVM_CS,
  inner_folds: int = 5,
) -> tuple[float, float]:
  """-> (test accuracy, chosen C) of an SVM whose C is grid-searched on the training part."""
  search = model_selection.GridSearchCV(
    svm.SVC(kernel='rbf'), {'C': list(cs)}, cv=inner_folds, scoring='accuracy'
  )
  search.fit(embeddings[train], labels[train])
  return float(search.score(embeddings[test], labels[test])), float(search.best_params_['C'])


def cross_validate(embeddings, labels: np.ndarray, folds, *, threads: int = 0, **kwargs) -> dict:
  """Mean accuracy over ``folds``. ``embeddings`` is one [graphs, d] array for every fold,
  or a list with one array per fold (leak-free protocol: one encoder per fold).

  Folds are scored on ``threads`` threads (0: one per CPU core); libsvm releases the GIL.
  """

  def score(k):
    x = embeddings[k] if isinstance(embeddings, (list, tuple)) else embeddings
    train, test = folds[k]
    return fold_accuracy(np.asarray(x, np.float64), labels, train, test, **kwargs)

  with futures.ThreadPoolExecutor(threads or os.cpu_count() or 1) as pool:
    results = list(pool.map(score, range(len(folds))))
  accuracies = [accuracy for accuracy, _ in results]
  return {
    'accuracy': float(np.mean(accuracies)),
    'fold_accuracies': accuracies,
    'chosen_C': [c for _, c in results],
  }
