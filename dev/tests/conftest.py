"""The tooling's tests: its package (`dev/mutation`) and the suite's helpers importable, JAX on
the CPU, and a test that reaches a package the command in dev/README.md does not install
fails (tests/declared_imports.py)."""

from __future__ import annotations

import os
import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]
for folder in ('dev', 'tests'):
  if str(REPO / folder) not in sys.path:
    sys.path.insert(0, str(REPO / folder))

import declared_imports

os.environ.setdefault('JAX_PLATFORMS', 'cpu')


def pytest_configure(config):
  """A test here may import what dev/README.md's command installs (declared_imports'
  FOLDER_EXTRAS['dev'])."""
  declared_imports.register(config)
