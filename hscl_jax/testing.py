"""A loss's device invariance, checked: its value and gradients on N devices against one.

    from hscl_jax import testing
    report = testing.check_device_invariance(my_loss, z, labels, options=dict(temperature=0.1))
    print(report)

A contrastive loss that gathers its negatives across devices must give, on N devices, the
value and the gradients it gives on one device holding the whole (global) batch. The most
common ways to break it change nothing on one device: a loss summed over devices, a gradient
summed twice (off by the device count), a loss that forgets to all-gather (each device sees
only its own negatives). `check_device_invariance` runs the loss both ways and names the
difference, as a ratio where it is a constant factor. docs/method.md (its section "Checking
a loss across devices") shows a user-written loss checked.

The loss is called as ``loss_fn(*arrays, **options)`` on one device and as
``loss_fn(*shards, axis_name=axis_name, **options)`` inside ``jax.shard_map`` over a 1-D
mesh of N devices, each positional array split along its leading axis (but those listed
in ``replicated``), each option whole on every device (but those listed in
``sharded_options``). The sharded value is the mean of the devices' values (they must
agree), and its gradients are those of the function of the global arrays that holds the
``shard_map``: what a user trains with.

On a CPU, JAX has one device unless XLA_FLAGS holds ``--xla_force_host_platform_device_count=N``
before JAX is imported (``XLA_FLAGS=--xla_force_host_platform_device_count=4 python ...``).
Over several processes (``jax.distributed.initialize`` first; gloo collectives on CPUs),
every process calls it with the same arrays: ``devices=None`` spans every process's
devices, so the collectives cross processes; each process computes the one-device loss on
a device of its own and reads the whole report. This module imports JAX and NumPy only, as
`hscl_jax.losses`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
import dataclasses
import inspect

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import numpy as np

HOST_DEVICES_FLAG = '--xla_force_host_platform_device_count'


class DeviceInvarianceError(AssertionError):
  """A loss whose value or gradients differ between one device and N."""


@dataclasses.dataclass(frozen=True)
class GradientComparison:
  """The gradient of one input (a positional array or a float option) both ways.

  ``ratio`` is the least-squares scale s of ``sharded ≈ s · one_device`` (NaN where the
  one-device gradient is 0); ``close``: they agree elementwise within (rtol, atol).
  """

  one_device: np.ndarray
  sharded: np.ndarray
  ratio: float
  close: bool

  @property
  def one_device_norm(self) -> float:
    return float(np.linalg.norm(self.one_device))

  @property
  def sharded_norm(self) -> float:
    return float(np.linalg.norm(self.sharded))


@dataclasses.dataclass(frozen=True)
class InvarianceReport:
  """What `check_device_invariance` measured: the value on one device and on each of the
  N devices, each gradient both ways (by input name), and a line per difference found."""

  num_devices: int
  value: float
  sharded_values: tuple[float, ...]
  gradients: dict[str, GradientComparison]
  failures: tuple[str, ...]

  @property
  def ok(self) -> bool:
    return not self.failures

  @property
  def sharded_value(self) -> float:
    return float(np.mean(self.sharded_values))

  def raise_if_different(self) -> InvarianceReport:
    """Raises DeviceInvarianceError with a line per difference; returns self otherwise."""
    if self.failures:
      raise DeviceInvarianceError('\n'.join(self.failures))
    return self

  def __str__(self) -> str:
    n = self.num_devices
    lines = [
      f'device invariance on {n} devices: {"ok" if self.ok else "DIFFERENT"}',
      f'  value: {self.value:.7g} on 1 device, {self.sharded_value:.7g} on {n}',
    ]
    for name, grad in self.gradients.items():
      lines.append(
        f'  gradient of {name}: norm {grad.one_device_norm:.6g} on 1 device, '
        f'{grad.sharded_norm:.6g} on {n}, ratio {grad.ratio:.4f}'
        f'{"" if grad.close else " DIFFERENT"}'
      )
    return '\n'.join([*lines, *(f'  {failure}' for failure in self.failures)])


def check_device_invariance(
  loss_fn: Callable,
  *arrays,
  options: dict | None = None,
  devices: int | Sequence[jax.Device] | None = None,
  axis_name: str = 'batch',
  replicated: Sequence[int] = (),
  sharded_options: Sequence[str] = (),
  rtol: float = 1e-4,
  atol: float = 1e-6,
  strict: bool = True,
) -> InvarianceReport:
  """The value and gradients of ``loss_fn`` on one device against N (module docstring).

  Args:
    loss_fn: returns a scalar; takes the positional ``arrays``, the keyword ``options``
      and, on N devices, ``axis_name=`` (the mesh axis the batch is split along).
    *arrays: the global batch: each split along its leading axis over the devices (a
      multiple of N rows), except those whose positions are in ``replicated``.
    options: keyword arguments. Float ones (Python floats, floating arrays: a temperature,
      β, a queue) are traced, replicated and differentiated; other arrays (labels of a
      queue, masks) traced and replicated; everything else (callables, ints, strings,
      None) passed as it is.
    devices: how many devices (the first of ``jax.devices()``), or which; None = all
      (every process's, over several processes).
    axis_name: the mesh axis name passed to the loss.
    replicated: positions in ``arrays`` of those every device takes whole (a bank of
      negatives).
    sharded_options: names of the options split along their leading axis as the batch
      (per-sample labels or masks passed by keyword).
    rtol, atol: the tolerance of every comparison (as ``numpy.allclose``).
    strict: raise DeviceInvarianceError on a difference (the report's lines), rather than
      only reporting it in ``report.failures``.

  Returns:
    The InvarianceReport (``print(report)`` shows the values, norms and ratios).
  """
  devices = _devices(devices)
  names = _argument_names(loss_fn, len(arrays))
  _check_takes_axis_name(loss_fn)
  traced, fixed, static = _split_inputs(names, arrays, options or {})
  sharded_names = {names[i] for i in range(len(arrays)) if i not in set(replicated)}
  sharded_names |= _checked_options(sharded_options, options or {})
  _check_rows(traced, fixed, sharded_names, len(devices))

  def call(values, **extra):
    args = [values[name] for name in names]
    kwargs = {key: values[key] for key in values if key not in names}
    return loss_fn(*args, **kwargs, **static, **extra)

  one_device = jax.jit(jax.value_and_grad(lambda diff, other: call({**diff, **other})))
  value, single_grads = one_device(*jax.device_put((traced, fixed), _own_device(devices)))
  (_, values), sharded_grads = _sharded_value_and_grad(call, devices, axis_name, sharded_names)(
    traced, fixed
  )
  # The loss's arguments first, then its options, as given.
  grads = {name: (single_grads[name], sharded_grads[name]) for name in traced}
  report = _compare(float(value), np.asarray(values, np.float64), grads, rtol, atol)
  return report.raise_if_different() if strict else report


def _sharded_value_and_grad(call, devices, axis_name, sharded_names):
  """jit(value_and_grad) of the mean of the devices' values, the loss run in shard_map."""
  mesh = jax.make_mesh(
    (len(devices),), (axis_name,), axis_types=(jax.sharding.AxisType.Auto,), devices=devices
  )

  def per_device(diff, other):
    value = call({**diff, **other}, axis_name=axis_name)
    if jnp.shape(value) != ():
      raise ValueError(f'loss_fn must return a scalar, got shape {jnp.shape(value)}.')
    return jnp.reshape(value, (1,))

  def specs(tree):
    return {name: P(axis_name) if name in sharded_names else P() for name in tree}

  def global_loss(diff, other):
    values = jax.shard_map(
      per_device, mesh=mesh, in_specs=(specs(diff), specs(other)), out_specs=P(axis_name)
    )(diff, other)
    return jnp.mean(values), values

  def placed(tree):
    return {
      k: jax.device_put(v, NamedSharding(mesh, s))
      for (k, v), s in zip(tree.items(), specs(tree).values())
    }

  # Replicated results: every process reads the whole of each, its devices' and the others'.
  whole = NamedSharding(mesh, P())
  jitted = jax.jit(jax.value_and_grad(global_loss, has_aux=True), out_shardings=whole)
  return lambda diff, other: jitted(placed(diff), placed(other))


def _own_device(devices):
  """The device of this process that computes the one-device loss: the first of ``devices``
  it holds (each process computes it alike)."""
  own = [device for device in devices if device.process_index == jax.process_index()]
  return own[0] if own else jax.local_devices()[0]


def _devices(devices) -> list:
  """The devices asked for; one line naming the flag where JAX has fewer."""
  available = jax.devices()
  if devices is not None and not isinstance(devices, int):
    if len(devices) < 2:
      raise ValueError(
        f'check_device_invariance needs 2 devices or more, was given {len(devices)}.'
      )
    return list(devices)
  wanted = len(available) if devices is None else devices
  if wanted < 2 or len(available) < wanted:
    raise ValueError(
      f'check_device_invariance needs {max(wanted, 2)} devices, JAX has {len(available)} '
      f'({available[0].platform}): on a CPU, set XLA_FLAGS={HOST_DEVICES_FLAG}='
      f'{max(wanted, 2)} before JAX is imported.'
    )
  return available[:wanted]


def _argument_names(loss_fn, count: int) -> list[str]:
  """The names of the first ``count`` positional parameters, for the report's lines."""
  try:
    parameters = list(inspect.signature(loss_fn).parameters.values())
  except (TypeError, ValueError):
    parameters = []
  positional = [
    p.name for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
  ]
  if len(positional) < count:
    return [f'arrays[{i}]' for i in range(count)]
  return positional[:count]


def _check_takes_axis_name(loss_fn) -> None:
  try:
    parameters = inspect.signature(loss_fn).parameters.values()
  except (TypeError, ValueError):
    return  # a callable without a signature: its call will say
  if not any(p.name == 'axis_name' or p.kind == p.VAR_KEYWORD for p in parameters):
    name = getattr(loss_fn, '__name__', repr(loss_fn))
    raise ValueError(
      f'{name} takes no axis_name= keyword, so it cannot run on a shard: give it one and '
      'all-gather the negatives over that axis (as hscl_jax.losses do).'
    )


def _split_inputs(names, arrays, options):
  """({name: float array}, {name: other array}, {name: static option}): the differentiated
  inputs, the other traced ones, and the options passed as they are."""
  traced, fixed, static = {}, {}, {}
  for name, array in [*zip(names, arrays), *options.items()]:
    positional = name in names
    if not positional and not _is_array_like(array):
      static[name] = array
      continue
    array = jnp.asarray(array, jnp.float32 if isinstance(array, float) else None)
    (traced if jnp.issubdtype(array.dtype, jnp.floating) else fixed)[name] = array
  return traced, fixed, static


def _checked_options(sharded_options, options) -> set[str]:
  for name in sharded_options:
    if not _is_array_like(options.get(name)):
      raise ValueError(
        f'sharded_options names {name!r}, which is not an array among the options '
        f'({", ".join(sorted(options)) or "none"}): name an array option.'
      )
  return set(sharded_options)


def _is_array_like(value) -> bool:
  if isinstance(value, bool):
    return False
  return isinstance(value, (float, np.ndarray, np.generic, jax.Array))


def _check_rows(traced, fixed, sharded_names, num_devices) -> None:
  for name in sharded_names:
    array = {**traced, **fixed}[name]
    rows = array.shape[0] if array.ndim else None
    if rows is None or rows % num_devices:
      raise ValueError(
        f'{name} has {rows if rows is not None else "no"} rows, not a multiple of the '
        f'{num_devices} devices: give a multiple of {num_devices} rows, or keep it whole on '
        'every device (its position in replicated=, or out of sharded_options=).'
      )


def _compare(value, values, grads, rtol, atol) -> InvarianceReport:
  """The report of the value (one device's, each of the N's) and each gradient (name: its
  one-device and N-device values)."""
  num_devices = len(values)
  failures = _value_failures(value, values, rtol, atol)
  gradients = {}
  for name, (one, many) in grads.items():
    one, many = np.asarray(one), np.asarray(many)
    gradients[name] = GradientComparison(
      one, many, _ratio(one, many), bool(np.allclose(many, one, rtol=rtol, atol=atol))
    )
    if not gradients[name].close:
      failures.append(_gradient_failure(name, gradients[name], num_devices, rtol, atol))
  return InvarianceReport(
    num_devices, value, tuple(float(v) for v in values), gradients, tuple(failures)
  )


def _ratio(one: np.ndarray, many: np.ndarray) -> float:
  one, many = one.astype(np.float64).ravel(), many.astype(np.float64).ravel()
  square = float(one @ one)
  return float(one @ many) / square if square > 0 else float('nan')


def _factor_meaning(ratio: float, num_devices: int, of_value: bool = False) -> str:
  """What a constant factor between N devices and one most likely means."""
  if np.isclose(ratio, num_devices, rtol=1e-3):
    if of_value:
      return ' (the device count: the loss is probably summed over devices, not averaged)'
    return (
      ' (the device count: the loss is probably summed over devices, or its psum is '
      'transposed to a psum, as under pmap)'
    )
  if np.isclose(ratio, 1 / num_devices, rtol=1e-3):
    return (
      ' (1 / the device count: the loss or its gradient is probably averaged over devices twice)'
    )
  return ''


def _value_failures(value, values, rtol, atol) -> list[str]:
  n = len(values)
  if not np.allclose(values, values[0], rtol=rtol, atol=atol):
    shown = ', '.join(f'{v:.7g}' for v in values)
    return [
      f'value differs between the {n} devices ({shown}): the loss is not reduced over the '
      'devices (a pmean or psum of its shards, or an all-gather, is missing).'
    ]
  mean = float(np.mean(values))
  if np.isclose(mean, value, rtol=rtol, atol=atol):
    return []
  ratio = mean / value if value else float('nan')
  meaning = _factor_meaning(ratio, n, of_value=True) or (
    ' (a loss that does not all-gather its negatives? each device then sees only its own)'
  )
  return [
    f'value differs on {n} devices: {mean:.7g} against {value:.7g} on 1 device, '
    f'{ratio:.3f} × it{meaning}.'
  ]


def _gradient_failure(name, grad: GradientComparison, num_devices, rtol, atol) -> str:
  head = f'gradient of {name} differs on {num_devices} devices'
  if np.isnan(grad.ratio):
    return f'{head}: it is 0 on 1 device and of norm {grad.sharded_norm:.6g} on {num_devices}.'
  if np.allclose(grad.sharded, grad.ratio * grad.one_device, rtol=rtol, atol=atol):
    meaning = _factor_meaning(grad.ratio, num_devices)
    return f'{head}: it is {grad.ratio:.3f} × the 1-device gradient{meaning}.'
  distance = float(np.linalg.norm(grad.sharded - grad.one_device)) / grad.one_device_norm
  return (
    f'{head}, not by a constant factor: |sharded − 1-device| = {distance:.3g} × '
    f'|1-device| (norms {grad.one_device_norm:.6g} and {grad.sharded_norm:.6g}).'
  )
