r"""The comparison against the training budget: one report from several comparisons' records.

    python -m hscl_jax.experiments.compare_budgets --config=configs/tiny_imagenet.py:cpu \
        --config.folder=DIR/tiny-imagenet-200 --config.samples_per_class=4 \
        --budgets=3=docs/results/tiny_imagenet_density/m4,9=docs/results/tiny_imagenet_density/m4_e9 \
        --report_dir=docs/results/tiny_imagenet_density/budgets

Each `E=REPORT_DIR` is a comparison (`python -m hscl_jax.experiments.compare`) of the same
config with `--config.num_epochs=E` whose finished runs are recorded in REPORT_DIR/runs/.
Writes REPORT_DIR/report.md over the seeds each method finished at every budget: Table I
per budget, the paired differences at each budget, each method's longer runs against its
shortest, how each pair's difference moved with the budget (every difference with its
tests of significance) and Fig. 1's measure per budget. Reads records only: no data, no
training. The work is done by hscl_jax.experiments.budget_grid.
"""  # noqa: E501

from __future__ import annotations

from absl import app
from absl import flags
from ml_collections import config_flags

from hscl_jax import errors
from hscl_jax.config import command_line
from hscl_jax.evaluation import linear_probe
from hscl_jax.experiments import budget_grid
from hscl_jax.rundir import metrics

_CONFIG = config_flags.DEFINE_config_file('config', None, 'Base config file.', lock_config=False)
_BUDGETS = flags.DEFINE_list(
  'budgets', None, 'E=REPORT_DIR pairs: a comparison of num_epochs E and its records.'
)
_PROTOCOL = flags.DEFINE_enum(
  'protocol', 'features', linear_probe.PROTOCOLS, 'Linear evaluation protocol of the runs.'
)
_REPORT_DIR = flags.DEFINE_string('report_dir', None, 'Where report.md goes.')
flags.mark_flags_as_required(['config', 'budgets', 'report_dir'])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {" ".join(argv[1:])}')
  metrics.show_only_own_info_logs()
  try:
    budgets = budget_grid.parse_budgets(_BUDGETS.value)
  except ValueError as error:
    raise app.UsageError(f'--budgets: {error}')
  report = errors.exit_on_user_error(
    lambda: budget_grid.write_report(_CONFIG.value, budgets, _PROTOCOL.value, _REPORT_DIR.value)
  )
  print(report or 'No seed is finished at every budget yet.')


def run():
  """The `hscl-compare-budgets` console script; `python -m hscl_jax.experiments.compare_budgets`
  runs it too."""
  command_line.run(main)


if __name__ == '__main__':
  run()
