"""XLA_FLAGS for a program a test starts with its own device count."""

from __future__ import annotations

import os
import subprocess
import sys


def with_devices(devices: int | None) -> str:
  """The test session's XLA_FLAGS (tests/conftest.py: the compiler settings that keep the
  suite fast) with `devices` fake CPU devices, or the platform's one where None."""
  flags = [
    flag
    for flag in os.environ.get('XLA_FLAGS', '').split()
    if not flag.startswith('--xla_force_host_platform_device_count')
  ]
  if devices:
    flags.append(f'--xla_force_host_platform_device_count={devices}')
  return ' '.join(flags)


def accepted(flag: str) -> bool:
  """Whether JAX here starts with `flag` in XLA_FLAGS (one short JAX process, ~1 s): XLA
  stops any process whose XLA_FLAGS hold a flag it does not know, and it retires flags
  from release to release (jaxlib 0.10 knows --xla_cpu_use_fusion_emitters, 0.12 not)."""
  started = subprocess.run(
    [sys.executable, '-c', 'import jax; jax.devices()'],
    env={**os.environ, 'XLA_FLAGS': flag, 'JAX_PLATFORMS': 'cpu'},
    capture_output=True,
    check=False,
  )
  return started.returncode == 0
