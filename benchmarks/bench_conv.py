"""Where the CPU training step goes: each convolution of the models, forward and its two
backward convolutions, XLA:CPU (jax.lax.conv_general_dilated, NHWC as flax) against
PyTorch (torch.nn.functional.conv2d and torch.nn.grad, NCHW as torchvision), same shapes.

    python benchmarks/bench_conv.py                 # small_cnn and ResNet-18 layers, batch 64
    python benchmarks/bench_conv.py --batch=512     # small_cnn's training batch (256 x 2 views)

Per layer: best time of --repeats calls of the forward convolution, the gradient with
respect to the input (d_input) and with respect to the kernel (d_kernel), each jitted
alone in JAX (from jax.vjp) and called directly in torch, the GFLOP/s of each and the
ratio torch time / JAX time (> 1: JAX faster). The totals weight each layer by the times it
occurs in the model. Needs PyTorch: `pip install -e '.[bench]'` (a benchmark dependency only).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import jax
import jax.numpy as jnp

# (name, height = width of the input, in channels, out channels, stride, occurrences)
LAYERS = {
  'small_cnn': [
    ('conv1', 32, 3, 32, 1, 1),
    ('conv2', 32, 32, 64, 2, 1),
    ('conv3', 16, 64, 128, 1, 1),
    ('conv4', 16, 128, 128, 2, 1),
  ],
  'resnet18': [
    ('stem', 32, 3, 64, 1, 1),
    ('stage1', 32, 64, 64, 1, 4),
    ('stage2_down', 32, 64, 128, 2, 1),
    ('stage2', 16, 128, 128, 1, 3),
    ('stage3_down', 16, 128, 256, 2, 1),
    ('stage3', 8, 256, 256, 1, 3),
    ('stage4_down', 8, 256, 512, 2, 1),
    ('stage4', 4, 512, 512, 1, 3),
  ],
}
PASSES = ('forward', 'd_input', 'd_kernel')


def best_time(fn, repeats):
  fn()
  best = float('inf')
  for _ in range(repeats):
    start = time.perf_counter()
    fn()
    best = min(best, time.perf_counter() - start)
  return best


def jax_passes(batch, size, cin, cout, stride):
  """{pass: a no-argument callable that runs it once and waits}."""
  x = jax.random.normal(jax.random.key(0), (batch, size, size, cin), jnp.float32)
  w = jax.random.normal(jax.random.key(1), (3, 3, cin, cout), jnp.float32)
  conv = lambda x, w: jax.lax.conv_general_dilated(
    x, w, (stride, stride), ((1, 1), (1, 1)), dimension_numbers=('NHWC', 'HWIO', 'NHWC')
  )
  y = jax.jit(conv)(x, w)
  forward = jax.jit(conv)
  d_input = jax.jit(lambda x, w, dy: jax.vjp(lambda x_: conv(x_, w), x)[1](dy)[0])
  d_kernel = jax.jit(lambda x, w, dy: jax.vjp(lambda w_: conv(x, w_), w)[1](dy)[0])
  dy = jnp.ones_like(y)
  return {
    'forward': lambda: forward(x, w).block_until_ready(),
    'd_input': lambda: d_input(x, w, dy).block_until_ready(),
    'd_kernel': lambda: d_kernel(x, w, dy).block_until_ready(),
  }


def torch_passes(batch, size, cin, cout, stride):
  import torch
  from torch.nn import functional as F

  x = torch.randn(batch, cin, size, size)
  w = torch.randn(cout, cin, 3, 3)
  dy = torch.ones_like(F.conv2d(x, w, stride=stride, padding=1))
  return {
    'forward': lambda: F.conv2d(x, w, stride=stride, padding=1),
    'd_input': lambda: torch.nn.grad.conv2d_input(x.shape, w, dy, stride=stride, padding=1),
    'd_kernel': lambda: torch.nn.grad.conv2d_weight(x, w.shape, dy, stride=stride, padding=1),
  }


def bench_layer(layer, batch, repeats):
  name, size, cin, cout, stride, count = layer
  out = size // stride
  gflop = 2 * batch * out * out * cout * cin * 9 / 1e9
  row = {'layer': name, 'count': count, 'gflop': gflop}
  for framework, passes in (('jax', jax_passes), ('torch', torch_passes)):
    for pass_name, fn in passes(batch, size, cin, cout, stride).items():
      row[f'{framework}_{pass_name}'] = best_time(fn, repeats)
  return row


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--models', default='small_cnn,resnet18')
  parser.add_argument('--batch', type=int, default=64, help='images (views) per call')
  parser.add_argument('--repeats', type=int, default=5)
  args = parser.parse_args()
  try:
    import torch
  except ImportError:
    sys.exit("bench_conv needs PyTorch: pip install -e '.[bench]' (or pip install torch).")
  torch.set_num_threads(os.cpu_count())
  print(
    f'batch {args.batch}, jax {jax.__version__} on {jax.devices()[0].platform}, '
    f'torch {torch.__version__} ({torch.get_num_threads()} threads), '
    f'load {os.getloadavg()[0]:.2f}'
  )
  for model in args.models.split(','):
    rows = [bench_layer(layer, args.batch, args.repeats) for layer in LAYERS[model]]
    print(f'\n{model}: ms per call (JAX / torch), torch time / JAX time')
    print(f'{"layer":12s} {"GFLOP":>6s} ' + ' '.join(f'{p:>22s}' for p in PASSES))
    for r in rows:
      times = [(r[f'jax_{p}'], r[f'torch_{p}']) for p in PASSES]
      cells = [f'{1e3 * j:6.1f}/{1e3 * t:6.1f} {t / j:5.2f}x' for j, t in times]
      print(f'{r["layer"]:12s} {r["gflop"]:6.2f} ' + ' '.join(f'{c:>22s}' for c in cells))
    totals = {
      f: {p: sum(r['count'] * r[f'{f}_{p}'] for r in rows) for p in PASSES}
      for f in ('jax', 'torch')
    }
    gflop = sum(r['count'] * r['gflop'] for r in rows)
    for p in PASSES:
      j, t = totals['jax'][p], totals['torch'][p]
      print(
        f'total {p:9s}: JAX {1e3 * j:7.1f} ms ({gflop / j:5.1f} GFLOP/s), torch '
        f'{1e3 * t:7.1f} ms ({gflop / t:5.1f} GFLOP/s), torch/JAX {t / j:.2f}'
      )
    j_all, t_all = (sum(totals[f].values()) for f in ('jax', 'torch'))
    print(
      f'total, three passes: JAX {1e3 * j_all:.1f} ms, torch {1e3 * t_all:.1f} ms, '
      f'torch/JAX {t_all / j_all:.2f}'
    )


if __name__ == '__main__':
  main()
