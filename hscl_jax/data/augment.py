"""SimCLR augmentations in pure JAX, applied on the accelerator.

Every random choice is drawn from a per-view key (``jax.vmap`` over keys), so a
batch is a deterministic function of one key, and the whole pipeline jits.
The order follows the SimCLR/torchvision recipe the paper uses:
random resized crop -> horizontal flip -> colour jitter (p) -> grayscale (p)
-> Gaussian blur (p) -> normalisation.  Images are float32 in [0, 1] between
the steps; each colour step clips back to [0, 1] as torchvision does.

All strengths and probabilities live in :class:`AugmentParams`. It is a pytree
whose numbers are leaves (changing a strength or probability does not
recompile) and whose shape-defining fields are static; it is also hashable, so
it can equally be a static argument of ``jax.jit`` or be closed over.
"""

from __future__ import annotations

from collections.abc import Mapping
import dataclasses
import numbers
from typing import Any

import jax
import jax.numpy as jnp

from hscl_jax import errors
from hscl_jax.config import fields
from hscl_jax.data import image_ops

# Attempts at sampling a crop that fits before falling back to a centre crop.
_CROP_ATTEMPTS = 10


def _default(name: str):
  """config.augment.<name>'s default: config/fields is the one source of the augmentations'
  defaults, so params built directly (library use) are the default config's."""
  return fields.FIELDS[f'augment.{name}'].default


# Fields that fix shapes or the traced program; every other field is a pytree leaf.
_STATIC_FIELDS = ('image_size', 'jitter_random_order', 'blur_kernel_frac', 'blur_min_size')


@dataclasses.dataclass(frozen=True)
class AugmentParams:
  """Strengths and probabilities of the augmentations (fields of config.augment, whose
  defaults in config/fields are these fields' defaults).

  Attributes:
    image_size: side of the (square) output images, in pixels.
    crop_scale: range of the crop area as a fraction of the image area.
    crop_ratio: range of the crop aspect ratio (width / height), sampled in log space.
    flip_prob: probability of a horizontal flip.
    jitter_prob: probability of applying the colour jitter (all four parts).
    brightness, contrast, saturation: jitter factors are drawn from
      U(max(0, 1 - s), 1 + s).
    hue: hue shift drawn from U(-hue, hue), in turns (hue <= 0.5).
    jitter_random_order: apply the four jitter parts in a random order per view
      (torchvision's ColorJitter does); False uses the fixed order b, c, s, h.
    grayscale_prob: probability of converting to (3-channel) grayscale.
    blur_prob: probability of a Gaussian blur.
    blur_sigma: range of the blur's standard deviation, in pixels.
    blur_kernel_frac: blur kernel side as a fraction of image_size (made odd, >= 3).
    blur_min_size: blur only when image_size >= this (SimCLR leaves small images,
      e.g. CIFAR's 32 px, unblurred); set 0 to blur at every size.
      Static, like image_size, jitter_random_order and blur_kernel_frac.
    mean, std: per-channel normalisation applied last, on [0, 1] images.
  """

  image_size: int
  crop_scale: tuple[float, float] = _default('crop_scale')
  crop_ratio: tuple[float, float] = _default('crop_ratio')
  flip_prob: float = _default('flip_prob')
  jitter_prob: float = _default('jitter_prob')
  brightness: float = _default('brightness')
  contrast: float = _default('contrast')
  saturation: float = _default('saturation')
  hue: float = _default('hue')
  jitter_random_order: bool = _default('jitter_random_order')
  grayscale_prob: float = _default('grayscale_prob')
  blur_prob: float = _default('blur_prob')
  blur_sigma: tuple[float, float] = _default('blur_sigma')
  blur_kernel_frac: float = _default('blur_kernel_frac')
  blur_min_size: int = _default('blur_min_size')
  mean: tuple[float, float, float] = _default('mean')
  std: tuple[float, float, float] = _default('std')

  def __post_init__(self):
    # Lists (e.g. from a ConfigDict) would make the dataclass unhashable for jit.
    for field in dataclasses.fields(self):
      value = getattr(self, field.name)
      if isinstance(value, list):
        object.__setattr__(self, field.name, tuple(value))
    if _is_concrete(self):  # Not when JAX rebuilds it around tracers.
      self._validate()

  def _validate(self):
    """Each refusal is one line naming config.augment (errors.fail), as this is its check."""
    bad = lambda problem, fix: errors.fail('augment', problem, fix)
    if self.image_size < 1:
      bad(f'image_size must be positive, got {self.image_size}', 'use e.g. 32')
    for name in ('flip_prob', 'jitter_prob', 'grayscale_prob', 'blur_prob'):
      if not 0.0 <= getattr(self, name) <= 1.0:
        bad(f'{name} must be in [0, 1], got {getattr(self, name)}', 'use a probability')
    if not 0.0 <= self.hue <= 0.5:
      bad(f'hue must be in [0, 0.5], got {self.hue}', 'use e.g. 0.1')
    low, high = self.crop_scale
    if not 0.0 < low <= high <= 1.0:
      bad(
        f'crop_scale must satisfy 0 < low <= high <= 1, got {self.crop_scale}',
        'use e.g. (0.08, 1.0)',
      )
    if not 0.0 < self.crop_ratio[0] <= self.crop_ratio[1]:
      bad(
        f'crop_ratio must satisfy 0 < low <= high, got {self.crop_ratio}', 'use e.g. (0.75, 1.33)'
      )
    if len(self.mean) != 3 or len(self.std) != 3 or min(self.std) <= 0:
      bad(
        f'mean/std need 3 channels and std > 0, got {self.mean}, {self.std}',
        "use the training split's per-channel statistics (configs/default.py NORMALIZATION)",
      )

  @classmethod
  def from_config(cls, config: Mapping[str, Any]) -> AugmentParams:
    """Builds params from a mapping such as ``config.augment`` (unknown keys raise)."""
    known = {field.name for field in dataclasses.fields(cls)}
    unknown = sorted(set(config.keys()) - known)
    if unknown:
      raise ValueError(f'unknown augment fields {unknown}; valid: {sorted(known)}')
    return cls(**dict(config.items()))

  @property
  def blur_kernel_size(self) -> int:
    """Odd kernel side, about blur_kernel_frac of the image side."""
    size = max(3, int(self.blur_kernel_frac * self.image_size))
    return size if size % 2 == 1 else size + 1

  @property
  def blur_enabled(self) -> bool:
    """Whether the blur step exists at all (static); blur_prob then decides per view."""
    return self.image_size >= self.blur_min_size


def _is_concrete(params: AugmentParams) -> bool:
  """True for user-built params; False when JAX rebuilds them from tracers or arrays."""
  leaves = jax.tree.leaves(tuple(getattr(params, f.name) for f in dataclasses.fields(params)))
  return all(
    isinstance(leaf, numbers.Number) and not isinstance(leaf, jax.Array) for leaf in leaves
  )


jax.tree_util.register_dataclass(
  AugmentParams,
  data_fields=[f.name for f in dataclasses.fields(AugmentParams) if f.name not in _STATIC_FIELDS],
  meta_fields=list(_STATIC_FIELDS),
)


# ----------------------------------------------------------------------------
# Random draws. Every random quantity of one view comes from a single uniform
# draw carved into these named slices: under vmap each jax.random call is
# inlined, so one call per view instead of a dozen keeps compile time low.

_DRAW_SIZES = {
  'crop_area': _CROP_ATTEMPTS,
  'crop_ratio': _CROP_ATTEMPTS,
  'crop_offset': 2,
  'flip': 1,
  'jitter_apply': 1,
  'jitter_factors': 4,  # brightness, contrast, saturation, hue
  'jitter_order': 4,
  'grayscale': 1,
  'blur_apply': 1,
  'blur_sigma': 1,
}
_NUM_DRAWS = sum(_DRAW_SIZES.values())


def _carve(uniforms: jax.Array) -> dict[str, jax.Array]:
  """Splits a [_NUM_DRAWS] uniform vector into the named draws (1-element ones as scalars)."""
  draws, start = {}, 0
  for name, size in _DRAW_SIZES.items():
    piece = uniforms[start : start + size]
    draws[name] = piece[0] if size == 1 else piece
    start += size
  return draws


def _lerp(low, high, u):
  return low + (high - low) * u


# ----------------------------------------------------------------------------
# Public entry points.


def two_views(key: jax.Array, images: jax.Array, params: AugmentParams) -> jax.Array:
  """Augments every view of a batch independently.

  Jittable with params traced (``jax.jit(two_views)``), static
  (``static_argnames='params'``) or closed over. View v of sample i uses the key
  ``fold_in(key, 2 * i + v)``, so a sample's views do not depend on the batch size.

  Args:
    key: a JAX random key (``jax.random.key``).
    images: uint8 [batch, views, H, W, 3] (views is 2 for the loaders' batches).
    params: the augmentation parameters.

  Returns:
    float32 [batch, views, image_size, image_size, 3], normalised.
  """
  batch, views = images.shape[:2]
  keys = jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.arange(batch * views))
  keys = keys.reshape(batch, views)
  augment_one = lambda k, image: augment_view(k, image, params)
  return jax.vmap(jax.vmap(augment_one))(keys, images)


def preprocess_eval(images: jax.Array, params: AugmentParams) -> jax.Array:
  """Evaluation preprocessing: bilinear resize to image_size (if needed) and normalise.

  Args:
    images: uint8 [batch, H, W, 3].
    params: the augmentation parameters (only image_size, mean and std are used).

  Returns:
    float32 [batch, image_size, image_size, 3].
  """
  images = to_unit_float(images)
  size = params.image_size
  if images.shape[1:3] != (size, size):
    images = jax.image.resize(images, (images.shape[0], size, size, 3), method='linear')
  return normalize(images, params)


def augment_view(key: jax.Array, image: jax.Array, params: AugmentParams) -> jax.Array:
  """All augmentations of one view: uint8 [H, W, 3] -> normalised float32 [S, S, 3]."""
  draws = _carve(jax.random.uniform(key, (_NUM_DRAWS,)))
  image = to_unit_float(image)
  image = random_resized_crop(image, params, draws)
  image = jnp.where(draws['flip'] < params.flip_prob, image[:, ::-1], image)
  if not _is_zero(params.jitter_prob):
    image = random_color_jitter(image, params, draws)
  image = jnp.where(draws['grayscale'] < params.grayscale_prob, image_ops.grayscale(image), image)
  if params.blur_enabled and not _is_zero(params.blur_prob):
    image = random_blur(image, params, draws)
  return normalize(image, params)


def _is_zero(probability) -> bool:
  """A probability known at trace time to be 0 (static or closed-over params): skip the step.

  Traced probabilities keep the step, which then selects the input unchanged.
  """
  return isinstance(probability, numbers.Number) and probability == 0


def to_unit_float(images: jax.Array) -> jax.Array:
  return images.astype(jnp.float32) / 255.0


def normalize(images: jax.Array, params: AugmentParams) -> jax.Array:
  mean = jnp.asarray(params.mean, jnp.float32)
  std = jnp.asarray(params.std, jnp.float32)
  return (images - mean) / std


# ----------------------------------------------------------------------------
# Geometry.


def random_resized_crop(image: jax.Array, params: AugmentParams, draws) -> jax.Array:
  """Crops a random box (area and aspect ratio from params) and resizes it to S x S."""
  height, width = image.shape[:2]
  box = sample_crop_box(
    height,
    width,
    params.crop_scale,
    params.crop_ratio,
    draws['crop_area'],
    draws['crop_ratio'],
    draws['crop_offset'],
  )
  return crop_and_resize(image, box, params.image_size)


def sample_crop_box(height, width, scale, ratio, area_u, ratio_u, offset_u):
  """Returns (top, left, crop_height, crop_width) as float32 scalars.

  Like torchvision: of ``_CROP_ATTEMPTS`` candidate boxes the first that fits
  wins; if none fits, the largest centred box with its ratio clipped to
  ``ratio``. Sizes and offsets are continuous (sub-pixel); the resampling
  handles them.
  """
  area = height * width * _lerp(scale[0], scale[1], area_u)
  aspect = jnp.exp(_lerp(jnp.log(ratio[0]), jnp.log(ratio[1]), ratio_u))
  crop_w = jnp.sqrt(area * aspect)
  crop_h = jnp.sqrt(area / aspect)
  fits = (crop_w <= width) & (crop_h <= height)
  first_fit = jnp.argmax(fits)
  fallback_h, fallback_w = _fallback_crop(height, width, ratio)
  crop_h = jnp.where(fits.any(), crop_h[first_fit], fallback_h)
  crop_w = jnp.where(fits.any(), crop_w[first_fit], fallback_w)
  top = offset_u[0] * (height - crop_h)
  left = offset_u[1] * (width - crop_w)
  return top, left, crop_h, crop_w


def _fallback_crop(height, width, ratio):
  """(height, width) of the largest box with aspect ratio clipped into ``ratio``."""
  in_ratio = width / height
  crop_h = jnp.where(in_ratio < ratio[0], width / ratio[0], height)
  crop_w = jnp.where(in_ratio > ratio[1], height * ratio[1], width)
  return crop_h, crop_w


def crop_and_resize(image: jax.Array, box, size: int) -> jax.Array:
  """Bilinear (antialiased when shrinking) resampling of ``box`` to size x size."""
  top, left, crop_h, crop_w = box
  scale = jnp.stack([size / crop_h, size / crop_w])
  translation = -jnp.stack([top, left]) * scale
  return jax.image.scale_and_translate(
    image, (size, size, image.shape[2]), (0, 1), scale, translation, method='linear', antialias=True
  )


# ----------------------------------------------------------------------------
# Colour.


def jitter_factors(params: AugmentParams, factor_u):
  """(brightness, contrast, saturation) factors around 1 and the hue shift around 0."""

  def around_one(strength, u):
    return _lerp(jnp.maximum(0.0, 1.0 - strength), 1.0 + strength, u)

  return (
    around_one(params.brightness, factor_u[0]),
    around_one(params.contrast, factor_u[1]),
    around_one(params.saturation, factor_u[2]),
    _lerp(-params.hue, params.hue, factor_u[3]),
  )


def random_color_jitter(image: jax.Array, params: AugmentParams, draws) -> jax.Array:
  """Brightness, contrast, saturation and hue jitter, applied together with jitter_prob."""
  brightness, contrast, saturation, hue = jitter_factors(params, draws['jitter_factors'])
  cheap = (
    lambda x: image_ops.adjust_brightness(x, brightness),
    lambda x: image_ops.adjust_contrast(x, contrast),
    lambda x: image_ops.adjust_saturation(x, saturation),
  )
  if params.jitter_random_order:
    order = jnp.argsort(draws['jitter_order'])  # A uniform random permutation of 0..3.
    jittered = _apply_in_order(image, order, cheap, lambda x: image_ops.adjust_hue(x, hue))
  else:
    jittered = image_ops.adjust_hue(cheap[2](cheap[1](cheap[0](image))), hue)
  return jnp.where(draws['jitter_apply'] < params.jitter_prob, jittered, image)


def _apply_in_order(image, order, cheap, hue_shift):
  """Applies cheap ops 0..2 and the hue shift (op 3) in ``order``.

  Under vmap a data-dependent switch evaluates every branch, so the costly hue
  shift is evaluated once, between a stage of cheap ops placed before it and a
  stage placed after it (identity where a position is on the other side).
  """
  hue_position = jnp.argmax(order == 3)
  branches = (*cheap, lambda x: x)  # Index 3 = identity.
  for position in range(3):  # Positions that can come before the hue shift.
    op = jnp.where(position < hue_position, order[position], 3)
    image = jax.lax.switch(op, branches, image)
  image = hue_shift(image)
  for position in range(1, 4):  # Positions that can come after it.
    op = jnp.where(position > hue_position, order[position], 3)
    image = jax.lax.switch(op, branches, image)
  return image


# ----------------------------------------------------------------------------
# Blur.


def random_blur(image: jax.Array, params: AugmentParams, draws) -> jax.Array:
  sigma = _lerp(params.blur_sigma[0], params.blur_sigma[1], draws['blur_sigma'])
  blurred = image_ops.gaussian_blur(image, sigma, params.blur_kernel_size)
  return jnp.where(draws['blur_apply'] < params.blur_prob, blurred, image)
