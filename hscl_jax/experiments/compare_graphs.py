r"""Table II: UCL, H-UCL, SCL and H-SCL(β) on graph datasets, beside the paper's numbers.

    python -m hscl_jax.experiments.compare_graphs \
        --datasets=MUTAG,PTC,ENZYMES,IMDB-BINARY,IMDB-MULTI --repeats=3 \
        --data_dir=PATH --workdir=ROOT [--betas=1,2,10] [--methods=ucl,hucl,scl,hscl] \
        [--config.num_epochs=20]

Runs every setting (UCL; H-UCL(β) and H-SCL(β) for each β; SCL) `--repeats` times
(seeds 0..N-1; repeat k of every setting before repeat k+1 of any) and writes
ROOT/report.md: Table II's shape (accuracy %, mean ± std over repeats; for the hardened
methods the β with the best mean), the paper's Table II, and every setting and run.
Finished runs (ROOT/DATASET/SETTING/seed_K/graph_eval.json) are reused, so an interrupted
grid resumes by running the same command; `--report_only` writes the report from them.
Several processes may run the same command on one ROOT: each run's workdir lock makes
them share the grid (a run held by another process is skipped).
The work is done by hscl_jax.experiments.graph_grid.
"""

from __future__ import annotations

import os

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

from hscl_jax import errors
from hscl_jax.config import command_line
from hscl_jax.experiments import graph_grid
from hscl_jax.rundir import metrics

_CONFIG = config_flags.DEFINE_config_file(
  'config',
  os.path.join(os.path.dirname(__file__), '..', '..', 'configs', 'graphs.py'),
  'Base graph configuration (configs/graphs.py); override fields with --config.X=...',
)
_DATASETS = flags.DEFINE_list('datasets', list(graph_grid.DATASETS), 'TU dataset names.')
_REPEATS = flags.DEFINE_integer('repeats', 3, 'Runs per setting (seeds 0..N-1).')
_BETAS = flags.DEFINE_list('betas', ['1', '2', '10'], 'β grid of H-UCL and H-SCL(β).')
_METHODS = flags.DEFINE_list(
  'methods', list(graph_grid.METHODS), 'Methods to run (the report covers every finished run).'
)
_DATA_DIR = flags.DEFINE_string('data_dir', None, 'Folder holding the dataset folders.')
_WORKDIR = flags.DEFINE_string('workdir', None, 'Root of the runs and of report.md.')
_REPORT_ONLY = flags.DEFINE_bool('report_only', False, 'Only write the report from finished runs.')
flags.mark_flags_as_required(['data_dir', 'workdir'])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {" ".join(argv[1:])}')
  unknown = sorted(set(_METHODS.value) - set(graph_grid.METHODS))
  if unknown:
    raise app.UsageError(
      f'--methods: unknown {unknown}; use some of {",".join(graph_grid.METHODS)}.'
    )
  metrics.show_only_own_info_logs()
  base, root, repeats = _CONFIG.value, _WORKDIR.value, _REPEATS.value
  datasets, betas = _DATASETS.value, [float(b) for b in _BETAS.value]
  os.makedirs(root, exist_ok=True)
  if not _REPORT_ONLY.value:
    errors.exit_on_user_error(
      lambda: graph_grid.run_grid(
        base, root, datasets, betas, _METHODS.value, repeats, _DATA_DIR.value
      ),
      workdir=root,
    )
  path = graph_grid.write_report(root, datasets, betas, repeats, base)
  logging.info('wrote %s', path)


def run():
  """The `hscl-compare-graphs` console script; `python -m hscl_jax.experiments.compare_graphs`
  runs it too."""
  command_line.run(main)


if __name__ == '__main__':
  run()
