"""Every equation of a jaxpr, nested ones (a jit's, a scan's or a remat's body) included:
what tests count or read in a traced program."""

from __future__ import annotations

from collections.abc import Iterator

import jax.extend.core


def equations(jaxpr) -> Iterator:
  """The equations of `jaxpr` (a Jaxpr, not a ClosedJaxpr) and of every jaxpr in their
  parameters, depth first."""
  for eqn in jaxpr.eqns:
    yield eqn
    for sub in jax.extend.core.jaxprs_in_params(eqn.params):
      yield from equations(sub)
