"""`accepted()` and `refused()`: the block asserts that a valid input is accepted, or an
invalid one refused.

A range check's bound must be accepted and one past it refused. Refused wrongly, the check
raises its own error (a ValueError, a ConfigError); inside `accepted()` that refusal fails
the test as a failed assertion naming the refused input, which is what the test asserts,
rather than as an unexpected exception."""

from __future__ import annotations

import contextlib
import pathlib
import re
import traceback

from hscl_jax import errors

PACKAGE = pathlib.Path(errors.__file__).resolve().parent


def raised_by_the_package(error: BaseException, source: pathlib.Path = PACKAGE) -> bool:
  """Whether the innermost frame of `error`'s traceback is in hscl_jax (or `source`, a
  folder or a file): a check of ours refusing, not a library failing on what a bug handed
  it."""
  frames = traceback.extract_tb(error.__traceback__)
  if not frames:
    return False
  return pathlib.Path(frames[-1].filename).resolve().is_relative_to(source.resolve())


@contextlib.contextmanager
def accepted(
  what: str = 'a valid input',
  *,
  refusals: tuple[type[BaseException], ...] = (errors.UserError, ValueError),
  source: pathlib.Path = PACKAGE,
):
  """The block asserts that `what` is accepted: a refusal (a UserError or ValueError
  raised by hscl_jax's own code; for a program outside the package, its `refusals`, such
  as SystemExit, raised in its `source` file) fails the test as an assertion. Any other
  exception (a ValueError from NumPy or JAX included) is no refusal and propagates as it
  is."""
  try:
    yield
  except refusals as refusal:
    if not raised_by_the_package(refusal, source):
      raise
    raise AssertionError(f'{what} was refused: {refusal}') from refusal


@contextlib.contextmanager
def refused(pattern: str, error: type[Exception] = ValueError):
  """The block asserts that an invalid input is refused with `error` matching `pattern`.

  Unlike `pytest.raises`, another exception (a ZeroDivisionError from the input reaching
  the computation, the wrong check's message) fails the test as a failed assertion: the
  test's subject is the refusal and its wording, which the user reads."""
  try:
    yield
  except error as refusal:
    assert re.search(pattern, str(refusal)), f'refused with {refusal!r}, not {pattern!r}'
  except Exception as other:
    raise AssertionError(f'not refused by a {error.__name__}: {other!r}') from other
  else:
    raise AssertionError(f'accepted; expected a {error.__name__} matching {pattern!r}')
