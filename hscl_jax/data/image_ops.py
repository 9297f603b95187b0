"""Per-image colour and blur operations of the SimCLR augmentations, in pure JAX.

Each takes one float32 image in [0, 1] (height, width, 3) and its strength; the random
choices (which strength, whether to apply) are `hscl_jax.data.augment`'s.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

# Luma weights of ITU-R 601-2, the ones PIL and torchvision use for grayscale.
_LUMA = (0.299, 0.587, 0.114)


def grayscale(image: jax.Array) -> jax.Array:
  """Luma, replicated to 3 equal channels."""
  luma = image @ jnp.asarray(_LUMA, image.dtype)
  return jnp.repeat(luma[..., None], 3, axis=-1)


def adjust_brightness(image, factor):
  return jnp.clip(image * factor, 0.0, 1.0)


def adjust_contrast(image, factor):
  # Blend with the mean luma, as torchvision/PIL do.
  mean = jnp.mean(image @ jnp.asarray(_LUMA, image.dtype))
  return jnp.clip(mean + factor * (image - mean), 0.0, 1.0)


def adjust_saturation(image, factor):
  gray = grayscale(image)
  return jnp.clip(gray + factor * (image - gray), 0.0, 1.0)


def adjust_hue(image, shift):
  """Rotates the HSV hue by ``shift`` turns; value and chroma are unchanged."""
  sixths, chroma, value = _hue_chroma_value(image)
  return _from_hue_chroma_value(sixths + 6.0 * shift, chroma, value)


def rgb_to_hsv(image):
  """[..., 3] RGB in [0, 1] -> (h, s, v), h in [0, 1) turns."""
  sixths, chroma, value = _hue_chroma_value(image)
  saturation = chroma / jnp.where(value > 0, value, 1.0)
  return sixths / 6.0, saturation, value


def hsv_to_rgb(hue, saturation, value):
  """Inverse of :func:`rgb_to_hsv`."""
  return _from_hue_chroma_value(6.0 * hue, value * saturation, value)


def _hue_chroma_value(image):
  """Hue in sixths of a turn [0, 6), chroma (max - min) and value (max) of RGB pixels.

  Written for speed (the hue shift dominates the jitter's cost): one reciprocal,
  no modulo. Grey pixels (chroma 0) get hue 0.
  """
  red, green, blue = image[..., 0], image[..., 1], image[..., 2]
  value = jnp.maximum(jnp.maximum(red, green), blue)
  chroma = value - jnp.minimum(jnp.minimum(red, green), blue)
  inverse = 1.0 / jnp.where(chroma > 0, chroma, 1.0)
  sixths = jnp.where(
    value == red,
    (green - blue) * inverse,
    jnp.where(value == green, (blue - red) * inverse + 2.0, (red - green) * inverse + 4.0),
  )
  return jnp.where(sixths < 0, sixths + 6.0, sixths), chroma, value


def _from_hue_chroma_value(sixths, chroma, value):
  """RGB from hue (in sixths, any real: it is periodic), chroma and value."""

  def channel(offset):
    k = offset + sixths
    k = k - 6.0 * jnp.floor(k / 6.0)  # Wrap into [0, 6); cheaper than jnp.mod.
    return value - chroma * jnp.clip(jnp.minimum(k, 4.0 - k), 0.0, 1.0)

  return jnp.stack([channel(5.0), channel(3.0), channel(1.0)], axis=-1)


def gaussian_blur(image: jax.Array, sigma: jax.Array, kernel_size: int) -> jax.Array:
  """Separable Gaussian blur with reflect padding (kernel_size odd, static)."""
  radius = kernel_size // 2
  offsets = jnp.arange(-radius, radius + 1, dtype=jnp.float32)
  weights = jnp.exp(-0.5 * (offsets / sigma) ** 2)
  weights = weights / weights.sum()
  image = _convolve_axis(image, weights, axis=0)
  return _convolve_axis(image, weights, axis=1)


def _convolve_axis(image, weights, axis):
  """1-D convolution along ``axis`` as a sum of shifted slices (the kernel is tiny)."""
  radius = weights.shape[0] // 2
  length = image.shape[axis]
  pad = [(0, 0)] * image.ndim
  pad[axis] = (radius, radius)
  padded = jnp.pad(image, pad, mode='reflect')
  out = jnp.zeros_like(image)
  for tap in range(weights.shape[0]):
    window = jax.lax.slice_in_dim(padded, tap, tap + length, axis=axis)
    out = out + weights[tap] * window
  return out
