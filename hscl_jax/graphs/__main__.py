r"""Trains and evaluates one graph setting (Table II).

  python -m hscl_jax.graphs --config=configs/graphs.py --workdir=DIR \
      --config.dataset=MUTAG --config.data_dir=PATH [--config.method=ucl|hucl|scl|hscl] \
      [--config.beta=2] [--config.protocol=leak_free|transductive] \
      [--config.estimator=jsd|infonce]

Writes DIR/graph_eval.json (accuracy, fold_accuracies, protocol, method, estimator, ...),
DIR/metrics.jsonl (training loss per epoch) and DIR/config.json.
"""

from __future__ import annotations

import sys

from absl import app
from absl import flags
from ml_collections import config_flags

from hscl_jax import errors
from hscl_jax.config import command_line
from hscl_jax.graphs import train
from hscl_jax.rundir import metrics

_WORKDIR = flags.DEFINE_string('workdir', None, 'Directory for the results of this run.')
_CONFIG = config_flags.DEFINE_config_file(
  'config', None, 'Graph configuration file (configs/graphs.py).', lock_config=True
)
flags.mark_flags_as_required(['config', 'workdir'])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {" ".join(argv[1:])}')
  metrics.show_only_own_info_logs()
  errors.exit_on_user_error(
    lambda: train.run(_CONFIG.value, _WORKDIR.value), workdir=_WORKDIR.value
  )


def run():
  """The `hscl-graphs` console script; `python -m hscl_jax.graphs` runs it too."""
  if any(arg.startswith('--config.samples_per_class') for arg in sys.argv):
    sys.exit(train.CLASS_AWARE_REFUSAL)  # the config has no such field: one line, not a traceback
  command_line.run(main)


if __name__ == '__main__':
  run()
