"""`python -m hscl_jax.inspect`, the program: each option flag reaches
evaluation/inspection.inspect_run under its own name, and a bad one is refused in one line
before any work (what it computes: tests/evaluation/test_inspection.py; the whole program
on a stored run: tests/end_to_end/test_stored_workdir.py)."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
FIXTURE = REPO / 'tests' / 'fixtures' / 'digits_workdir'


@pytest.mark.parametrize(
  'flag, message',
  [
    ('--k=0', '--k=0 must be >= 1 (the top-k negatives counted); e.g. --k=8.'),
    ('--beta=-1.0', '--beta=-1.0: beta must be finite and >= 0'),
    # Good options go on to the work: the (missing) checkpoint is what is refused.
    ('--hardening=threshold --tau=2', 'no checkpoint in '),
  ],
)
def test_an_option_flag_reaches_the_work_and_a_bad_one_is_one_line_before_it(
  tmp_path, flag, message
):
  """On a workdir of the stored run's config alone: a bad option is refused before the
  checkpoint is looked for, a good one goes on to look for it; --out is never made."""
  shutil.copy(FIXTURE / 'config.json', tmp_path / 'config.json')
  out = subprocess.run(
    [
      sys.executable,
      '-m',
      'hscl_jax.inspect',
      f'--workdir={tmp_path}',
      f'--out={tmp_path}/out',
      *flag.split(),
    ],
    cwd=REPO,
    env={**os.environ, 'PYTHONPATH': str(REPO), 'JAX_PLATFORMS': 'cpu'},
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert out.returncode == 1, out.stderr[-3000:]
  lines = [line for line in out.stderr.splitlines() if line.startswith('E')]
  assert len(lines) == 1 and 'Traceback' not in out.stderr, out.stderr
  assert message in lines[0], lines
  assert not (tmp_path / 'out').exists()
