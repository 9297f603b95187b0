"""data/tfds_prepare: the library's checks: the manual archive, and TensorFlow required
only where it is missing, said in one line with how to install it. (The program:
tests/test_prepare.py.)"""

from __future__ import annotations

import importlib.util
import re
import sys
import types

from acceptance import accepted
import pytest

from hscl_jax.data import tfds_prepare
from hscl_jax.data.errors import PreparationError


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
