"""A run's ResNet backbone as a torchvision ResNet state_dict in a safetensors file.

The library behind `python -m hscl_jax.export`. The encoder of a checkpoint (restored
as linear evaluation restores it) is renamed to torchvision's ResNet-18/34/50 names,
convolution kernels transposed from Flax's HWIO to PyTorch's OIHW, BatchNorm's scale,
bias and statistics written as weight, bias, running_mean, running_var (and
num_batches_tracked, which torchvision's strict load expects). `fc` is not written: the
backbone ends at the pooled features, so PyTorch replaces it by an Identity. A JSON of
metadata beside the file says how to build the PyTorch model:

  * the CIFAR stem (3x3 convolution, stride 1, no max-pool) replaces torchvision's
    `conv1` and makes `maxpool` an Identity; the ImageNet stem is torchvision's own;
  * the stride-2 3x3 convolutions (first block of layers 2-4) pad one pixel on each
    side, as torchvision's, so nothing else changes. A run stored before
    config.model.strided_padding existed padded them as Flax's 'SAME' (one zero
    row/column after the input, one before only when its size is odd; on even sizes the
    two sample different pixels): its metadata names those convolutions, PyTorch sets
    their `padding` to 0 and pads in a forward pre-hook, which leaves the state_dict's
    names as torchvision's (docs/training.md shows the code);
  * BatchNorm: epsilon 1e-5 in both; Flax's momentum m is PyTorch's 1 - m;
  * the input: RGB in [0, 1], normalised with the run's mean and std, NCHW, at the
    run's image size.

The file is written by the `safetensors` package (its NumPy API, no PyTorch), which
lays out the format, its alignment and the metadata (the run's, as a JSON string under
`hscl_jax`).
"""

from __future__ import annotations

import json
import os
from typing import Any

from ml_collections import config_dict
import numpy as np
import safetensors.numpy

from hscl_jax import errors
from hscl_jax import models
from hscl_jax.data import augment
from hscl_jax.models import backbones
from hscl_jax.models import factory
from hscl_jax.models import resnet
from hscl_jax.rundir import atomic
from hscl_jax.rundir import trained_run

FORMATS = ('torch',)
SUFFIX = '.safetensors'
# The block convolution that carries the stride (as torchvision's ResNet v1.5).
STRIDED_CONV = {'BasicBlock': 'conv1', 'Bottleneck': 'conv2'}


class ExportError(errors.UserError, ValueError):
  """A run or an output path that cannot be exported (the message names it and the fix)."""


def metadata_path(out: str) -> str:
  """The metadata JSON beside the weights: FILE.safetensors -> FILE.json."""
  return out[: -len(SUFFIX)] + '.json'


def check_exportable(config: config_dict.ConfigDict, out: str) -> None:
  """Raises ExportError for a backbone torchvision has no model of, or a bad --out."""
  name = config.model.name
  if not name.startswith('resnet'):
    raise ExportError(
      f'config.model.name is {name!r}: only ResNets export (torchvision has no model of '
      'the others). Fix: train with --config.model.name=resnet18, resnet34 or resnet50.'
    )
  if config.model.norm != 'batch':
    raise ExportError(
      f'config.model.norm is {config.model.norm!r}: only BatchNorm ResNets export '
      "(torchvision's ResNet has BatchNorm layers); train with model.norm='batch'."
    )
  activation = factory.configured(config.model, 'activation')
  if activation != 'relu':
    raise ExportError(
      f'config.model.activation is {activation!r}: only ReLU ResNets export '
      "(torchvision's ResNet applies ReLU); train with model.activation='relu'."
    )
  if not out.endswith(SUFFIX):
    raise ExportError(f'--out={out} must end in {SUFFIX}. Fix: e.g. --out=backbone{SUFFIX}.')
  directory = os.path.dirname(os.path.abspath(out))
  if not os.path.isdir(directory):
    raise ExportError(f'--out={out}: directory {directory} does not exist. Fix: create it first.')


def _torch_block_names(backbone: resnet.ResNet) -> list[tuple[str, str]]:
  """(Flax block name, torchvision prefix) of every residual block, in order."""
  names = []
  block_type = backbone.block_cls.__name__
  for layer, size in enumerate(backbone.stage_sizes):
    for block in range(size):
      names.append((f'{block_type}_{len(names)}', f'layer{layer + 1}.{block}'))
  return names


def _conv(kernel) -> np.ndarray:
  """Flax's HWIO kernel -> PyTorch's OIHW weight."""
  return np.ascontiguousarray(np.transpose(np.asarray(kernel, np.float32), (3, 2, 0, 1)))


def _batch_norm(params, stats, batches: int) -> dict[str, np.ndarray]:
  return {
    'weight': np.asarray(params['scale'], np.float32),
    'bias': np.asarray(params['bias'], np.float32),
    'running_mean': np.asarray(stats['mean'], np.float32),
    'running_var': np.asarray(stats['var'], np.float32),
    'num_batches_tracked': np.asarray(batches, np.int64),
  }


def _block_layers(params, stats) -> dict[str, tuple[str, Any, Any]]:
  """torchvision name -> (kind, params, statistics) of one block's layers."""
  layers = {}
  for flax_name, layer_params in params.items():
    if flax_name.startswith('Conv_'):
      layers[f'conv{int(flax_name[5:]) + 1}'] = ('conv', layer_params, None)
    elif flax_name.startswith('BatchNorm_'):
      layers[f'bn{int(flax_name[10:]) + 1}'] = ('bn', layer_params, stats[flax_name])
    elif flax_name == 'conv_proj':
      layers['downsample.0'] = ('conv', layer_params, None)
    elif flax_name == 'norm_proj':
      layers['downsample.1'] = ('bn', layer_params, stats[flax_name])
    else:
      raise ValueError(f'unexpected layer {flax_name} in a ResNet block')
  return layers


def torch_state_dict(
  backbone: resnet.ResNet, variables: dict[str, Any], batches: int
) -> dict[str, np.ndarray]:
  """torchvision ResNet state_dict (without `fc`) of the encoder in `variables`
  ({'params': {'encoder': ...}, 'batch_stats': {'encoder': ...}})."""
  params = variables['params']['encoder']
  stats = variables['batch_stats']['encoder']
  layers = {
    'conv1': ('conv', params['conv_init'], None),
    'bn1': ('bn', params['bn_init'], stats['bn_init']),
  }
  for flax_name, prefix in _torch_block_names(backbone):
    block = _block_layers(params[flax_name], stats[flax_name])
    layers.update({f'{prefix}.{name}': layer for name, layer in block.items()})
  state = {}
  for name, (kind, layer_params, layer_stats) in layers.items():
    if kind == 'conv':
      state[f'{name}.weight'] = _conv(layer_params['kernel'])
    else:
      for field, value in _batch_norm(layer_params, layer_stats, batches).items():
        state[f'{name}.{field}'] = value
  return state


def same_padding_convs(backbone: resnet.ResNet) -> list[str]:
  """The torchvision names of the stride-2 3x3 convolutions (first block of layers 2-4)."""
  conv = STRIDED_CONV[backbone.block_cls.__name__]
  return [f'layer{layer + 1}.0.{conv}' for layer in range(1, len(backbone.stage_sizes))]


def _same_padding(backbone: resnet.ResNet) -> dict[str, Any]:
  """The metadata of a run whose strided convolutions pad as Flax's 'SAME' (the hook's)."""
  return {
    'same_padding_convs': same_padding_convs(backbone),
    'same_padding': (
      "as Flax's 'SAME': padding=0, input padded left W % 2, right 1, top H % 2, bottom 1"
    ),
  }


def _umask() -> int:
  """The process's umask, read without setting it (os.umask sets it, for every thread)."""
  try:
    with open('/proc/self/status') as f:
      return next(int(line.split()[1], 8) for line in f if line.startswith('Umask:'))
  except (OSError, StopIteration, ValueError):
    umask = os.umask(0o022)
    os.umask(umask)
    return umask


def write_safetensors(path: str, tensors: dict[str, np.ndarray], metadata: dict[str, str]) -> None:
  """Writes `tensors` with `metadata` in the safetensors format, atomically, with the mode
  of any file the process creates (0644 under umask 022): the package writes its file
  0600, and the rename would keep that, so a co-worker could not read it."""
  temporary = f'{path}.tmp'
  safetensors.numpy.save_file(tensors, temporary, metadata=metadata)
  os.chmod(temporary, 0o666 & ~_umask())
  os.replace(temporary, path)


def export_metadata(config, backbone: resnet.ResNet, step: int, workdir: str) -> dict[str, Any]:
  """What a PyTorch user needs to build the model and feed it (the JSON beside the file)."""
  params = augment.AugmentParams.from_config(config.augment)
  cifar = config.model.stem == 'cifar'
  strided_padding = factory.configured(config.model, 'strided_padding')
  width = backbone.num_filters
  return {
    'architecture': config.model.name,
    'torchvision_model': f'torchvision.models.{config.model.name}(weights=None)',
    'stem': config.model.stem,
    'replace_modules': {
      'conv1': f'torch.nn.Conv2d(3, {width}, kernel_size=3, stride=1, padding=1, bias=False)',
      'maxpool': 'torch.nn.Identity()',
      'fc': 'torch.nn.Identity()',
    }
    if cifar
    else {'fc': 'torch.nn.Identity()'},
    'strided_padding': strided_padding,
    **(_same_padding(backbone) if strided_padding == 'same' else {}),
    'feature_dim': models.feature_dim(config.model.name),
    'image_size': params.image_size,
    'input': 'RGB in [0, 1], (x - mean) / std per channel, NCHW float32',
    'mean': list(params.mean),
    'std': list(params.std),
    'batchnorm': {'epsilon': 1e-5, 'torch_momentum': round(1.0 - config.model.bn_momentum, 6)},
    'jax_compute_dtype': config.model.dtype,
    'checkpoint_step': step,
    'workdir': os.path.abspath(workdir),
    'dataset': config.dataset,
    'method': config.method,
  }


def export_torch(
  workdir: str,
  out: str,
  *,
  config: config_dict.ConfigDict | None = None,
  checkpoint_step: trained_run.Checkpoint = None,
) -> dict[str, Any]:
  """Writes the backbone of checkpoint `checkpoint_step` (default: the newest usable) to
  `out` (.safetensors) and its metadata to metadata_path(out); returns the metadata."""
  if config is None:
    config = trained_run.load_run_config(workdir)
  check_exportable(config, out)
  model = models.create_model(config.model)
  size = config.augment.image_size
  step, variables = trained_run.restore_usable_encoder(
    workdir, checkpoint_step, model, (size, size, 3)
  )
  backbone = backbones.make_backbone(config.model.name, stem=config.model.stem)
  metadata = export_metadata(config, backbone, step, workdir)
  state = torch_state_dict(backbone, variables, batches=step)
  write_safetensors(out, state, {'hscl_jax': json.dumps(metadata)})
  atomic.write_json(metadata_path(out), metadata, newline=True)
  return metadata
