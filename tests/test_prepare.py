"""The dataset-preparation command: its flags and the one-line errors before any work.

(The offline end-to-end preparation with TensorFlow is tests/test_prepare_offline.py.)
"""

from __future__ import annotations

import pytest

from hscl_jax import prepare


def test_prepare_arguments():
  args = prepare.parse_args(['--dataset=stl10', '--data_dir=/d', '--manual_dir=/m'])
  assert (args.dataset, args.data_dir, args.manual_dir) == ('stl10', '/d', '/m')
  with pytest.raises(SystemExit):
    prepare.parse_args(['--dataset=digits'])  # Needs no preparation: not a choice.


def test_prepare_checks_the_manual_archive(tmp_path):
  with pytest.raises(SystemExit, match='has no cifar-10-binary.tar.gz'):
    prepare.main(['--dataset=cifar10', f'--manual_dir={tmp_path}'])


def test_prepare_without_tensorflow_says_how_to_install(monkeypatch):
  monkeypatch.setattr(prepare.importlib.util, 'find_spec', lambda name: None)
  with pytest.raises(SystemExit, match=r"pip install -e '\.\[prepare\]'"):
    prepare.main(['--dataset=cifar10', '--data_dir=/nonexistent'])
