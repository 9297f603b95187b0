"""What setup.py declares, read from setup.py itself (its `setup()` call captured).

>>> 'pytest' in extra('test') and 'jax' in install_requires()
True
"""

from __future__ import annotations

import ast
import functools
import importlib.metadata
import pathlib
import re
import types

REPO = pathlib.Path(__file__).resolve().parents[1]


def distribution(requirement: str) -> str:
  """'absl-py>=0.12.0' -> 'absl-py' (lower case, '_' and '.' as '-': PEP 503's name)."""
  name = re.split(r'[<>=!~\[ ;]', requirement.strip(), maxsplit=1)[0]
  return re.sub(r'[-_.]+', '-', name).lower()


@functools.cache
def setup_arguments() -> dict:
  """The keyword arguments setup.py passes to setuptools.setup: its statements run with a
  stand-in for setuptools (a fresh venv of Python 3.12 has none), its imports left out."""
  captured = {}
  stand_in = types.SimpleNamespace(
    setup=lambda **kwargs: captured.update(kwargs), find_packages=lambda **kwargs: []
  )
  tree = ast.parse((REPO / 'setup.py').read_text())
  tree.body = [node for node in tree.body if not isinstance(node, (ast.Import, ast.ImportFrom))]
  exec(compile(tree, str(REPO / 'setup.py'), 'exec'), {'setuptools': stand_in})
  return captured


def install_requires() -> list[str]:
  """The distributions `pip install hscl_jax` installs by name (no extra)."""
  return [distribution(r) for r in setup_arguments()['install_requires']]


def extras() -> dict[str, list[str]]:
  """{extra: its distributions}, as setup.py's extras_require declares them."""
  return {
    name: [distribution(r) for r in requirements]
    for name, requirements in setup_arguments()['extras_require'].items()
  }


def extra(name: str) -> list[str]:
  return extras()[name]


def installed_by(*extra_names: str) -> frozenset[str]:
  """The distributions `pip install -e '.[EXTRAS]'` brings: the declared ones and their
  requirements, transitively (read from the installed distributions' metadata)."""
  return with_requirements(install_requires() + [d for e in extra_names for d in extra(e)])


def with_requirements(names) -> frozenset[str]:
  """The distributions `names` and what they require, transitively."""
  todo = list(names)
  found: set[str] = set()
  while todo:
    name = todo.pop()
    if name not in found:
      found.add(name)
      todo.extend(_requirements_of(name))
  return frozenset(found)


def _requirements_of(name: str) -> list[str]:
  """The distributions an installed distribution requires unconditionally or under an
  environment marker (markers other than `extra` are taken as met: a superset is what a
  fresh install may bring), or [] where it is not installed."""
  try:
    requires = importlib.metadata.distribution(name).requires or []
  except importlib.metadata.PackageNotFoundError:
    return []
  return [distribution(r) for r in requires if 'extra ==' not in r.replace('"', "'")]


_HIDING = """
import importlib, importlib.machinery, runpy, sys
HIDDEN = {hidden!r}

class Hide:  # PathFinder, but these distributions are not installed
  def find_spec(self, name, path=None, target=None):
    if name.partition('.')[0] in HIDDEN:
      return None
    return importlib.machinery.PathFinder.find_spec(name, path, target)

sys.meta_path[sys.meta_path.index(importlib.machinery.PathFinder)] = Hide()
{code}
"""


def hiding(hidden, code: str) -> str:
  """A `python -c` script that runs `code` with the top-level modules `hidden` (a set the
  script may change, as HIDDEN) unimportable, as if their distributions were not installed."""
  return _HIDING.format(hidden=set(hidden), code=code)
