r"""Retrieval metrics of a training run's encoder (the program;
hscl_jax.evaluation.retrieval_evaluation says what it computes and does the work).

    python -m hscl_jax.retrieval --workdir=DIR [--reference=train|test] \
        [--checkpoint=best|latest|STEP]

Ranks the test split's backbone features against the train split (or, with
--reference=test, against the test split, each query leaving itself out), prints
precision@1, R-precision, MAP@R and Recall@{1, 2, 4, 8} and writes
DIR/retrieval_<reference>.json (docs/method.md, "Retrieval metrics").
"""

from __future__ import annotations

import os

from absl import app
from absl import flags

from hscl_jax import errors
from hscl_jax.config import command_line
from hscl_jax.evaluation import retrieval_evaluation
from hscl_jax.evaluation import retrieval_metrics
from hscl_jax.rundir import metrics
from hscl_jax.rundir import trained_run

_WORKDIR = flags.DEFINE_string('workdir', None, 'Directory of the training run.', required=True)
_REFERENCE = flags.DEFINE_enum(
  'reference', 'train', retrieval_evaluation.REFERENCES, 'What the test split is ranked against.'
)
_CHECKPOINT = flags.DEFINE_string('checkpoint', None, trained_run.CHECKPOINT_HELP)
_CHECKPOINT_STEP = flags.DEFINE_integer('checkpoint_step', None, trained_run.CHECKPOINT_STEP_HELP)


def _retrieval_from_flags() -> dict:
  workdir = _WORKDIR.value
  return retrieval_evaluation.retrieval_over_trained_run(
    workdir,
    reference=_REFERENCE.value,
    checkpoint_step=trained_run.checkpoint_choice(_CHECKPOINT.value, _CHECKPOINT_STEP.value),
  )


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {" ".join(argv[1:])}')
  metrics.show_only_own_info_logs()
  result = errors.exit_on_user_error(_retrieval_from_flags, workdir=_WORKDIR.value)
  figures = '  '.join(f'{name} {result[name]:.4f}' for name in retrieval_metrics.METRICS)
  print(
    f'retrieval (checkpoint step {result["checkpoint_step"]}, {result["num_queries"]} test '
    f'against {result["num_reference"]} {result["reference"]}): {figures} -> '
    f'{os.path.join(_WORKDIR.value, retrieval_evaluation.result_file(result["reference"]))}'
  )


def run():
  """The `hscl-retrieval` console script; `python -m hscl_jax.retrieval` runs it too."""
  command_line.run(main)


if __name__ == '__main__':
  run()
