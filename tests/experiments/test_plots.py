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
