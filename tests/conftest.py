"""Test set-up: 4 fake CPU devices, set before JAX is imported anywhere; a trained digits run
shared by the tests that read one."""

from __future__ import annotations

import os
import pathlib
import sys

import pytest

os.environ.setdefault('JAX_PLATFORMS', 'cpu')
_flags = os.environ.get('XLA_FLAGS', '')
if 'xla_force_host_platform_device_count' not in _flags:
  os.environ['XLA_FLAGS'] = (_flags + ' --xla_force_host_platform_device_count=4').strip()


REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope='session')
def digits_run(tmp_path_factory):
  """One epoch of H-SCL on digits over the 4 fake devices, trained once per session for
  the tests that read a finished run: (workdir, config, train.TrainResult)."""
  if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # `from configs import ...`, as from the repo root
  from configs import digits
  from hscl_jax import train

  config = digits.get_config()
  config.num_epochs = 1
  config.optimizer.warmup_epochs = 0.0
  config.knn.every_epochs = 0
  workdir = tmp_path_factory.mktemp('digits_run')
  return workdir, config, train.train_and_evaluate(config, str(workdir))
