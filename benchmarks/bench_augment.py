"""Augmented two-view samples per second: jitted JAX vs a per-image NumPy/PIL pipeline.

  python benchmarks/bench_augment.py [--batch=256] [--sizes=32,96] [--repeats=5]

Both sides run the same SimCLR recipe (random resized crop, flip 0.5, colour
jitter 0.8 in random order, grayscale 0.2, blur 0.5 when the side is >= 33 px,
normalisation) on uint8 images already at the output size (CIFAR 32 px, STL-10
96 px). The PIL side is the classic per-image CPU data-loader path (what
torchvision does with PIL images), one process; the JAX side is one jitted call
per batch on whatever JAX device is present (CPU here).
"""

from __future__ import annotations

import argparse
import math
import os
import time

import jax
import numpy as np
from PIL import Image
from PIL import ImageEnhance
from PIL import ImageFilter

from hscl_jax.data import augment


def parse_args():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--batch', type=int, default=256)
  parser.add_argument('--sizes', default='32,96')
  parser.add_argument('--repeats', type=int, default=5, help='timed JAX batches per size')
  parser.add_argument(
    '--pil_samples',
    type=int,
    default=256,
    help='samples timed on the PIL side (the rate is per sample)',
  )
  return parser.parse_args()


def time_jax(images: np.ndarray, params: augment.AugmentParams, repeats: int) -> float:
  """Seconds per batch of the jitted two_views (compile excluded)."""
  two_views = jax.jit(augment.two_views, static_argnames='params')
  device_images = jax.device_put(images)
  two_views(jax.random.key(0), device_images, params).block_until_ready()  # Compile.
  start = time.perf_counter()
  for step in range(repeats):
    two_views(jax.random.key(step + 1), device_images, params).block_until_ready()
  return (time.perf_counter() - start) / repeats


# ----------------------------------------------------------------------------
# The per-image NumPy/PIL reference pipeline.


def pil_crop_box(rng, height, width, params):
  """torchvision's RandomResizedCrop box: 10 attempts, then a centred fallback."""
  area = height * width
  for _ in range(10):
    target = area * rng.uniform(*params.crop_scale)
    aspect = math.exp(rng.uniform(math.log(params.crop_ratio[0]), math.log(params.crop_ratio[1])))
    crop_w, crop_h = math.sqrt(target * aspect), math.sqrt(target / aspect)
    if crop_w <= width and crop_h <= height:
      top, left = rng.uniform(0, height - crop_h), rng.uniform(0, width - crop_w)
      return left, top, left + crop_w, top + crop_h
  return 0, 0, width, height


def pil_hue(image: Image.Image, shift: float) -> Image.Image:
  hsv = np.array(image.convert('HSV'))
  hsv[..., 0] = (hsv[..., 0].astype(np.int16) + int(round(shift * 255))) % 256
  return Image.fromarray(hsv, 'HSV').convert('RGB')


def pil_jitter(rng, image, params):
  def around_one(strength):
    return rng.uniform(max(0.0, 1 - strength), 1 + strength)

  steps = [
    lambda im: ImageEnhance.Brightness(im).enhance(around_one(params.brightness)),
    lambda im: ImageEnhance.Contrast(im).enhance(around_one(params.contrast)),
    lambda im: ImageEnhance.Color(im).enhance(around_one(params.saturation)),
    lambda im: pil_hue(im, rng.uniform(-params.hue, params.hue)),
  ]
  for index in rng.permutation(len(steps)):
    image = steps[index](image)
  return image


def pil_augment_view(rng, image: np.ndarray, params: augment.AugmentParams) -> np.ndarray:
  pil = Image.fromarray(image)
  size = params.image_size
  box = pil_crop_box(rng, pil.height, pil.width, params)
  pil = pil.resize((size, size), Image.Resampling.BILINEAR, box=box)
  if rng.random() < params.flip_prob:
    pil = pil.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
  if rng.random() < params.jitter_prob:
    pil = pil_jitter(rng, pil, params)
  if rng.random() < params.grayscale_prob:
    pil = pil.convert('L').convert('RGB')
  if params.blur_enabled and rng.random() < params.blur_prob:
    pil = pil.filter(ImageFilter.GaussianBlur(radius=rng.uniform(*params.blur_sigma)))
  out = np.asarray(pil, np.float32) / 255.0
  return (out - np.asarray(params.mean, np.float32)) / np.asarray(params.std, np.float32)


def time_pil(images: np.ndarray, params: augment.AugmentParams, samples: int) -> float:
  """Seconds per sample (two views) of the per-image pipeline."""
  rng = np.random.default_rng(0)
  start = time.perf_counter()
  for index in range(samples):
    for view in range(2):
      pil_augment_view(rng, images[index % len(images), view], params)
  return (time.perf_counter() - start) / samples


def main():
  args = parse_args()
  print(
    f'JAX {jax.__version__} on {jax.devices()[0].platform}, batch {args.batch}, '
    f'load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs'
  )
  print(f'{"size":>5} {"blur":>5} {"JAX samples/s":>14} {"PIL samples/s":>14} {"JAX/PIL":>8}')
  for size in (int(s) for s in args.sizes.split(',')):
    # SimCLR's recipe: blur half the views from 33 px up (the configs' defaults leave it off).
    params = augment.AugmentParams(image_size=size, blur_prob=0.5, blur_min_size=33)
    images = np.random.default_rng(size).integers(0, 256, (args.batch, 2, size, size, 3), np.uint8)
    jax_rate = args.batch / time_jax(images, params, args.repeats)
    pil_rate = 1.0 / time_pil(images, params, args.pil_samples)
    print(
      f'{size:>5} {str(params.blur_enabled):>5} {jax_rate:>14.0f} {pil_rate:>14.0f} '
      f'{jax_rate / pil_rate:>8.2f}'
    )
  print('samples/s counts two-view samples (2 augmented images each).')


if __name__ == '__main__':
  main()
