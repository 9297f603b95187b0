r"""Figures of what a training run learned, and how often its hardest negatives are false
(the program; hscl_jax.evaluation.inspection says what it computes and does the work).

    python -m hscl_jax.inspect --workdir=RUN --out=DIR \
        [--hardening=exp --beta=B | --hardening=threshold --tau=T] [--k=8] [--seed=0] \
        [--checkpoint=best|latest|STEP]

Writes DIR/tsne.png, DIR/neighbours.png, DIR/hardest_negatives.png and
DIR/false_negatives.json (docs/inspect.md describes each). The hardening defaults to the
run's own (config.hardening with config.beta, or τ at the last epoch).
"""

from __future__ import annotations

from absl import app
from absl import flags

from hscl_jax import errors
from hscl_jax.config import command_line
from hscl_jax.config import methods
from hscl_jax.evaluation import inspection
from hscl_jax.rundir import metrics
from hscl_jax.rundir import trained_run

_WORKDIR = flags.DEFINE_string('workdir', None, 'Directory of the training run.', required=True)
_OUT = flags.DEFINE_string('out', None, 'Directory the figures and JSON go to.', required=True)
_CHECKPOINT = flags.DEFINE_string('checkpoint', None, trained_run.CHECKPOINT_HELP)
_CHECKPOINT_STEP = flags.DEFINE_integer('checkpoint_step', None, trained_run.CHECKPOINT_STEP_HELP)
# inspection.inspect_run's keyword arguments, each from its flag (the checkpoint's from two).
_OPTIONS = {
  'hardening': flags.DEFINE_enum(
    'hardening', None, methods.HARDENINGS, "Hardening to rank negatives by (default: the run's)."
  ),
  'beta': flags.DEFINE_float('beta', None, "β of --hardening=exp (default: the run's config.beta)"),
  'tau': flags.DEFINE_float(
    'tau', None, "τ of --hardening=threshold (default: the run's τ at its last epoch)."
  ),
  'k': flags.DEFINE_integer('k', inspection.NUM_SHOWN_NEGATIVES, 'Top-k negatives counted.'),
  'seed': flags.DEFINE_integer('seed', 0, 'Seed of the queries, anchors and test batches.'),
}


def _inspect_from_flags() -> dict:
  workdir = _WORKDIR.value
  options = {name: flag.value for name, flag in _OPTIONS.items()}
  checkpoint = trained_run.checkpoint_choice(_CHECKPOINT.value, _CHECKPOINT_STEP.value)
  return inspection.inspect_run(workdir, _OUT.value, checkpoint_step=checkpoint, **options)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {" ".join(argv[1:])}')
  metrics.show_only_own_info_logs()
  result = errors.exit_on_user_error(_inspect_from_flags)
  print(f'{inspection.summary_line(result)} Figures in {_OUT.value}')


def run():
  """The `hscl-inspect` console script; `python -m hscl_jax.inspect` runs it too."""
  command_line.run(main)


if __name__ == '__main__':
  run()
