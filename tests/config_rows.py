"""A config as rows a JSON file can hold exactly: every field in order, its value, the type
of the value and the type ml_collections will accept for it (a placeholder's, for a field
that is None until set), the types inside a tuple, and whether a resumed run may change it.

tests/fixtures/default_config.json holds configs/default.py's rows from commit e5a6e14,
before the fields were declared in hscl_jax/config/fields.py, as `rows` wrote them then
(with that commit's schema.FREE_FIELDS). `python tests/config_rows.py` prints today's;
tests/config/test_fields.py checks that they are the same.
"""

from __future__ import annotations

import json
import pathlib
import sys

import ml_collections


def rows(config: ml_collections.ConfigDict, free: tuple[str, ...], prefix: str = '') -> list:
  out = []
  for key in config.keys():
    name, value = prefix + key, config[key]
    if isinstance(value, ml_collections.ConfigDict):
      out.append([name, 'section'])
      out.extend(rows(value, free, name + '.'))
      continue
    inner = [type(v).__name__ for v in value] if isinstance(value, (tuple, list)) else None
    kinds = [type(value).__name__, config.get_type(key).__name__, inner]
    out.append([name, list(value) if inner is not None else value, *kinds, name in free])
  return out


if __name__ == '__main__':
  repo = pathlib.Path(__file__).resolve().parents[1]
  sys.path.insert(0, str(repo))
  from configs import default
  from hscl_jax.config import fields

  lines = [json.dumps(row) for row in rows(default.get_config(), fields.FREE_FIELDS)]
  print('[\n' + ',\n'.join(lines) + '\n]')
