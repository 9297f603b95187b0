"""data/image_ops: the per-image operations the augmentations apply: RGB <-> HSV against
Python's colorsys, a hue shift, and the Gaussian blur (constants kept, noise smoothed)."""

from __future__ import annotations

import colorsys

import jax
import jax.numpy as jnp
import numpy as np

from hscl_jax.data import image_ops


@jax.jit
def _hsv_checks(pixels):
  hsv = image_ops.rgb_to_hsv(pixels)
  return jnp.stack(hsv, -1), image_ops.hsv_to_rgb(*hsv), image_ops.adjust_hue(pixels, 1 / 3)


def test_hsv_round_trip_and_reference():
  pixels = jax.random.uniform(jax.random.key(8), (200, 3))
  pixels = pixels.at[0].set(jnp.array([1.0, 0.0, 0.0]))  # Pure red.
  hsv, round_trip, shifted = _hsv_checks(pixels)
  reference = np.array([colorsys.rgb_to_hsv(*p) for p in np.asarray(pixels, np.float64)])
  np.testing.assert_allclose(hsv, reference, atol=1e-5)
  np.testing.assert_allclose(round_trip, pixels, atol=1e-5)
  np.testing.assert_allclose(shifted[0], [0.0, 1.0, 0.0], atol=1e-5)  # Red -> green.


def test_gaussian_blur_keeps_constants_and_smooths():
  blur = jax.jit(jax.vmap(image_ops.gaussian_blur, in_axes=(0, 0, None)), static_argnums=2)
  noise = jax.random.uniform(jax.random.key(9), (12, 12, 3))
  images = jnp.stack([jnp.full((12, 12, 3), 0.3), noise, noise])
  constant, blurred, barely = blur(images, jnp.array([1.5, 2.0, 0.1]), 5)
  np.testing.assert_allclose(constant, images[0], atol=1e-6)
  assert float(blurred.std()) < 0.6 * float(noise.std())
  np.testing.assert_allclose(barely, noise, atol=1e-4)
