"""Dataset preparation: the program's one-line errors before any work, and the library's
checks (hscl_jax.data.tfds_prepare).

(The offline end-to-end preparation with TensorFlow is tests/test_prepare.py.)
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import re
import subprocess
import sys
import types

from acceptance import accepted
import pytest

from hscl_jax.data import tfds_prepare
from hscl_jax.data.errors import PreparationError

REPO = pathlib.Path(__file__).resolve().parents[2]


def _prepare(*args):
  return subprocess.run(
    [sys.executable, '-m', 'hscl_jax.prepare', *args],
    cwd=REPO,
    env={**os.environ, 'PYTHONPATH': str(REPO)},
    capture_output=True,
    text=True,
    timeout=300,
  )


def test_program_errors_are_one_line_before_any_work(tmp_path):
  no_work = _prepare('--dataset=digits')
  assert no_work.returncode == 1 and 'Traceback' not in no_work.stderr
  assert no_work.stderr.strip().splitlines()[-1] == '--dataset=digits needs no preparation'
  # --manual_dir reaches the library: its missing archive is one logged line, nothing written.
  no_archive = _prepare('--dataset=cifar10', f'--manual_dir={tmp_path}', f'--data_dir={tmp_path}')
  assert no_archive.returncode == 1 and 'Traceback' not in no_archive.stderr
  (line,) = [line for line in no_archive.stderr.splitlines() if line.startswith('E')]
  assert f'--manual_dir={tmp_path} has no cifar-10-binary.tar.gz' in line
  assert os.listdir(tmp_path) == []


def test_prepare_checks_the_manual_archive(tmp_path):
  with pytest.raises(PreparationError, match='has no cifar-10-binary.tar.gz'):
    tfds_prepare.prepare('cifar10', manual_dir=str(tmp_path))


def test_tensorflow_is_required_only_where_it_is_missing(monkeypatch):
  """Checked by its import spec, TensorFlow itself never imported for the check."""
  monkeypatch.setattr(importlib.util, 'find_spec', lambda name: object())
  with accepted('an installed TensorFlow'):
    tfds_prepare.require_tensorflow()
  looked_up = []
  monkeypatch.setattr(importlib.util, 'find_spec', lambda name: looked_up.append(name))
  with pytest.raises(PreparationError, match=re.escape(tfds_prepare.NEEDS_TENSORFLOW)):
    tfds_prepare.require_tensorflow()
  assert looked_up == ['tensorflow']


def test_prepare_without_tensorflow_says_how_to_install(monkeypatch):
  """It stops before TFDS: a TFDS that is reached fails the test at once (the real one
  would try to download and prepare, for minutes)."""
  monkeypatch.setattr(importlib.util, 'find_spec', lambda name: None)

  def reached(*args, **kwargs):
    raise AssertionError('prepare went on to TFDS without TensorFlow')

  monkeypatch.setitem(sys.modules, 'tensorflow_datasets', types.SimpleNamespace(builder=reached))
  with pytest.raises(PreparationError, match=r"pip install -e '\.\[prepare\]'"):
    tfds_prepare.prepare('cifar10', data_dir='/nonexistent')
