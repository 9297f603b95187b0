"""`python -m hscl_jax.embed`, the program: the file it writes, and a workdir without a
checkpoint refused in one line (what it computes: tests/evaluation/test_embedding.py)."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import xla_flags

REPO = pathlib.Path(__file__).resolve().parents[1]


def _embed_program(*args):
  env = {**os.environ, 'XLA_FLAGS': xla_flags.with_devices(None)}
  return subprocess.run(
    [sys.executable, '-m', 'hscl_jax.embed', *args],
    cwd=REPO,
    env={**env, 'PYTHONPATH': str(REPO), 'JAX_PLATFORMS': 'cpu'},
    capture_output=True,
    text=True,
    timeout=300,
  )


def test_program_writes_the_file_and_refuses_a_workdir_without_checkpoint(digits_run, tmp_path):
  workdir, _, _ = digits_run
  out = _embed_program(f'--workdir={workdir}', '--split=test', f'--out={tmp_path}/t.npz')
  assert out.returncode == 0, out.stderr[-3000:]
  assert out.stdout.startswith('embedded 359 images (backbone features, dim 128')
  assert np.load(tmp_path / 't.npz')['features'].shape == (359, 128)
  untrained = tmp_path / 'untrained'
  untrained.mkdir()
  shutil.copy(workdir / 'config.json', untrained / 'config.json')
  out = _embed_program(f'--workdir={untrained}', '--split=test', f'--out={tmp_path}/u.npz')
  assert out.returncode == 1
  lines = [line for line in out.stderr.splitlines() if line.startswith('E')]
  assert len(lines) == 1 and 'Traceback' not in out.stderr
  assert (
    f'no checkpoint in {untrained}/checkpoints: train first (python -m hscl_jax.main)' in (lines[0])
  )
