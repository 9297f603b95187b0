"""`accepted()`: the block asserts that a valid input is accepted.

A range check's bound must be accepted and one past it refused. Refused wrongly, the check
raises its own error (a ValueError, a ConfigError); inside `accepted()` that refusal fails
the test as a failed assertion naming the refused input, which is what the test asserts,
rather than as an unexpected exception."""

from __future__ import annotations

import contextlib

from hscl_jax import errors


@contextlib.contextmanager
def accepted(what: str = 'a valid input'):
  try:
    yield
  except (errors.UserError, ValueError) as refusal:
    raise AssertionError(f'{what} was refused: {refusal}') from refusal
