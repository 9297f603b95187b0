"""data/augment: properties of the JAX augmentations (small images: every distinct params is
one compile), each step against its direct computation from the draws, and the colour
jitter's factors at strengths above 1 (torchvision's ColorJitter: a factor drawn from
U(max(0, 1 - s), 1 + s), never negative)."""

from __future__ import annotations

import colorsys
import dataclasses
import functools

from acceptance import accepted
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hscl_jax.data import augment

SIZE = 8
# Params are traced, so every test with this batch shape shares one compile.
BATCH_SHAPE = (300, 2, SIZE, SIZE, 3)
NO_NORMALISATION = dict(mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0))
# blur_min_size=0 keeps the blur step in the program (static); blur_prob turns it off.
IDENTITY = augment.AugmentParams(
  image_size=SIZE,
  crop_scale=(1.0, 1.0),
  crop_ratio=(1.0, 1.0),
  flip_prob=0.0,
  jitter_prob=0.0,
  grayscale_prob=0.0,
  blur_prob=0.0,
  blur_min_size=0,
)
DEFAULTS_WITH_BLUR = augment.AugmentParams(
  image_size=SIZE, blur_prob=0.5, blur_min_size=0, **NO_NORMALISATION
)


@functools.cache
def jitted_two_views():
  return jax.jit(augment.two_views)


def random_images(shape=BATCH_SHAPE, seed=0):
  return jnp.asarray(np.random.default_rng(seed).integers(0, 256, shape, np.uint8))


def binomial_tolerance(prob, count, sigmas=4.5):
  return sigmas * np.sqrt(prob * (1 - prob) / count)


# The recipe recomputed from the draws first: the broadest check (a failure shows soonest).


def test_every_step_equals_its_direct_computation_from_the_draws():
  """two_views with every step on equals, view by view, the recipe recomputed in float64
  from the view's own draws: the jitter's factors, its random order (argsort of the order
  draws), whether it applies, grayscale, blur sigma and whether it applies. The draws
  cover every branch: each position of the hue shift, each step applied and skipped."""
  samples = 24
  images = random_images((samples, 2, 14, 11, 3), seed=11)
  key = jax.random.key(12)
  out = np.asarray(jax.jit(augment.two_views)(key, images, ALL_STEPS))
  hue_positions, applied = set(), {'jitter_apply': set(), 'grayscale': set(), 'blur_apply': set()}
  for i in range(samples):
    for v in range(2):
      view_key = jax.random.fold_in(key, 2 * i + v)
      draw = _view_draws(view_key)
      if draw['jitter_apply'][0] < ALL_STEPS.jitter_prob:
        hue_positions.add(int(np.argmax(np.argsort(draw['jitter_order']) == 3)))
      probs = (ALL_STEPS.jitter_prob, ALL_STEPS.grayscale_prob, ALL_STEPS.blur_prob)
      for (name, seen), prob in zip(applied.items(), probs):
        seen.add(bool(draw[name][0] < prob))
      expected = _direct_view(view_key, np.asarray(images[i, v]), ALL_STEPS)
      np.testing.assert_allclose(out[i, v], expected, atol=3e-4, err_msg=f'sample {i} view {v}')
  assert hue_positions == {0, 1, 2, 3}
  assert all(seen == {False, True} for seen in applied.values()), applied


def test_fixed_jitter_order_is_brightness_contrast_saturation_hue():
  """jitter_random_order=False: the four parts in torchvision's fixed order, from the
  same factor draws; the order matters on these images (hue before saturation differs;
  brightness, contrast and saturation commute unless they clip)."""
  params = dataclasses.replace(ALL_STEPS, jitter_prob=1.0, jitter_random_order=False)
  jitter = jax.jit(augment.random_color_jitter, static_argnames='params')
  rng = np.random.default_rng(13)
  for trial in range(4):
    image = rng.uniform(size=(SIZE, SIZE, 3))
    key = jax.random.key(trial)
    got = jitter(jnp.asarray(image, jnp.float32), params, augment._carve(uniform_draws(key)))
    draw = _view_draws(key)
    expected = _jitter_reference(image, params, draw['jitter_factors'], range(4))
    np.testing.assert_allclose(got, expected, atol=1e-4)
    swapped = _jitter_reference(image, params, draw['jitter_factors'], (0, 1, 3, 2))
    assert np.abs(swapped - expected).max() > 1e-3


def test_identity_params_give_normalised_input():
  images = random_images()
  out = jitted_two_views()(jax.random.key(0), images, IDENTITY)
  flat = images.reshape(-1, SIZE, SIZE, 3)
  expected = augment.preprocess_eval(flat, IDENTITY)
  np.testing.assert_allclose(out.reshape(flat.shape), expected, atol=1e-5)
  manual = (np.asarray(images, np.float32) / 255 - np.array(IDENTITY.mean)) / np.array(IDENTITY.std)
  np.testing.assert_allclose(out, manual, atol=1e-5)
  # Static params with zero probabilities skip the jitter and blur steps entirely.
  static = jax.jit(augment.two_views, static_argnames='params')
  np.testing.assert_allclose(static(jax.random.key(0), images[:2], IDENTITY), out[:2], atol=1e-6)


def test_preprocess_eval_resizes_and_normalises():
  images = random_images((2, 12, 12, 3))
  params = augment.AugmentParams(image_size=SIZE, **NO_NORMALISATION)
  out = augment.preprocess_eval(images, params)
  assert out.shape == (2, SIZE, SIZE, 3) and out.dtype == jnp.float32
  # Bilinear resizing keeps the mean and stays in range.
  np.testing.assert_allclose(out.mean(), np.asarray(images).mean() / 255, atol=0.02)
  assert 0.0 <= float(out.min()) and float(out.max()) <= 1.0


def two_halves_image():
  """A colourful image whose left half differs from its right half."""
  image = np.zeros((SIZE, SIZE, 3), np.uint8)
  image[:, : SIZE // 2] = (250, 20, 20)
  image[:, SIZE // 2 :] = (20, 20, 250)
  return image


def test_flip_and_grayscale_frequencies_match_probabilities():
  flip_prob, gray_prob = 0.5, 0.3
  params = dataclasses.replace(
    IDENTITY, flip_prob=flip_prob, grayscale_prob=gray_prob, **NO_NORMALISATION
  )
  image = two_halves_image()
  images = jnp.broadcast_to(jnp.asarray(image), BATCH_SHAPE)
  out = np.asarray(jitted_two_views()(jax.random.key(1), images, params))
  out = out.reshape(-1, SIZE, SIZE, 3)
  views = len(out)
  is_gray = np.all(out == out[..., :1], axis=(1, 2, 3))
  left_sum, right_sum = out[:, :, : SIZE // 2].sum((1, 2, 3)), out[:, :, SIZE // 2 :].sum((1, 2, 3))
  is_flipped = np.where(is_gray, left_sum < right_sum, out[:, 0, 0, 0] < out[:, 0, 0, 2])
  assert abs(is_gray.mean() - gray_prob) < binomial_tolerance(gray_prob, views)
  assert abs(is_flipped.mean() - flip_prob) < binomial_tolerance(flip_prob, views)
  # A flipped view is the exact mirror image; a gray one the exact luma.
  flipped = out[~is_gray & is_flipped]
  np.testing.assert_allclose(
    flipped, np.broadcast_to(image[:, ::-1] / 255, flipped.shape), atol=1e-6
  )
  luma = image.astype(np.float32) @ np.array([0.299, 0.587, 0.114], np.float32) / 255
  gray_views = out[is_gray & ~is_flipped][..., 0]
  np.testing.assert_allclose(gray_views, np.broadcast_to(luma, gray_views.shape), atol=1e-5)


def test_jitter_probability_and_strength():
  jitter_prob = 0.4
  params = dataclasses.replace(
    IDENTITY,
    jitter_prob=jitter_prob,
    brightness=0.4,
    contrast=0.0,
    saturation=0.0,
    hue=0.0,
    **NO_NORMALISATION,
  )
  images = jnp.full(BATCH_SHAPE, 100, jnp.uint8)
  out = np.asarray(jitted_two_views()(jax.random.key(6), images, params))
  factors = out.reshape(-1, SIZE * SIZE * 3).mean(axis=1) / (100 / 255)
  changed = np.abs(factors - 1) > 1e-4
  assert abs(changed.mean() - jitter_prob) < binomial_tolerance(jitter_prob, len(factors))
  # Brightness factors are uniform on [0.6, 1.4].
  assert 0.6 - 1e-4 <= factors.min() and factors.max() <= 1.4 + 1e-4
  assert abs(np.median(factors[changed]) - 1.0) < 0.08


def test_default_augmentations_shapes_ranges_and_determinism():
  params = DEFAULTS_WITH_BLUR
  assert params.blur_enabled and params.jitter_random_order
  images = random_images()
  two_views = jitted_two_views()
  out = two_views(jax.random.key(2), images, params)
  assert out.shape == BATCH_SHAPE and out.dtype == jnp.float32
  # All steps are convex combinations or clipped, so [0, 1] images stay in range.
  assert float(out.min()) >= -1e-5 and float(out.max()) <= 1 + 1e-5
  np.testing.assert_array_equal(out, two_views(jax.random.key(2), images, params))
  other = two_views(jax.random.key(3), images, params)
  assert float(jnp.abs(out - other).mean()) > 0.01
  # The two views of one image differ (independent per-view keys).
  assert float(jnp.abs(out[:, 0] - out[:, 1]).mean()) > 0.01


def test_jit_equals_no_jit_and_static_params():
  images = random_images(seed=4)
  jitted = jitted_two_views()(jax.random.key(5), images, DEFAULTS_WITH_BLUR)
  # Eager execution compiles every primitive on its own: one sample keeps it quick.
  # Per-view keys are fold_in(key, view number), so sample 0 is the same in both.
  with jax.disable_jit():
    eager = augment.two_views(jax.random.key(5), images[:1], DEFAULTS_WITH_BLUR)
  np.testing.assert_allclose(jitted[:1], eager, atol=1e-5)
  static = jax.jit(augment.two_views, static_argnames='params')
  np.testing.assert_allclose(
    static(jax.random.key(5), images[:1], DEFAULTS_WITH_BLUR), eager, atol=1e-5
  )


def test_crop_boxes_respect_scale_and_ratio():
  height, width, count = 20, 30, 2000
  uniforms = jax.random.uniform(jax.random.key(7), (count, 22))
  box = jax.vmap(
    lambda u: augment.sample_crop_box(
      height, width, (0.08, 1.0), (3 / 4, 4 / 3), u[:10], u[10:20], u[20:]
    )
  )(uniforms)
  top, left, crop_h, crop_w = map(np.asarray, box)
  assert np.all(top >= 0) and np.all(left >= 0)
  assert np.all(top + crop_h <= height + 1e-4) and np.all(left + crop_w <= width + 1e-4)
  area = crop_h * crop_w / (height * width)
  assert area.min() >= 0.08 - 1e-4 and area.max() <= 1 + 1e-4
  ratio = crop_w / crop_h
  assert ratio.min() >= 3 / 4 - 1e-4 and ratio.max() <= 4 / 3 + 1e-4


def test_crop_without_fitting_candidate_falls_back_to_centre():
  # Ratio 4 cannot fit a 10x10 image at full area: centred box clipped to the image.
  u = jnp.full((22,), 0.5)
  top, left, crop_h, crop_w = augment.sample_crop_box(
    10, 10, (1.0, 1.0), (4.0, 4.0), u[:10], u[10:20], u[20:]
  )
  np.testing.assert_allclose([top, left, crop_h, crop_w], [3.75, 0, 2.5, 10], atol=1e-5)


@pytest.mark.parametrize(
  'height, width, expected',
  [
    (40, 10, [(40 - 10 / 0.75) / 2, 0, 10 / 0.75, 10]),  # tall: height at the lower ratio
    (10, 40, [0, (40 - 10 * 4 / 3) / 2, 10, 10 * 4 / 3]),  # wide: width at the upper ratio
    (10, 12, [0, 0, 10, 12]),  # its aspect 1.2 within the range: the whole image
  ],
)
def test_the_fallback_crop_clips_the_aspect_into_the_ratio_range(height, width, expected):
  # Full area at a ratio in [3/4, 4/3] fits neither image: the centred fallback box takes
  # the image's aspect clipped into the range (the bound nearer the image's own).
  u = jnp.full((22,), 0.5)
  box = augment.sample_crop_box(height, width, (1.0, 1.0), (3 / 4, 4 / 3), u[:10], u[10:20], u[20:])
  np.testing.assert_allclose(box, expected, atol=1e-4)


def test_crop_and_resize_picks_the_box():
  image = jnp.tile(jnp.arange(16.0)[None, :, None], (16, 1, 3))  # Value = column.
  out = augment.crop_and_resize(
    image, (jnp.float32(2), jnp.float32(4), jnp.float32(8), jnp.float32(8)), 8
  )
  np.testing.assert_allclose(out[0, :, 0], np.arange(4.0, 12.0), atol=1e-5)


def test_blur_kernel_size_and_the_small_image_rule():
  assert augment.AugmentParams(image_size=96).blur_kernel_size == 9
  assert augment.AugmentParams(image_size=224).blur_kernel_size == 23
  assert augment.AugmentParams(image_size=32).blur_kernel_size == 3
  assert not augment.AugmentParams(image_size=32, blur_min_size=33).blur_enabled
  assert augment.AugmentParams(image_size=96, blur_min_size=33).blur_enabled
  # The config's default: the blur step at every size, applied to no view (blur_prob 0).
  default = augment.AugmentParams(image_size=8)
  assert default.blur_enabled and default.blur_prob == 0.0


_BELOW = lambda b: float(np.nextafter(b, -np.inf))
_ABOVE = lambda b: float(np.nextafter(b, np.inf))


@pytest.mark.parametrize(
  'field, accepted, refused',
  [
    ('image_size', (1,), (0,)),
    *[
      (p, (0.0, 1.0), (_BELOW(0.0), _ABOVE(1.0)))
      for p in ('flip_prob', 'jitter_prob', 'grayscale_prob', 'blur_prob')
    ],
    ('hue', (0.0, 0.5), (_BELOW(0.0), _ABOVE(0.5))),
    # 0 < low <= high <= 1: the least positive low, low = high, high = 1.
    (
      'crop_scale',
      ((5e-324, 1.0), (0.3, 0.3), (0.08, 1.0)),
      ((0.0, 1.0), (0.3, _BELOW(0.3)), (0.08, _ABOVE(1.0))),
    ),
    ('crop_ratio', ((5e-324, 2.0), (1.5, 1.5)), ((0.0, 2.0), (1.5, _BELOW(1.5)))),
    ('std', ((5e-324, 1.0, 1.0),), ((0.0, 1.0, 1.0), (1.0, 1.0))),
  ],
)
def test_every_range_check_accepts_its_bounds_and_refuses_one_past(field, accepted, refused):
  for value in accepted:
    augment.AugmentParams(**{'image_size': 32, field: value})
  for value in refused:
    with pytest.raises(ValueError, match=f'{field} must|/{field} need'):
      augment.AugmentParams(**{'image_size': 32, field: value})


def test_params_from_config_accepts_lists_and_rejects_unknown_keys():
  params = augment.AugmentParams.from_config(
    {'image_size': 32, 'crop_scale': [0.2, 1.0], 'mean': [0.5, 0.5, 0.5]}
  )
  assert params.crop_scale == (0.2, 1.0) and hash(params)
  with pytest.raises(ValueError) as refusal:
    augment.AugmentParams.from_config({'image_size': 32, 'zoom': 2, 'flip_probability': 0.5})
  # The unknown keys, then every valid field, each list in alphabetical order.
  valid = sorted(field.name for field in dataclasses.fields(augment.AugmentParams))
  message = f"unknown augment fields ['flip_probability', 'zoom']; valid: {valid}"
  assert str(refusal.value) == message
  with pytest.raises(ValueError, match='flip_prob'):
    augment.AugmentParams(image_size=32, flip_prob=1.5)


def test_flip_and_grayscale_are_drawn_independently():
  """P(flip and gray) = P(flip) P(gray): each random choice has its own draw."""
  params = dataclasses.replace(IDENTITY, flip_prob=0.5, grayscale_prob=0.5, **NO_NORMALISATION)
  images = jnp.broadcast_to(jnp.asarray(two_halves_image()), BATCH_SHAPE)
  out = np.asarray(jitted_two_views()(jax.random.key(2), images, params)).reshape(-1, SIZE, SIZE, 3)
  is_gray = np.all(out == out[..., :1], axis=(1, 2, 3))
  left_sum, right_sum = out[:, :, : SIZE // 2].sum((1, 2, 3)), out[:, :, SIZE // 2 :].sum((1, 2, 3))
  is_flipped = np.where(is_gray, left_sum < right_sum, out[:, 0, 0, 0] < out[:, 0, 0, 2])
  both = np.mean(is_gray & is_flipped)
  assert abs(both - 0.25) < binomial_tolerance(0.25, len(out)), both


def uniform_draws(key):
  return jax.random.uniform(key, (sum(augment._DRAW_SIZES.values()),))


def _view_draws(key):
  """The view's uniform draws, carved by hand in the order of augment._DRAW_SIZES."""
  sizes = augment._DRAW_SIZES
  u = np.asarray(uniform_draws(key), np.float64)
  offsets = np.cumsum([0, *sizes.values()])
  return {name: u[offsets[i] : offsets[i + 1]] for i, name in enumerate(sizes)}


def _direct_view(key, image, params):
  """One view computed from the formulas: torchvision's crop box (first fitting candidate,
  area and log-ratio interpolated, offsets from their own draws), flip, colour jitter in
  the drawn order, grayscale, blur, normalisation; every choice from its own draw."""
  draw = _view_draws(key)
  height, width = image.shape[:2]
  (s0, s1), (r0, r1) = params.crop_scale, params.crop_ratio
  area = height * width * (s0 + (s1 - s0) * draw['crop_area'])
  aspect = np.exp(np.log(r0) + (np.log(r1) - np.log(r0)) * draw['crop_ratio'])
  crop_w, crop_h = np.sqrt(area * aspect), np.sqrt(area / aspect)
  fits = (crop_w <= width) & (crop_h <= height)
  assert fits.any()  # the test's parameters always leave a fitting candidate
  first = int(np.argmax(fits))
  crop_h, crop_w = crop_h[first], crop_w[first]
  top = draw['crop_offset'][0] * (height - crop_h)
  left = draw['crop_offset'][1] * (width - crop_w)
  box = tuple(jnp.float32(x) for x in (top, left, crop_h, crop_w))
  out = np.asarray(augment.crop_and_resize(jnp.asarray(image, jnp.float32) / 255, box, SIZE))
  out = out.astype(np.float64)
  if draw['flip'][0] < params.flip_prob:
    out = out[:, ::-1]
  if draw['jitter_apply'][0] < params.jitter_prob:
    order = np.argsort(draw['jitter_order']) if params.jitter_random_order else range(4)
    out = _jitter_reference(out, params, draw['jitter_factors'], order)
  if draw['grayscale'][0] < params.grayscale_prob:
    out = np.repeat(out @ LUMA[:, None], 3, axis=-1)
  if params.image_size >= params.blur_min_size and draw['blur_apply'][0] < params.blur_prob:
    sigma = (
      params.blur_sigma[0] + (params.blur_sigma[1] - params.blur_sigma[0]) * draw['blur_sigma']
    )
    out = _blur_reference(out, sigma[0], params.blur_kernel_frac)
  return (out - np.array(params.mean)) / np.array(params.std)


LUMA = np.array([0.299, 0.587, 0.114])


def _jitter_reference(image, params, factor_u, order):
  """torchvision's ColorJitter in float64: factors from U(max(0, 1 - s), 1 + s), the hue
  shift from U(-hue, hue), ops 0..3 = brightness, contrast (blend with the mean luma),
  saturation (blend with the luma), hue (colorsys HSV rotation) in `order`, each clipped."""
  low = lambda s: max(0.0, 1.0 - s)
  brightness, contrast, saturation = (
    low(s) + (1.0 + s - low(s)) * u
    for s, u in zip((params.brightness, params.contrast, params.saturation), factor_u[:3])
  )
  shift = -params.hue + 2 * params.hue * factor_u[3]

  def hue(x):
    hsv = [colorsys.rgb_to_hsv(*p) for p in x.reshape(-1, 3)]
    rgb = [colorsys.hsv_to_rgb((h + shift) % 1.0, s, v) for h, s, v in hsv]
    return np.asarray(rgb).reshape(x.shape)

  def blend(x, toward, factor):
    return np.clip(toward + factor * (x - toward), 0.0, 1.0)

  ops = (
    lambda x: np.clip(x * brightness, 0.0, 1.0),
    lambda x: blend(x, np.mean(x @ LUMA), contrast),
    lambda x: blend(x, (x @ LUMA)[..., None], saturation),
    hue,
  )
  for op in order:
    image = ops[op](image)
  return image


def _blur_reference(image, sigma, kernel_frac):
  """Separable Gaussian blur: odd kernel of about kernel_frac of the side (>= 3), weights
  exp(-x^2 / 2 sigma^2) summing to 1, reflect padding (torchvision's)."""
  size = max(3, int(kernel_frac * image.shape[0]))
  size += 1 - size % 2
  radius = size // 2
  weights = np.exp(-0.5 * (np.arange(-radius, radius + 1) / sigma) ** 2)
  weights /= weights.sum()
  for axis in (0, 1):
    pad = [(0, 0)] * 3
    pad[axis] = (radius, radius)
    padded = np.pad(image, pad, mode='reflect')
    image = sum(
      w * np.take(padded, np.arange(t, t + image.shape[axis]), axis=axis)
      for t, w in enumerate(weights)
    )
  return image


def test_end_to_end_with_non_trivial_crop_flip_and_normalisation():
  """two_views with a non-square input, an asymmetric scale and ratio range, flips and a
  per-channel normalisation equals each view computed directly (key fold_in(key, 2i + v))."""
  params = dataclasses.replace(ALL_STEPS, jitter_prob=0.0, grayscale_prob=0.0, blur_prob=0.0)
  images = random_images((3, 2, 14, 11, 3), seed=5)
  key = jax.random.key(9)
  out = np.asarray(jax.jit(augment.two_views)(key, images, params))
  for i in range(3):
    for v in range(2):
      view_key = jax.random.fold_in(key, 2 * i + v)
      expected = _direct_view(view_key, np.asarray(images[i, v]), params)
      np.testing.assert_allclose(out[i, v], expected, atol=2e-4, err_msg=f'sample {i} view {v}')
  assert not np.allclose(out[:, 0], out[:, 1], atol=0.05)  # the two views differ


# Every colour step on, with strengths told apart (contrast != saturation), a hue range
# around 0, a blur kernel of 5 (reflect padding reaches 2 pixels in).
ALL_STEPS = augment.AugmentParams.from_config(
  {
    'image_size': SIZE,
    'crop_scale': (0.3, 0.6),
    'crop_ratio': (1.3, 2.0),
    'flip_prob': 0.5,
    'jitter_prob': 0.7,
    'brightness': 0.4,
    'contrast': 0.7,
    'saturation': 0.2,
    'hue': 0.2,
    'grayscale_prob': 0.3,
    'blur_prob': 0.5,
    'blur_sigma': (0.4, 1.5),
    'blur_kernel_frac': 0.6,
    'blur_min_size': 0,
    'mean': (0.1, 0.2, 0.3),
    'std': (0.5, 0.6, 0.7),
  }
)


def test_the_params_defaults_are_the_configs():
  """config/fields is the one source of the augmentations' defaults: params built directly
  with the default config's image size are the ones the default config builds."""
  from hscl_jax.config import fields

  config = fields.default_config().augment
  assert augment.AugmentParams(image_size=config.image_size) == (
    augment.AugmentParams.from_config(config)
  )
  for field in dataclasses.fields(augment.AugmentParams):
    if field.name != 'image_size':
      assert field.default == fields.FIELDS[f'augment.{field.name}'].default, field.name


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
