r"""Trains a contrastive model (UCL/SimCLR, H-UCL, SCL, H-SCL) and monitors it with kNN.

  python -m hscl_jax.main --config=configs/digits.py --workdir=/tmp/hscl_digits
  python -m hscl_jax.main --config=configs/cifar10.py --workdir=DIR \
      --config.method=hscl --config.hardening=exp --config.beta=1.0 --config.num_epochs=50
  python -m hscl_jax.main --config=configs/digits.py --config_help=augment

An existing DIR resumes from its latest checkpoint (with the same config: a change is
refused unless named in --allow_config_change, e.g. --allow_config_change=num_epochs to
train longer). On several hosts, run the same command
on every host: jax.distributed is started from the cluster environment (SLURM, multi-host
TPU) or from --coordinator_address/--num_processes/--process_id (hscl_jax.training.distributed).
"""

from __future__ import annotations

import sys

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

from hscl_jax import errors
from hscl_jax.config import command_line
from hscl_jax.rundir import checkpoints
from hscl_jax.rundir import metrics
from hscl_jax.training import distributed
from hscl_jax.training import loop

_WORKDIR = flags.DEFINE_string('workdir', None, 'Directory for checkpoints and metrics.')
_CONFIG = config_flags.DEFINE_config_file(
  'config', None, 'Training configuration file (configs/<dataset>.py).', lock_config=True
)
_COORDINATOR = flags.DEFINE_string(
  'coordinator_address', None, 'host:port of process 0 (explicit multi-process set-up).'
)
_NUM_PROCESSES = flags.DEFINE_integer('num_processes', None, 'Number of processes (explicit).')
_PROCESS_ID = flags.DEFINE_integer('process_id', None, 'This process (explicit set-up).')
_MULTIHOST = flags.DEFINE_bool(
  'multihost', None, 'Force (True) or forbid (False) jax.distributed; default: detect.'
)
_LIBRARY_LOGS = flags.DEFINE_bool(
  'library_logs', False, 'Show the INFO logs of JAX and Orbax (checkpoint I/O details).'
)
_ALLOW_CONFIG_CHANGE = flags.DEFINE_list(
  'allow_config_change',
  [],
  'Config fields (dotted; a section name allows all of its fields) that may differ from '
  "the workdir's config.json when resuming, e.g. num_epochs to train longer.",
)
flags.DEFINE_string('config_help', None, command_line.CONFIG_HELP)  # read by command_line.run
flags.mark_flags_as_required(['config', 'workdir'])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {" ".join(argv[1:])}')
  if not _LIBRARY_LOGS.value:
    metrics.show_only_own_info_logs()
  # First JAX call of the program: jax.distributed must start before devices are touched.
  setup = distributed.initialize(
    _COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value, multihost=_MULTIHOST.value
  )
  logging.info('JAX %s', distributed.describe(setup))
  result = errors.exit_on_user_error(
    lambda: loop.train_and_evaluate(
      _CONFIG.value, _WORKDIR.value, allowed_config_changes=tuple(_ALLOW_CONFIG_CHANGE.value)
    ),
    workdir=_WORKDIR.value,
    describe_disk_full=checkpoints.disk_full_message,
  )
  if result.preempted:  # saved: the same command resumes; the status says it is not finished
    sys.exit(errors.signal_exit_status(result.stop_signal))


def run():
  """The `hscl-train` console script; `python -m hscl_jax.main` runs it too."""
  command_line.run(main)


if __name__ == '__main__':
  run()
