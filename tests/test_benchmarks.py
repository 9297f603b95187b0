"""The benchmark scripts start as benchmarks/README.md runs them: `python benchmarks/NAME.py`.

They are scripts, not modules: `sys.path[0]` is `benchmarks/`, so whatever they import from
the repository (e.g. `configs`) must be found without PYTHONPATH. Their `--help` in fresh
processes (all started at once) imports everything they need.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
BENCHMARKS = sorted((REPO / 'benchmarks').glob('bench_*.py'))


def test_every_benchmark_script_starts_without_pythonpath(tmp_path):
  assert BENCHMARKS, 'no benchmarks/bench_*.py found'
  env = {key: value for key, value in os.environ.items() if key != 'PYTHONPATH'}
  env['JAX_PLATFORMS'] = 'cpu'
  procs = {
    script.name: subprocess.Popen(
      [sys.executable, str(script), '--help'],
      cwd=tmp_path,  # not the repository root: nothing may rely on the working directory
      env=env,
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
    )
    for script in BENCHMARKS
  }
  for name, proc in procs.items():
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, f'{name}:\n{err[-3000:]}'
    assert out.startswith('usage:'), f'{name}:\n{out[:500]}'
