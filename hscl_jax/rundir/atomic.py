"""How every program writes a file: atomically, with the mode any file the process creates.

The bytes go to a hidden temporary file beside the target (`layout.temporary`), which is
then renamed over it: a crash or a full disk leaves the old contents or the new ones,
never a torn file under the final name, and a reader never sees a partial one. Paths may
be local or any `etils.epath` path (on a bucket the rename is a copy and a delete).

    atomic.write_json(workdir / 'linear_eval.json', result)
"""

from __future__ import annotations

from collections.abc import Callable
import contextlib
import json
import shutil
from typing import Any, BinaryIO

from etils import epath

from hscl_jax.rundir import layout


def write(path, write_to: Callable[[BinaryIO], Any]) -> None:
  """Calls `write_to` with the temporary file (binary), then renames it over `path`."""
  path = epath.Path(path)
  temporary = path.with_name(layout.temporary(path.name))
  try:
    with temporary.open('wb') as f:
      write_to(f)
    temporary.replace(path)
  except BaseException:
    with contextlib.suppress(OSError):
      temporary.unlink()
    raise


def write_text(path, text: str) -> None:
  write(path, lambda f: f.write(text.encode('utf-8')))


def write_json(path, value: Any, *, indent: int = 2, newline: bool = False) -> None:
  """`json.dumps(value, indent=indent)`, with a final newline when asked."""
  write_text(path, json.dumps(value, indent=indent) + ('\n' if newline else ''))


def write_figure(path, figure, *, dpi: int) -> None:
  """A matplotlib figure, in the format its file name ends with (`.png`)."""
  suffix = epath.Path(path).suffix.lstrip('.') or 'png'
  write(path, lambda f: figure.savefig(f, format=suffix, dpi=dpi))


def copy(source, path) -> None:
  """The bytes of `source`, written to `path` atomically."""
  with epath.Path(source).open('rb') as stream:
    write(path, lambda f: shutil.copyfileobj(stream, f))
