r"""The backbone of a training run for PyTorch (the program;
hscl_jax.evaluation.torch_export says what it writes and does the work).

    python -m hscl_jax.export --workdir=DIR --format=torch --out=FILE.safetensors \
        [--checkpoint=best|latest|STEP] [--config=FILE]

Writes the ResNet backbone as a torchvision ResNet state_dict to FILE.safetensors and
how to build and feed the PyTorch model to FILE.json beside it.
"""

from __future__ import annotations

from absl import app
from absl import flags
from ml_collections import config_flags

from hscl_jax import errors
from hscl_jax.config import command_line
from hscl_jax.evaluation import torch_export
from hscl_jax.rundir import metrics
from hscl_jax.rundir import trained_run

_WORKDIR = flags.DEFINE_string('workdir', None, 'Directory of the training run.', required=True)
# Required though there is one format, so that commands stay explicit if another comes.
flags.DEFINE_enum(
  'format',
  None,
  torch_export.FORMATS,
  'Output format (torch: torchvision ResNet weights).',
  required=True,
)
_OUT = flags.DEFINE_string('out', None, 'Output file (FILE.safetensors).', required=True)
_CONFIG = config_flags.DEFINE_config_file(
  'config', None, "Config file (default: the run's DIR/config.json).", lock_config=False
)
_CHECKPOINT = flags.DEFINE_string('checkpoint', None, trained_run.CHECKPOINT_HELP)
_CHECKPOINT_STEP = flags.DEFINE_integer('checkpoint_step', None, trained_run.CHECKPOINT_STEP_HELP)


def _export_from_flags() -> dict:
  workdir = _WORKDIR.value
  checkpoint = trained_run.checkpoint_choice(_CHECKPOINT.value, _CHECKPOINT_STEP.value)
  config = (
    _CONFIG.value
    if _CONFIG.value is not None
    else trained_run.load_run_config(workdir, config_flag=True)
  )
  return torch_export.export_torch(workdir, _OUT.value, config=config, checkpoint_step=checkpoint)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {" ".join(argv[1:])}')
  metrics.show_only_own_info_logs()
  meta = errors.exit_on_user_error(_export_from_flags)
  weights = _OUT.value
  print(
    f'{meta["architecture"]} ({meta["stem"]} stem) at checkpoint step {meta["checkpoint_step"]}:'
  )
  print(f'  {weights}\n  {torch_export.metadata_path(weights)}')


def run():
  """The `hscl-export` console script; `python -m hscl_jax.export` runs it too."""
  command_line.run(main)


if __name__ == '__main__':
  run()
