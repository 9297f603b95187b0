"""`python -m hscl_jax.export --format=torch` refuses what torchvision cannot load, before
any work, in one line: these tests need no PyTorch (the round trip is test_torch_export)."""

from __future__ import annotations

import pathlib
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # `from configs import ...`, as from the repo root

from configs import default  # noqa: E402
from hscl_jax import errors  # noqa: E402
from hscl_jax import metrics  # noqa: E402
from hscl_jax import torch_export  # noqa: E402


def export_config(name: str, stem: str, image_size: int):
  config = default.get_config()
  config.model.name = name
  config.model.stem = stem
  config.augment.image_size = image_size
  return config


def _one_line_error(tmp_path, config, *, out='backbone.safetensors') -> str:
  """The message of a run without a checkpoint: what is checked first is refused."""
  workdir = tmp_path / 'run'
  metrics.write_config(str(workdir), config)
  with pytest.raises(errors.UserError) as raised:
    torch_export.export_torch(str(workdir), str(tmp_path / out))
  assert '\n' not in str(raised.value)
  assert not list(tmp_path.glob('*.safetensors')) and not list(tmp_path.glob('*.json'))
  return str(raised.value)


def test_only_batchnorm_relu_resnets_export(tmp_path):
  config = export_config('small_cnn', 'cifar', 8)
  assert 'only ResNets export' in _one_line_error(tmp_path, config)
  config = export_config('resnet18', 'cifar', 8)
  config.model.norm = 'group'
  assert 'only BatchNorm ResNets export' in _one_line_error(tmp_path, config)
  config = export_config('resnet18', 'cifar', 8)
  config.model.activation = 'silu'
  assert "activation is 'silu': only ReLU ResNets export" in _one_line_error(tmp_path, config)


def test_workdir_without_checkpoint_names_it_and_the_fix(tmp_path):
  message = _one_line_error(tmp_path, export_config('resnet18', 'cifar', 8))
  assert str(tmp_path / 'run' / 'checkpoints') in message
  assert 'python -m hscl_jax.main' in message


def test_bad_output_path(tmp_path):
  config = export_config('resnet18', 'cifar', 8)
  assert 'must end in .safetensors' in _one_line_error(tmp_path, config, out='b.pt')
  message = _one_line_error(tmp_path, config, out='missing/b.safetensors')
  assert 'does not exist' in message
