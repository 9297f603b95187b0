"""The test session's XLA_FLAGS (tests/conftest.py sets them), and those of a program a test
starts with its own device count."""

from __future__ import annotations

from collections.abc import Callable
import os
import subprocess
import sys

CLASSIC_EMITTERS = '--xla_cpu_use_fusion_emitters=false'


def session_flags(flags: str, is_accepted: Callable[[str], bool] | None = None) -> str:
  """`flags` (the user's XLA_FLAGS) with 4 fake devices and the compiler settings, unless
  the user set them. Where jaxlib has XLA's classic CPU fusion emitters (0.10; 0.12 has only
  the MLIR ones, its default), those and LLVM at -O1: the suite takes 16 % less CPU time
  than at -O0 with the MLIR emitters (docs/results/test_suite/measurements.md). Not -O0
  with the classic ones: a 4-device training step then computed a loss 0.2 % off the
  1-device one and the float64 reference (tests/end_to_end/test_train.py). With the MLIR emitters,
  -O0: most tests compile small programs and run them once or twice. The programs compute
  the same up to float32 rounding, which the tests allow for. A level the user set is kept,
  with the user's emitters; settings already made are left as they are (a worker inherits
  the session's)."""
  is_accepted = is_accepted or accepted  # (a test passes its own)
  if 'xla_force_host_platform_device_count' not in flags:
    flags += ' --xla_force_host_platform_device_count=4'
  if 'xla_backend_optimization_level' not in flags:
    if 'xla_cpu_use_fusion_emitters' not in flags and is_accepted(CLASSIC_EMITTERS):
      flags += ' ' + CLASSIC_EMITTERS
    level = 1 if CLASSIC_EMITTERS in flags.split() else 0
    flags += f' --xla_backend_optimization_level={level}'
  return flags.strip()


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
