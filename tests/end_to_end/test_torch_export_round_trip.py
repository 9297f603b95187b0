"""`python -m hscl_jax.export --format=torch`: the backbone in stock torchvision's ResNet,
checked by loading it (strict, no hook) and comparing PyTorch's features with JAX's on the
same images; a run stored before model.strided_padding, with the docs' hook.

The checkpoints are written directly (no training) with every parameter and BatchNorm
statistic random, away from its initial value (the zero-initialised last scale of each
block would hide the residual branch, unit variances would hide a swapped statistic), so
each exported tensor matters.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import xla_flags

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # `from configs import ...`, as from the repo root

from evaluation.test_torch_export import STEP  # noqa: E402
from evaluation.test_torch_export import export_config as _config  # noqa: E402
from evaluation.test_torch_export import write_run  # noqa: E402

from hscl_jax import models  # noqa: E402
from hscl_jax.data import augment  # noqa: E402
from hscl_jax.evaluation import torch_export  # noqa: E402

NEEDS = 'the export round trip needs PyTorch: pip install -e ".[torch]"'
torch = pytest.importorskip('torch', reason=NEEDS)
torchvision = pytest.importorskip('torchvision', reason=NEEDS)
safetensors = pytest.importorskip('safetensors', reason=NEEDS)

NUM_IMAGES = 4


def _run(tmp_path, name, stem, image_size, *, stored_before=False):
  """(run directory, uint8 images, the JAX features of the saved variables);
  `stored_before`: a config.json without model.strided_padding (a run trained before it)."""
  config = _config(name, stem, image_size)
  if stored_before:
    config.model.strided_padding = 'same'  # what it trained with; its config.json lacks it
  raw = jax.random.randint(jax.random.key(2), (NUM_IMAGES, image_size, image_size, 3), 0, 256)
  raw = np.asarray(raw, np.uint8)
  images = augment.preprocess_eval(
    jnp.asarray(raw), augment.AugmentParams.from_config(config.augment)
  )
  workdir = tmp_path / 'run'
  variables = write_run(workdir, config)
  if stored_before:  # config.json of format 0: no version, no model.strided_padding
    stored = json.loads((workdir / 'config.json').read_text())
    del stored['format_version'], stored['model']['strided_padding']
    (workdir / 'config.json').write_text(json.dumps(stored))
  model = models.create_model(config.model)
  features = jax.jit(lambda v, x: model.apply(v, x, train=False, method='features'))(
    variables, images
  )
  return workdir, raw, np.asarray(features)


def _docs_code(block: int) -> str:
  """The `block`-th Python block of docs/training.md's "Using the backbone in PyTorch"
  (0: stock torchvision; 1: the hook of a run stored before model.strided_padding)."""
  text = (REPO / 'docs' / 'training.md').read_text()
  section = text[text.index('## Using the backbone in PyTorch') :].split('\n## ', 1)[0]
  return section.split('```python\n')[block + 1].split('```', 1)[0]


def _torch_model(directory, *, hook=False):
  """(model, metadata) built by the docs' code in `directory` (backbone.safetensors, .json);
  `hook`: with the docs' code for a run stored before model.strided_padding."""
  namespace = {}
  with contextlib.chdir(directory):
    exec(_docs_code(0), namespace)
    if hook:
      exec(_docs_code(1), namespace)
  return namespace['model'], namespace['meta']


def _torch_features(model, meta, raw):
  """Features of uint8 NHWC images, normalised as the metadata says."""
  x = torch.from_numpy(raw).permute(0, 3, 1, 2).float() / 255
  mean = torch.tensor(meta['mean']).view(1, 3, 1, 1)
  std = torch.tensor(meta['std']).view(1, 3, 1, 1)
  with torch.no_grad():
    return model((x - mean) / std).numpy()


def _max_difference(model, meta, raw, jax_features):
  torch_features = _torch_features(model, meta, raw)
  assert torch_features.shape == jax_features.shape == (NUM_IMAGES, meta['feature_dim'])
  return float(np.max(np.abs(torch_features - jax_features)))


def _tolerance(jax_features) -> float:
  """float32 rounding through the network's depth, at the features' scale."""
  return 1e-5 * max(1.0, float(np.max(np.abs(jax_features))))


def _check_round_trip(directory, jax_features, raw):
  """Stock torchvision (no hook anywhere) loads the file strictly and its features equal
  JAX's to float32 rounding. Returns the metadata."""
  model, meta = _torch_model(directory)
  assert not any(module._forward_pre_hooks for module in model.modules())
  assert 'same_padding_convs' not in meta and meta['strided_padding'] == 'symmetric'
  difference = _max_difference(model, meta, raw, jax_features)
  scale = float(np.max(np.abs(jax_features)))
  print(
    f'{meta["architecture"]}: max |torch - jax| {difference:.2e} for features up to {scale:.3g}'
  )
  assert difference <= _tolerance(jax_features)
  return meta


def test_resnet18_cifar_stem_through_the_command(tmp_path):
  """The real command; 36 px, so layer4's strided convolution sees an odd size (9 px)."""
  workdir, raw, jax_features = _run(tmp_path, 'resnet18', 'cifar', 36)
  weights = tmp_path / 'backbone.safetensors'
  env = {**os.environ, 'XLA_FLAGS': xla_flags.with_devices(None)}
  command = [sys.executable, '-m', 'hscl_jax.export', f'--workdir={workdir}']
  out = subprocess.run(
    [*command, '--format=torch', f'--out={weights}'],
    cwd=REPO,
    env={**env, 'JAX_PLATFORMS': 'cpu'},
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert out.returncode == 0, out.stderr[-3000:]
  meta_file = tmp_path / 'backbone.json'
  assert (
    out.stdout == f'resnet18 (cifar stem) at checkpoint step {STEP}:\n  {weights}\n  {meta_file}\n'
  )
  meta = _check_round_trip(tmp_path, jax_features, raw)
  with safetensors.safe_open(weights, framework='pt') as f:  # the metadata survives
    assert json.loads(f.metadata()['hscl_jax']) == meta
  config = _config('resnet18', 'cifar', 36)
  expected = {
    'architecture': 'resnet18',
    'stem': 'cifar',
    'image_size': 36,
    'feature_dim': 512,
    'checkpoint_step': STEP,
    'mean': list(config.augment.mean),
    'std': list(config.augment.std),
  }
  assert {key: meta[key] for key in expected} == expected
  assert set(meta['replace_modules']) == {'conv1', 'maxpool', 'fc'}


def test_resnet50_imagenet_stem(tmp_path):
  workdir, raw, jax_features = _run(tmp_path, 'resnet50', 'imagenet', 64)
  weights = tmp_path / 'backbone.safetensors'
  torch_export.export_torch(str(workdir), str(weights))
  meta = _check_round_trip(tmp_path, jax_features, raw)
  assert set(meta['replace_modules']) == {'fc'}
  assert (meta['feature_dim'], meta['image_size']) == (2048, 64)


def test_run_stored_before_strided_padding_exports_with_the_hook(tmp_path):
  """A config.json without model.strided_padding trained with Flax's 'SAME': it exports
  as trained, and the docs' hook matches JAX's features where stock torchvision does not
  (32 px: every strided convolution sees an even size). The hook's code is the same for
  every ResNet; which convolutions it pads (ResNet-50's conv2) is checked without PyTorch
  (tests/evaluation/test_torch_export.py)."""
  name = 'resnet18'
  workdir, raw, jax_features = _run(tmp_path, name, 'cifar', 32, stored_before=True)
  torch_export.export_torch(str(workdir), str(tmp_path / 'backbone.safetensors'))
  tolerance = _tolerance(jax_features)
  model, meta = _torch_model(tmp_path)
  assert (meta['strided_padding'], meta['same_padding_convs']) == (
    'same',
    ['layer2.0.conv1', 'layer3.0.conv1', 'layer4.0.conv1'],
  )
  stock = _max_difference(model, meta, raw, jax_features)
  model, meta = _torch_model(tmp_path, hook=True)
  hooked = _max_difference(model, meta, raw, jax_features)
  scale = float(np.max(np.abs(jax_features)))
  print(f'{name} stored before: hook {hooked:.2e}, stock {stock:.3g}, features up to {scale:.3g}')
  assert hooked <= tolerance
  assert stock > 100 * tolerance
