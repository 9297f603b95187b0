r"""Linear evaluation of a training run's encoder (the program;
hscl_jax.evaluation.linear_evaluation says what it computes and does the work).

    python -m hscl_jax.linear_eval --workdir=DIR [--checkpoint=best|latest|STEP] \
        [--protocol=features|augmented] [--config=FILE]

Prints top-1/top-5 on the test split and writes DIR/linear_eval.json.
"""

from __future__ import annotations

import os
from typing import Any

from absl import app
from absl import flags
from ml_collections import config_flags

from hscl_jax import errors
from hscl_jax.config import command_line
from hscl_jax.config import fields
from hscl_jax.evaluation import linear_evaluation
from hscl_jax.rundir import checkpoints
from hscl_jax.rundir import metrics
from hscl_jax.rundir import trained_run

_WORKDIR = flags.DEFINE_string('workdir', None, 'Directory of the training run.', required=True)
_CONFIG = config_flags.DEFINE_config_file(
  'config', None, "Config file (default: the run's DIR/config.json).", lock_config=False
)
_CHECKPOINT = flags.DEFINE_string('checkpoint', None, trained_run.CHECKPOINT_HELP)
_CHECKPOINT_STEP = flags.DEFINE_integer('checkpoint_step', None, trained_run.CHECKPOINT_STEP_HELP)
_PROTOCOL = flags.DEFINE_enum(
  'protocol', None, fields.LINEAR_EVAL_PROTOCOLS, 'Override config.linear_eval.protocol.'
)
_NUM_EPOCHS = flags.DEFINE_integer('num_epochs', None, 'Override config.linear_eval.num_epochs.')


def _evaluate_from_flags() -> dict[str, Any]:
  num_epochs = _NUM_EPOCHS.value
  linear_evaluation.check_num_epochs_flag(num_epochs)
  workdir = _WORKDIR.value
  checkpoint = trained_run.checkpoint_choice(_CHECKPOINT.value, _CHECKPOINT_STEP.value)
  config = (
    _CONFIG.value
    if _CONFIG.value is not None
    else trained_run.load_run_config(workdir, config_flag=True)
  )
  if _PROTOCOL.value is not None:
    config.linear_eval.protocol = _PROTOCOL.value
  if num_epochs is not None:
    config.linear_eval.num_epochs = num_epochs
  return linear_evaluation.linear_evaluate(config, workdir, checkpoint_step=checkpoint)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {" ".join(argv[1:])}')
  metrics.show_only_own_info_logs()
  result = errors.exit_on_user_error(
    _evaluate_from_flags, workdir=_WORKDIR.value, describe_disk_full=checkpoints.disk_full_message
  )
  print(
    f'linear eval ({result["protocol"]} protocol, checkpoint step {result["checkpoint_step"]}): '
    f'top-1 {result["top1"]:.4f}  top-5 {result["top5"]:.4f}  '
    f'({result["num_train"]} train / {result["num_test"]} test) -> '
    f'{os.path.join(_WORKDIR.value, linear_evaluation.RESULT_FILE)}'
  )


def run():
  """The `hscl-linear-eval` console script; `python -m hscl_jax.linear_eval` runs it too."""
  command_line.run(main)


if __name__ == '__main__':
  run()
