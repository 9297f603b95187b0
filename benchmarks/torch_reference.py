"""The same contrastive training step in PyTorch: the reference of bench_train_step and
accelerator.py.

    python benchmarks/torch_reference.py --device=cuda --models=resnet18 --dtypes=bfloat16

Our own PyTorch versions of the project's models (hscl_jax.models: the CIFAR-stem
ResNet-18/34/50 and the small CNN, each with the 2-layer projection head, BatchNorm with
the same momentum and epsilon), H-SCL with exponential hardening (eq. (3), M = n - 2,
weights not detached, as configs/default.py) written densely, and torch.optim.Adam with
coupled L2 (optax's adam + add_decayed_weights before it, as hscl_jax.optimizers).
No input pipeline and no augmentation: random float images stay on the device (the JAX
step times its on-device augmentation too; bench_train_step prints that part alone).

As a program it prints one JSON line for the environment (or {"skipped": reason} where
--device=auto finds no CUDA device), then one per model x dtype x variant: float32 (TF32
allowed for matmuls and convolutions, as JAX's default precision on NVIDIA GPUs) or
bfloat16 autocast with channels_last; `eager` or `compile` (torch.compile); the warm-up's
seconds (the compilation included), the best and median step of --steps, images/s
(samples x 2 views). cuDNN picks its fastest convolution algorithms (benchmark mode), as
XLA autotunes its own. accelerator.py runs it in a process of its own, before JAX takes
the GPU's memory, and divides.

torch is a benchmark dependency only (`pip install -e '.[bench]'`), never one of the package.
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import sys
import time

import torch
from torch import nn
from torch.nn import functional as F

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))  # the sibling scripts

from rows import measured  # noqa: E402

BN = dict(momentum=0.1, eps=1e-5)  # flax's momentum 0.9 is torch's 0.1


def conv_bn(in_channels, out_channels, kernel, stride):
  return nn.Sequential(
    nn.Conv2d(in_channels, out_channels, kernel, stride, padding=kernel // 2, bias=False),
    nn.BatchNorm2d(out_channels, **BN),
  )


class BasicBlock(nn.Module):
  expansion = 1

  def __init__(self, in_channels, filters, stride):
    super().__init__()
    self.a = conv_bn(in_channels, filters, 3, stride)
    self.b = conv_bn(filters, filters, 3, 1)
    out = filters * self.expansion
    self.proj = conv_bn(in_channels, out, 1, stride) if (stride, in_channels) != (1, out) else None

  def forward(self, x):
    y = self.b(F.relu(self.a(x)))
    return F.relu(y + (x if self.proj is None else self.proj(x)))


class Bottleneck(nn.Module):
  expansion = 4

  def __init__(self, in_channels, filters, stride):
    super().__init__()
    out = filters * self.expansion
    self.a = conv_bn(in_channels, filters, 1, 1)
    self.b = conv_bn(filters, filters, 3, stride)
    self.c = conv_bn(filters, out, 1, 1)
    self.proj = conv_bn(in_channels, out, 1, stride) if (stride, in_channels) != (1, out) else None

  def forward(self, x):
    y = self.c(F.relu(self.b(F.relu(self.a(x)))))
    return F.relu(y + (x if self.proj is None else self.proj(x)))


def resnet(stage_sizes, block):
  layers, channels = [conv_bn(3, 64, 3, 1), nn.ReLU()], 64
  for i, size in enumerate(stage_sizes):
    for j in range(size):
      layers.append(block(channels, 64 * 2**i, 2 if i > 0 and j == 0 else 1))
      channels = 64 * 2**i * block.expansion
  return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten()), channels


def small_cnn(widths=(32, 64, 128, 128), strides=(1, 2, 1, 2)):
  layers, channels = [], 3
  for width, stride in zip(widths, strides, strict=True):
    layers += [conv_bn(channels, width, 3, stride), nn.ReLU()]
    channels = width
  return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten()), channels


BACKBONES = {
  'resnet18': lambda: resnet((2, 2, 2, 2), BasicBlock),
  'resnet34': lambda: resnet((3, 4, 6, 3), BasicBlock),
  'resnet50': lambda: resnet((3, 4, 6, 3), Bottleneck),
  'small_cnn': small_cnn,
}


def contrastive_model(name, hidden=512, out=128):
  backbone, width = BACKBONES[name]()
  head = nn.Sequential(
    nn.Linear(width, hidden, bias=False),
    nn.BatchNorm1d(hidden, **BN),
    nn.ReLU(),
    nn.Linear(hidden, out),
  )
  return nn.Sequential(backbone, head)


def hscl_loss(z, labels, *, beta=1.0, temperature=0.5):
  """H-SCL, eq. (3): mean over positive pairs of softplus(log M - g_ip + log E_i), with
  E_i the e^{β g}-weighted mean of e^{g} over the anchor's other-label rows."""
  n = z.shape[0]
  g = z @ z.T / temperature
  same = labels[:, None] == labels[None, :]
  positives = same & ~torch.eye(n, dtype=torch.bool)
  negatives = ~same
  minus_inf = torch.full_like(g, -math.inf)
  log_w = torch.where(negatives, beta * g, minus_inf)
  log_e = torch.logsumexp(log_w + g, dim=1) - torch.logsumexp(log_w, dim=1)
  pair = F.softplus(math.log(n - 2) - g + log_e[:, None])
  # The mean over positive pairs as a masked sum: static shapes, which torch.compile keeps
  # in one graph (boolean indexing would break it).
  return torch.where(positives, pair, 0.0).sum() / positives.sum()


def make_step(name, batch_size, image_size, *, device='cpu', dtype='float32', compiled=False):
  """One training step on random images already on `device`: returns step() -> loss tensor.

  bfloat16: autocast (the convolutions and matmuls in bfloat16, BatchNorm and the loss in
  float32, as config.model.dtype in JAX) with the model and images channels_last.
  compiled: the forward pass and the loss through torch.compile (their backward follows);
  the optimizer stays eager (fused Adam on CUDA)."""
  device = torch.device(device)
  torch.manual_seed(0)
  model = contrastive_model(name).to(device).train()
  images = torch.randn(2 * batch_size, 3, image_size, image_size, device=device)
  labels = (torch.arange(batch_size, device=device) % 10).repeat_interleave(2)  # sample-major
  low_precision = dtype == 'bfloat16'
  if low_precision:
    model = model.to(memory_format=torch.channels_last)
    images = images.contiguous(memory_format=torch.channels_last)
  optimizer = torch.optim.Adam(
    model.parameters(), lr=1e-3, weight_decay=1e-6, fused=device.type == 'cuda'
  )

  def loss_of(images):
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=low_precision):
      z = model(images)
    return hscl_loss(F.normalize(z.float(), dim=1), labels)  # the loss in float32

  forward = torch.compile(loss_of) if compiled else loss_of

  def step():
    optimizer.zero_grad(set_to_none=True)
    loss = forward(images)
    loss.backward()
    optimizer.step()
    return loss

  return step


def time_step(step, steps: int, device) -> dict:
  """Two warm-up steps (torch.compile compiles in the first), then `steps` timed ones,
  each synchronised with the device: the warm-up's seconds, the best and median step."""
  sync = torch.cuda.synchronize if torch.device(device).type == 'cuda' else lambda: None
  start = time.perf_counter()
  for _ in range(2):
    step()
  sync()
  warmup_s = time.perf_counter() - start
  times = []
  for _ in range(steps):
    start = time.perf_counter()
    loss = step()
    sync()
    times.append(time.perf_counter() - start)
  return dict(
    warmup_s=round(warmup_s, 2),
    step_s_best=round(min(times), 5),
    step_s_median=round(sorted(times)[len(times) // 2], 5),
    loss=round(float(loss.detach()), 4),
  )


def step_images_per_second(name: str, batch_size: int, image_size: int, steps: int, threads: int):
  """(best images/s over `steps` timed steps after two warm-up steps, last loss): the CPU
  float32 eager step (bench_train_step --torch)."""
  torch.set_num_threads(threads)
  timed = time_step(make_step(name, batch_size, image_size), steps, 'cpu')
  return 2 * batch_size / timed['step_s_best'], timed['loss']


def resolve_device(requested: str) -> tuple[str | None, str]:
  """(the device to run on, or None: skipped; why)."""
  if requested != 'auto':
    return requested, f'--device={requested}'
  if torch.cuda.is_available():
    return 'cuda', 'a CUDA device is visible to PyTorch'
  return None, f'no CUDA device visible to PyTorch {torch.__version__} (CUDA {torch.version.cuda})'


def environment(device: str, threads: int) -> dict:
  cuda = device == 'cuda'
  return dict(
    torch=torch.__version__,
    device=device,
    device_name=torch.cuda.get_device_name() if cuda else 'cpu',
    cuda=torch.version.cuda,
    tf32=cuda,
    cudnn_benchmark=cuda,
    threads=torch.get_num_threads() if not cuda else threads,
  )


def measure(name, dtype, variant, args, device) -> dict:
  """One row: the step of `name` x `dtype` x `variant` timed on `device`."""
  try:
    step = make_step(
      name,
      args.batch_size,
      args.image_size,
      device=device,
      dtype=dtype,
      compiled=variant == 'compile',
    )
    timed = time_step(step, args.steps, device)
  finally:
    if device == 'cuda':
      torch.cuda.empty_cache()  # the next row starts from a free device
  return dict(
    model=name,
    dtype=dtype,
    variant=variant,
    batch_size=args.batch_size,
    image_size=args.image_size,
    images_per_s=round(2 * args.batch_size / timed['step_s_best'], 2),
    **timed,
  )


def parse_args(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument(
    '--device', default='auto', help='auto (CUDA if visible, else skip) | cuda | cpu'
  )
  parser.add_argument('--models', default='resnet18,resnet50')
  parser.add_argument('--dtypes', default='float32,bfloat16')
  parser.add_argument('--variants', default='eager,compile', help='eager and/or compile')
  parser.add_argument('--batch_size', type=int, default=512, help='samples per step (x2 views)')
  parser.add_argument('--image_size', type=int, default=32)
  parser.add_argument('--steps', type=int, default=5, help='timed steps after two warm-up')
  parser.add_argument('--threads', type=int, default=None, help='CPU threads (default: all)')
  return parser.parse_args(argv)


def main(argv=None):
  args = parse_args(argv)
  device, why = resolve_device(args.device)
  if device is None:
    print(json.dumps(dict(skipped=why)), flush=True)
    return
  if args.threads:
    torch.set_num_threads(args.threads)
  if device == 'cuda':
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    torch.backends.cudnn.benchmark = True
  print(json.dumps(dict(environment=environment(device, args.threads))), flush=True)
  for variant in args.variants.split(','):  # every eager row first: they take seconds
    for name in args.models.split(','):
      for dtype in args.dtypes.split(','):
        measured(
          lambda: measure(name, dtype, variant, args, device),
          model=name,
          dtype=dtype,
          variant=variant,
        )


if __name__ == '__main__':
  main()
