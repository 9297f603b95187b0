"""One measurement's row of a benchmark report, or the error it failed with.

Shared by accelerator.py and torch_reference.py (which runs in its own process, without JAX).
"""

from __future__ import annotations

import json


def measured(measure, **labels) -> dict:
  """measure()'s row, printed as a JSON line; where it fails (e.g. out of memory), the
  labels and the error's first line, so that one failure does not cost the rest of a run."""
  try:
    row = measure()
  except Exception as error:  # recorded in the report; the run goes on
    first_line = (str(error).strip().splitlines() or [''])[0][:300]
    row = dict(labels, error=f'{type(error).__name__}: {first_line}')
  print(json.dumps(row), flush=True)
  return row
