"""Two-view training batches per second from an image folder, beside what the step consumes.

    python benchmarks/bench_input.py --folder=DIR [--batch_size=512] [--batches=20] \
        [--models=small_cnn,resnet18] [--step_batch=64]

Measured in one run, one process: (1) the time to decode the training split into memory
(`data.get_source`'s cache, a thread pool); (2) samples/s of `data.TrainLoader` (the
training program's loader: grain threads, two views of each sample, batch --batch_size)
reading the JPEGs lazily; (3) the same from the decoded cache; (4) samples/s that the real
training step (`train.make_train_step`: augmentation, H-SCL, diagnostics, Adam) consumes
for each model at 32 px on this machine's JAX device. The target is the cached loader at
>= 20,000 samples/s (about what one H100 needs for a ResNet-18 step at 32 px), so the host
never limits an accelerator.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))  # the sibling scripts

TARGET_SAMPLES_PER_SECOND = 20_000


def parse_args():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--folder', required=True, help='image folder with train/ and test/')
  parser.add_argument('--image_size', type=int, default=32)
  parser.add_argument('--batch_size', type=int, default=512, help='samples per loader batch')
  parser.add_argument('--batches', type=int, default=20, help='timed batches per loader')
  parser.add_argument('--models', default='small_cnn,resnet18', help="'' skips the steps")
  parser.add_argument('--step_batch', type=int, default=64, help='samples per timed step')
  return parser.parse_args()


def loader_rate(source, batch_size: int, batches: int) -> float:
  """Samples/s of TrainLoader over `source`, after one warm-up batch."""
  from hscl_jax import data

  loader = data.TrainLoader(
    source, global_batch_size=batch_size, seed=0, shard_index=0, shard_count=1
  )
  next(loader)
  start = time.perf_counter()
  for _ in range(batches):
    next(loader)
  return batch_size * batches / (time.perf_counter() - start)


def step_rate(model: str, args) -> float:
  """Samples/s of the real training step (bench_train_step's measurement)."""
  import bench_train_step

  step_args = argparse.Namespace(
    batch_size=args.step_batch,
    image_size=args.image_size,
    dtype='float32',
    diagnostics=True,
    steps=3,
    matmul_size=1024,
  )
  return bench_train_step.bench_model(model, step_args)['images_per_s'] / 2


def main():
  args = parse_args()
  from hscl_jax import data

  kwargs = dict(folder=args.folder, folder_image_size=args.image_size)
  lazy = data.get_source('image_folder', 'train', **kwargs, cache_bytes=0)
  start = time.perf_counter()
  cached = data.get_source('image_folder', 'train', **kwargs)
  build_seconds = time.perf_counter() - start
  print(f'decoded cache: {len(cached)} images in {build_seconds:.1f} s')
  rates = {
    'lazy (JPEG)': loader_rate(lazy, args.batch_size, args.batches),
    'decoded cache': loader_rate(cached, args.batch_size, args.batches),
  }
  for model in filter(None, args.models.split(',')):
    rates[f'step {model}'] = step_rate(model, args)
  print(f'\n{"what":24s} {"samples/s":>10s}')
  for name, rate in rates.items():
    print(f'{name:24s} {rate:10.0f}')
  met = rates['decoded cache'] >= TARGET_SAMPLES_PER_SECOND
  print(f'\ncache target {TARGET_SAMPLES_PER_SECOND} samples/s: {"met" if met else "not met"}')


if __name__ == '__main__':
  main()
