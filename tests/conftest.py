"""Test set-up: 4 fake CPU devices, set before JAX is imported anywhere."""

from __future__ import annotations

import os

os.environ.setdefault('JAX_PLATFORMS', 'cpu')
_flags = os.environ.get('XLA_FLAGS', '')
if 'xla_force_host_platform_device_count' not in _flags:
  os.environ['XLA_FLAGS'] = (_flags + ' --xla_force_host_platform_device_count=4').strip()
