"""The figures of `python -m hscl_jax.inspect` (matplotlib, Agg; the `[train]` extra): the
t-SNE map, the nearest neighbours and the hardest negatives. `hscl_jax.evaluation.inspection`
computes what they show.

Each function takes an `inspection.Embedded` (the splits, class names, features and
projections) and writes one PNG.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
import sys

from absl import logging
import numpy as np

from hscl_jax import errors
from hscl_jax.evaluation import hard_negatives
from hscl_jax.rundir import atomic

TSNE_MAX_POINTS = 5000  # t-SNE is quadratic in memory and slow beyond this on a CPU
LEGEND_MAX_CLASSES = 20
DPI = 110  # every figure's: a 1.25-inch panel is 137 pixels, a 9-point title 13.75 high
PANEL_INCHES = 1.25  # an image panel's width in the neighbours and hardest-negatives grids
PANEL_FONT = 9  # points: the panels' titles and labels, readable at the PNG's own size
NAME_CHARS = 16  # a class name longer than a panel's title holds at PANEL_FONT is cut


@dataclasses.dataclass(frozen=True)
class Colour:
  value: str  # what matplotlib draws
  name: str  # what the figures' captions call it


# The one palette of the panel grids: a colour means the same in every figure. A panel
# framed in SAME_CLASS shows the class of the query or anchor beside it, one framed in
# OTHER_CLASS another class; each figure frames the panels its reader looks for (a
# neighbour of another class; a negative of the anchor's class) and names the colour.
SAME_CLASS = Colour('#0072b2', 'blue')
OTHER_CLASS = Colour('#e69f00', 'orange')
UNMARKED = '#bbbbbb'  # the thin frame of every other panel


def pyplot(program: str = 'python -m hscl_jax.inspect'):
  """matplotlib.pyplot on the Agg backend (files only, never a window); a missing
  matplotlib (in the `[train]` extra) is one line naming `program` and the fix. A program
  that trains before it draws calls this first, so the hours of training are not lost to
  a missing package at the end. Where matplotlib's font cache is still to be built (its
  first use on a machine: seconds, up to a minute with many fonts), a line says so first
  rather than leaving the program silent meanwhile."""
  try:
    import matplotlib
  except ImportError:
    raise errors.UserError(
      f'{program} draws with matplotlib, which is not installed. Fix: '
      "pip install -e '.[train]' (or pip install matplotlib)."
    ) from None
  matplotlib.use('Agg')
  if 'matplotlib.font_manager' not in sys.modules:  # importing it builds a missing cache
    cache = font_cache_file(matplotlib.get_cachedir())
    if cache is not None and not os.path.exists(cache):
      logging.info(
        "Building matplotlib's font cache (%s), once per machine and matplotlib version: "
        'seconds, up to a minute with many fonts installed.',
        cache,
      )
  import matplotlib.pyplot as plt  # after choosing the backend

  return plt


def font_cache_file(cache_dir: str) -> str | None:
  """The font list matplotlib's font_manager reads when it is imported, and builds there
  when it is missing: `fontlist-v<FontManager.__version__>.json` in matplotlib's cache
  folder, the version read from the module's source (importing it would build the cache);
  None where the source does not show it."""
  source = importlib.util.find_spec('matplotlib.font_manager').origin
  with open(source, encoding='utf-8') as f:
    match = re.search(r'class FontManager\b.*?__version__ = [\'"]([^\'"]+)', f.read(), re.S)
  return os.path.join(cache_dir, f'fontlist-v{match.group(1)}.json') if match else None


def _class_colours(num_classes: int) -> np.ndarray:
  """Distinct colours: tab10/tab20 for up to 20 classes, evenly spread hues beyond."""
  import matplotlib  # pyplot() has been called: it is installed

  if num_classes <= 10:
    return matplotlib.colormaps['tab10'](np.arange(num_classes))
  if num_classes <= 20:
    return matplotlib.colormaps['tab20'](np.arange(num_classes))
  return matplotlib.colormaps['turbo'](np.linspace(0.02, 0.98, num_classes))


def _embed_2d(features: np.ndarray, seed: int) -> np.ndarray:
  """t-SNE on one OpenMP thread: scikit-learn's Barnes-Hut threads spin at every
  iteration's barrier, so on a shared CPU they mostly wait for each other (the 359 digits
  test points: 4.8 s on one thread, 82 s on two, 2 cores under load 14)."""
  from sklearn.manifold import TSNE  # local: scikit-learn is slow to import
  from threadpoolctl import threadpool_limits

  perplexity = min(30.0, (len(features) - 1) / 3)
  tsne = TSNE(n_components=2, perplexity=perplexity, init='pca', random_state=seed)
  with threadpool_limits(limits=1, user_api='openmp'):
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
  save(fig, path)


def _show(ax, image: np.ndarray, title: str, frame: Colour | None) -> None:
  """An image without ticks, titled at PANEL_FONT, framed thick in `frame` or thin grey."""
  ax.imshow(image, interpolation='nearest' if image.shape[0] < 64 else 'antialiased')
  ax.set_xticks([])
  ax.set_yticks([])
  ax.set_title(title, fontsize=PANEL_FONT)
  for spine in ax.spines.values():
    spine.set_edgecolor(UNMARKED if frame is None else frame.value)
    spine.set_linewidth(0.5 if frame is None else 3)


def _fit(name: str) -> str:
  """A class name cut to what a panel's title holds."""
  return name if len(name) <= NAME_CHARS else name[: NAME_CHARS - 1] + '…'


def nearest_neighbours(embedded, queries: np.ndarray, k: int, path: str) -> None:
  """One row per test query: the query, then its k nearest training images by cosine
  similarity of backbone features (the kNN monitor's), another class framed OTHER_CLASS."""
  names = embedded.class_names
  similarity = embedded.test_features[queries] @ embedded.train_features.T
  nearest = np.argsort(-similarity, axis=1, kind='stable')[:, :k]
  fig = pyplot().figure(figsize=(PANEL_INCHES * (k + 1.3), 1.5 * len(queries) + 0.5))
  grid = fig.add_gridspec(len(queries), k + 2, width_ratios=[1, 0.3] + [1] * k)
  for row, (query, neighbours) in enumerate(zip(queries, nearest)):
    label = embedded.test_labels[query]
    ax = fig.add_subplot(grid[row, 0])
    _show(ax, embedded.test[int(query)]['image'], f'query\n{_fit(names[label])}', None)
    same = int(np.sum(embedded.train_labels[neighbours] == label))
    ax.set_ylabel(f'test #{query}\n{same}/{k} same class', fontsize=PANEL_FONT)
    for col, j in enumerate(neighbours, start=2):
      neighbour_label = embedded.train_labels[j]
      other = neighbour_label != label
      name = _fit(names[neighbour_label]) if other else ''
      ax = fig.add_subplot(grid[row, col])
      frame = OTHER_CLASS if other else None
      _show(ax, embedded.train[int(j)]['image'], f'{similarity[row, j]:.3f}\n{name}', frame)
  fig.suptitle(
    f'Nearest training images of {len(queries)} seeded test queries (cosine similarity of '
    f"backbone features)\n{OTHER_CLASS.name} frame: another class than the query's",
    fontsize=PANEL_FONT + 1,
  )
  save(fig, path, rect=(0, 0, 1, 1 - 0.5 / fig.get_figheight()))


def hardest_negatives(
  embedded,
  batch: np.ndarray,
  num_anchors: int,
  choice,
  temperature: float,
  path: str,
  k: int,
  run: str,
  set_phrases: dict[str, str],
) -> None:
  """The paper's Fig. 2 on data: for the first anchors of one test batch, the k negatives
  of largest hardening weight as H-UCL sees them (every other sample) and, in the row
  below, as H-SCL does (other classes only); same-class (false) negatives framed
  SAME_CLASS. `run` names the trained model ("H-SCL(β)"); `set_phrases`, per negative
  set, whether it trained with that set's weights ("as H-SCL does") or not ("as H-UCL
  would"): the figure shows one model's encoder, never two."""
  z, labels = embedded.test_projections[batch], embedded.test_labels[batch]
  names = embedded.class_names
  sets = hard_negatives.NEGATIVE_SETS
  fig = pyplot().figure(figsize=(PANEL_INCHES * (k + 1.3), 2.95 * num_anchors + 1.0))
  heights = ([1] * len(sets) + [0.1]) * num_anchors  # a thin gap between anchors
  grid = fig.add_gridspec(
    len(heights) - 1, k + 2, width_ratios=[1, 0.3] + [1] * k, height_ratios=heights[:-1]
  )
  for half, negatives in enumerate(sets):
    top, weights = hard_negatives.top_negatives(
      z, labels, choice.function(), temperature, negatives, k
    )
    for row in range(num_anchors):
      first = row * (len(sets) + 1)
      if half == 0:
        ax = fig.add_subplot(grid[first : first + len(sets), 0])
        _show(
          ax, embedded.test[int(batch[row])]['image'], f'anchor\n{_fit(names[labels[row]])}', None
        )
      for col, (j, weight) in enumerate(zip(top[row], weights[row]), start=2):
        ax = fig.add_subplot(grid[first + half, col])
        if col == 2:
          ax.set_ylabel(hard_negatives.SET_LABELS[negatives], fontsize=PANEL_FONT + 1)
        if j < 0:  # fewer than k negatives of weight > 0 (a threshold hardening)
          _empty(ax, note=col == 2)
          continue
        frame = SAME_CLASS if labels[j] == labels[row] else None
        title = f'q={weight:.3f}\n{_fit(names[labels[j]])}'
        _show(ax, embedded.test[int(batch[j])]['image'], title, frame)
  rows = '; '.join(
    f'{position} rows {set_phrases[n]}: {hard_negatives.SET_MEMBERS[n]}'
    for position, n in zip(('upper', 'lower'), sets)
  )
  fig.suptitle(
    f"This {run} run's encoder: the top-{k} negatives by hardening weight q ∝ η(g) of "
    f'{num_anchors} anchors of one test batch of {len(batch)}\n{choice.describe()}, '
    f'g = z·z′/{temperature:g} on projection-head outputs\n{rows}; '
    f"{SAME_CLASS.name} frame: the anchor's class (a false negative)",
    fontsize=PANEL_FONT + 1,
  )
  save(fig, path, rect=(0, 0, 1, 1 - 0.7 / fig.get_figheight()))


def _empty(ax, note: bool) -> None:
  """A negative's panel left blank (ylabel kept); the row's first says why."""
  for spine in ax.spines.values():
    spine.set_visible(False)
  ax.set_xticks([])
  ax.set_yticks([])
  if note:  # out of the layout: tight_layout would shrink every image for it
    text = ax.text(0, 0.5, 'no negative with η(g) > 0', transform=ax.transAxes, fontsize=PANEL_FONT)
    text.set_in_layout(False)


def save(fig, path: str, rect=(0, 0, 1, 1)) -> None:
  """`fig` laid out, written atomically at the figures' DPI, and closed (pyplot keeps every
  open figure until it is)."""
  fig.tight_layout(rect=rect)
  atomic.write_figure(path, fig, dpi=DPI)
  pyplot().close(fig)
