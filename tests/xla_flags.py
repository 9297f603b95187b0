"""XLA_FLAGS for a program a test starts with its own device count."""

from __future__ import annotations

import os


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
