"""The inspection figures drawn from small hand-made embeddings: what each panel shows
(which image, which title, which outline) recomputed here from the arrays, without a run.

t-SNE is replaced by a recorder (its layout is scikit-learn's business; which points reach
it, and with which perplexity, is ours)."""

from __future__ import annotations

import contextlib
import types
import warnings

import matplotlib
import numpy as np
from PIL import Image
import pytest

from hscl_jax.evaluation import figures
from hscl_jax.evaluation import hard_negatives
from hscl_jax.evaluation import inspection

WRONG_RGBA = matplotlib.colors.to_rgba(figures.WRONG)
RIGHT_RGBA = matplotlib.colors.to_rgba(figures.RIGHT)


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
  """Every figure handed to `_save`, kept after it is written and closed."""
  kept = []
  original = figures._save

  def keep(fig, path, **kwargs):
    kept.append(fig)
    original(fig, path, **kwargs)

  monkeypatch.setattr(figures, '_save', keep)
  return kept


@pytest.fixture
def tsne(monkeypatch):
  """scikit-learn's TSNE replaced: records its arguments and the rows it is given, and
  returns their first two coordinates."""
  calls = []

  class RecordingTSNE:
    def __init__(self, **kwargs):
      self.kwargs = kwargs

    def fit_transform(self, features):
      calls.append((self.kwargs, np.array(features)))
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
  titled with it (and its class when another, outlined in red); the row's label counts
  the same-class ones."""
  embedded, queries, k = _embedded(), np.array([1, 4, 6]), 4
  path = tmp_path / 'nn.png'
  with drawn_without_warnings():
    figures.nearest_neighbours(embedded, queries, k, str(path))
  (fig,) = saved
  panels = fig.axes
  assert len(panels) == len(queries) * (k + 1)
  _assert_same_width(panels)
  _assert_inside(fig, top=0.97)  # the top 3 %: the title's
  similarity = embedded.test_features.astype(np.float64) @ embedded.train_features.T
  for row, query in enumerate(queries):
    query_ax, *neighbour_axes = panels[row * (k + 1) : (row + 1) * (k + 1)]
    assert [_cell(ax) for ax in neighbour_axes] == [(row, col) for col in range(2, k + 2)]
    assert _cell(query_ax) == (row, 0)
    label = embedded.test_labels[query]
    assert _shown(query_ax) == 100 + query
    assert query_ax.get_title() == f'query: class{label}'
    nearest = np.argsort(-similarity[query])[:k]
    same = int(np.sum(embedded.train_labels[nearest] == label))
    assert query_ax.get_ylabel() == f'test #{query}\n{same}/{k} same class'
    for ax, j in zip(neighbour_axes, nearest):
      assert _shown(ax) == j
      wrong = embedded.train_labels[j] != label
      name = f'class{embedded.train_labels[j]}' if wrong else ''
      assert ax.get_title() == f'{similarity[query, j]:.3f}\n{name}'
      _assert_outlined(ax, wrong)
  with Image.open(path) as png:  # 1.25 (k + 1.3) x 1.45 rows inches at 110 dpi, truncated
    assert png.size == (int(110 * 1.25 * (k + 1.3)), int(110 * 1.45 * len(queries)))


def _shown(ax) -> int:
  """The value of the uniform image a panel shows."""
  assert len(ax.images) == 1, ax.get_title()
  return int(ax.images[0].get_array()[0, 0, 0])


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


def _assert_outlined(ax, wrong):
  """A wrong panel: red title and thick red frame; a right one: black title, thin grey."""
  colour = WRONG_RGBA if wrong else matplotlib.colors.to_rgba('black')
  assert matplotlib.colors.to_rgba(ax.title.get_color()) == colour
  for spine in ax.spines.values():
    assert spine.get_edgecolor() == (WRONG_RGBA if wrong else RIGHT_RGBA)
    assert spine.get_linewidth() == (3 if wrong else 0.5)


@pytest.mark.parametrize('side, interpolation', [(63, 'nearest'), (64, 'antialiased')])
def test_small_images_are_drawn_with_nearest_pixels(side, interpolation):
  plt = figures.pyplot()
  fig, ax = plt.subplots()
  figures._show(ax, np.zeros((side, side, 3), np.uint8), 'title', None)
  assert ax.images[0].get_interpolation() == interpolation
  assert not ax.get_xticks().size and not ax.get_yticks().size
  plt.close(fig)


def test_hardest_negatives_shows_each_sets_top_k_as_hard_negatives_computes_them(saved, tmp_path):
  """Two halves (H-UCL's negatives, then H-SCL's), one row per anchor: the anchor, then
  its k most weighted negatives with their weight q and class, same-class ones in red."""
  embedded, k, num_anchors, temperature = _embedded(num_test=9), 3, 2, 0.5
  batch = np.array([8, 2, 5, 0, 7, 3])
  choice = inspection.HardeningChoice('exp', 1.0)
  path = tmp_path / 'hard.png'
  with drawn_without_warnings():
    figures.hardest_negatives(embedded, batch, num_anchors, choice, temperature, str(path), k)
  (fig,) = saved
  z, labels = embedded.test_projections[batch], embedded.test_labels[batch]
  panels = iter(fig.axes)
  for half, negatives in enumerate(hard_negatives.NEGATIVE_SETS):
    top, weights = hard_negatives.top_negatives(
      z, labels, choice.function(), temperature, negatives, k
    )
    for row in range(num_anchors):
      anchor_ax = next(panels)
      assert _shown(anchor_ax) == 100 + batch[row]
      assert _cell(anchor_ax) == (row, half * (k + 2))
      assert anchor_ax.get_title() == f'anchor: class{labels[row]}'
      for col, (j, weight) in enumerate(zip(top[row], weights[row]), start=1):
        ax = next(panels)
        assert _cell(ax) == (row, half * (k + 2) + col)
        assert _shown(ax) == 100 + batch[j]
        assert ax.get_title() == f'q={weight:.3f}\nclass{labels[j]}'
        _assert_outlined(ax, labels[j] == labels[row])
  assert next(panels, None) is None
  _assert_same_width(fig.axes)
  _assert_inside(fig, top=0.95)
  # Each half's heading centred over its panels, above them.
  for half, text in enumerate(('H-UCL: every other sample', 'H-SCL: only samples of other')):
    (heading,) = [t for t in fig.texts if t.get_text().startswith(text)]
    x, y = heading.get_position()
    boxes = [ax.get_position() for ax in fig.axes if _cell(ax)[1] // (k + 2) == half]
    assert min(b.x0 for b in boxes) < x < max(b.x1 for b in boxes), text
    assert max(b.y1 for b in boxes) < y < 1, text
  assert 'in one test batch of 6; η(g) = exp(βg), β = 1, g = z·z′/0.5' in fig._suptitle.get_text()
  with Image.open(path) as png:
    assert png.size == (int(110 * 1.1 * (2 * k + 3)), int(110 * (1.35 * num_anchors + 0.9)))


def test_an_anchor_without_weighted_negatives_gets_a_note_in_place_of_its_images(saved, tmp_path):
  """A threshold no pair reaches: every negative panel is off, the first holds the note."""
  embedded, k = _embedded(num_test=6), 2
  choice = inspection.HardeningChoice('threshold', 1e6)
  with drawn_without_warnings():
    figures.hardest_negatives(embedded, np.arange(6), 1, choice, 0.5, str(tmp_path / 'h.png'), k)
  (fig,) = saved
  for half in range(2):
    anchor_ax, *negative_axes = fig.axes[half * (k + 1) : (half + 1) * (k + 1)]
    assert anchor_ax.images
    assert all(not ax.axison and not ax.images for ax in negative_axes)
    notes = [[t.get_text() for t in ax.texts] for ax in negative_axes]
    assert notes == [['no negative with η(g) > 0'], []]
