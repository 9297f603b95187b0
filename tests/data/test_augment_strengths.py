"""data/augment: the colour jitter's factors at strengths above 1 (torchvision's
ColorJitter: a factor drawn from U(max(0, 1 - s), 1 + s), never negative)."""

from __future__ import annotations

from acceptance import accepted
import jax.numpy as jnp
import numpy as np
import pytest

from hscl_jax.data import augment

UNIFORMS = jnp.array([0.0, 0.25, 0.5, 1.0])


def _factors(brightness, contrast, saturation, hue):
  with accepted(f'strengths {brightness}, {contrast}, {saturation}'):
    params = augment.AugmentParams(
      image_size=8, brightness=brightness, contrast=contrast, saturation=saturation, hue=hue
    )
  return [np.asarray(f) for f in augment.jitter_factors(params, [UNIFORMS] * 4)]


@pytest.mark.parametrize('strength', [1.0, 1.5, 3.0])
def test_a_strength_of_1_or_more_draws_from_0_to_1_plus_it(strength):
  for factor in _factors(strength, strength, strength, 0.25)[:3]:
    np.testing.assert_allclose(factor, np.asarray(UNIFORMS) * (1 + strength), rtol=1e-6)
    assert factor.min() == 0.0


def test_a_strength_below_1_draws_around_1_and_the_hue_around_0():
  brightness, contrast, saturation, hue = _factors(0.4, 0.8, 0.0, 0.5)
  np.testing.assert_allclose(brightness, 0.6 + 0.8 * np.asarray(UNIFORMS), rtol=1e-6)
  np.testing.assert_allclose(contrast, 0.2 + 1.6 * np.asarray(UNIFORMS), rtol=1e-6)
  np.testing.assert_array_equal(saturation, np.ones(4))
  np.testing.assert_allclose(hue, [-0.5, -0.25, 0.0, 0.5], atol=1e-7)
