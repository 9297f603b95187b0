"""The inspection figures drawn from small hand-made embeddings: what each panel shows
(which image, which title, which outline) recomputed here from the arrays, without a run.

t-SNE is replaced by a recorder (its layout is scikit-learn's business; which points reach
it, and with which perplexity, is ours)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import subprocess
import sys
import types
import warnings

import matplotlib
from matplotlib.backends.backend_agg import FigureCanvasAgg
import numpy as np
from PIL import Image
import pytest
import threadpoolctl

from hscl_jax.evaluation import figures
from hscl_jax.evaluation import hard_negatives
from hscl_jax.evaluation import inspection

PALETTE = (figures.SAME_CLASS, figures.OTHER_CLASS)


def _images(count, side=6, offset=0):
  """Image i is uniform with value (i + offset) % 256: which one a panel shows is readable."""
  values = (np.arange(count) + offset) % 256
  return [{'image': np.full((side, side, 3), v, np.uint8)} for v in values]


def _embedded(num_train=12, num_test=9, num_classes=3, dim=5, seed=0):
  rng = np.random.default_rng(seed)
  unit = lambda x: (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)
  return inspection.Embedded(
    train=_images(num_train),
    test=_images(num_test, offset=100),
    class_names=[f'class{c}' for c in range(num_classes)],
    train_features=unit(rng.normal(size=(num_train, dim))),
    train_labels=np.arange(num_train) % num_classes,
    test_features=unit(rng.normal(size=(num_test, dim))),
    test_labels=(np.arange(num_test) * 2) % num_classes,
    test_projections=unit(rng.normal(size=(num_test, dim))),
  )


@contextlib.contextmanager
def drawn_without_warnings():
  """A warning while drawing is a layout matplotlib could not apply (tight_layout in a
  degenerate rect) or a drawing it changed: the figure would not be the one described."""
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter('always')
    yield
  assert not caught, [str(w.message) for w in caught]


@pytest.fixture
def saved(monkeypatch):
  """Every figure handed to `save`, kept after it is written and closed."""
  kept = []
  original = figures.save

  def keep(fig, path, **kwargs):
    kept.append(fig)
    original(fig, path, **kwargs)

  monkeypatch.setattr(figures, 'save', keep)
  return kept


class Calls(list):
  threads: list[int] | None = None


@pytest.fixture
def tsne(monkeypatch):
  """scikit-learn's TSNE replaced: records its arguments and the rows it is given (and in
  `threads`, the OpenMP threads it may use), and returns their first two coordinates."""
  calls = Calls()

  class RecordingTSNE:
    def __init__(self, **kwargs):
      self.kwargs = kwargs

    def fit_transform(self, features):
      calls.append((self.kwargs, np.array(features)))
      info = threadpoolctl.threadpool_info()
      calls.threads = [pool['num_threads'] for pool in info if pool['user_api'] == 'openmp']
      return np.asarray(features)[:, :2]

  import sklearn.manifold

  monkeypatch.setattr(sklearn.manifold, 'TSNE', RecordingTSNE)
  return calls


def _tsne_embedded(labels, dim=3, seed=0):
  rng = np.random.default_rng(seed)
  num_classes = int(np.max(labels)) + 1
  return types.SimpleNamespace(
    test_features=rng.normal(size=(len(labels), dim)).astype(np.float32),
    test_labels=np.asarray(labels),
    class_names=[f'c{c}' for c in range(num_classes)],
  )


@pytest.mark.parametrize('count, perplexity', [(40, 13.0), (91, 30.0), (100, 30.0)])
def test_tsne_perplexity_is_a_third_of_the_points_at_most_30(tsne, tmp_path, count, perplexity):
  with drawn_without_warnings():
    figures.tsne_map(_tsne_embedded(np.arange(count) % 4), str(tmp_path / 't.png'), 'run', seed=3)
  ((kwargs, _),) = tsne
  assert kwargs == dict(n_components=2, perplexity=perplexity, init='pca', random_state=3)


def test_tsne_runs_on_one_openmp_thread_whatever_the_process_allows(tsne, tmp_path):
  """scikit-learn's OpenMP runtime is loaded (with TSNE's module) and allows 2 threads
  around the call; inside it, 1."""
  with threadpoolctl.threadpool_limits(limits=2, user_api='openmp'):
    allowed = threadpoolctl.threadpool_info()
    figures.tsne_map(_tsne_embedded(np.arange(40) % 4), str(tmp_path / 't.png'), 'run', seed=0)
  assert [p['num_threads'] for p in allowed if p['user_api'] == 'openmp'][:1] == [2]
  assert tsne.threads and set(tsne.threads) == {1}, tsne.threads


@pytest.mark.parametrize('count', [50, 51])
def test_tsne_map_shows_every_point_up_to_the_cap_and_a_seeded_subset_beyond(
  tsne, saved, tmp_path, monkeypatch, count
):
  monkeypatch.setattr(figures, 'TSNE_MAX_POINTS', 50)
  embedded = _tsne_embedded(np.arange(count) % 4)
  with drawn_without_warnings():
    figures.tsne_map(embedded, str(tmp_path / 't.png'), 'my run', seed=7)
  with Image.open(tmp_path / 't.png') as png:  # 8 x 7 inches at 110 dpi
    assert png.size == (880, 770)
  ((_, rows),) = tsne
  if count <= 50:
    np.testing.assert_array_equal(rows, embedded.test_features)
    subset = ''
  else:
    shown = np.sort(np.random.default_rng(7).choice(count, 50, replace=False))
    np.testing.assert_array_equal(rows, embedded.test_features[shown])
    subset = f' (a seeded 50 of {count})'
  (fig,) = saved
  _assert_inside(fig)
  title = fig.axes[0].get_title()
  assert title == f't-SNE of the test split{subset}, backbone features\nmy run'


@pytest.mark.parametrize('count, size', [(2000, 12), (2001, 4)])
def test_tsne_points_are_smaller_beyond_2000(tsne, saved, tmp_path, count, size):
  with drawn_without_warnings():
    figures.tsne_map(_tsne_embedded(np.arange(count) % 4), str(tmp_path / 't.png'), 'r', seed=0)
  points = saved[0].axes[0].collections[0]
  assert len(points.get_offsets()) == count
  np.testing.assert_array_equal(points.get_sizes(), [size])


def test_tsne_points_are_coloured_by_class(tsne, saved, tmp_path):
  labels = np.array([2, 0, 1, 1, 2, 0, 2])
  with drawn_without_warnings():
    figures.tsne_map(_tsne_embedded(labels), str(tmp_path / 't.png'), 'r', seed=0)
  points = saved[0].axes[0].collections[0]
  want = matplotlib.colormaps['tab10'](np.arange(3))[labels]
  np.testing.assert_allclose(points.get_facecolors()[:, :3], want[:, :3])


def test_a_legend_of_every_class_up_to_20(tsne, saved, tmp_path):
  labels = np.arange(60) % 20
  with drawn_without_warnings():
    figures.tsne_map(_tsne_embedded(labels), str(tmp_path / 't.png'), 'r', seed=0)
  ax = saved[0].axes[0]
  assert [t.get_text() for t in ax.get_legend().get_texts()] == [f'c{c}' for c in range(20)]
  assert 'legend' not in ax.get_title()


def test_beyond_20_classes_the_legend_names_the_most_frequent_in_class_order(tsne, saved, tmp_path):
  """25 classes, class c with 1 + (c * 7) % 25 members: the 20 largest are all but the
  five whose (c * 7) % 25 is smallest (classes 0, 18, 11, 4 and 22)."""
  counts = 1 + (np.arange(25) * 7) % 25
  labels = np.repeat(np.arange(25), counts)
  with drawn_without_warnings():
    figures.tsne_map(_tsne_embedded(labels), str(tmp_path / 't.png'), 'r', seed=0)
  ax = saved[0].axes[0]
  largest = sorted(np.argsort(-counts, kind='stable')[:20])
  assert set(range(25)) - set(largest) == {0, 4, 11, 18, 22}
  assert [t.get_text() for t in ax.get_legend().get_texts()] == [f'c{c}' for c in largest]
  assert ax.get_title().endswith('; legend: the 20 most frequent of 25 classes')


@pytest.mark.parametrize(
  'num_classes, colours',
  [
    (10, lambda: matplotlib.colormaps['tab10'](np.arange(10))),
    (11, lambda: matplotlib.colormaps['tab20'](np.arange(11))),
    (20, lambda: matplotlib.colormaps['tab20'](np.arange(20))),
    (21, lambda: matplotlib.colormaps['turbo'](np.linspace(0.02, 0.98, 21))),
  ],
)
def test_class_colours_tab10_then_tab20_then_spread_hues(num_classes, colours):
  figures.pyplot()
  np.testing.assert_array_equal(figures._class_colours(num_classes), colours())


def test_nearest_neighbours_rows_are_the_most_similar_training_images(saved, tmp_path):
  """Row r: the query, then its k training images in decreasing cosine similarity, each
  titled with it (and its class when another, framed OTHER_CLASS); the row's label counts
  the same-class ones."""
  embedded, queries, k = _embedded(), np.array([1, 4, 6]), 4
  path = tmp_path / 'nn.png'
  with drawn_without_warnings():
    figures.nearest_neighbours(embedded, queries, k, str(path))
  (fig,) = saved
  panels = fig.axes
  assert len(panels) == len(queries) * (k + 1)
  _assert_same_width(panels)
  _assert_inside(fig, top=1 - 0.5 / fig.get_figheight())  # the top half inch: the title's
  similarity = embedded.test_features.astype(np.float64) @ embedded.train_features.T
  for row, query in enumerate(queries):
    query_ax, *neighbour_axes = panels[row * (k + 1) : (row + 1) * (k + 1)]
    assert [_cell(ax) for ax in neighbour_axes] == [(row, col) for col in range(2, k + 2)]
    assert _cell(query_ax) == (row, 0)
    label = embedded.test_labels[query]
    assert _shown(query_ax) == 100 + query
    assert query_ax.get_title() == f'query\nclass{label}'
    nearest = np.argsort(-similarity[query])[:k]
    same = int(np.sum(embedded.train_labels[nearest] == label))
    assert query_ax.get_ylabel() == f'test #{query}\n{same}/{k} same class'
    for ax, j in zip(neighbour_axes, nearest):
      assert _shown(ax) == j
      wrong = embedded.train_labels[j] != label
      name = f'class{embedded.train_labels[j]}' if wrong else ''
      assert ax.get_title() == f'{similarity[query, j]:.3f}\n{name}'
      _assert_framed(ax, figures.OTHER_CLASS if wrong else None)
  assert "orange frame: another class than the query's" in fig._suptitle.get_text()
  with Image.open(path) as png:  # 1.25 (k + 1.3) x (1.5 rows + 0.5) inches at 110 dpi
    assert png.size == (int(110 * 1.25 * (k + 1.3)), int(110 * (1.5 * len(queries) + 0.5)))


def _shown(ax) -> int:
  """The value of the uniform image a panel shows."""
  assert len(ax.images) == 1, ax.get_title()
  return int(ax.images[0].get_array()[0, 0, 0])


def _rows(ax) -> int:
  """How many grid rows a panel spans."""
  return len(ax.get_subplotspec().rowspan)


def _cell(ax) -> tuple[int, int]:
  """(row, column) of a panel's grid cell."""
  spec = ax.get_subplotspec()
  return spec.rowspan.start, spec.colspan.start


def _assert_inside(fig, top=1.0):
  """Every panel inside the figure, below `top` (figure fraction)."""
  for ax in fig.axes:
    box = ax.get_position()
    assert 0 <= box.x0 < box.x1 <= 1 and 0 <= box.y0 < box.y1 <= top, (ax.get_title(), box)


def _assert_same_width(panels):
  """Every image drawn at one size: the grid cells of queries, anchors and their rows are
  equally wide (only the gap columns are narrower)."""
  widths = [ax.get_position(original=True).width for ax in panels]
  np.testing.assert_allclose(widths, widths[0], rtol=1e-9)


def _assert_framed(ax, colour):
  """A marked panel: a thick frame of its palette colour; any other: thin grey. Titles
  stay black (a coloured title is harder to read than a frame)."""
  assert matplotlib.colors.to_rgba(ax.title.get_color()) == matplotlib.colors.to_rgba('black')
  want = figures.UNMARKED if colour is None else colour.value
  for spine in ax.spines.values():
    assert spine.get_edgecolor() == matplotlib.colors.to_rgba(want)
    assert spine.get_linewidth() == (0.5 if colour is None else 3)


@pytest.mark.parametrize('side, interpolation', [(63, 'nearest'), (64, 'antialiased')])
def test_small_images_are_drawn_with_nearest_pixels(side, interpolation):
  plt = figures.pyplot()
  fig, ax = plt.subplots()
  figures._show(ax, np.zeros((side, side, 3), np.uint8), 'title', None)
  assert ax.images[0].get_interpolation() == interpolation
  assert not ax.get_xticks().size and not ax.get_yticks().size
  plt.close(fig)


RUN = 'H-SCL(β)'
PHRASES = {'hucl': 'as H-UCL would', 'hscl': 'as H-SCL does'}


def _draw_hardest(embedded, batch, num_anchors, k, path, choice=None, temperature=0.5):
  choice = choice or inspection.HardeningChoice('exp', 1.0)
  with drawn_without_warnings():
    figures.hardest_negatives(
      embedded, batch, num_anchors, choice, temperature, str(path), k, RUN, PHRASES
    )


def test_hardest_negatives_shows_each_sets_top_k_as_hard_negatives_computes_them(saved, tmp_path):
  """Per anchor two rows (H-UCL's negatives, then H-SCL's) beside the anchor: its k most
  weighted negatives with their weight q and class, same-class ones framed SAME_CLASS;
  the title names the one run measured and the set it trained with."""
  embedded, k, num_anchors, temperature = _embedded(num_test=9), 3, 2, 0.5
  batch = np.array([8, 2, 5, 0, 7, 3])
  choice = inspection.HardeningChoice('exp', 1.0)
  path = tmp_path / 'hard.png'
  _draw_hardest(embedded, batch, num_anchors, k, path, choice, temperature)
  (fig,) = saved
  z, labels = embedded.test_projections[batch], embedded.test_labels[batch]
  panels = iter(fig.axes)
  for half, negatives in enumerate(hard_negatives.NEGATIVE_SETS):
    top, weights = hard_negatives.top_negatives(
      z, labels, choice.function(), temperature, negatives, k
    )
    for row in range(num_anchors):
      if half == 0:
        anchor_ax = next(panels)
        assert _shown(anchor_ax) == 100 + batch[row]
        assert _cell(anchor_ax) == (3 * row, 0) and _rows(anchor_ax) == 2
        assert anchor_ax.get_title() == f'anchor\nclass{labels[row]}'
      for col, (j, weight) in enumerate(zip(top[row], weights[row]), start=2):
        ax = next(panels)
        assert _cell(ax) == (3 * row + half, col)
        assert _shown(ax) == 100 + batch[j]
        assert ax.get_title() == f'q={weight:.3f}\nclass{labels[j]}'
        assert ax.get_ylabel() == (hard_negatives.SET_LABELS[negatives] if col == 2 else '')
        _assert_framed(ax, figures.SAME_CLASS if labels[j] == labels[row] else None)
  assert next(panels, None) is None
  _assert_same_width(fig.axes)
  _assert_inside(fig, top=1 - 0.7 / fig.get_figheight())
  title = fig._suptitle.get_text()
  assert title.startswith("This H-SCL(β) run's encoder: the top-3 negatives")
  assert 'of 2 anchors of one test batch of 6\nη(g) = exp(βg), β = 1, g = z·z′/0.5' in title
  assert (
    'upper rows as H-UCL would: every other sample; lower rows as H-SCL does: only samples '
    "of other classes; blue frame: the anchor's class (a false negative)"
  ) in title
  with Image.open(path) as png:
    assert png.size == (int(110 * 1.25 * (k + 1.3)), int(110 * (2.95 * num_anchors + 1.0)))


def test_one_palette_one_meaning_per_colour_in_both_figures(saved, tmp_path):
  """Both grids frame panels only in the palette's colours, each colour for one relation
  to the query or anchor beside it (SAME_CLASS: its class; OTHER_CLASS: another), and
  each figure's caption calls the colour it uses by the palette's name."""
  embedded = _embedded(num_train=30, num_test=12)
  figures.nearest_neighbours(embedded, np.arange(6), 5, str(tmp_path / 'nn.png'))
  _draw_hardest(embedded, np.arange(12), 3, 5, tmp_path / 'hard.png')
  assert len({c.value for c in PALETTE}) == len({c.name for c in PALETTE}) == len(PALETTE)
  neighbours_fig, hardest_fig = saved
  meaning = {}  # colour -> whether the panels it frames show the query's or anchor's class
  unmarked = matplotlib.colors.to_rgba(figures.UNMARKED)
  for fig, reference in ((neighbours_fig, 'query'), (hardest_fig, 'anchor')):
    used = set()
    for ax in fig.axes:
      if not ax.images or ax.get_title().startswith(reference):
        continue
      (edge,) = {spine.get_edgecolor() for spine in ax.spines.values()}
      if edge != unmarked:
        own = current_of(fig, ax, reference)
        name = ax.get_title().split('\n')[1] or own  # a neighbour of the query's class: unnamed
        meaning.setdefault(edge, set()).add(name == own)
        used.add(edge)
    (colour,) = [c for c in PALETTE if matplotlib.colors.to_rgba(c.value) in used]
    assert f'{colour.name} frame' in fig._suptitle.get_text()
  assert meaning == {
    matplotlib.colors.to_rgba(figures.OTHER_CLASS.value): {False},
    matplotlib.colors.to_rgba(figures.SAME_CLASS.value): {True},
  }


def current_of(fig, ax, reference):
  """The class name of the query or anchor whose row holds `ax`."""
  row = _cell(ax)[0]
  for other in fig.axes:
    start, stop = other.get_subplotspec().rowspan.start, other.get_subplotspec().rowspan.stop
    if other.get_title().startswith(reference) and start <= row < stop:
      return other.get_title().split('\n')[1]
  raise AssertionError(ax.get_title())


def test_hardest_negatives_fits_a_screen_with_readable_text(saved, tmp_path):
  """At inspect's sizes (8 negatives, NUM_ANCHORS anchors) the PNG is at most 1,400 pixels
  wide; every text is at least PANEL_FONT = 9 points, 13.75 pixels at its 110 dpi; and a
  panel's title, long class names cut, fits the grid's column (no overlap)."""
  k, num_anchors = inspection.NUM_SHOWN_NEGATIVES, inspection.NUM_ANCHORS
  embedded = _embedded(num_train=30, num_test=40, num_classes=4)
  embedded = dataclasses.replace(
    embedded, class_names=['European fire salamander', 'cat', "potter's wheel", 'ship']
  )
  path = tmp_path / 'hard.png'
  _draw_hardest(embedded, np.arange(40), num_anchors, k, path)
  with Image.open(path) as png:
    width, height = png.size
  assert (width, height) == (int(110 * 1.25 * (k + 1.3)), int(110 * (2.95 * num_anchors + 1.0)))
  assert width <= 1400 and figures.DPI == 110
  (fig,) = saved
  texts = [fig._suptitle] + [
    t for ax in fig.axes for t in (ax.title, ax.yaxis.label) if t.get_text()
  ]
  smallest = min(t.get_fontsize() for t in texts)
  assert smallest >= figures.PANEL_FONT == 9 and smallest * figures.DPI / 72 >= 13.75
  fig.set_dpi(figures.DPI)  # extents in the PNG's pixels
  renderer = FigureCanvasAgg(fig).get_renderer()
  column = width / (k + 1.3)  # the pitch of the grid's unit columns, in pixels
  for ax in fig.axes:
    assert ax.title.get_window_extent(renderer).width <= column, ax.get_title()
  assert fig._suptitle.get_window_extent(renderer).width <= width
  cut = 'European fire salamander'[: figures.NAME_CHARS - 1] + '…'
  assert any(cut in ax.get_title() for ax in fig.axes)


def test_an_anchor_without_weighted_negatives_gets_a_note_in_place_of_its_images(saved, tmp_path):
  """A threshold no pair reaches: every negative panel is blank (no image, no frame, its
  row's label kept), the first of each row holds the note."""
  embedded, k = _embedded(num_test=6), 2
  choice = inspection.HardeningChoice('threshold', 1e6)
  _draw_hardest(embedded, np.arange(6), 1, k, tmp_path / 'h.png', choice)
  (fig,) = saved
  anchor_ax, *negative_axes = fig.axes
  assert anchor_ax.images and len(negative_axes) == 2 * k
  for half in range(2):
    row = negative_axes[half * k : (half + 1) * k]
    assert all(not ax.images for ax in row)
    assert all(not spine.get_visible() for ax in row for spine in ax.spines.values())
    assert [[t.get_text() for t in ax.texts] for ax in row] == [['no negative with η(g) > 0'], []]
    assert row[0].get_ylabel() == hard_negatives.SET_LABELS[hard_negatives.NEGATIVE_SETS[half]]


_FIRST_DRAW = """
from absl import logging
from hscl_jax.evaluation import figures
logging.set_verbosity(logging.INFO)
figures.pyplot()
"""


def test_a_missing_font_cache_is_announced_once_and_then_built(tmp_path):
  """The first pyplot() in a fresh matplotlib cache folder logs the line naming the font
  list before matplotlib builds it; that file then exists, and the next pyplot() in a new
  process finds it and says nothing."""
  env = {**os.environ, 'MPLCONFIGDIR': str(tmp_path)}
  cache = figures.font_cache_file(str(tmp_path))
  line = f"Building matplotlib's font cache ({cache})"
  outputs = []
  for _ in range(2):
    out = subprocess.run(
      [sys.executable, '-c', _FIRST_DRAW], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    outputs.append(out.stderr)
  assert line in outputs[0] and os.path.isfile(cache)
  assert line not in outputs[1], outputs[1]
