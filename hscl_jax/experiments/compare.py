r"""The paper's comparison (Table I, Figs. 1, 4, 5) on any config, as a Markdown report.

    python -m hscl_jax.experiments.compare --config=configs/digits.py --seeds=3 \
        --workdir=/tmp/hscl_compare [--seeds_for=scl=5,hscl_beta=5] \
        [--grid=beta,tau,queue,sigmoid] [--protocol=features] [--report_dir=docs/results/digits] \
        [--records=DIR] [--report_only]

Trains UCL, H-UCL, SCL, H-SCL(β) and H-SCL(τ) with the same budget (the config's), runs
the linear evaluation on each, and writes DIR/report.md (mean ± std over seeds, the best
setting of each method when a grid is searched, and every run) with PNG plots: kNN
accuracy per epoch (Fig. 1), the fraction of anchors satisfying Assumption 1 (Fig. 4) and
the four losses per epoch (Fig. 5), beside the raw pixels' weighted kNN on the same split
and the first epoch at which each method reaches SCL's final kNN accuracy. `--grid=beta`
searches β ∈ {0.1, 0.5, 1, 2, 5} for H-UCL and H-SCL(β); `--grid=tau` searches eq. (4)'s
start × end grid for H-SCL(τ); `--grid=queue` adds SCL and H-SCL(β) with a queue of about
4,096 negatives from a momentum key encoder (their table beside the same runs without
it); `--grid=sigmoid` adds the methods table's supervised sigmoid rows (Sig-SCL,
Sig-H-SCL(β) at the config's β) and pairs them, in place of the paper's pairs, by
methods.SIGMOID_PAIRS (does hardening help the sigmoid loss as it helps the softmax one?).
Runs already finished in DIR are reused (each run resumes from its checkpoints), so
an interrupted grid resumes by running the same command. Each finished run is also
recorded (RECORDS/runs/<setting>/seed<k>/: its config, metrics and linear evaluation, a
few KB; RECORDS is --records, by default the report's directory): from those records
alone, e.g. a committed docs/results/<experiment>/, the report is rewritten and the grid
goes on where it stopped, on any machine, without the runs' checkpoints. A report whose
--records is another comparison's directory reads that comparison's records where they
are (one record per run) and adds its own runs' records there; its header names them
and the command.
Several processes may run the same command on one DIR (e.g. one per core, under
`taskset`): a run another process holds is skipped; `--report_only` then writes the
report from the finished runs.

A sweep's report, from several comparisons of the same config that differ in one field,
each one's finished runs recorded in its REPORT_DIR/runs/ (reads records only; trains
nothing):

    python -m hscl_jax.experiments.compare --config=configs/tiny_imagenet.py:cpu \
        --config.folder=DIR/tiny-imagenet-200 --sweep=samples_per_class \
        --points=0=docs/results/tiny_imagenet,4=docs/results/tiny_imagenet_density/m4 \
        --report_dir=docs/results/tiny_imagenet_density

`--sweep=samples_per_class` (M=REPORT_DIR points, 0: uniform batches): Table I per
density, the paired differences (H-SCL(β) − SCL, H-SCL(β) − H-UCL, SCL − UCL, H-UCL − UCL)
per density against the same-class samples an anchor met (measured in the runs' batches;
a table and paired_differences.png), each class-aware run against the uniform run of its
method and seed, and the H-UCL encoders' false-negative fraction where `inspect` measured
it (reads the training labels from the data, no image decoded). `--sweep=num_epochs`
(E=REPORT_DIR points): over the seeds each method finished at every budget, Table I per
budget, the paired differences at each budget, each method's longer runs against its
shortest, how each pair's difference moved with the budget, and Fig. 1's measure per
budget. Every difference comes with its tests of significance.
The work is done by hscl_jax.experiments.grid (the grid and its runs) and reports (the
reports).
"""

from __future__ import annotations

import sys

from absl import app
from absl import flags
from ml_collections import config_flags

from hscl_jax import errors
from hscl_jax.config import command_line
from hscl_jax.config import fields
from hscl_jax.experiments import grid
from hscl_jax.experiments import plots
from hscl_jax.experiments import reports
from hscl_jax.rundir import metrics
from hscl_jax.training import preemption

_CONFIG = config_flags.DEFINE_config_file('config', None, 'Base config file.', lock_config=False)
_WORKDIR = flags.DEFINE_string('workdir', '/tmp/hscl_compare', 'Root of the runs and the report.')
_SEEDS = flags.DEFINE_integer('seeds', 3, 'Seeds per setting (0, 1, ...).')
_SEEDS_FOR = flags.DEFINE_list(
  'seeds_for',
  [],
  'METHOD=N pairs giving a method its own number of seeds, e.g. scl=5,hscl_beta=5 '
  f'(methods: {", ".join(map(grid.method_slug, grid.METHODS))}; with --grid=sigmoid also '
  f'{", ".join(row.slug for row in grid.sigmoid_rows())}).',
)
_GRID = flags.DEFINE_list(
  'grid',
  [],
  'Grids to search: beta, tau (paper grids); queue (SCL, H-SCL(β) with a queue); sigmoid '
  '(Sig-SCL, Sig-H-SCL(β) beside them, paired with them).',
)
_PROTOCOL = flags.DEFINE_enum(
  'protocol', 'features', fields.LINEAR_EVAL_PROTOCOLS, 'Linear evaluation protocol.'
)
_REPORT_DIR = flags.DEFINE_string(
  'report_dir', None, 'Where report.md and its plots go (default: --workdir).'
)
_RECORDS = flags.DEFINE_string(
  'records',
  None,
  'Where the run records are read from and written to (RECORDS/runs/<setting>/seed<k>/; '
  'default: --report_dir, else --workdir).',
)
_REPORT_ONLY = flags.DEFINE_bool('report_only', False, 'Only write the report from finished runs.')
_SWEEP = flags.DEFINE_enum(
  'sweep',
  None,
  list(reports.SWEEPS),
  "A sweep's report along this config field, from --points' records (needs --report_dir).",
)
_POINTS = flags.DEFINE_list(
  'points', None, "--sweep's VALUE=REPORT_DIR pairs: a comparison of that value and its records."
)
flags.mark_flags_as_required(['config'])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {" ".join(argv[1:])}')
  grids = set(_GRID.value)
  if grids - set(grid.GRIDS):
    unknown = sorted(grids - set(grid.GRIDS))
    takes = f'{", ".join(grid.GRIDS[:-1])} and/or {grid.GRIDS[-1]}'
    raise app.UsageError(f'--grid takes {takes}, got {unknown}.')
  metrics.show_only_own_info_logs()
  if _SWEEP.value is not None:
    return _sweep_report(reports.SWEEPS[_SWEEP.value])
  try:
    seeds_for = {name: int(count) for name, count in (p.split('=', 1) for p in _SEEDS_FOR.value)}
    plan = grid.plan_runs(_CONFIG.value, list(range(_SEEDS.value)), grids, seeds_for)
  except ValueError as error:
    raise app.UsageError(
      f'--seeds_for={",".join(_SEEDS_FOR.value)}: {error} (e.g. --seeds_for=scl=5,hscl_beta=5)'
    )
  records = _RECORDS.value or _REPORT_DIR.value or _WORKDIR.value
  run_args = (_CONFIG.value, _WORKDIR.value, plan, _PROTOCOL.value, records)
  report_args = (_CONFIG.value, _WORKDIR.value, plan, grids, _PROTOCOL.value)
  command = reports.stated_command(sys.argv)
  where = dict(report_dir=_REPORT_DIR.value, records=records, command=command)
  errors.exit_on_user_error(plots.require_pyplot)
  if not _REPORT_ONLY.value:
    try:
      errors.exit_on_user_error(lambda: grid.run_grid(*run_args), workdir=_WORKDIR.value)
    except preemption.Preempted as stop:  # the run in progress saved: the same command resumes
      sys.exit(errors.signal_exit_status(stop.signum))
  report = errors.exit_on_user_error(
    lambda: reports.write_report(*report_args, **where), workdir=_WORKDIR.value
  )
  print(report or f'No finished run in {_WORKDIR.value} yet.')


def _sweep_report(sweep: reports.Sweep) -> None:
  """--sweep's report from --points' records, printed."""
  if not _POINTS.value or not _REPORT_DIR.value:
    raise app.UsageError(
      f'--sweep={sweep.field} needs --points=VALUE=REPORT_DIR,... and --report_dir=DIR.'
    )
  try:
    points = sweep.parse(_POINTS.value)
  except ValueError as error:
    raise app.UsageError(f'--points: {error}')
  report = errors.exit_on_user_error(
    lambda: sweep.write(_CONFIG.value, points, _PROTOCOL.value, _REPORT_DIR.value)
  )
  print(report or sweep.nothing_yet)


def run():
  """The `hscl-compare` console script; `python -m hscl_jax.experiments.compare` runs it too."""
  command_line.run(main)


if __name__ == '__main__':
  run()
