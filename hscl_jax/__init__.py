"""hscl_jax: UCL, H-UCL, SCL and H-SCL contrastive learning in JAX/Flax.

`from hscl_jax import losses` needs JAX and NumPy only (`pip install hscl_jax`); the
trainer, the evaluations, the export and the experiments need the `[train]` extra. Where it
is missing, importing one of them fails with one line naming it, and a program
(`python -m hscl_jax.main`, ...) prints only that line.
"""

from __future__ import annotations

import importlib.abc
import sys

__version__ = '0.1.0'

# The top-level modules the package imports from the `[train]` extra's distributions
# (setup.py's TRAIN_REQUIRES; tests/test_package.py checks that every third-party import of
# the package is one of these, JAX's, NumPy's or an optional feature's, and that these are
# the extra's).
TRAINER_MODULES = frozenset(
  {
    'absl',
    'etils',
    'flax',
    'grain',
    'matplotlib',
    'ml_collections',
    'optax',
    'orbax',
    'PIL',
    'safetensors',
    'sklearn',
    'tensorboardX',
    'tensorflow_datasets',
    'threadpoolctl',
  }
)
INSTALL_TRAINER = "pip install 'hscl_jax[train]' (from a checkout: pip install -e '.[train]')"


_IMPORT_SYSTEM = ('importlib', '_frozen_importlib')  # frozen or not (-X frozen_modules=off)


def _importer() -> str | None:
  """The module (dotted name) whose import statement is running, past importlib's frames."""
  frame = sys._getframe(2)
  while frame is not None and frame.f_globals.get('__name__', '').startswith(_IMPORT_SYSTEM):
    frame = frame.f_back
  if frame is None:
    return None
  spec = frame.f_globals.get('__spec__')
  return spec.name if spec is not None else frame.f_globals.get('__name__')


def _program() -> str | None:
  """The program this process runs (e.g. hscl_jax.main for `python -m hscl_jax.main`), or None."""
  spec = getattr(sys.modules.get('__main__'), '__spec__', None)
  return spec.name if spec is not None and spec.name.startswith('hscl_jax.') else None


class _MissingTrainerDependency(importlib.abc.MetaPathFinder):
  """Asked last, so only about a module no other finder found: one of the trainer's
  dependencies, imported by one of our modules, becomes one line naming the extra."""

  def find_spec(self, fullname, path=None, target=None):
    top = fullname.partition('.')[0]
    if top not in TRAINER_MODULES:
      return None
    importer = _importer() or ''
    if not importer.startswith('hscl_jax.'):
      return None  # another package's import: its own error
    program = _program()
    message = (
      f"{program or importer} needs the trainer's dependencies ({top} is not installed). "
      f'Fix: {INSTALL_TRAINER}'
    )
    if program is not None:
      raise SystemExit(message)  # a program: the line alone, no traceback
    raise ModuleNotFoundError(message, name=fullname)


if not any(isinstance(f, _MissingTrainerDependency) for f in sys.meta_path):
  sys.meta_path.append(_MissingTrainerDependency())
