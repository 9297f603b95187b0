"""The methods: one row per method and setting of the paper's comparison (docs/method.md).

Config validation, the training loss and its hyperparameters, inspection's hardening, the
image and graph grids, their paired claims and launch/sweep.py all read `ROWS`, when they
run (so a row added for a test is seen by all of them). The table is data and imports no
loss (config/ imports nothing of ours but `errors`): hscl_jax/objectives maps each row to
its loss by the row's slug. Adding a method is one `Method` row in `ROWS` and its loss
function, written with `hscl_jax.losses`, in objectives' `LOSSES` under the row's slug.

A row is a config's (method, hardening) choice: `config.method` names the loss, and for a
method with several rows (H-SCL) `config.hardening` picks the row, `selects` saying which.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
import dataclasses
import math
from typing import Any

import numpy as np

# config.hardening's values, and the loss hyperparameter (training/plan's) each one reads.
HARDENINGS = ('exp', 'threshold')
HARDENING_PARAMETER = {'exp': 'beta', 'threshold': 'tau'}

# The paper's grids (Table I, eq. (4)): β for the exponential hardening, τ's schedule
# start × end for the threshold one.
BETA_GRID = (0.1, 0.5, 1.0, 2.0, 5.0)
TAU_STARTS = (-0.5, -0.3, -0.1)
TAU_ENDS = (-0.1, 0.0, 0.1)
GRID_FIELDS = ('beta', 'tau_start', 'tau_end')  # the config fields a grid point sets

# A sigmoid row's trained loss parameters (SigLIP's: t = e^{log_t}, b) and SigLIP's start
# (losses.SIGLIP_T, SIGLIP_B; tests/test_objectives.py checks they agree), the defaults of
# the config fields that start them (config/fields: `sigmoid_` + name).
SIGMOID_START = {'log_t': math.log(10.0), 'b': -10.0}
SIGMOID_LEARNED = tuple(SIGMOID_START)


@dataclasses.dataclass(frozen=True)
class Method:
  """One method with one hardening: its names, what it reads and its grid.

  `name` is config.method's value; `label` the paper's (report tables, --methods of the
  reports); `slug` the comparison's run directories and --seeds_for; `sweep_name`
  launch/sweep.py's --methods. `hardening` is 'none', 'exp' (β) or 'threshold' (τ).
  `queue`: the comparison's queue experiment runs it again with a queue; `graph`: Table
  II's graph experiment runs it (its loss there is the local–global one, tilted by β).
  `family`: 'softmax' (eq. (3): temperature, M, the queue) or 'sigmoid' (one logistic term
  per pair, its scale and bias trained with the model: `learned`). `compared`: one of the
  paper's settings, which the image comparison (Table I) and its reports run. Its loss is
  hscl_jax/objectives.LOSSES[slug].
  """

  name: str
  label: str
  slug: str
  sweep_name: str
  supervised: bool
  hardening: str
  selects: tuple[tuple[str, object], ...] = ()
  queue: bool = False
  graph: bool = False
  family: str = 'softmax'
  compared: bool = True

  @property
  def learned(self) -> tuple[str, ...]:
    """The loss parameters the train state holds and trains for this row."""
    return SIGMOID_LEARNED if self.family == 'sigmoid' else ()

  @property
  def reads(self) -> tuple[str, ...]:
    """The loss hyperparameters (training/plan's) this row's loss reads."""
    return () if self.hardening == 'none' else (HARDENING_PARAMETER[self.hardening],)

  @property
  def overrides(self) -> tuple[tuple[str, object], ...]:
    """The config fields that choose this row."""
    return (('method', self.name), *self.selects)

  def grid(self, betas: Sequence[float], taus: Sequence[tuple[float, float]]) -> list[tuple]:
    """Each setting's grid fields: one per β, per (τ start, τ end), or one empty one."""
    if self.hardening == 'exp':
      return [(('beta', b),) for b in betas]
    if self.hardening == 'threshold':
      return [(('tau_start', s), ('tau_end', e)) for s, e in taus]
    return [()]


def learned_initial(config) -> dict[str, Any] | None:
  """The config's row's trained loss parameters at their start (config.sigmoid_log_t,
  config.sigmoid_b), float32; None for a row that trains none."""
  names = of_config(config).learned
  return {name: np.float32(config[f'sigmoid_{name}']) for name in names} or None


# The table, in the paper's order (Table I's rows, the grids' and the sweep's order).
ROWS: tuple[Method, ...] = (
  Method('ucl', 'UCL', 'ucl', 'ucl', False, 'none', graph=True),
  Method('hucl', 'H-UCL', 'hucl', 'hucl', False, 'exp', graph=True),
  Method('scl', 'SCL', 'scl', 'scl', True, 'none', queue=True, graph=True),
  Method(
    'hscl',
    'H-SCL(β)',
    'hscl_beta',
    'hscl-exp',
    True,
    'exp',
    selects=(('hardening', 'exp'),),
    queue=True,
    graph=True,
  ),
  Method(
    'hscl',
    'H-SCL(τ)',
    'hscl_tau',
    'hscl-threshold',
    True,
    'threshold',
    selects=(('hardening', 'threshold'),),
  ),
  # The sigmoid family (SigLIP's loss on the same sets): after the paper's rows.
  Method(
    'sigmoid', 'Sig-UCL', 'sig_ucl', 'sigmoid', False, 'none', family='sigmoid', compared=False
  ),
  Method(
    'sigmoid_scl',
    'Sig-SCL',
    'sig_scl',
    'sigmoid-scl',
    True,
    'none',
    family='sigmoid',
    compared=False,
  ),
  Method(
    'sigmoid_hscl',
    'Sig-H-SCL(β)',
    'sig_hscl_beta',
    'sigmoid-hscl-exp',
    True,
    'exp',
    selects=(('hardening', 'exp'),),
    family='sigmoid',
    compared=False,
  ),
)

# The paper's claims as pairs of rows: hardening with labels against labels alone and
# against hardening alone; labels and hardening each against UCL.
PAIRS = (('H-SCL(β)', 'SCL'), ('H-SCL(β)', 'H-UCL'), ('SCL', 'UCL'), ('H-UCL', 'UCL'))

# The sigmoid family's question (`compare --grid=sigmoid`): does hardening help the
# supervised sigmoid loss as it helps the softmax one (the first pair); each supervised
# sigmoid row against its softmax row; the hardened one against hardening without labels.
SIGMOID_PAIRS = (
  ('Sig-H-SCL(β)', 'Sig-SCL'),
  ('Sig-H-SCL(β)', 'H-SCL(β)'),
  ('Sig-SCL', 'SCL'),
  ('Sig-H-SCL(β)', 'H-UCL'),
)


class Column(Sequence):
  """One column of `ROWS`, read when used (a row added later is in it), e.g. the labels."""

  def __init__(self, read: Callable[[tuple[Method, ...]], list]):
    self._read = read

  def __getitem__(self, index):
    return self._read(ROWS)[index]

  def __len__(self) -> int:
    return len(self._read(ROWS))

  def __repr__(self) -> str:
    return repr(tuple(self))


def _unique(values) -> list:
  return list(dict.fromkeys(values))


NAMES = Column(lambda rows: _unique(r.name for r in rows))  # config.method's values
SUPERVISED_NAMES = Column(lambda rows: _unique(r.name for r in rows if r.supervised))
UNSUPERVISED_NAMES = Column(lambda rows: _unique(r.name for r in rows if not r.supervised))
LABELS = Column(lambda rows: [r.label for r in rows])
COMPARED_LABELS = Column(lambda rows: [r.label for r in rows if r.compared])  # Table I's


def by_label(label: str) -> Method:
  """The row of a paper label ('H-SCL(β)')."""
  (row,) = [r for r in ROWS if r.label == label]
  return row


def of_config(config) -> Method:
  """The row a config trains: config.method's, and of several the one config selects."""
  rows = [r for r in ROWS if r.name == config.method]
  for row in rows:
    if all(config[field] == value for field, value in row.selects):
      return row
  raise ValueError(f'config.method={config.method!r} with config.hardening={config.hardening!r}')


def graph_rows() -> dict[str, Method]:
  """The graph experiment's rows by name (one per method)."""
  return {r.name: r for r in ROWS if r.graph}
