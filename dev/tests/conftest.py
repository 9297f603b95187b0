"""The tooling's tests: its package (`dev/mutation`) and the suite's helpers importable, JAX on
the CPU."""

from __future__ import annotations

import os
import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]
for folder in ('dev', 'tests'):
  if str(REPO / folder) not in sys.path:
    sys.path.insert(0, str(REPO / folder))

os.environ.setdefault('JAX_PLATFORMS', 'cpu')
