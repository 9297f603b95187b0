"""The workdir's format version, and the one migration of workdirs written in older ones.

`config.json` and every checkpoint's metadata carry `format_version`. A workdir without it
is format 0 (written before the version existed). Every reader goes through
`read_config` / `migrate_config` and `migrate_metadata`, which bring what is stored to the
current format, so no other module knows an older layout.

A field a stored config lacks (written before the field existed) means what its
config/fields declaration states (`Field.absent`); `absent_values` reads them, so a field
added later is migrated by its declaration alone:

- Format 0 -> 1: `config.model` may lack the fields that shape the backbone added since
  (activation, strided_padding: ReLU, and Flax's 'SAME' padding of the ResNets' strided
  convolutions). Every program builds the model from config.json, so the stored config
  reads with them (`migrate_config`), and a resumed run given another value is refused
  (so a model field added later comes with a format version of its own). A checkpoint's
  metadata may lack the metrics records (the file is then trusted) and the epoch's timings.
- In any format, every other field a config.json lacks is read as written; a resumed run
  continues with what the run trained with (rundir/stored_config.as_resumed): no `probe`
  section, no online probe; no `keep_best`, no best checkpoint.
"""

from __future__ import annotations

import json
from typing import Any

from etils import epath
from flax import traverse_util

from hscl_jax import errors
from hscl_jax.config import fields
from hscl_jax.config.checks import AS_GIVEN

FORMAT_VERSION = 1
KEY = 'format_version'
MODEL = 'model'  # the section every program builds from a stored config
_FORMAT_0_METADATA = {
  'epoch_end_pending': False,
  'epoch_seconds': 0.0,
  'epoch_steps_timed': 0,
  'epoch_compile_seconds': 0.0,
  'epoch_compile_steps': 0,
  'records': None,
}


def stamped(tree: dict[str, Any]) -> dict[str, Any]:
  """`tree` as the current format writes it: with its version."""
  return {**tree, KEY: FORMAT_VERSION}


class FormatError(errors.UserError, ValueError):
  """A workdir in a format this version cannot read (a newer hscl_jax wrote it)."""


def version_of(stored: dict[str, Any]) -> int:
  version = stored.get(KEY, 0)
  if not isinstance(version, int) or not 0 <= version <= FORMAT_VERSION:
    raise FormatError(
      f'format_version {version!r} is not one this hscl_jax reads (0 to {FORMAT_VERSION}): '
      'the workdir was written by a newer hscl_jax. Fix: upgrade hscl_jax.'
    )
  return version


def absent_values(stored: dict[str, Any]) -> dict[str, Any]:
  """{dotted field: what the run trained with} of the declared fields `stored` (a config's
  nested dict) lacks whose declaration states it (config/fields' `absent`)."""
  flat = traverse_util.flatten_dict(stored, sep='.')
  values = {name: field.absent_from(flat) for name, field in fields.FIELDS.items()}
  return {
    name: value for name, value in values.items() if name not in flat and value is not AS_GIVEN
  }


def migrate_config(stored: dict[str, Any]) -> dict[str, Any]:
  """A stored config (config.json's contents) in the current format, without its version."""
  version = version_of(stored)
  config = {key: value for key, value in stored.items() if key != KEY}
  if version == 0 and isinstance(config.get(MODEL), dict):
    prefix = f'{MODEL}.'
    shaped = {
      name.removeprefix(prefix): value
      for name, value in absent_values(config).items()
      if name.startswith(prefix)
    }
    config[MODEL] = {**shaped, **config[MODEL]}
  return config


def added_by_migration(stored: dict[str, Any]) -> set[str]:
  """The dotted config fields `migrate_config` fills in (a run resumes only as it trained)."""
  migrated = migrate_config(stored).get(MODEL, {})
  return {f'{MODEL}.{field}' for field in migrated.keys() - stored.get(MODEL, {}).keys()}


def read_config(path) -> dict[str, Any]:
  """DIR/config.json, migrated (json.JSONDecodeError where it is not JSON)."""
  return migrate_config(json.loads(epath.Path(path).read_text()))


def migrate_metadata(metadata: dict[str, Any]) -> dict[str, Any]:
  """A checkpoint's metadata in the current format, without its version."""
  version = version_of(metadata)
  current = {key: value for key, value in metadata.items() if key != KEY}
  return {**_FORMAT_0_METADATA, **current} if version == 0 else current
