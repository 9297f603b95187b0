r"""The paper's comparison (Table I, Figs. 1, 4, 5) on any config, as a Markdown report.

    python -m hscl_jax.experiments.compare --config=configs/digits.py --seeds=3 \
        --workdir=/tmp/hscl_compare [--grid=beta,tau] [--protocol=features]

Trains UCL, H-UCL, SCL, H-SCL(β) and H-SCL(τ) with the same budget (the config's), runs
the linear evaluation on each, and writes DIR/report.md (mean ± std over seeds, the best
setting of each method when a grid is searched, and every run) with PNG plots: kNN
accuracy per epoch (Fig. 1), the fraction of anchors satisfying Assumption 1 (Fig. 4) and
the four losses per epoch (Fig. 5). `--grid=beta` searches β ∈ {0.1, 0.5, 1, 2, 5} for
H-UCL and H-SCL(β); `--grid=tau` searches eq. (4)'s start × end grid for H-SCL(τ).
Runs already finished in DIR are reused (each run resumes from its checkpoints).
The work is done by hscl_jax.experiments.image_grid.
"""

from __future__ import annotations

import sys

from absl import app
from absl import flags
from ml_collections import config_flags

from hscl_jax import errors
from hscl_jax import linear_probe
from hscl_jax import metrics
from hscl_jax import schema
from hscl_jax.experiments import image_grid

_CONFIG = config_flags.DEFINE_config_file('config', None, 'Base config file.', lock_config=False)
_WORKDIR = flags.DEFINE_string('workdir', '/tmp/hscl_compare', 'Root of the runs and the report.')
_SEEDS = flags.DEFINE_integer('seeds', 3, 'Seeds per setting (0, 1, ...).')
_GRID = flags.DEFINE_list('grid', [], 'Grids to search: beta, tau (paper grids).')
_PROTOCOL = flags.DEFINE_enum(
  'protocol', 'features', linear_probe.PROTOCOLS, 'Linear evaluation protocol.'
)
flags.mark_flags_as_required(['config'])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {" ".join(argv[1:])}')
  grids = set(_GRID.value)
  if grids - set(image_grid.GRIDS):
    unknown = sorted(grids - set(image_grid.GRIDS))
    raise app.UsageError(f'--grid takes beta and/or tau, got {unknown}.')
  metrics.show_only_own_info_logs()
  seeds = list(range(_SEEDS.value))
  report = errors.exit_on_user_error(
    lambda: image_grid.compare(_CONFIG.value, _WORKDIR.value, seeds, grids, _PROTOCOL.value),
    workdir=_WORKDIR.value,
  )
  print(report)


if __name__ == '__main__':
  # configs/<name>.py imports configs.default: make it importable from any directory
  # before app.run parses --config.
  schema.make_config_importable(sys.argv)
  app.run(main)
