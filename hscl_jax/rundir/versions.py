"""The workdir's format version, and the one migration of workdirs written in older ones.

`config.json` and every checkpoint's metadata carry `format_version`. A workdir without it
is format 0 (written before the version existed). Every reader goes through
`read_config` / `migrate_config` and `migrate_metadata`, which bring what is stored to the
current format, so no other module knows an older layout.

Format 0 -> 1: `config.model` may lack the fields that shape the backbone added since
(activation, strided_padding); the run trained with what their absence meant then
(`FORMAT_0_MODEL`): ReLU, and Flax's 'SAME' padding of the ResNets' strided convolutions
(small_cnn's convolutions pad as 'SAME' whatever the field says). A checkpoint's metadata
may lack the metrics records (the file is then trusted) and the epoch's timings.

In any format, a section a config.json lacks (`ABSENT_SECTIONS`) means what the run trained
with before the section existed: no `probe` section, no online probe; and a field it lacks
(`ABSENT_FIELDS`), what the run kept: no `keep_best`, no best checkpoint. The stored config
reads as it was written; a resumed run takes these values (rundir/stored_config.as_resumed).
"""

from __future__ import annotations

import json
from typing import Any

from etils import epath

from hscl_jax import errors

FORMAT_VERSION = 1
KEY = 'format_version'
FORMAT_0_MODEL = {'activation': 'relu', 'strided_padding': 'same'}
ABSENT_SECTIONS = {'probe': {'enabled': False}}
ABSENT_FIELDS = {'keep_best': ''}
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


def migrate_config(stored: dict[str, Any]) -> dict[str, Any]:
  """A stored config (config.json's contents) in the current format, without its version."""
  version = version_of(stored)
  config = {key: value for key, value in stored.items() if key != KEY}
  if version == 0 and isinstance(config.get('model'), dict):
    model = config['model']
    shaped = dict(FORMAT_0_MODEL)
    if not str(model.get('name', '')).startswith('resnet'):
      del shaped['strided_padding']  # small_cnn's convolutions pad as Flax's 'SAME'
    config['model'] = {**shaped, **model}
  return config


def added_by_migration(stored: dict[str, Any]) -> set[str]:
  """The dotted config fields `migrate_config` fills in (a run resumes only as it trained)."""
  migrated = migrate_config(stored).get('model', {})
  return {f'model.{field}' for field in migrated.keys() - stored.get('model', {}).keys()}


def read_config(path) -> dict[str, Any]:
  """DIR/config.json, migrated (json.JSONDecodeError where it is not JSON)."""
  return migrate_config(json.loads(epath.Path(path).read_text()))


def migrate_metadata(metadata: dict[str, Any]) -> dict[str, Any]:
  """A checkpoint's metadata in the current format, without its version."""
  version = version_of(metadata)
  current = {key: value for key, value in metadata.items() if key != KEY}
  return {**_FORMAT_0_METADATA, **current} if version == 0 else current
