"""hscl_jax.testing.check_device_invariance on 4 host devices (tests/conftest.py): every loss
of losses.__all__ passes it; a user-written gathered InfoNCE passes it, and the same loss
with its gradient scaled by the device count, or without its all-gather, fails it with
the line that names the difference; its report holds the values and gradients, pinned to
float64 NumPy written from the formulas."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import io
import json
import os
import pathlib
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
from losses.test_kernel import normalized
from losses.test_kernel import random_batch
import numpy as np
import pytest

from hscl_jax import losses
from hscl_jax import testing

DEVICES = 4
FEATURES, LABELS = random_batch(60, batch=8, views=2, dim=8, num_classes=3)
QUEUE = dict(
  queue=normalized(jax.random.normal(jax.random.key(61), (6, 8))),
  queue_labels=jnp.array([0, 1, 2, -1, 1, 0]),
  queue_filled=jnp.array([True, True, True, True, False, True]),
)

# Two towers of 8 rows each, labelled (a class of one among them).
TOWER_X = normalized(jax.random.normal(jax.random.key(65), (8, 8)))
TOWER_Y = normalized(jax.random.normal(jax.random.key(66), (8, 8)))
TOWER_LABELS = dict(
  labels_x=jnp.array([0, 1, 2, 0, 1, 2, 3, 0]), labels_y=jnp.array([1, 0, 2, 2, 1, 0, 0, 4])
)

# A graph batch: 8 graphs (the last one padding) of 2 nodes each, node 2g and 2g + 1 in
# graph g; the last node padding too. node_graph indexes the global batch's graphs.
NODES = jax.random.normal(jax.random.key(63), (16, 8))
GRAPHS = jax.random.normal(jax.random.key(64), (8, 8))
GRAPH_BATCH = dict(
  graph_labels=jnp.array([0, 1, 2, 0, 1, 2, 0, 0]),
  node_mask=jnp.arange(16) < 15,
  graph_mask=jnp.arange(8) < 7,
  hardening=losses.exponential(1.0),
)


@pytest.fixture(autouse=True)
def _four_devices():
  if jax.device_count() < DEVICES:
    pytest.skip('needs 4 devices (tests/conftest.py sets them)')


@dataclasses.dataclass(frozen=True)
class Case:
  """A loss's inputs for the check: its positional arrays (the global batch) and options."""

  arrays: tuple
  options: dict = dataclasses.field(default_factory=dict)
  replicated: tuple = ()
  sharded_options: tuple = ()


# losses.__all__'s losses and their inputs: a loss added to __all__ fails
# test_every_public_loss_is_device_invariant until it has a row here (or in NOT_LOSSES).
CASES = {
  'ucl': Case((FEATURES,), dict(temperature=0.5)),
  'hucl': Case((FEATURES,), dict(beta=1.0, tau_plus=0.1, temperature=0.5)),
  'scl': Case((FEATURES, LABELS), dict(temperature=0.3, **QUEUE)),
  'hscl': Case((FEATURES, LABELS), dict(hardening=losses.exponential(1.0), temperature=0.5)),
  'siglip': Case(
    (TOWER_X, TOWER_Y),
    dict(t=5.0, b=-2.0, hardening=losses.exponential(1.0), collective='ring', **TOWER_LABELS),
    sharded_options=('labels_x', 'labels_y'),
  ),
  'sigmoid_contrastive': Case(
    (FEATURES, LABELS), dict(t=5.0, b=-2.0, hardening=losses.exponential(1.0))
  ),
  'local_global_jsd': Case(
    (NODES, GRAPHS, jnp.arange(16) // 2),
    GRAPH_BATCH,
    sharded_options=('graph_labels', 'node_mask', 'graph_mask'),
  ),
  'local_global_infonce': Case(
    (NODES, GRAPHS, jnp.arange(16) // 2),
    GRAPH_BATCH,
    sharded_options=('graph_labels', 'node_mask', 'graph_mask'),
  ),
}
# The rest of losses.__all__, and why it is not a loss to check.
NOT_LOSSES = {
  'Array': 'a type',
  'DEFAULT_BLOCK_SIZE': 'a constant',
  'DEFAULT_PRECISION': 'a constant',
  'DENSE_MAX_ENTRIES': 'a constant',
  'Hardening': 'a type',
  'Mask': 'a type',
  'Precision': 'a type',
  'SIGLIP_B': 'a constant',
  'SIGLIP_T': 'a constant',
  'assumption1': 'a per-anchor diagnostic',
  'batch_diagnostics': 'a diagnostic (tests/losses/test_diagnostics.py checks it across devices)',
  'beta_schedule': 'a schedule',
  'exponential': 'a hardening',
  'l2_normalize': 'a normalisation',
  'log_alphas': 'a per-anchor diagnostic',
  'tau_schedule': 'a schedule',
  'threshold': 'a hardening',
}


@pytest.mark.parametrize('name', [n for n in losses.__all__ if n not in NOT_LOSSES])
def test_every_public_loss_is_device_invariant(name):
  assert name in CASES, f'losses.{name} has no inputs in CASES: add its row (or to NOT_LOSSES)'
  case = CASES[name]
  report = testing.check_device_invariance(
    getattr(losses, name),
    *case.arrays,
    options=case.options,
    devices=DEVICES,
    replicated=case.replicated,
    sharded_options=case.sharded_options,
  )
  assert report.ok and len(report.sharded_values) == DEVICES
  float_options = [k for k, v in case.options.items() if isinstance(v, float) or k == 'queue']
  float_arrays = [a for a in case.arrays if a.dtype == jnp.float32]
  assert len(report.gradients) == len(float_arrays) + len(float_options)
  assert all(report.gradients[k].close for k in float_options)
  first = next(iter(report.gradients.values()))  # the features'
  assert first.one_device_norm > 0 and np.isclose(first.ratio, 1.0, rtol=1e-4)


def test_no_public_name_is_left_unclassified():
  assert set(CASES) <= set(losses.__all__)
  assert set(NOT_LOSSES) <= set(losses.__all__)


# --------------------------------------------------------------------------------------
# A user-written loss: InfoNCE of two views, the second view's rows gathered as keys.


def gathered_infonce(z, *, temperature=0.1, axis_name=None, gather=True):
  """Row i of view 0 against every row of view 1 of the global batch, its own the positive."""
  anchors, keys = z[:, 0], z[:, 1]
  first_row = 0
  if axis_name is not None and gather:
    keys = jax.lax.all_gather(keys, axis_name, tiled=True)
    first_row = jax.lax.axis_index(axis_name) * z.shape[0]
  logits = anchors @ keys.T / temperature
  positives = jnp.take_along_axis(logits, first_row + jnp.arange(z.shape[0])[:, None], axis=1)
  loss = jnp.mean(jax.nn.logsumexp(logits, axis=1) - positives[:, 0])
  return loss if axis_name is None else jax.lax.pmean(loss, axis_name)


def infonce_reference(z: np.ndarray, temperature: float) -> float:
  """The same in float64 NumPy on the whole batch."""
  z = np.asarray(z, np.float64)
  logits = z[:, 0] @ z[:, 1].T / temperature
  log_denominators = np.log(np.exp(logits).sum(axis=1))
  return float(np.mean(log_denominators - np.diag(logits)))


def test_a_gathered_user_loss_passes_and_its_report_holds_value_and_temperature_gradient():
  report = testing.check_device_invariance(
    gathered_infonce, FEATURES, options=dict(temperature=0.1), devices=DEVICES
  )
  z = np.asarray(FEATURES)
  np.testing.assert_allclose(report.value, infonce_reference(z, 0.1), rtol=1e-5)
  np.testing.assert_allclose(report.sharded_values, report.value, rtol=1e-5)
  eps = 1e-6
  d_temperature = (infonce_reference(z, 0.1 + eps) - infonce_reference(z, 0.1 - eps)) / (2 * eps)
  temperature = report.gradients['temperature']
  np.testing.assert_allclose(temperature.one_device, d_temperature, rtol=1e-4)
  np.testing.assert_allclose(temperature.sharded, d_temperature, rtol=1e-4)
  assert temperature.close and np.isclose(temperature.ratio, 1.0, rtol=1e-5)
  assert np.isclose(report.gradients['z'].ratio, 1.0, rtol=1e-5)
  shown = str(report)
  assert 'device invariance on 4 devices: ok' in shown and 'gradient of temperature' in shown


def test_a_gradient_scaled_by_the_device_count_fails_naming_the_factor():
  def scaled(z, *, temperature=0.1, axis_name=None):
    loss = gathered_infonce(z, temperature=temperature, axis_name=axis_name)
    scale = 1 if axis_name is None else jax.lax.axis_size(axis_name)
    return scale * loss - jax.lax.stop_gradient((scale - 1) * loss)  # the value unchanged

  with pytest.raises(testing.DeviceInvarianceError) as raised:
    testing.check_device_invariance(scaled, FEATURES, devices=DEVICES)
  assert str(raised.value).splitlines() == [
    'gradient of z differs on 4 devices: it is 4.000 × the 1-device gradient (the device '
    'count: the loss is probably summed over devices, or its psum is transposed to a psum, '
    'as under pmap)'
    '.'
  ]


def test_a_loss_that_forgets_the_all_gather_fails_on_its_value():
  no_gather = functools.partial(gathered_infonce, gather=False)
  report = testing.check_device_invariance(no_gather, FEATURES, devices=DEVICES, strict=False)
  assert not report.ok
  assert report.failures[0].startswith(f'value differs on 4 devices: {report.sharded_value:.7g}')
  assert 'a loss that does not all-gather its negatives?' in report.failures[0]
  assert report.failures[1].startswith('gradient of z differs on 4 devices, not by a constant')
  with pytest.raises(testing.DeviceInvarianceError, match='all-gather'):
    report.raise_if_different()


def test_a_loss_summed_over_devices_fails_naming_the_factor_of_its_value_and_gradient():
  def summed(z, *, axis_name=None):
    loss = gathered_infonce(z, axis_name=axis_name)
    return loss if axis_name is None else jax.lax.psum(loss, axis_name)

  report = testing.check_device_invariance(summed, FEATURES, devices=DEVICES, strict=False)
  value, gradient = report.failures
  assert value == (
    f'value differs on 4 devices: {report.sharded_value:.7g} against {report.value:.7g} on 1 '
    'device, 4.000 × it (the device count: the loss is probably summed over devices, not '
    'averaged).'
  )
  assert gradient.startswith('gradient of z differs on 4 devices: it is 4.000 × the 1-device')


def test_a_loss_not_reduced_over_devices_fails_naming_the_devices_values():
  def unreduced(z, *, axis_name=None):
    return gathered_infonce(z, gather=False)  # each device's own value

  with pytest.raises(testing.DeviceInvarianceError, match='value differs between the 4 devices'):
    testing.check_device_invariance(unreduced, FEATURES, devices=DEVICES)


# --------------------------------------------------------------------------------------
# Two sharded arrays, and a replicated one.


def clip_loss(x, y, *, temperature=0.1, axis_name=None):
  """CLIP's symmetric loss of two towers, each tower's rows gathered as the other's keys."""
  first_row = 0
  x_all, y_all = x, y
  if axis_name is not None:
    x_all = jax.lax.all_gather(x, axis_name, tiled=True)
    y_all = jax.lax.all_gather(y, axis_name, tiled=True)
    first_row = jax.lax.axis_index(axis_name) * x.shape[0]
  own = first_row + jnp.arange(x.shape[0])
  x_to_y = jax.nn.log_softmax(x @ y_all.T / temperature, axis=1)[jnp.arange(x.shape[0]), own]
  y_to_x = jax.nn.log_softmax(y @ x_all.T / temperature, axis=1)[jnp.arange(x.shape[0]), own]
  loss = -(jnp.mean(x_to_y) + jnp.mean(y_to_x)) / 2
  return loss if axis_name is None else jax.lax.pmean(loss, axis_name)


def test_a_two_tower_loss_passes_with_both_towers_sharded():
  report = testing.check_device_invariance(
    clip_loss, FEATURES[:, 0], FEATURES[:, 1], devices=DEVICES
  )
  assert sorted(report.gradients) == ['x', 'y']
  assert all(g.close and g.one_device_norm > 0 for g in report.gradients.values())


def with_bank(z, bank, *, axis_name=None):
  """gathered_infonce with a bank of extra keys that every device holds whole."""
  extra = jnp.mean(jax.nn.logsumexp(z[:, 0] @ bank.T / 0.1, axis=1))
  extra = extra if axis_name is None else jax.lax.pmean(extra, axis_name)
  return extra + gathered_infonce(z, axis_name=axis_name)


def test_replicated_arrays_are_whole_on_every_device():
  bank = normalized(jax.random.normal(jax.random.key(62), (8, 8)))
  report = testing.check_device_invariance(
    with_bank, FEATURES, bank, devices=DEVICES, replicated=(1,)
  )
  assert report.gradients['bank'].close and report.gradients['bank'].one_device_norm > 0
  split = testing.check_device_invariance(with_bank, FEATURES, bank, devices=DEVICES, strict=False)
  assert not split.ok  # the bank split over the devices is another loss


# --------------------------------------------------------------------------------------
# Bad input: one line, naming the value and the fix.


def test_too_few_devices_is_one_line_naming_the_flag():
  with pytest.raises(ValueError) as raised:
    testing.check_device_invariance(gathered_infonce, FEATURES, devices=64)
  assert str(raised.value) == (
    'check_device_invariance needs 64 devices, JAX has 4 (cpu): on a CPU, set '
    'XLA_FLAGS=--xla_force_host_platform_device_count=64 before JAX is imported.'
  )
  with pytest.raises(
    ValueError, match=r'^check_device_invariance needs 2 devices or more, was given 1\.$'
  ):
    testing.check_device_invariance(gathered_infonce, FEATURES, devices=jax.devices()[:1])


def test_a_batch_that_does_not_split_and_a_loss_without_axis_name_are_refused():
  with pytest.raises(ValueError, match=r'^z has 6 rows, not a multiple of the 4 devices'):
    testing.check_device_invariance(gathered_infonce, FEATURES[:6], devices=DEVICES)
  with pytest.raises(ValueError, match=r'^single_device takes no axis_name= keyword'):

    def single_device(z):
      return gathered_infonce(z)

    testing.check_device_invariance(single_device, FEATURES, devices=DEVICES)
  with pytest.raises(ValueError, match=r"^sharded_options names 'labels', which is not an array"):
    testing.check_device_invariance(
      gathered_infonce, FEATURES, devices=DEVICES, sharded_options=('labels',)
    )


METHOD_DOC = pathlib.Path(__file__).resolve().parents[1] / 'docs' / 'method.md'
_NUMBER = re.compile(r'-?\d+\.\d+(?:e-?\d+)?')


def test_the_documented_example_runs_and_prints_what_the_doc_shows():
  """docs/method.md's user-written InfoNCE: its check passes and prints the doc's lines
  (the figures to 1e-5)."""
  section = METHOD_DOC.read_text().split('## Checking a loss across devices')[1]
  code = section.split('```python\n')[1].split('```')[0]
  shown = section.split('```text\n')[1].split('```')[0]
  printed = io.StringIO()
  with contextlib.redirect_stdout(printed):
    exec(compile(code, str(METHOD_DOC), 'exec'), {})
  got, expected = printed.getvalue().splitlines(), shown.splitlines()
  assert [_NUMBER.sub('#', line) for line in got] == [_NUMBER.sub('#', line) for line in expected]
  got_numbers = [float(x) for x in _NUMBER.findall(printed.getvalue())]
  np.testing.assert_allclose(got_numbers, [float(x) for x in _NUMBER.findall(shown)], rtol=1e-5)


_PROBE = """
import json, sys
import jax, jax.numpy
with_jax = set(sys.modules)
from hscl_jax import testing
print(json.dumps(sorted(set(sys.modules) - with_jax)))
"""


def test_the_check_imports_nothing_beyond_jax_and_numpy():
  """As `losses`: usable where the package is installed without the [train] extra."""
  out = subprocess.run(
    [sys.executable, '-c', _PROBE],
    capture_output=True,
    text=True,
    env={**os.environ, 'JAX_PLATFORMS': 'cpu'},
    timeout=120,
    check=True,
  )
  loaded = json.loads(out.stdout.splitlines()[-1])
  assert [m for m in loaded if m.startswith('hscl_jax')] == ['hscl_jax', 'hscl_jax.testing']
  assert {m.split('.')[0] for m in loaded} <= {'hscl_jax', 'jax', 'jaxlib', 'numpy'}, loaded
