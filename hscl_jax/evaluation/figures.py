"""The figures of `python -m hscl_jax.inspect` (matplotlib, Agg; the `[report]` extra): the
t-SNE map, the nearest neighbours and the hardest negatives. `hscl_jax.evaluation.inspection`
computes what they show.

Each function takes an `inspection.Embedded` (the splits, class names, features and
projections) and writes one PNG.
"""

from __future__ import annotations

import numpy as np

from hscl_jax import errors
from hscl_jax.evaluation import hard_negatives
from hscl_jax.rundir import atomic

TSNE_MAX_POINTS = 5000  # t-SNE is quadratic in memory and slow beyond this on a CPU
LEGEND_MAX_CLASSES = 20
WRONG = '#d62728'  # outline of a wrong-class neighbour or a same-class negative
RIGHT = '#bbbbbb'


def pyplot(program: str = 'python -m hscl_jax.inspect'):
  """matplotlib.pyplot on the Agg backend (files only, never a window); a missing
  matplotlib (the `[report]` extra) is one line naming `program` and the fix. A program
  that trains before it draws calls this first, so the hours of training are not lost to
  a missing package at the end."""
  try:
    import matplotlib
  except ImportError:
    raise errors.UserError(
      f'{program} draws with matplotlib, which is not installed. Fix: '
      "pip install -e '.[report]' (or pip install matplotlib)."
    ) from None
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # after choosing the backend

  return plt


def _class_colours(num_classes: int) -> np.ndarray:
  """Distinct colours: tab10/tab20 for up to 20 classes, evenly spread hues beyond."""
  import matplotlib  # pyplot() has been called: it is installed

  if num_classes <= 10:
    return matplotlib.colormaps['tab10'](np.arange(num_classes))
  if num_classes <= 20:
    return matplotlib.colormaps['tab20'](np.arange(num_classes))
  return matplotlib.colormaps['turbo'](np.linspace(0.02, 0.98, num_classes))


def _embed_2d(features: np.ndarray, seed: int) -> np.ndarray:
  from sklearn.manifold import TSNE  # local: scikit-learn is slow to import

  perplexity = min(30.0, (len(features) - 1) / 3)
  tsne = TSNE(n_components=2, perplexity=perplexity, init='pca', random_state=seed)
  return tsne.fit_transform(features)


def tsne_map(embedded, path: str, title: str, seed: int) -> None:
  """The test split's backbone features in 2-D, a colour per class; a legend of class
  names (for more than LEGEND_MAX_CLASSES classes, of the most frequent ones only)."""
  features, labels = embedded.test_features, embedded.test_labels
  rng = np.random.default_rng(seed)
  shown = np.arange(len(labels))
  if len(shown) > TSNE_MAX_POINTS:
    shown = np.sort(rng.choice(len(labels), TSNE_MAX_POINTS, replace=False))
  points, labels = _embed_2d(features[shown], seed), labels[shown]
  names = embedded.class_names
  colours = _class_colours(len(names))
  fig, ax = pyplot().subplots(figsize=(8, 7))
  size = 4 if len(shown) > 2000 else 12
  ax.scatter(*points.T, c=colours[labels], s=size, linewidths=0, alpha=0.8)
  counts = np.bincount(labels, minlength=len(names))
  legend = np.argsort(-counts, kind='stable')[:LEGEND_MAX_CLASSES]
  for c in sorted(legend):
    ax.scatter([], [], color=colours[c], s=30, label=names[c])
  note = f'; legend: the {len(legend)} most frequent of {len(names)} classes' * (
    len(names) > LEGEND_MAX_CLASSES
  )
  subset = f' (a seeded {len(shown)} of {len(features)})' * (len(shown) < len(features))
  ax.set_title(f't-SNE of the test split{subset}, backbone features\n{title}{note}', fontsize=10)
  ax.set_xticks([])
  ax.set_yticks([])
  ax.legend(loc='center left', bbox_to_anchor=(1.01, 0.5), fontsize=8, frameon=False)
  _save(fig, path)


def _show(ax, image: np.ndarray, title: str, outline: str | None, fontsize: float = 7) -> None:
  """An image without ticks, titled, its frame coloured `outline` (thick) or light grey."""
  ax.imshow(image, interpolation='nearest' if image.shape[0] < 64 else 'antialiased')
  ax.set_xticks([])
  ax.set_yticks([])
  ax.set_title(title, fontsize=fontsize, color=outline or 'black')
  for spine in ax.spines.values():
    spine.set_edgecolor(outline or RIGHT)
    spine.set_linewidth(3 if outline else 0.5)


def nearest_neighbours(embedded, queries: np.ndarray, k: int, path: str) -> None:
  """One row per test query: the query, then its k nearest training images by cosine
  similarity of backbone features (the kNN monitor's), wrong classes outlined in red."""
  names = embedded.class_names
  similarity = embedded.test_features[queries] @ embedded.train_features.T
  nearest = np.argsort(-similarity, axis=1, kind='stable')[:, :k]
  fig = pyplot().figure(figsize=(1.25 * (k + 1.3), 1.45 * len(queries)))
  grid = fig.add_gridspec(len(queries), k + 2, width_ratios=[1, 0.3] + [1] * k)
  for row, (query, neighbours) in enumerate(zip(queries, nearest)):
    label = embedded.test_labels[query]
    ax = fig.add_subplot(grid[row, 0])
    _show(ax, embedded.test[int(query)]['image'], f'query: {names[label]}', None, 8)
    same = int(np.sum(embedded.train_labels[neighbours] == label))
    ax.set_ylabel(f'test #{query}\n{same}/{k} same class', fontsize=7)
    for col, j in enumerate(neighbours, start=2):
      neighbour_label = embedded.train_labels[j]
      wrong = neighbour_label != label
      title = f'{similarity[row, j]:.3f}' + (f'\n{names[neighbour_label]}' if wrong else '\n')
      ax = fig.add_subplot(grid[row, col])
      _show(ax, embedded.train[int(j)]['image'], title, WRONG if wrong else None)
  fig.suptitle(
    f'Nearest training images of {len(queries)} seeded test queries (cosine similarity of '
    'backbone features); red: another class',
    fontsize=10,
  )
  _save(fig, path, rect=(0, 0, 1, 0.97))


def hardest_negatives(
  embedded, batch: np.ndarray, num_anchors: int, choice, temperature: float, path: str, k: int
) -> None:
  """The paper's Fig. 2 on data: for the first anchors of one test batch, the k negatives
  of largest hardening weight as H-UCL sees them (every other sample) and as H-SCL does
  (other classes only); same-class (false) negatives outlined in red."""
  z, labels = embedded.test_projections[batch], embedded.test_labels[batch]
  names = embedded.class_names
  fig = pyplot().figure(figsize=(1.1 * (2 * k + 3), 1.35 * num_anchors + 0.9))
  grid = fig.add_gridspec(
    num_anchors, 2 * k + 3, width_ratios=[1] * (k + 1) + [0.35] + [1] * (k + 1)
  )
  for half, negatives in enumerate(hard_negatives.NEGATIVE_SETS):
    top, weights = hard_negatives.top_negatives(
      z, labels, choice.function(), temperature, negatives, k
    )
    first = half * (k + 2)
    for row in range(num_anchors):
      anchor = int(batch[row])
      ax = fig.add_subplot(grid[row, first])
      _show(ax, embedded.test[anchor]['image'], f'anchor: {names[labels[row]]}', None, 8)
      for col, (j, weight) in enumerate(zip(top[row], weights[row]), start=1):
        ax = fig.add_subplot(grid[row, first + col])
        if j < 0:  # fewer than k negatives of weight > 0 (a threshold hardening)
          ax.axis('off')
          if col == 1:  # out of the layout: tight_layout would shrink every image for it
            note = ax.text(0, 0.5, 'no negative with η(g) > 0', transform=ax.transAxes, fontsize=9)
            note.set_in_layout(False)
          continue
        false = labels[j] == labels[row]
        title = f'q={weight:.3f}\n{names[labels[j]]}'
        _show(ax, embedded.test[int(batch[j])]['image'], title, WRONG if false else None)
  fig.text(0.27, 0.965, 'H-UCL: every other sample is a negative', ha='center', fontsize=11)
  fig.text(0.75, 0.965, 'H-SCL: only samples of other classes', ha='center', fontsize=11)
  fig.suptitle(
    f'Top-{k} negatives by hardening weight q ∝ η(g) in one test batch of {len(batch)}; '
    f'{choice.describe()}, g = z·z′/{temperature:g} on projection-head outputs; '
    'red: same class (a false negative)',
    fontsize=9,
    y=0.995,
  )
  _save(fig, path, rect=(0, 0, 1, 0.95))


def _save(fig, path: str, rect=(0, 0, 1, 1)) -> None:
  fig.tight_layout(rect=rect)
  atomic.write_figure(path, fig, dpi=110)
  pyplot().close(fig)
