"""benchmarks/torch_reference.py is the project's step in PyTorch: the same model (layers in
the same order and shapes; with the same weights, the same train-mode outputs and running
statistics: BatchNorm's momentum in PyTorch's convention, 1 - Flax's, and its epsilon),
H-SCL against a float64 loop over the anchors written from eq. (3), the step's loss equal
to ours on the same projections, and images/s counting both views. Skipped without torch.
"""

from __future__ import annotations

import math
import pathlib
import re
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip('torch')

from configs import default  # noqa: E402
from hscl_jax import losses  # noqa: E402
from hscl_jax import models  # noqa: E402
from hscl_jax.models import resnet  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / 'benchmarks')]  # a script, imported as such

import torch_reference  # noqa: E402

LAYERS = (torch.nn.Conv2d, torch.nn.Linear, torch.nn.BatchNorm2d, torch.nn.BatchNorm1d)
# Flax names its modules; their creation order (the forward pass's, PyTorch's module order):
# stem, then Conv_i / BatchNorm_i / Dense_i / blocks by i (a layer before its norm), then
# the projection shortcut; the encoder before the head.
FIXED_ORDER = {
  'encoder': (0, 0, 0), 'conv_init': (0, 0, 0), 'bn_init': (0, 0, 1),
  'conv_proj': (2, 0, 0), 'norm_proj': (2, 0, 1), 'head': (3, 0, 0),
}  # fmt: skip


def creation_order(name: str) -> tuple:
  if name in FIXED_ORDER:
    return FIXED_ORDER[name]
  kind, index = re.fullmatch(r'(\w+)_(\d+)', name).groups()
  return (1, int(index), int(kind == 'BatchNorm'))


def flax_layers(params: dict, path=()):
  """(path, the layer's params) of every convolution, dense layer and BatchNorm, in the
  order of the forward pass."""
  if 'kernel' in params or 'scale' in params:
    yield path, params
    return
  for name in sorted(params, key=creation_order):
    yield from flax_layers(params[name], (*path, name))


def at(tree: dict, path: tuple):
  for name in path:
    tree = tree[name]
  return tree


def torch_shape(layer: dict) -> tuple:
  """The PyTorch weight's shape of a Flax layer (OIHW convolutions, (out, in) dense)."""
  if 'scale' in layer:
    return tuple(layer['scale'].shape)
  kernel = tuple(layer['kernel'].shape)
  return (*kernel[::-1][:2], *kernel[:2]) if len(kernel) == 4 else kernel[::-1]


def flax_model(name: str):
  """The project's model as the default config builds it (its bn_momentum)."""
  config = default.get_config()
  config.model.name = name
  return models.create_model(config.model)


@pytest.mark.parametrize('name', ['small_cnn', 'resnet18', 'resnet50'])
def test_the_layers_are_ours_in_order_and_shape(name):
  shapes = jax.eval_shape(
    lambda: flax_model(name).init(jax.random.key(0), jnp.zeros((1, 8, 8, 3)), train=False)
  )['params']
  ours = [('BatchNorm' if 'scale' in layer else 'Kernel', torch_shape(layer))
          for _, layer in flax_layers(shapes)]  # fmt: skip
  kind = lambda module: 'BatchNorm' if 'BatchNorm' in type(module).__name__ else 'Kernel'
  theirs = [(kind(module), tuple(module.weight.shape))
            for module in torch_reference.contrastive_model(name).modules()
            if isinstance(module, LAYERS)]  # fmt: skip
  assert theirs == ours


def random_variables(shapes, rng) -> dict:
  """Every parameter random (BatchNorm scales around 1, not the zeros that make a block the
  identity), running means random, variances positive."""
  draw = lambda path, leaf: (
    rng.uniform(0.5, 1.5, leaf.shape)
    if path[-1].key in ('scale', 'var')
    else rng.normal(0, 0.3, leaf.shape)
  ).astype(np.float32)
  return jax.tree_util.tree_map_with_path(draw, shapes)


def copy_into(module, variables: dict) -> None:
  """Flax's weights and running statistics into the PyTorch module, layer by layer."""
  layers = [m for m in module.modules() if isinstance(m, LAYERS)]
  ours = list(flax_layers(variables['params']))
  assert len(layers) == len(ours)
  tensor = lambda array: torch.from_numpy(np.array(array))
  with torch.no_grad():
    for layer, (path, params) in zip(layers, ours, strict=True):
      if 'kernel' in params:
        kernel = np.asarray(params['kernel'])
        layer.weight.copy_(tensor(kernel.transpose(3, 2, 0, 1) if kernel.ndim == 4 else kernel.T))
        if 'bias' in params:
          layer.bias.copy_(tensor(params['bias']))
        continue
      stats = at(variables['batch_stats'], path)
      layer.weight.copy_(tensor(params['scale']))
      layer.bias.copy_(tensor(params['bias']))
      layer.running_mean.copy_(tensor(stats['mean']))
      layer.running_var.copy_(tensor(stats['var']))


def compare_train_step(flax_module, torch_module, size: int, scale: float, outputs) -> None:
  """One train-mode forward pass of both on the same images (`scale` times a standard
  normal): the outputs and every BatchNorm's updated running mean equal, and its running
  variance, which PyTorch updates with the unbiased batch variance (Flax the biased one)."""
  rng = np.random.default_rng(0)
  images = (scale * rng.normal(size=(6, size, size, 3))).astype(np.float32)
  shapes = jax.eval_shape(
    lambda: flax_module.init(jax.random.key(0), jnp.zeros((1, size, size, 3)), train=False)
  )
  variables = random_variables(shapes, rng)
  forward = jax.jit(lambda v, x: flax_module.apply(v, x, train=True, mutable=['batch_stats']))
  output, updated = forward(variables, images)
  copy_into(torch_module.train(), variables)
  norms = [layer for layer in torch_module.modules() if isinstance(layer, LAYERS[2:])]
  counts = []  # each BatchNorm's values per channel in this batch
  for layer in norms:
    layer.register_forward_hook(lambda _, x, __: counts.append(x[0].numel() // x[0].shape[1]))
  theirs = torch_module(torch.from_numpy(images.transpose(0, 3, 1, 2).copy())).detach().numpy()
  ours = np.asarray(outputs(output))
  np.testing.assert_allclose(theirs, ours, atol=2e-5 * np.abs(ours).max())
  m = 0.9  # Flax's momentum: new = m * old + (1 - m) * batch
  paths = [path for path, params in flax_layers(variables['params']) if 'scale' in params]
  for layer, path, count in zip(norms, paths, counts, strict=True):
    old, new = at(variables['batch_stats'], path), at(updated['batch_stats'], path)
    np.testing.assert_allclose(layer.running_mean.numpy(), new['mean'], rtol=1e-4, atol=1e-6)
    biased = (np.asarray(new['var']) - m * old['var']) / (1 - m)
    unbiased = m * old['var'] + (1 - m) * biased * count / (count - 1)
    np.testing.assert_allclose(layer.running_var.numpy(), unbiased, rtol=1e-4)


def test_small_cnn_and_its_head_compute_ours():
  """The whole contrastive model (small_cnn, 9 px: odd sizes, where Flax's 'SAME' stride-2
  padding is PyTorch's one pixel a side; at even sizes, the benchmark's 32 px, they sample
  other pixels: the same work, not the same function) on images of standard deviation
  1e-3: the first BatchNorm's batch variance is below its epsilon, so another epsilon shows."""
  assert default.get_config().model.bn_momentum == 0.9  # what compare_train_step assumes
  compare_train_step(
    flax_model('small_cnn'), torch_reference.contrastive_model('small_cnn'), 9, 1e-3,
    lambda output: output[1],
  )  # fmt: skip


@pytest.mark.parametrize('block', ['BasicBlock', 'Bottleneck'])
def test_a_resnet_of_each_block_computes_ours(block):
  """Two stages of one block each (the second strided, with a projection shortcut; the
  symmetric padding of the CIFAR stem's ResNets) at 8 px, standard deviation 1e-3."""
  ours = resnet.ResNet(stage_sizes=(1, 1), block_cls=getattr(resnet, block))
  theirs, _ = torch_reference.resnet((1, 1), getattr(torch_reference, block))
  compare_train_step(ours, theirs, 8, 1e-3, lambda output: output)


def hscl_by_anchor(z: np.ndarray, labels: np.ndarray, beta: float, temperature: float) -> float:
  """Eq. (3) in float64, anchor by anchor: the mean over positive pairs (i, p) of
  -log(e^{g_ip} / (e^{g_ip} + M E_i)), E_i the e^{beta g}-weighted mean of e^{g} over the
  anchor's other-label rows, M = n - 2."""
  n, g = len(z), z @ z.T / temperature
  losses_of_pairs = []
  for i in range(n):
    negatives = [k for k in range(n) if labels[k] != labels[i]]
    weights = np.exp(beta * g[i, negatives])
    mean = np.sum(weights * np.exp(g[i, negatives])) / np.sum(weights)
    for p in range(n):
      if p != i and labels[p] == labels[i]:
        positive = math.exp(g[i, p])
        losses_of_pairs.append(-math.log(positive / (positive + (n - 2) * mean)))
  return float(np.mean(losses_of_pairs))


def test_hscl_loss_is_eq_3_at_the_configs_beta_and_temperature():
  rng = np.random.default_rng(3)
  z = rng.normal(size=(12, 5))
  z /= np.linalg.norm(z, axis=1, keepdims=True)
  labels = np.array([0, 0, 1, 1, 0, 0, 2, 2, 1, 1, 3, 3])  # sample-major: two views a sample
  given = torch_reference.hscl_loss(
    torch.tensor(z), torch.tensor(labels), beta=0.7, temperature=0.3
  )
  assert given.item() == pytest.approx(hscl_by_anchor(z, labels, 0.7, 0.3), rel=1e-12)
  config = default.get_config()
  defaults = torch_reference.hscl_loss(torch.tensor(z), torch.tensor(labels))  # the step's
  expected = hscl_by_anchor(z, labels, config.beta, config.temperature)
  assert defaults.item() == pytest.approx(expected, rel=1e-12)


def test_the_steps_loss_is_ours_on_its_projections():
  """The first step's loss (12 samples, labels i % 10: samples 0 and 10, 1 and 11 share a
  class) = losses.hscl at the config's beta and temperature on the same model's normalised
  projections, rows (2i, 2i + 1) being sample i's two views."""
  config = default.get_config()
  step = torch_reference.make_step('small_cnn', 12, 8)
  torch.manual_seed(0)  # make_step's model and images, drawn again
  model = torch_reference.contrastive_model('small_cnn').train()
  images = torch.randn(24, 3, 8, 8)
  with torch.no_grad():
    z = torch.nn.functional.normalize(model(images), dim=1).numpy()
  hscl = lambda z, labels: losses.hscl(
    z, labels, hardening=losses.exponential(config.beta), temperature=config.temperature
  )
  ours = jax.jit(hscl)(z.reshape(12, 2, -1), np.arange(12) % 10)  # jitted: one compilation
  assert step().item() == pytest.approx(float(ours), rel=1e-5)


def test_images_per_second_count_both_views(monkeypatch):
  """Each row's images/s is 2 x batch (samples x views) over the best step."""
  timed = dict(warmup_s=1.0, step_s_best=0.25, step_s_median=0.5, loss=1.0)
  monkeypatch.setattr(torch_reference, 'make_step', lambda *args, **kwargs: None)
  monkeypatch.setattr(torch_reference, 'time_step', lambda step, steps, device: timed)
  monkeypatch.setattr(torch, 'set_num_threads', lambda threads: None)
  args = torch_reference.parse_args(['--batch_size=8', '--image_size=16', '--steps=2'])
  row = torch_reference.measure('small_cnn', 'bfloat16', 'eager', args, 'cpu')
  assert row['images_per_s'] == 2 * 8 / 0.25 == 64
  assert (row['step_s_best'], row['batch_size'], row['image_size']) == (0.25, 8, 16)
  assert torch_reference.step_images_per_second('small_cnn', 8, 16, 2, 1) == (64, 1.0)


def test_time_step_reports_the_warmup_the_best_and_the_upper_median(monkeypatch):
  """On a scripted clock: two warm-up steps timed together, then each step alone; the best
  is the shortest step, the median the upper one of an even count (sorted ascending),
  rounded to 10 µs; the loss is the last step's."""
  durations = [0.4, 0.1234567, 0.3, 0.2]  # sorted: 0.1234567, 0.2, 0.3, 0.4
  clock = [0.0, 3.14159]  # the warm-up's start and end
  for i, seconds in enumerate(durations):
    clock += [10.0 * (i + 1), 10.0 * (i + 1) + seconds]
  ticks = iter(clock)
  monkeypatch.setattr(torch_reference.time, 'perf_counter', lambda: next(ticks))
  losses_left = iter(torch.tensor(x) for x in (9.0, 9.0, 5.0, 4.0, 3.0, 1.23456789))
  timed = torch_reference.time_step(lambda: next(losses_left), len(durations), 'cpu')
  assert timed == dict(warmup_s=3.14, step_s_best=0.12346, step_s_median=0.3, loss=1.2346)
  assert next(ticks, None) is None  # every tick read: no step left untimed
