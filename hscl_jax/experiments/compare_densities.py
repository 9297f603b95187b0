r"""The comparison against label density: one report from several comparisons' records.

    python -m hscl_jax.experiments.compare_densities --config=configs/tiny_imagenet.py:cpu \
        --config.folder=DIR/tiny-imagenet-200 \
        --densities=0=docs/results/tiny_imagenet,4=docs/results/tiny_imagenet_density/m4 \
        --report_dir=docs/results/tiny_imagenet_density

Each `M=REPORT_DIR` is a comparison (`python -m hscl_jax.experiments.compare`) of the same
config with `--config.samples_per_class=M` (0: uniform batches) whose finished runs are
recorded in REPORT_DIR/runs/. Writes REPORT_DIR/report.md: Table I per density, the
paired differences (H-SCL(β) − SCL, H-SCL(β) − H-UCL, SCL − UCL, H-UCL − UCL) per density
against the same-class samples an anchor met (measured in the runs' batches; a table and
paired_differences.png), each class-aware run against the uniform run of its method and
seed (every difference with its tests of significance), and the H-UCL encoders'
false-negative fraction where `inspect` measured it. Reads
the training labels from the data (no image decoded); trains nothing.
The work is done by hscl_jax.experiments.density_grid.
"""

from __future__ import annotations

from absl import app
from absl import flags
from ml_collections import config_flags

from hscl_jax import errors
from hscl_jax.config import command_line
from hscl_jax.evaluation import linear_probe
from hscl_jax.experiments import density_grid
from hscl_jax.rundir import metrics

_CONFIG = config_flags.DEFINE_config_file('config', None, 'Base config file.', lock_config=False)
_DENSITIES = flags.DEFINE_list(
  'densities', None, 'M=REPORT_DIR pairs: a comparison of samples_per_class M and its records.'
)
_PROTOCOL = flags.DEFINE_enum(
  'protocol', 'features', linear_probe.PROTOCOLS, 'Linear evaluation protocol of the runs.'
)
_REPORT_DIR = flags.DEFINE_string('report_dir', None, 'Where report.md and its plot go.')
flags.mark_flags_as_required(['config', 'densities', 'report_dir'])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {" ".join(argv[1:])}')
  metrics.show_only_own_info_logs()
  try:
    densities = density_grid.parse_densities(_DENSITIES.value)
  except ValueError as error:
    raise app.UsageError(f'--densities: {error}')
  report = errors.exit_on_user_error(
    lambda: density_grid.write_report(_CONFIG.value, densities, _PROTOCOL.value, _REPORT_DIR.value)
  )
  print(report or 'No finished run recorded for any density yet.')


def run():
  """The `hscl-compare-densities` console script; `python -m hscl_jax.experiments.compare_densities`
  runs it too."""
  command_line.run(main)


if __name__ == '__main__':
  run()
