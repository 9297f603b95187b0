"""The four losses with a queue of extra negatives (issue 21), against a float64 reference."""

from __future__ import annotations

import functools

from absl.testing import parameterized
from acceptance import accepted
import chex
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P
import numpy as np
import pytest

from hscl_jax import losses
from hscl_jax.losses import kernel as loss_kernel
from losses.test_kernel import LOSSES  # tests/ is on sys.path (pytest)
from losses.test_kernel import SETTINGS
from losses.test_kernel import _mesh
from losses.test_kernel import _projected_loss
from losses.test_kernel import assert_gradient_matches
from losses.test_kernel import assert_value_matches
from losses.test_kernel import normalized

# --------------------------------------------------------------------------------------
# The float64 reference (losses.test_kernel.reference_loss) counts the queue's filled slots as
# negatives (label-filtered for SCL/H-SCL), never as positives, and M = n - 2 + filled.


def random_batch(seed, batch=6, views=2, dim=8, num_classes=3, slots=7):
  """(features, labels, queue, queue_labels, queue_filled): mixed labels, some slots
  unlabelled (-1), some empty."""
  kf, kl, kq, kql = jax.random.split(jax.random.key(seed), 4)
  features = normalized(jax.random.normal(kf, (batch, views, dim)))
  labels = jax.random.randint(kl, (batch,), 0, num_classes)
  queue = normalized(jax.random.normal(kq, (slots, dim)))
  queue_labels = jax.random.randint(kql, (slots,), -1, num_classes).at[0].set(-1)
  queue_filled = jnp.arange(slots) % 3 != 2
  return features, labels, queue, queue_labels, queue_filled


SUPERVISED = ('scl', 'hscl_exp', 'hscl_threshold')


def queue_kwargs(queue, queue_labels, queue_filled):
  return dict(queue=queue, queue_labels=queue_labels, queue_filled=queue_filled)


class ReferenceTest(chex.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.product(name=sorted(LOSSES), setting=SETTINGS)
  @pytest.mark.covering  # tests/covering.py
  def test_value_matches_reference(self, name, setting):
    features, labels, *queue = random_batch(0, views=setting['views'])
    kw = dict(temperature=setting['temperature'], M=setting['M'], **queue_kwargs(*queue))
    assert_value_matches(self.variant, name, features, labels, **kw)

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters(*sorted(LOSSES))
  @pytest.mark.covering  # tests/covering.py
  def test_gradient_matches_reference(self, name):
    """Dense and blockwise (blocks of 3 rows: batch and queue keys in separate blocks)."""
    kernel, reference = LOSSES[name]
    features, labels, *queue = random_batch(1)
    kw = queue_kwargs(*queue)
    for block_size in (0, 3):
      loss = functools.partial(kernel, y=labels, block_size=block_size, **kw)
      grad = self.variant(jax.grad(loss))(features)
      assert_gradient_matches(grad, lambda f: reference(f, labels, **kw), features)

  def test_queue_changes_the_loss(self):
    """The reference test is not vacuous: the queue's negatives move every loss."""
    features, labels, *queue = random_batch(2)
    for name, (kernel, _) in LOSSES.items():
      with_queue = kernel(features, labels, M=10.0, **queue_kwargs(*queue))
      self.assertGreater(abs(float(with_queue - kernel(features, labels, M=10.0))), 1e-4, name)


class IdentityTest(parameterized.TestCase):
  @parameterized.parameters(*sorted(LOSSES))
  def test_empty_queue_is_the_loss_without_one_bit_for_bit(self, name):
    kernel, _ = LOSSES[name]
    features, labels, *_ = random_batch(3)
    empty = queue_kwargs(jnp.zeros((0, 8)), jnp.zeros((0,), jnp.int32), jnp.zeros((0,), bool))
    for block_size in (None, 3):
      today = jax.value_and_grad(lambda f: kernel(f, labels, block_size=block_size))(features)
      for kw in (empty, queue_kwargs(None, None, None)):
        got = jax.value_and_grad(lambda f: kernel(f, labels, block_size=block_size, **kw))(features)
        chex.assert_trees_all_equal(got, today)
      self.assertEqual(
        str(jax.make_jaxpr(lambda f: kernel(f, labels, **empty))(features)),
        str(jax.make_jaxpr(lambda f: kernel(f, labels))(features)),
      )

  @parameterized.product(name=SUPERVISED, block_size=[0, 3])
  @pytest.mark.covering  # tests/covering.py
  def test_queue_of_the_anchors_label_adds_nothing(self, name, block_size):
    """Anchors all of label 0: the queue's label-0 and unlabelled slots are no negatives,
    so only its label-1 slots count (M fixed, so only the negative set is compared)."""
    kernel, _ = LOSSES[name]
    features, _, queue, _, _ = random_batch(4, slots=9)
    labels = jnp.zeros(6, jnp.int32)
    slot_labels = jnp.array([0, 1, 0, -1, 1, 0, 0, -1, 1])
    others = slot_labels == 1
    fn = lambda f, **kw: kernel(f, labels, M=12.0, block_size=block_size, **kw)
    full = jax.value_and_grad(lambda f: fn(f, queue=queue, queue_labels=slot_labels))(features)
    only_others = jax.value_and_grad(
      lambda f: fn(f, queue=queue[others], queue_labels=slot_labels[others])
    )(features)
    chex.assert_trees_all_close(full, only_others, rtol=1e-6, atol=1e-7)
    self.assertGreater(float(full[0]), 0.0)  # the label-1 slots are negatives
    same_label_only = fn(features, queue=queue, queue_labels=jnp.where(others, 0, slot_labels))
    self.assertEqual(float(same_label_only), 0.0)  # no negative at all: the loss is 0

  @parameterized.parameters(*sorted(LOSSES))
  def test_queue_gets_no_gradient(self, name):
    kernel, _ = LOSSES[name]
    features, labels, queue, queue_labels, queue_filled = random_batch(5)
    for block_size in (0, 3):
      grad = jax.grad(
        lambda q: kernel(
          features, labels, block_size=block_size, **queue_kwargs(q, queue_labels, queue_filled)
        )
      )(queue)
      np.testing.assert_array_equal(grad, jnp.zeros_like(queue))

  def test_beta_zero_gives_scl_and_ucl_with_the_same_queue(self):
    features, labels, *queue = random_batch(6)
    kw = queue_kwargs(*queue)
    for detach in (False, True):
      np.testing.assert_allclose(
        losses.hscl(
          features, labels, hardening=losses.exponential(0.0), stop_gradient_weights=detach, **kw
        ),
        losses.scl(features, labels, **kw),
        rtol=1e-6,
      )
      np.testing.assert_allclose(
        losses.hucl(features, beta=0.0, stop_gradient_weights=detach, **kw),
        losses.ucl(features, **kw),
        rtol=1e-6,
      )

  def test_default_m_counts_filled_slots(self):
    features, labels, queue, queue_labels, queue_filled = random_batch(7)
    kw = queue_kwargs(queue, queue_labels, queue_filled)
    m = 12 - 2 + int(queue_filled.sum())
    np.testing.assert_array_equal(losses.ucl(features, **kw), losses.ucl(features, M=m, **kw))
    np.testing.assert_array_equal(
      losses.scl(features, labels, **kw), losses.scl(features, labels, M=m, **kw)
    )

  def test_errors_name_the_argument(self):
    features, labels, queue, queue_labels, queue_filled = random_batch(8)
    with self.assertRaisesRegex(ValueError, 'queue_labels'):
      losses.scl(features, labels, queue=queue)
    with self.assertRaisesRegex(ValueError, 'queue_labels'):
      losses.hscl(features, labels, hardening=losses.exponential(1.0), queue=queue)
    with self.assertRaisesRegex(ValueError, 'queue_filled'):
      losses.ucl(features, queue_filled=queue_filled)
    with self.assertRaisesRegex(ValueError, r'queue must have shape \[K, 8\]'):
      losses.ucl(features, queue=queue[:, :4])
    with self.assertRaisesRegex(ValueError, 'queue_labels must have shape'):
      losses.scl(features, labels, queue=queue, queue_labels=queue_labels[:3])
    with self.assertRaisesRegex(TypeError, 'queue_labels must be integers'):
      losses.scl(features, labels, queue=queue, queue_labels=queue_labels * 1.0)
    losses.ucl(features, queue=queue)  # unlabelled, all filled: fine for UCL

  def test_every_valid_queue_length_is_accepted(self):
    """One slot, fewer or more slots than the feature dimension (8): the labels and filled
    flags of K slots are accepted as shape [K] (a refusal is a failed assertion naming K)."""
    for slots in (1, 5, 13):
      features, labels, *queue = random_batch(9, slots=slots)
      with accepted(f'a queue of K={slots} slots'):
        value = losses.scl(features, labels, **queue_kwargs(*queue))
      assert np.isfinite(value)


class BlockwiseTest(parameterized.TestCase):
  @parameterized.product(name=sorted(LOSSES), block_size=[3, 8])
  @pytest.mark.covering  # tests/covering.py
  def test_blockwise_equals_dense(self, name, block_size):
    kernel, _ = LOSSES[name]
    features, labels, *queue = random_batch(12, batch=10, views=2, slots=11)
    kw = queue_kwargs(*queue)
    dense = jax.value_and_grad(lambda f: kernel(f, labels, block_size=0, **kw))(features)
    blocked = jax.jit(jax.value_and_grad(lambda f: kernel(f, labels, block_size=block_size, **kw)))(
      features
    )
    np.testing.assert_allclose(blocked[0], dense[0], rtol=1e-5)
    np.testing.assert_allclose(blocked[1], dense[1], atol=1e-6)

  def test_auto_streams_with_a_queue(self):
    """block_size=None with a queue: key blocks at any size (traced from shapes)."""
    features = jax.ShapeDtypeStruct((8, 2, 8), jnp.float32)
    labels = jax.ShapeDtypeStruct((8,), jnp.int32)
    for slots, blockwise in ((0, False), (1, True), (70_000, True)):
      queue = jax.ShapeDtypeStruct((slots, 8), jnp.float32)
      queue_labels = jax.ShapeDtypeStruct((slots,), jnp.int32)
      jaxpr = jax.make_jaxpr(
        lambda f, y, q, ql: losses.hscl(
          f, y, hardening=losses.exponential(1.0), queue=q, queue_labels=ql
        )
      )(features, labels, queue, queue_labels)
      self.assertEqual('scan' in str(jaxpr), blockwise)


# --------------------------------------------------------------------------------------
# Cross-device: 4 fake CPU devices (tests/conftest.py); the queue is replicated.


@pytest.mark.skipif(jax.device_count() < 4, reason='needs 4 devices (tests/conftest.py)')
@pytest.mark.parametrize('block_size', [None, 3])
@pytest.mark.parametrize('name', sorted(LOSSES))
@pytest.mark.covering  # tests/covering.py
def test_shard_map_equals_single_device(name, block_size):
  """Local anchors against the all-gathered batch plus the replicated queue."""
  _, labels, *queue = random_batch(32, batch=8, slots=9)
  w = jax.random.normal(jax.random.key(30), (8, 8))
  x = jax.random.normal(jax.random.key(31), (8, 2, 8))
  args = (w, x, labels, *queue)
  single = jax.value_and_grad(_projected_loss(name))(*args)
  sharded = jax.jit(
    jax.shard_map(
      jax.value_and_grad(_projected_loss(name, 'data', block_size)),
      mesh=_mesh(),
      in_specs=(P(), P('data'), P('data'), P(), P(), P()),
      out_specs=(P(), P()),
    )
  )
  value, grad = sharded(*args)
  np.testing.assert_allclose(value, single[0], rtol=1e-5)
  np.testing.assert_allclose(grad, single[1], atol=1e-5)


# --------------------------------------------------------------------------------------
# Key features (a momentum key encoder's): every non-anchor row enters as its key.


def _keys_near(features, seed):
  """Other unit features of the same rows, close to ``features`` (a key encoder lagging)."""
  noise = 0.3 * jax.random.normal(jax.random.key(seed), features.shape)
  return normalized(features + noise)


class KeysTest(parameterized.TestCase):
  @parameterized.product(name=sorted(LOSSES), block_size=[0, 3])
  @pytest.mark.covering  # tests/covering.py
  def test_value_and_gradient_match_reference(self, name, block_size):
    """Anchors against the keys of the other rows and the queue; the gradient reaches the
    anchors only (the reference's keys are constants)."""
    kernel, reference = LOSSES[name]
    features, labels, *queue = random_batch(40)
    keys = _keys_near(features, 41)
    kw = dict(keys=keys, **queue_kwargs(*queue))
    loss = functools.partial(kernel, y=labels, block_size=block_size, **kw)
    np.testing.assert_allclose(loss(features), reference(features, labels, **kw), rtol=2e-5)
    assert_gradient_matches(
      jax.grad(loss)(features), lambda f: reference(f, labels, **kw), features
    )
    self.assertGreater(
      abs(float(loss(features) - kernel(features, labels, **queue_kwargs(*queue)))), 1e-4
    )

  @parameterized.parameters(*sorted(LOSSES))
  def test_keys_equal_to_the_features_change_nothing(self, name):
    """θ_k = θ_q (a key encoder's first step): the value is the loss without keys."""
    kernel, _ = LOSSES[name]
    features, labels, *queue = random_batch(42)
    kw = queue_kwargs(*queue)
    np.testing.assert_allclose(
      kernel(features, labels, keys=features, **kw), kernel(features, labels, **kw), rtol=1e-6
    )

  @parameterized.parameters(*sorted(LOSSES))
  def test_keys_get_no_gradient(self, name):
    kernel, _ = LOSSES[name]
    features, labels, *_ = random_batch(43)
    grad = jax.grad(lambda k: kernel(features, labels, keys=k))(_keys_near(features, 44))
    np.testing.assert_array_equal(grad, jnp.zeros_like(grad))

  def test_keys_of_another_shape_are_refused(self):
    features, *_ = random_batch(45)
    with self.assertRaisesRegex(ValueError, 'keys must have the shape of features'):
      losses.ucl(features, keys=features[:, :1])


@pytest.mark.parametrize('block_size', [0, 3])
@pytest.mark.parametrize('name', ['ucl', 'hscl_exp'])  # the kernel is the same for all
def test_keys_gradient_skips_the_keys_matmul(name, block_size, monkeypatch):
  """With keys= the anchors' gradient is the one the kernel computes with the keys'
  gradient too (how it was computed before: the keys' part then dropped), bit for bit,
  and the program has fewer matmuls (the keys' n×n·d one per tile is gone)."""
  loss, _ = LOSSES[name]
  features, labels, *queue = random_batch(48)
  keys = _keys_near(features, 49)

  def gradient_and_matmuls():
    grad = jax.grad(
      lambda f: loss(f, labels, keys=keys, block_size=block_size, **queue_kwargs(*queue))
    )
    return jax.jit(grad)(features), str(jax.make_jaxpr(grad)(features)).count('dot_general')

  skipped, skipped_matmuls = gradient_and_matmuls()
  original = loss_kernel.Kernel
  with_keys_gradient = lambda **fields: original(**{**fields, 'key_gradient': True})
  monkeypatch.setattr(loss_kernel, 'Kernel', with_keys_gradient)
  full, full_matmuls = gradient_and_matmuls()
  np.testing.assert_array_equal(skipped, full)
  assert skipped_matmuls < full_matmuls


@pytest.mark.skipif(jax.device_count() < 4, reason='needs 4 devices (tests/conftest.py)')
@pytest.mark.parametrize('name', ['ucl', 'hscl_exp'])
def test_keys_shard_map_equals_single_device(name):
  """Each device's anchors against the all-gathered keys of the global batch."""
  kernel, _ = LOSSES[name]
  features, labels, *queue = random_batch(46, batch=8, slots=9)
  keys = _keys_near(features, 47)

  def loss(f, y, k, *q):
    return kernel(f, y, keys=k, axis_name='data', **queue_kwargs(*q))

  single = jax.value_and_grad(lambda f: kernel(f, labels, keys=keys, **queue_kwargs(*queue)))(
    features
  )
  sharded = jax.jit(
    jax.shard_map(
      jax.value_and_grad(loss),
      mesh=_mesh(),
      in_specs=(P('data'), P('data'), P('data'), P(), P(), P()),
      out_specs=(P(), P('data')),
    )
  )(features, labels, keys, *queue)
  np.testing.assert_allclose(sharded[0], single[0], rtol=1e-5)
  np.testing.assert_allclose(sharded[1], single[1], atol=1e-6)
