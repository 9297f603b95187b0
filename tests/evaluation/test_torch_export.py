"""`python -m hscl_jax.export --format=torch` without PyTorch: the exported state dict's
values against a hand-written NumPy reference (names, HWIO -> OIHW, BatchNorm's
statistics, the metadata's momentum), and what torchvision cannot load refused before any
work, in one line (the round trip through torchvision is
tests/end_to_end/test_torch_export_round_trip.py)."""

from __future__ import annotations

import json
import os
import pathlib
import stat
import sys

from ml_collections import config_dict
import numpy as np
import pytest
import safetensors
import safetensors.numpy

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # `from configs import ...`, as from the repo root

from acceptance import accepted  # noqa: E402
from models.test_factory import host_variables  # noqa: E402

from configs import default  # noqa: E402
from hscl_jax import errors  # noqa: E402
from hscl_jax import models  # noqa: E402
from hscl_jax.evaluation import torch_export  # noqa: E402
from hscl_jax.models import backbones  # noqa: E402
from hscl_jax.rundir import checkpoints  # noqa: E402
from hscl_jax.rundir import metrics  # noqa: E402
from hscl_jax.rundir import versions  # noqa: E402

STEP = 7
THIS_FILE = pathlib.Path(__file__)


def export_config(name: str, stem: str, image_size: int):
  config = default.get_config()
  config.model.name = name
  config.model.stem = stem
  config.augment.image_size = image_size
  return config


def write_run(workdir, config):
  """A run's config.json and one checkpoint at STEP, as training writes them, of random
  variables (BatchNorm's too, so that each exported tensor matters); returns them."""
  model = models.create_model(config.model)
  size = config.augment.image_size
  variables = host_variables(model, (size, size, 3), random_norms=True)
  variables = {'params': variables['params'], 'batch_stats': variables['batch_stats']}
  metrics.write_config(str(workdir), config)
  checkpointer = checkpoints.Checkpointer(str(workdir), keep=1)
  checkpointer.save(STEP, variables, iterator_state={})
  checkpointer.close()
  return variables


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


def _expected_state(variables, block: str, stage_sizes) -> dict[str, np.ndarray]:
  """torchvision's ResNet state_dict (without fc), written out from its definition: a
  block's convolutions conv1..convN with bn1..bnN, the projection downsample.0/1; Flax's
  HWIO kernels as OIHW; BatchNorm's scale, bias, mean and (biased) variance as weight,
  bias, running_mean, running_var; num_batches_tracked the checkpoint's step."""
  params, stats = variables['params']['encoder'], variables['batch_stats']['encoder']
  state = {}

  def conv(name, flax_params):
    state[f'{name}.weight'] = np.einsum('hwio->oihw', np.asarray(flax_params['kernel']))

  def batch_norm(name, flax_params, flax_stats):
    state[f'{name}.weight'] = np.asarray(flax_params['scale'])
    state[f'{name}.bias'] = np.asarray(flax_params['bias'])
    state[f'{name}.running_mean'] = np.asarray(flax_stats['mean'])
    state[f'{name}.running_var'] = np.asarray(flax_stats['var'])
    state[f'{name}.num_batches_tracked'] = np.asarray(STEP, np.int64)

  conv('conv1', params['conv_init'])
  batch_norm('bn1', params['bn_init'], stats['bn_init'])
  convs = {'BasicBlock': 2, 'Bottleneck': 3}[block]
  index = 0
  for layer, size in enumerate(stage_sizes, start=1):
    for j in range(size):
      flax, prefix = f'{block}_{index}', f'layer{layer}.{j}'
      index += 1
      for c in range(convs):
        conv(f'{prefix}.conv{c + 1}', params[flax][f'Conv_{c}'])
        batch_norm(
          f'{prefix}.bn{c + 1}', params[flax][f'BatchNorm_{c}'], stats[flax][f'BatchNorm_{c}']
        )
      if j == 0 and (layer > 1 or block == 'Bottleneck'):  # the shape changes: a projection
        conv(f'{prefix}.downsample.0', params[flax]['conv_proj'])
        batch_norm(f'{prefix}.downsample.1', params[flax]['norm_proj'], stats[flax]['norm_proj'])
  return state


@pytest.mark.parametrize(
  'name, stem, block, keys',
  # keys: len(torchvision.models.resnetN().state_dict()) minus fc.weight and fc.bias.
  [('resnet18', 'cifar', 'BasicBlock', 122 - 2), ('resnet50', 'imagenet', 'Bottleneck', 320 - 2)],
)
def test_state_dict_values_and_metadata_without_torch(tmp_path, name, stem, block, keys):
  """The file (read with safetensors' NumPy API) holds exactly the reference's tensors,
  bit for bit, and its metadata equals the JSON's, whose BatchNorm momentum is PyTorch's
  (1 - Flax's: 0.03 for 0.97)."""
  config = export_config(name, stem, 16)
  config.model.bn_momentum = 0.97
  variables = write_run(tmp_path / 'run', config)
  out = tmp_path / 'backbone.safetensors'
  with accepted(f'a {name} with the {stem} stem'):  # each layer's name read, none refused
    meta = torch_export.export_torch(str(tmp_path / 'run'), str(out))
  stage_sizes = backbones.BACKBONES[name][0].keywords['stage_sizes']
  expected = _expected_state(variables, block, stage_sizes)
  written = safetensors.numpy.load_file(str(out))
  assert len(expected) == keys and sorted(written) == sorted(expected)
  for key, value in expected.items():
    assert written[key].dtype == value.dtype and written[key].shape == value.shape, key
    np.testing.assert_array_equal(written[key], value, err_msg=key)
  with safetensors.safe_open(str(out), framework='np') as f:
    assert json.loads(f.metadata()['hscl_jax']) == meta
  assert json.loads((tmp_path / 'backbone.json').read_text()) == meta
  assert meta['batchnorm'] == {'epsilon': 1e-5, 'torch_momentum': 0.03}
  assert (meta['checkpoint_step'], meta['strided_padding']) == (STEP, 'symmetric')


@pytest.mark.parametrize(
  'name, convs',
  [
    ('resnet18', ['layer2.0.conv1', 'layer3.0.conv1', 'layer4.0.conv1']),
    # torchvision's Bottleneck (v1.5) strides its 3x3 conv2, as ours.
    ('resnet50', ['layer2.0.conv2', 'layer3.0.conv2', 'layer4.0.conv2']),
  ],
)
def test_only_a_run_stored_before_strided_padding_needs_the_hook(name, convs):
  """Its metadata names the stride-2 3x3 convolutions to pad as Flax's 'SAME'; a new
  run's has none (stock torchvision)."""
  config = export_config(name, 'cifar', 32)
  backbone = backbones.make_backbone(name)
  meta = torch_export.export_metadata(config, backbone, STEP, 'run')
  assert meta['strided_padding'] == 'symmetric' and 'same_padding_convs' not in meta
  stored = metrics.config_as_json(config)
  del stored['model']['strided_padding']  # its config.json, of format 0, as a reader gets it
  config = config_dict.ConfigDict(versions.migrate_config(stored))
  meta = torch_export.export_metadata(config, backbone, STEP, 'run')
  assert (meta['strided_padding'], meta['same_padding_convs']) == ('same', convs)


@pytest.mark.parametrize('umask', [0o022, 0o027, 0o002])
def test_exported_files_follow_the_umask(tmp_path, umask):
  """Both files get the mode any new file gets (0o666 less the umask): the safetensors
  package writes 0600, which a rename would keep."""
  config = export_config('resnet18', 'cifar', 16)
  write_run(tmp_path / 'run', config)
  previous = os.umask(umask)
  try:
    torch_export.export_torch(str(tmp_path / 'run'), str(tmp_path / 'backbone.safetensors'))
  finally:
    os.umask(previous)
  for name in ('backbone.safetensors', 'backbone.json'):
    assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o666 & ~umask, name


@pytest.mark.parametrize('umask', [0o027, 0o002])
def test_the_umask_is_read_where_proc_cannot_be(monkeypatch, umask):
  """Without /proc (macOS, a sandbox), or with it unreadable, the umask is read by setting
  it and setting it back: the same value, and the process's umask unchanged."""

  def no_proc(path, *args, **kwargs):
    raise OSError(f'{path}: no such file')

  previous = os.umask(umask)
  try:
    with monkeypatch.context() as patch:
      patch.setattr(torch_export, 'open', no_proc, raising=False)
      # The OSError raised here reaching the test is the fallback missing: an assertion.
      with accepted('the umask read without /proc', refusals=(OSError,), source=THIS_FILE):
        read = torch_export._umask()
      assert read == umask
    assert os.umask(umask) == umask
  finally:
    os.umask(previous)
