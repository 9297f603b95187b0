"""`python dev/mutation handwritten ...` under the name docs/testing.md shows: the
hand-written regression mutants (dev/mutation/handwritten.py)."""

from __future__ import annotations

import pathlib
import runpy
import sys

if __name__ == '__main__':
  sys.argv = [sys.argv[0], 'handwritten', *sys.argv[1:]]
  runpy.run_path(str(pathlib.Path(__file__).with_name('mutation')), run_name='__main__')
