"""experiments/plots: which methods Figs. 4 and 5 draw, read from the methods table."""

from __future__ import annotations

import dataclasses
import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # `from configs import ...`, as from the repo root

from hscl_jax.config import methods  # noqa: E402
from hscl_jax.experiments import plots as image_plots  # noqa: E402


def test_figs_4_and_5_show_the_methods_tables_supervised_hardened_rows(monkeypatch):
  """Figs. 4 and 5's methods are read from the methods table: H-SCL(β) and H-SCL(τ) (not
  H-UCL, hardened but unsupervised, nor SCL), and a new supervised hardened row with them."""
  assert image_plots.hardened_supervised_labels() == ['H-SCL(β)', 'H-SCL(τ)']
  new = dataclasses.replace(
    methods.by_label('H-SCL(β)'), label='H-SCL(new)', slug='hscl_new', sweep_name='hscl-new'
  )
  monkeypatch.setattr(methods, 'ROWS', (*methods.ROWS, new))
  assert image_plots.hardened_supervised_labels() == ['H-SCL(β)', 'H-SCL(τ)', 'H-SCL(new)']


@dataclasses.dataclass(frozen=True)
class _Setting:
  label: str


def test_every_figure_a_report_draws_is_closed(tmp_path):
  """pyplot keeps a figure until it is closed: a grid writing its report after every run
  would otherwise hold every figure of every report (matplotlib warns past 20)."""
  plt = image_plots.require_pyplot()
  plt.close('all')
  epoch = {'epoch': 1, 'knn_top1': 0.5, 'assumption1_fraction': 0.4}
  epoch.update(dict.fromkeys(image_plots.FOUR_LOSSES, 1.0))
  best = {label: _Setting(label) for label in ('SCL', 'H-SCL(β)')}
  summary = {setting: {'runs': [{'history': [epoch]}]} for setting in best.values()}
  files = image_plots.plot_report(summary, best, str(tmp_path))
  assert files == ['fig1_knn.png', 'fig4_assumption1.png', 'fig5_losses.png']
  assert all((tmp_path / name).stat().st_size > 0 for name in files)
  assert plt.get_fignums() == []
