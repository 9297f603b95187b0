"""A comparison's finished runs kept beside its report, so the report outlives the runs.

A run's workdir holds checkpoints (megabytes to gigabytes) that a report never reads; what
it reads is three small files. Each finished run of a grid is recorded as
REPORT_DIR/runs/<setting>/seed<k>/{config.json, metrics.jsonl, linear_eval.json} (a few
KB), so that the report directory alone (committed, copied to another machine) lets
`compare --report_only` rewrite the report, and lets the same `compare` command resume a
grid without the runs' workdirs: a recorded run is not trained again.

A record is reused only if it was made with the same config, field for field, as the run
the grid would start now (up to fields that cannot change the result and the dataset's
location on disk), and with the same linear evaluation; otherwise it is ignored, said
once in the log, and replaced when the run finishes.
"""

from __future__ import annotations

import json
import os

from absl import logging

from hscl_jax.evaluation import linear_evaluation
from hscl_jax.rundir import atomic
from hscl_jax.rundir import layout
from hscl_jax.rundir import metrics
from hscl_jax.rundir import stored_config

RECORDS_DIR = 'runs'
FILES = (layout.CONFIG_FILE, layout.METRICS_FILE, linear_evaluation.RESULT_FILE)
# Where the data lies on this machine: differs between machines, not between runs.
LOCATION_FIELDS = ('folder', 'data_dir')


def record_dir(report_dir: str, slug: str, seed: int) -> str:
  return os.path.join(report_dir, RECORDS_DIR, slug, f'seed{seed}')


def write_record(workdir: str, directory: str) -> None:
  """Copies the run's three files to `directory`, each file atomically."""
  os.makedirs(directory, exist_ok=True)
  for name in FILES:
    atomic.copy(os.path.join(workdir, name), os.path.join(directory, name))


def config_differences(recorded: dict, config) -> dict:
  """{field: (recorded, current)} of the fields that shape a run and differ; the dataset's
  location only counts by its last component (the dataset's name)."""
  current = metrics.config_as_json(config)
  changed = stored_config.differences(recorded, current)
  for field in LOCATION_FIELDS:
    if field in changed:
      old, new = (os.path.basename(os.path.normpath(v)) if v else v for v in changed[field])
      if old == new:
        del changed[field]
  return {f: v for f, v in changed.items() if not stored_config.is_free(f)}


def read_record(directory: str, config, linear_eval: dict, keys) -> dict | None:
  """{'linear', 'history'} of the record in `directory` if it is a finished run of `config`
  (every epoch logged) evaluated with `linear_eval` (the fields `keys`); None otherwise."""
  if not all(os.path.isfile(os.path.join(directory, name)) for name in FILES):
    return None
  with open(os.path.join(directory, layout.CONFIG_FILE)) as f:
    recorded_config = json.load(f)
  with open(os.path.join(directory, linear_evaluation.RESULT_FILE)) as f:
    linear = json.load(f)
  history = metrics.read_metrics(directory)
  changed = config_differences(recorded_config, config)
  if changed:
    listed = '; '.join(f'{f}: {json.dumps(a)} -> {json.dumps(b)}' for f, (a, b) in changed.items())
    logging.warning('Ignoring the record %s: made with another config (%s).', directory, listed)
    return None
  last_step = max((r['step'] for r in history if 'step' in r), default=None)
  if not is_finished(history, linear, config.num_epochs, last_step, linear_eval, keys):
    return None
  return {'linear': linear, 'history': history}


def is_finished(history, linear: dict, num_epochs: int, last_step, linear_eval: dict, keys) -> bool:
  """Whether a run whose metrics are `history` trained all `num_epochs` and its linear
  evaluation `linear` is of its last checkpoint (`last_step`) with the settings
  `linear_eval` (compared on the fields `keys`)."""
  return (
    bool(history)
    and history[-1].get('epoch') == num_epochs
    and linear.get('checkpoint_step') == last_step
    and all(linear.get(k) == linear_eval[k] for k in keys)
  )
