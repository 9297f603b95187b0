"""The tooling's tests: dev/mutation.py importable as `mutation`."""

from __future__ import annotations

import pathlib
import sys

DEV = pathlib.Path(__file__).resolve().parents[1]
if str(DEV) not in sys.path:
  sys.path.insert(0, str(DEV))
