"""The transfer guard of the tests: JAX_TRANSFER_GUARD=disallow within a block."""

from __future__ import annotations

import contextlib

import jax


@contextlib.contextmanager
def no_implicit_transfers():
  """As JAX_TRANSFER_GUARD=disallow: a host value reaching the device other than by
  jax.device_put (a jnp op on NumPy input, a NumPy argument of a jit) raises. Global, not
  thread-local, so Orbax's threads are held to it too. (The CPU's device-to-host copies
  are views: only host-to-device transfers are checked here.)"""
  previous = jax.config.jax_transfer_guard
  jax.config.update('jax_transfer_guard', 'disallow')
  try:
    yield
  finally:
    jax.config.update('jax_transfer_guard', previous)
