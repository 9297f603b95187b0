"""Loss kernels against an independent float64 reference and the paper's identities."""

from __future__ import annotations

import functools
import re

from absl.testing import parameterized
from acceptance import accepted
import chex
import jax
import jax.numpy as jnp
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P
from jaxprs import equations
import numpy as np
import optax
import pytest

from hscl_jax import losses
from hscl_jax.losses import kernel as loss_kernel

# --------------------------------------------------------------------------------------
# Independent float64 reference, written from eq. (3) (docs/method.md) with explicit sets.


def reference_loss(
  features,
  labels=None,
  *,
  method,
  temperature=0.5,
  M=None,
  eta=None,
  hcl=False,
  tau_plus=0.0,
  clamp=True,
  queue=None,
  queue_labels=None,
  queue_filled=None,
  keys=None,
):
  """Flat mean over ordered positive pairs of log(1 + M e^{-g_ip} E_{q_i}[e^g]).

  method: 'sample' (UCL/H-UCL sets) or 'label' (SCL/H-SCL sets); eta: g -> η(g) (numpy);
  hcl: use HCL's debiased, clamped objective (Robinson et al., Fig. 13) instead.
  queue: [K, d] extra keys, only ever negatives: q_i ∝ η over the in-batch negatives and
  the filled slots (for method='label' only those with a label other than -1 and the
  anchor's); M = n - 2 + (filled slots) by default. keys: [b, v, d] features of the same
  rows standing for every row j != i in g_ij = z_i . k_j / γ (a key encoder's).
  """
  z = np.asarray(features, np.float64)
  b, v, d = z.shape
  n = b * v
  rows = z.reshape(n, d)
  queue = np.zeros((0, d)) if queue is None else np.asarray(queue, np.float64)
  filled = np.ones(len(queue), bool) if queue_filled is None else np.asarray(queue_filled)
  slot_label = -np.ones(len(queue), int) if queue_labels is None else np.asarray(queue_labels)
  sample = np.arange(n) // v
  label = np.asarray(labels)[sample] if labels is not None else sample
  group = sample if method == 'sample' else label
  key_rows = rows if keys is None else np.asarray(keys, np.float64).reshape(n, d)
  g = rows @ np.concatenate([key_rows, queue]).T / temperature
  M = n - 2 + filled.sum() if M is None else M
  eta = eta or (lambda x: np.ones_like(x))
  total, count = 0.0, 0
  for i in range(n):
    positives = [j for j in range(n) if j != i and group[j] == group[i]]
    negatives = [j for j in range(n) if group[j] != group[i]]
    for s in range(len(queue)):
      if filled[s] and (method == 'sample' or slot_label[s] not in (-1, label[i])):
        negatives.append(n + s)
    w = eta(g[i, negatives]) if negatives else np.zeros(0)
    expectation = (w * np.exp(g[i, negatives])).sum() / w.sum() if w.sum() > 0 else 0.0
    for p in positives:
      if hcl:
        mass = M * (expectation - tau_plus * np.exp(g[i, p])) / (1 - tau_plus)
        mass = max(mass, M * np.exp(-1 / temperature) if clamp else 0.0)
        total += -np.log(np.exp(g[i, p]) / (np.exp(g[i, p]) + mass))
      else:
        total += np.log1p(M * np.exp(-g[i, p]) * expectation)
      count += 1
  return total / count


def reference_hucl(features, *, beta, tau_plus=0.0, temperature=0.5, M=None, clamp=True, **queue):
  return reference_loss(
    features,
    method='sample',
    eta=lambda g: np.exp(beta * g),
    hcl=True,
    tau_plus=tau_plus,
    temperature=temperature,
    M=M,
    clamp=clamp,
    **queue,
  )


def normalized(x):
  return x / jnp.linalg.norm(x, axis=-1, keepdims=True)


def random_batch(seed, batch=6, views=2, dim=8, num_classes=3):
  kf, kl = jax.random.split(jax.random.key(seed))
  features = normalized(jax.random.normal(kf, (batch, views, dim)))
  labels = jax.random.randint(kl, (batch,), 0, num_classes)
  return features, labels


# name -> (kernel(features, labels, **kw), reference(features, labels, **kw))
LOSSES = {
  'ucl': (
    lambda f, y, **kw: losses.ucl(f, **kw),
    lambda f, y, **kw: reference_loss(f, method='sample', **kw),
  ),
  'hucl': (
    lambda f, y, **kw: losses.hucl(f, beta=1.5, **kw),
    lambda f, y, **kw: reference_hucl(f, beta=1.5, **kw),
  ),
  'hucl_debiased': (
    lambda f, y, **kw: losses.hucl(f, beta=1.0, tau_plus=0.1, **kw),
    lambda f, y, **kw: reference_hucl(f, beta=1.0, tau_plus=0.1, **kw),
  ),
  'scl': (
    lambda f, y, **kw: losses.scl(f, y, **kw),
    lambda f, y, **kw: reference_loss(f, y, method='label', **kw),
  ),
  'hscl_exp': (
    lambda f, y, **kw: losses.hscl(f, y, hardening=losses.exponential(2.0), **kw),
    lambda f, y, **kw: reference_loss(f, y, method='label', eta=lambda g: np.exp(2.0 * g), **kw),
  ),
  'hscl_threshold': (
    lambda f, y, **kw: losses.hscl(f, y, hardening=losses.threshold(np.exp(-0.2)), **kw),
    lambda f, y, **kw: reference_loss(
      f, y, method='label', eta=lambda g: (np.exp(g) >= np.exp(-0.2)) * 1.0, **kw
    ),
  ),
}


# Views, temperature and M of the value tests.
SETTINGS = [dict(views=2, temperature=0.5, M=None), dict(views=3, temperature=0.2, M=7.5)]


def directional_derivative(fn, x, direction, eps=1e-5):
  """Central finite difference of a float64 numpy function."""
  x = np.asarray(x, np.float64)
  return (fn(x + eps * direction) - fn(x - eps * direction)) / (2 * eps)


def assert_value_matches(variant, name, features, labels, **kw):
  """LOSSES[name] (under a chex ``variant``) is a float32 scalar equal to its reference."""
  kernel, reference = LOSSES[name]
  got = variant(functools.partial(kernel, **kw))(features, labels)
  chex.assert_shape(got, ())
  assert got.dtype == jnp.float32, got.dtype
  np.testing.assert_allclose(got, reference(features, labels, **kw), rtol=2e-5)


def assert_gradient_matches(grad, reference, features, num_directions=3):
  """grad · u against central differences of the float64 ``reference`` along random u."""
  rng = np.random.default_rng(0)
  for _ in range(num_directions):
    direction = rng.normal(size=features.shape)
    expected = directional_derivative(reference, features, direction)
    np.testing.assert_allclose(jnp.vdot(grad, direction), expected, rtol=1e-3, atol=1e-5)


class ReferenceTest(chex.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.product(name=sorted(LOSSES), setting=SETTINGS)
  def test_value_matches_reference(self, name, setting):
    features, labels = random_batch(0, views=setting['views'])
    kw = dict(temperature=setting['temperature'], M=setting['M'])
    assert_value_matches(self.variant, name, features, labels, **kw)

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters(*sorted(LOSSES))
  def test_gradient_matches_reference(self, name):
    kernel, reference = LOSSES[name]
    features, labels = random_batch(1)
    grad = self.variant(jax.grad(lambda f: kernel(f, labels)))(features)
    assert_gradient_matches(grad, lambda f: reference(f, labels), features)


class IdentityTest(parameterized.TestCase):
  def test_ucl_is_nt_xent(self):
    """With two views and M = n - 2, eq. (3) is SimCLR's NT-Xent cross-entropy."""
    features, _ = random_batch(2, batch=8)
    z = features.reshape(16, -1)
    logits = z @ z.T / 0.5
    logits = jnp.where(jnp.eye(16, dtype=bool), -jnp.inf, logits)
    partner = jnp.arange(16) ^ 1  # rows 2s and 2s+1 are the two views of sample s
    nt_xent = -jnp.mean(jax.nn.log_softmax(logits)[jnp.arange(16), partner])
    np.testing.assert_allclose(losses.ucl(features), nt_xent, rtol=1e-6)

  @parameterized.parameters((2, None, 0.5), (2, None, 0.1), (3, 21, 0.5))
  def test_ucl_equals_optax_ntxent(self, views, M, temperature):
    """optax.losses.ntxent (the maintained JAX peer) sums over the negatives: our UCL with
    M = the negative count (n - 2 for two views, the default) is the same loss."""
    features, _ = random_batch(3, batch=8, views=views)
    rows = features.reshape(8 * views, -1)  # sample-major: row r is sample r // views
    labels = jnp.repeat(jnp.arange(8), views)
    expected = optax.losses.ntxent(rows, labels, temperature=temperature)
    got = losses.ucl(features, temperature=temperature, M=M)
    np.testing.assert_allclose(got, expected, rtol=2e-6)

  def test_beta_zero_gives_scl_and_ucl(self):
    features, labels = random_batch(3)
    for detach in (False, True):
      np.testing.assert_allclose(
        losses.hscl(
          features, labels, hardening=losses.exponential(0.0), stop_gradient_weights=detach
        ),
        losses.scl(features, labels),
        rtol=1e-6,
      )
      np.testing.assert_allclose(
        losses.hucl(features, beta=0.0, stop_gradient_weights=detach),
        losses.ucl(features),
        rtol=1e-6,
      )
    # β = 0 detached: the gradient is SCL's too (the reference code returns NaN here).
    grad = jax.grad(
      lambda f: losses.hscl(
        f, labels, hardening=losses.exponential(0.0), stop_gradient_weights=True
      )
    )(features)
    np.testing.assert_allclose(grad, jax.grad(losses.scl)(features, labels), atol=1e-6)

  def test_distinct_labels_give_ucl(self):
    features, _ = random_batch(4)
    np.testing.assert_allclose(losses.scl(features, jnp.arange(6)), losses.ucl(features), rtol=1e-6)

  def test_threshold_to_zero_gives_scl(self):
    features, labels = random_batch(5)
    for tau in (0.0, 1e-30, np.exp(-1 / 0.5) * 0.999):  # e^g >= e^{-1/γ} on the sphere
      np.testing.assert_allclose(
        losses.hscl(features, labels, hardening=losses.threshold(tau)),
        losses.scl(features, labels),
        rtol=1e-6,
      )

  def test_stop_gradient_weights_keeps_value_changes_gradient(self):
    features, labels = random_batch(6)
    fn = lambda f, detach: losses.hscl(
      f, labels, hardening=losses.exponential(2.0), stop_gradient_weights=detach
    )
    np.testing.assert_allclose(fn(features, True), fn(features, False), rtol=1e-6)
    self.assertGreater(
      float(jnp.abs(jax.grad(fn)(features, True) - jax.grad(fn)(features, False)).max()), 1e-4
    )

  @parameterized.parameters(*sorted(LOSSES))
  def test_permutation_invariance(self, name):
    kernel, _ = LOSSES[name]
    features, labels = random_batch(11, views=3)
    perm = np.random.default_rng(0).permutation(6)
    view_perm = np.array([2, 0, 1])
    permuted = features[perm][:, view_perm]
    np.testing.assert_allclose(kernel(permuted, labels[perm]), kernel(features, labels), rtol=1e-5)


class BlockwiseTest(parameterized.TestCase):
  @parameterized.product(name=sorted(LOSSES), block_size=[3, 8, 64])
  @pytest.mark.covering  # tests/covering.py
  def test_blockwise_equals_dense(self, name, block_size):
    kernel, _ = LOSSES[name]
    features, labels = random_batch(12, batch=10, views=2)
    dense = jax.value_and_grad(lambda f: kernel(f, labels, block_size=0))(features)
    blocked = jax.jit(jax.value_and_grad(lambda f: kernel(f, labels, block_size=block_size)))(
      features
    )
    np.testing.assert_allclose(blocked[0], dense[0], rtol=1e-5)
    np.testing.assert_allclose(blocked[1], dense[1], atol=1e-6)

  def test_auto_switches_to_blocks_above_threshold(self):
    """block_size=None: dense up to DENSE_MAX_ENTRIES = 2^24 similarities (4096 rows on one
    device), key blocks above (traced from shapes only: nothing is computed)."""
    hscl = lambda f, y: losses.hscl(f, y, hardening=losses.exponential(1.0))
    for samples, blockwise in ((2048, False), (2049, True)):
      features = jax.ShapeDtypeStruct((samples, 2, 8), jnp.float32)
      labels = jax.ShapeDtypeStruct((samples,), jnp.int32)
      self.assertEqual('scan' in str(jax.make_jaxpr(hscl)(features, labels)), blockwise)
    self.assertEqual(losses.DENSE_MAX_ENTRIES, 4096**2)


def test_gradient_with_respect_to_temperature():
  """γ is folded into the anchors before the custom-JVP core, so it stays differentiable."""
  features, labels = random_batch(32)
  for block_size in (0, 4):
    grad = jax.grad(lambda t: losses.scl(features, labels, temperature=t, block_size=block_size))(
      0.5
    )
    eps = 1e-4
    expected = (
      reference_loss(features, labels, method='label', temperature=0.5 + eps)
      - reference_loss(features, labels, method='label', temperature=0.5 - eps)
    ) / (2 * eps)
    np.testing.assert_allclose(grad, expected, rtol=1e-3)


def test_pair_softplus_and_slope_match_float64():
  """The kernels' one-exponential softplus: value and slope (σ) against float64, and the
  non-finite cases as jax.nn.softplus."""
  x = np.concatenate([np.linspace(-80.0, 80.0, 32001), [-1e-6, 0.0, 1e-6]]).astype(np.float32)
  value, slope = jax.vmap(jax.value_and_grad(loss_kernel.softplus))(x)
  x64 = x.astype(np.float64)
  np.testing.assert_allclose(value, np.logaddexp(x64, 0.0), rtol=2e-6)
  np.testing.assert_allclose(slope, 1.0 / (1.0 + np.exp(-x64)), rtol=1e-6)
  special = jnp.array([-jnp.inf, jnp.inf, jnp.nan])
  expected = jax.vmap(jax.value_and_grad(jax.nn.softplus))(special)
  slope_fn = jax.vmap(jax.value_and_grad(loss_kernel.softplus))
  np.testing.assert_array_equal(slope_fn(special), expected)


@pytest.mark.parametrize('block_size', [0, 16])
def test_kernels_export_for_gpu_and_tpu(block_size):
  """jax.export lowers value and gradient for CUDA and TPU from this CPU host (it rejects
  custom calls without a stability guarantee): no CPU-only piece in the kernels."""
  features = jax.ShapeDtypeStruct((64, 2, 16), jnp.float32)
  labels = jax.ShapeDtypeStruct((64,), jnp.int32)
  beta = jax.ShapeDtypeStruct((), jnp.float32)
  kernels = {
    'hscl': lambda f, y, b: losses.hscl(
      f, y, hardening=losses.exponential(b), block_size=block_size
    ),
    'hucl': lambda f, y, b: losses.hucl(f, beta=b, tau_plus=0.1, block_size=block_size),
    'diagnostics': lambda f, y, b: losses.batch_diagnostics(
      f, y, hardening=losses.threshold(b), block_size=block_size
    )['loss_hscl'],
  }
  for name, kernel in kernels.items():
    exported = jax.export.export(jax.jit(jax.value_and_grad(kernel)), platforms=('cuda', 'tpu'))(
      features, labels, beta
    )
    module = exported.mlir_module()
    assert exported.platforms == ('cuda', 'tpu'), name
    assert 'custom_call' not in module and 'callback' not in module, name


class PrecisionTest(parameterized.TestCase):
  def dot_precisions(self, fn, *args):
    """The precision of every dot_general in fn's jaxpr (including scan/remat bodies)."""
    return [
      eqn.params['precision']
      for eqn in equations(jax.make_jaxpr(fn)(*args).jaxpr)
      if eqn.primitive.name == 'dot_general'
    ]

  @parameterized.product(block_size=[0, 8], precision=['highest', 'default'])
  def test_precision_reaches_every_similarity_matmul(self, block_size, precision):
    """Forward and gradient matmuls alike; the default is HIGHEST (full float32)."""
    features, labels = random_batch(31, batch=10)
    expected = getattr(jax.lax.Precision, precision.upper())

    def loss(f, **kw):
      return losses.hscl(f, labels, hardening=losses.exponential(1.0), block_size=block_size, **kw)

    found = self.dot_precisions(
      jax.value_and_grad(lambda f: loss(f, precision=precision)), features
    )
    self.assertGreaterEqual(len(found), 3)  # z zᵀ and the two matmuls of its gradient
    self.assertEqual(set(found), {(expected, expected)})
    default = self.dot_precisions(jax.grad(loss), features)
    self.assertEqual(set(default), {(jax.lax.Precision.HIGHEST,) * 2})


class EdgeCaseTest(parameterized.TestCase):
  def assert_finite_with_gradient(self, fn, features):
    value, grad = jax.value_and_grad(fn)(features)
    self.assertTrue(bool(jnp.isfinite(value)), f'loss {value}')
    self.assertTrue(bool(jnp.isfinite(grad).all()), 'non-finite gradient')
    return value, grad

  def test_all_labels_equal(self):
    features, _ = random_batch(14)
    same = jnp.zeros(6, jnp.int32)
    for hardening in (losses.exponential(1.0), losses.threshold(0.5)):
      value, grad = self.assert_finite_with_gradient(
        lambda f: losses.hscl(f, same, hardening=hardening), features
      )
      self.assertEqual(float(value), 0.0)
      self.assertEqual(float(jnp.abs(grad).max()), 0.0)
    np.testing.assert_allclose(losses.scl(features, same), 0.0)

  def test_nothing_above_threshold(self):
    features, labels = random_batch(15)
    value, _ = self.assert_finite_with_gradient(
      lambda f: losses.hscl(f, labels, hardening=losses.threshold(np.exp(3.0))), features
    )
    self.assertEqual(float(value), 0.0)  # e^g <= e^{1/γ} = e^2 < τ: no hard negative at all

  def test_some_anchors_without_hard_negatives_match_reference(self):
    features, labels = random_batch(16, batch=8)
    tau = np.exp(0.6)
    value = losses.hscl(features, labels, hardening=losses.threshold(tau))
    expected = reference_loss(
      features, labels, method='label', eta=lambda g: (np.exp(g) >= tau) * 1.0
    )
    np.testing.assert_allclose(value, expected, rtol=1e-5)

  @parameterized.parameters(True, False)
  def test_debiasing_never_nan(self, clamp):
    features, _ = random_batch(17)
    for tau_plus in (0.1, 0.5, 0.9):
      value, _ = self.assert_finite_with_gradient(
        lambda f: losses.hucl(f, beta=1.0, tau_plus=tau_plus, clamp=clamp), features
      )
      np.testing.assert_allclose(
        value, reference_hucl(features, beta=1.0, tau_plus=tau_plus, clamp=clamp), rtol=1e-5
      )

  @parameterized.parameters(*sorted(LOSSES))
  def test_low_temperature_high_beta(self, name):
    features, labels = random_batch(18)
    fns = {
      'hucl': lambda f: losses.hucl(f, beta=10.0, temperature=0.05),
      'hscl_exp': lambda f: losses.hscl(
        f, labels, hardening=losses.exponential(10.0), temperature=0.05
      ),
    }
    fn = fns.get(name, lambda f: LOSSES[name][0](f, labels, temperature=0.05))
    self.assert_finite_with_gradient(fn, features)

  def test_hard_exp_low_temperature_matches_reference(self):
    features, labels = random_batch(19)
    np.testing.assert_allclose(
      losses.hscl(features, labels, hardening=losses.exponential(10.0), temperature=0.05),
      reference_loss(
        features, labels, method='label', temperature=0.05, eta=lambda g: np.exp(10.0 * g)
      ),
      rtol=1e-4,
    )

  def test_bfloat16_inputs_compute_in_float32(self):
    features, labels = random_batch(20)
    fn = lambda f: losses.hscl(f, labels, hardening=losses.exponential(1.0))
    value, grad = self.assert_finite_with_gradient(fn, features.astype(jnp.bfloat16))
    self.assertEqual(value.dtype, jnp.float32)
    self.assertEqual(grad.dtype, jnp.bfloat16)
    np.testing.assert_allclose(
      value, fn(features.astype(jnp.bfloat16).astype(jnp.float32)), rtol=1e-6
    )

  def test_unnormalised_inputs(self):
    features, labels = random_batch(21)
    for scale in (30.0, 1e3):
      self.assert_finite_with_gradient(
        lambda f: losses.hscl(
          f * scale, labels, hardening=losses.exponential(5.0), temperature=0.05
        ),
        features,
      )
      self.assert_finite_with_gradient(
        lambda f: losses.hucl(f * scale, beta=5.0, tau_plus=0.1, temperature=0.05), features
      )

  @parameterized.parameters(*sorted(LOSSES))
  def test_non_finite_inputs_give_nan(self, name):
    """A diverged model must not look like a batch without negatives (loss 0)."""
    features, labels = random_batch(25)
    kernel, _ = LOSSES[name]
    for bad in (jnp.nan, jnp.inf):
      self.assertTrue(bool(jnp.isnan(kernel(features.at[2, 1, 0].set(bad), labels))))
    traced_beta = jax.jit(
      lambda beta: losses.hscl(features, labels, hardening=losses.exponential(beta))
    )
    self.assertTrue(bool(jnp.isnan(traced_beta(jnp.nan))))


class InputValidationTest(parameterized.TestCase):
  def test_errors_name_the_problem(self):
    features, labels = random_batch(22)
    cases = [
      (lambda: losses.scl(features[:, 0], labels), ValueError, 'batch, views, dim'),
      (lambda: losses.scl(features[:, :1], labels), ValueError, 'at least 2 views'),
      (lambda: losses.scl(features, labels.astype(jnp.float32)), TypeError, 'integers'),
      (lambda: losses.scl(features, labels[:4]), ValueError, 'one label per sample'),
      (lambda: losses.scl(features, labels[:, None]), ValueError, 'shape \\[batch\\]'),
      (lambda: losses.ucl(features, temperature=-0.5), ValueError, 'temperature'),
      (lambda: losses.ucl(features, M=0), ValueError, 'M must be positive'),
      (lambda: losses.hucl(features, beta=1.0, tau_plus=1.0), ValueError, 'tau_plus'),
      (lambda: losses.exponential(-1.0), ValueError, 'beta'),
      (lambda: losses.threshold(-1.0), ValueError, 'tau'),
      (lambda: losses.ucl(features, block_size=-2), ValueError, 'block_size'),
    ]
    for fn, error, message in cases:
      with self.assertRaisesRegex(error, message):
        fn()

  def test_the_default_m_is_n_minus_2_from_three_rows_and_refused_below(self):
    """A batch of two rows (one sample, two views) has no negative: refused, naming the
    fix; three rows (M = 1) are the smallest accepted, and UCL then is eq. (3) at M = 1."""
    three = random_batch(23, batch=1, views=3)[0]  # one sample, three views
    with accepted('three rows, M = n - 2 = 1'):
      default = losses.ucl(three)
    np.testing.assert_allclose(default, losses.ucl(three, M=1), rtol=1e-6)
    two = three[:, :2]
    with self.assertRaisesRegex(
      ValueError, re.escape('M = n - 2 = 0 is not positive: the batch has too few rows; pass M.')
    ):
      losses.ucl(two)
    assert np.isfinite(losses.ucl(two, M=1))  # the fix the message names

  def test_concrete_values_of_any_type_are_checked(self):
    """Zero/NaN/inf as Python, NumPy or (non-traced) JAX scalars are refused alike."""
    features, labels = random_batch(26)
    for make in (float, np.float32, jnp.float32, lambda x: jnp.array([x, 1.0])):
      for bad in (0.0, np.nan, np.inf):
        with self.assertRaisesRegex(ValueError, 'temperature must be positive and finite'):
          losses.ucl(features, temperature=make(bad))
        with self.assertRaisesRegex(ValueError, 'temperature'):
          losses.scl(features, labels, temperature=make(bad))
        with self.assertRaisesRegex(ValueError, 'M must be positive'):
          losses.ucl(features, M=make(bad))
      for bad in (np.nan, np.inf, -1.0):
        with self.assertRaisesRegex(ValueError, 'beta must be finite'):
          losses.exponential(make(bad))
        with self.assertRaisesRegex(ValueError, 'tau must be finite'):
          losses.threshold(make(bad))
        with self.assertRaisesRegex(ValueError, 'tau_plus'):
          losses.hucl(features, beta=1.0, tau_plus=make(bad))
    with self.assertRaisesRegex(ValueError, 'start must be finite'):
      losses.tau_schedule(1, start=np.nan, end=0.1, num_epochs=4)
    with self.assertRaisesRegex(ValueError, 'beta must be finite'):
      losses.beta_schedule(1, beta=np.nan, num_epochs=4, num_steps=2)
    with self.assertRaisesRegex(ValueError, r'num_steps \(ℓ, the number of β changes\) .* got 0'):
      losses.beta_schedule(1, beta=1.0, num_epochs=4, num_steps=0)
    # Valid concrete values of every type still work (and zero thresholds are allowed).
    expected = losses.scl(features, labels)
    for make in (np.float32, jnp.float32):
      chex.assert_trees_all_close(
        losses.hscl(features, labels, hardening=losses.threshold(make(0.0)), temperature=make(0.5)),
        expected,
        rtol=1e-6,
      )

  def test_array_likes_are_accepted(self):
    features, labels = random_batch(27)
    as_lists = np.asarray(features).tolist(), np.asarray(labels).tolist()
    for name, (kernel, _) in LOSSES.items():
      chex.assert_trees_all_close(
        kernel(*as_lists), kernel(features, labels), rtol=1e-6, custom_message=name
      )
    chex.assert_trees_all_close(
      losses.batch_diagnostics(*as_lists, hardening=losses.exponential(1.0)),
      losses.batch_diagnostics(features, labels, hardening=losses.exponential(1.0)),
      rtol=1e-6,
    )

  def test_errors_at_trace_time(self):
    features, labels = random_batch(23)
    with self.assertRaisesRegex(ValueError, 'one label per sample'):
      jax.jit(losses.scl).lower(features, labels[:5])

  def test_options_in_the_wrong_form_are_one_line_naming_the_right_one(self):
    """Every option of the losses and diagnostics given in a form they cannot use is
    refused before any tracing, in one line that names the form (or the call) it takes."""
    z, y = random_batch(28)
    exp = losses.exponential(1.0)
    form = re.escape('hardening= takes a function g -> log η(g), e.g. losses.exponential(1.0)')
    no_labels = re.escape('labels=None: scl, hscl and the diagnostics need labels')
    diagnostics = (losses.log_alphas, losses.assumption1, losses.batch_diagnostics)
    cases = [
      (
        lambda: losses.hscl(z, y, hardening=1.0),
        TypeError,
        form + r'.*hardening=losses.exponential\(1.0\)',
      ),
      (lambda: losses.hscl(z, y, hardening=None), TypeError, form + ', got None'),
      (lambda: losses.hscl(z, y, hardening='exp'), TypeError, form + ", got 'exp'"),
      *[
        (
          lambda f=f: losses.hscl(z, y, hardening=f),
          TypeError,
          f'losses.{f.__name__} is the factory: call it',
        )
        for f in (losses.exponential, losses.threshold)
      ],
      *[(lambda d=d: d(z, y, hardening=2), TypeError, form) for d in diagnostics],
      (lambda: losses.scl(z, None), ValueError, no_labels),
      (lambda: losses.hscl(z, None, hardening=exp), ValueError, no_labels),
      *[(lambda d=d: d(z, None, hardening=exp), ValueError, no_labels) for d in diagnostics],
      (lambda: losses.scl(z, jax.nn.one_hot(y, 3).astype(int)), ValueError, r'labels.argmax\(-1\)'),
      *[
        (lambda b=b: losses.ucl(z, block_size=b), ValueError, f'a positive int, got {b!r}.$')
        for b in (4.0, 'auto', True)
      ],
      (lambda: losses.ucl(z, precision='fast'), ValueError, "Precision or its name .*got 'fast'"),
      (lambda: losses.log_alphas(z, y, hardening=exp, precision='fast'), ValueError, "'fast'"),
      (
        lambda: losses.ucl(z, axis_name='data'),
        ValueError,
        "axis_name='data' is not a mapped axis",
      ),
      (lambda: losses.assumption1(z, y, hardening=exp, axis_name='d'), ValueError, 'jax.shard_map'),
      (
        lambda: losses.ucl(z, temperature='0.5'),
        TypeError,
        "temperature must be a number, got '0.5'",
      ),
      (lambda: losses.hucl(z, beta='1'), TypeError, "beta must be a number, got '1'"),
      (
        lambda: losses.hucl(z, beta=1.0, clamp='no'),
        TypeError,
        "clamp must be True or False, got 'no'",
      ),
      (
        lambda: losses.hscl(z, y, hardening=exp, stop_gradient_weights=1),
        TypeError,
        'stop_gradient_weights must be True or False',
      ),
    ]
    for fn, error, message in cases:
      with self.assertRaisesRegex(error, message) as raised:
        fn()
      assert '\n' not in str(raised.exception), str(raised.exception)

  def test_the_forms_the_options_take_are_accepted(self):
    """What the messages name works: a precision by name, object or pair; a NumPy int block
    size; a NumPy bool; a hardening returning a Python float (η constant: SCL)."""
    z, y = random_batch(29)
    dense = losses.scl(z, y)
    for precision in ('highest', jax.lax.Precision.HIGHEST, ('highest', 'highest')):
      np.testing.assert_allclose(losses.scl(z, y, precision=precision), dense, rtol=1e-6)
    np.testing.assert_allclose(losses.scl(z, y, block_size=np.int64(4)), dense, rtol=1e-5)
    np.testing.assert_allclose(
      losses.hucl(z, beta=1.0, clamp=np.bool_(True)), losses.hucl(z, beta=1.0)
    )
    np.testing.assert_allclose(losses.hscl(z, y, hardening=lambda g: 0.0), dense, rtol=1e-6)

  def test_the_namespace_is_the_public_api_and_its_modules(self):
    """dir(losses) (what completion and help read) holds `__all__` and the package's modules
    (losses.kernel, losses.image, ...), nothing else public."""
    import pkgutil

    public = {name for name in dir(losses) if not name.startswith('_')}
    modules = {module.name for module in pkgutil.iter_modules(losses.__path__)}
    self.assertEqual(public, set(losses.__all__) | modules)


class NoRecompileTest(parameterized.TestCase):
  def test_changing_beta_and_tau_does_not_retrace(self):
    features, labels = random_batch(24)

    @jax.jit
    @chex.assert_max_traces(n=1)
    def step(f, beta, tau):
      return (
        losses.hscl(f, labels, hardening=losses.exponential(beta)),
        losses.hscl(f, labels, hardening=losses.threshold(tau)),
      )

    for epoch in range(1, 5):
      tau = losses.tau_schedule(epoch, start=-0.5, end=0.1, num_epochs=4)
      beta = losses.beta_schedule(epoch, beta=2.0, num_epochs=4, num_steps=2)
      step(features, beta, tau)


# --------------------------------------------------------------------------------------
# Cross-device: 4 fake CPU devices (tests/conftest.py).


def _mesh():
  return Mesh(np.array(jax.devices()[:4]), ('data',))


def _projected_loss(name, axis_name=None, block_size=None):
  """Loss of a tiny linear projection so gradients reach replicated parameters; ``queue``:
  optionally (queue, queue_labels, queue_filled), replicated."""
  kernel, _ = LOSSES[name]

  def loss(w, x, labels, *queue):
    z = normalized(jnp.einsum('bvd,de->bve', x, w))
    kw = dict(zip(('queue', 'queue_labels', 'queue_filled'), queue))
    return kernel(z, labels, axis_name=axis_name, block_size=block_size, **kw)

  return loss


class CrossDeviceTest(parameterized.TestCase):
  def setUp(self):
    super().setUp()
    if jax.device_count() < 4:
      self.skipTest('needs 4 devices (tests/conftest.py sets them)')
    self.w = jax.random.normal(jax.random.key(30), (8, 8))
    self.x = jax.random.normal(jax.random.key(31), (8, 2, 8))
    self.labels = jax.random.randint(jax.random.key(32), (8,), 0, 3)

  @parameterized.product(name=sorted(LOSSES), block_size=[None, 3])
  @pytest.mark.covering  # tests/covering.py
  def test_shard_map_equals_single_device(self, name, block_size):
    single = jax.value_and_grad(_projected_loss(name))(self.w, self.x, self.labels)
    sharded = jax.jit(
      jax.shard_map(
        jax.value_and_grad(_projected_loss(name, 'data', block_size)),
        mesh=_mesh(),
        in_specs=(P(), P('data'), P('data')),
        out_specs=(P(), P()),
      )
    )
    value, grad = sharded(self.w, self.x, self.labels)
    np.testing.assert_allclose(value, single[0], rtol=1e-5)
    np.testing.assert_allclose(grad, single[1], atol=1e-5)

  @chex.variants(with_pmap=True)
  def test_pmap_value_equals_single_device(self):
    features = normalized(self.x)
    loss = self.variant(
      lambda f, y: losses.hscl(f, y, hardening=losses.exponential(1.0), axis_name='i'),
      n_devices=4,
      axis_name='i',
      broadcast_args_to_devices=False,
      reduce_fn=None,
    )
    values = loss(features.reshape(4, 2, 2, 8), self.labels.reshape(4, 2))
    expected = losses.hscl(features, self.labels, hardening=losses.exponential(1.0))
    np.testing.assert_allclose(values, jnp.full(4, expected), rtol=1e-5)


@pytest.mark.parametrize('n', [4096])
def test_blockwise_large_batch_is_finite(n):
  """A batch above the dense threshold runs blockwise end to end (value + gradient)."""
  features, labels = random_batch(40, batch=n // 2, dim=16, num_classes=10)
  fn = jax.jit(
    jax.value_and_grad(
      lambda f: losses.hscl(f, labels, hardening=losses.exponential(1.0), block_size=1024)
    )
  )
  value, grad = fn(features)
  assert np.isfinite(value) and np.isfinite(grad).all()


def test_docstring_examples_run():
  """The Example of each public loss (hscl_jax.losses.image) runs and prints what it shows."""
  import doctest

  from hscl_jax.losses import image

  results = doctest.testmod(image, verbose=False)
  assert results.failed == 0 and results.attempted >= 4 * 3
  for loss in (losses.ucl, losses.hucl, losses.scl, losses.hscl):
    for section in ('Args:', 'Returns:', 'Example:'):
      assert section in loss.__doc__, (loss.__name__, section)


def test_l2_normalize_gives_unit_rows_in_float32_and_keeps_zero_rows():
  x = np.array([[3.0, 4.0], [0.0, 0.0], [1e-3, 0.0], [-2.0, 2.0]], np.float16)
  out = losses.l2_normalize(x)
  assert out.dtype == jnp.float32
  expected = np.array([[0.6, 0.8], [0.0, 0.0], [1.0, 0.0], [-(0.5**0.5), 0.5**0.5]])
  np.testing.assert_allclose(out, expected, rtol=1e-6, atol=1e-7)
  # Below eps a row is divided by eps, not by its norm (no division by zero).
  np.testing.assert_allclose(losses.l2_normalize(np.array([[1e-13, 0.0]]), eps=1e-12), [[0.1, 0.0]])


_DENSE_KEYS = loss_kernel.DENSE_MAX_ENTRIES // 4096  # with 4096 queries: the bound exactly


@pytest.mark.parametrize(
  'block_size, num_queries, num_keys, resolved',
  [
    (None, 4096, _DENSE_KEYS, None),  # DENSE_MAX_ENTRIES similarities: dense
    (None, 4096, _DENSE_KEYS + 1, loss_kernel.DEFAULT_BLOCK_SIZE),  # more: blockwise
    # Queries times keys counts, not either side alone (nor its square).
    (None, 2, loss_kernel.DENSE_MAX_ENTRIES // 2, None),
    (None, loss_kernel.DENSE_MAX_ENTRIES // 2, 3, loss_kernel.DEFAULT_BLOCK_SIZE),
    (0, 10**5, 10**5, None),  # 0 asks for dense at any size
    (5, 8, 8, 5),  # a size given is kept, however small the batch
    (1, 10**5, 10**5, 1),
  ],
)
def test_block_size_none_is_dense_up_to_its_bound_and_a_given_size_is_kept(
  block_size, num_queries, num_keys, resolved
):
  assert 4096 * _DENSE_KEYS == loss_kernel.DENSE_MAX_ENTRIES
  assert loss_kernel.resolve_block_size(block_size, num_queries, num_keys) == resolved


def test_a_negative_block_size_is_refused():
  with pytest.raises(ValueError, match=re.escape('got -1.')):
    loss_kernel.resolve_block_size(-1, 8, 8)
