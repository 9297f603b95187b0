"""What a config field is declared with: `Field` (its dotted name, default, check, whether it
may change on resume, its documentation) and the checks of one value, by kind.

Every check takes (dotted field, value) and raises through `errors.fail`, so every refusal
is one line, `config.<field>: <problem>. Fix: <fix>.`
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
import dataclasses
from typing import Any

from ml_collections import config_dict

from hscl_jax import errors

Check = Callable[[str, Any], None]


def choice(choices) -> Check:
  def check(field, value):
    if value not in choices:
      errors.fail(field, f'unknown value {value!r}', f'use one of {", ".join(map(repr, choices))}')

  return check


def at_least(bound, fix: str) -> Check:
  def check(field, value):
    if not value >= bound:
      errors.fail(field, f'must be >= {bound}, got {value}', fix)

  return check


def positive(fix: str) -> Check:
  def check(field, value):
    if not value > 0:
      errors.fail(field, f'must be positive, got {value}', fix)

  return check


def in_unit_interval(fix: str) -> Check:
  """[0, 1)."""

  def check(field, value):
    if not 0 <= value < 1:
      errors.fail(field, f'must be in [0, 1), got {value}', fix)

  return check


def unset_or(check: Check) -> Check:
  return lambda field, value: None if value is None else check(field, value)


@dataclasses.dataclass(frozen=True)
class Unset:
  """The default of a field that is None until set, and the type a value set then has."""

  type: type


def unset(kind: type) -> Unset:
  """None by default; a value given later must be a `kind` (ml_collections' placeholder)."""
  return Unset(kind)


class _AsGiven:
  """`Field.absent`'s default (see there)."""

  def __repr__(self) -> str:
    return 'AS_GIVEN'


AS_GIVEN = _AsGiven()


@dataclasses.dataclass(frozen=True)
class Field:
  """One config field.

  name: dotted ('optimizer.learning_rate'). default: its value in configs/default.py, or
  `unset(type)`. check: of its value alone (None: free-form, or checked with other fields
  by config/schema, or by the module that builds it). free: a resumed run may change it
  (it cannot change the trained model, e.g. a logging period). doc: what it means.
  absent: what a stored run whose config.json lacks the field (written before it existed)
  trained with; rundir/versions derives the migration of old runs from it. A value, or a
  function of the stored config (flat, dotted names) giving it where it depends on other
  fields. AS_GIVEN (the default): such a run resumes with the value it is given, unchecked
  (the field is in every stored config, or no value of it changes a run that lacked it).
  """

  name: str
  default: Any
  check: Check | None = None
  free: bool = False
  doc: str = ''
  absent: Any = AS_GIVEN

  def absent_from(self, stored: Mapping[str, Any]) -> Any:
    """What a run whose flat stored config `stored` lacks this field trained with (or
    AS_GIVEN)."""
    return self.absent(stored) if callable(self.absent) else self.absent

  def initial(self) -> Any:
    """The default as a ConfigDict holds it (a fresh placeholder for an unset field)."""
    if isinstance(self.default, Unset):
      return config_dict.placeholder(self.default.type)
    return self.default
