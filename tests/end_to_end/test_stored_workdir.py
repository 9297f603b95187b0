"""A workdir written by an earlier version (tests/fixtures/digits_workdir, stopped mid epoch 3)
resumes, evaluates, embeds, inspects and exports as that version's programs did.

The figures that version gave are tests/fixtures/digits_workdir.expected.json; every program
runs as a user runs it (`python -m hscl_jax.X`) on a copy of the workdir, on one CPU device
with XLA's default compiler settings (as the workdir was written), so the stored figures
are reproduced to float32 rounding.

    python tests/end_to_end/test_stored_workdir.py  # prints what this tree's programs give on it
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest

from hscl_jax.evaluation import retrieval_metrics

REPO = pathlib.Path(__file__).resolve().parents[2]
FIXTURE = REPO / 'tests' / 'fixtures' / 'digits_workdir'
EXPECTED = FIXTURE.with_name('digits_workdir.expected.json')
RESUME = [
  '--config=configs/digits.py',
  '--config.num_epochs=3',
  '--config.model.head_hidden=64',
  '--config.model.head_out=32',
  '--config.checkpoint_every_epochs=1',
  '--config.keep_checkpoints=1',
  '--config.optimizer.name=sgd',
  '--config.optimizer.learning_rate=0.1',
  '--config.optimizer.momentum=0.9',
  '--config.knn.k=200',  # configs/digits.py's value when the workdir was written
]
TIMINGS = ('epoch_time', 'images_per_second', 'samples_per_second', 'knn_time', 'seconds', 'time')


def _program(name: str, *args: str) -> subprocess.CompletedProcess:
  env = {**os.environ, 'JAX_PLATFORMS': 'cpu', 'XLA_FLAGS': ''}  # one device, default settings
  return subprocess.run(
    [sys.executable, '-m', f'hscl_jax.{name}', *args],
    cwd=REPO,
    env=env,
    capture_output=True,
    text=True,
    timeout=600,
  )


def _ran(out: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
  assert out.returncode == 0, out.stderr[-3000:]
  return out


def _without_timings(row: dict) -> dict:
  return {key: value for key, value in row.items() if key not in TIMINGS}


def _copy(scratch: pathlib.Path, name: str) -> pathlib.Path:
  return pathlib.Path(shutil.copytree(FIXTURE, scratch / name))


def resumed(scratch: pathlib.Path) -> dict:
  """The same command again: epoch 3 finished, every epoch's record, the checkpoints kept."""
  workdir = _copy(scratch, 'resumed')
  _ran(_program('main', *RESUME, f'--workdir={workdir}'))
  rows = [json.loads(line) for line in (workdir / 'metrics.jsonl').read_text().splitlines()]
  steps = sorted(int(p.name) for p in (workdir / 'checkpoints').iterdir() if p.name.isdigit())
  return {'records': [_without_timings(row) for row in rows], 'checkpoints': steps}


def evaluated(workdir: pathlib.Path) -> dict:
  """linear_eval's record (the features protocol, the config's budget) of the stopped run."""
  _ran(_program('linear_eval', f'--workdir={workdir}'))
  return _without_timings(json.loads((workdir / 'linear_eval.json').read_text()))


def embedded(workdir: pathlib.Path) -> dict:
  """The test split's features: what the .npz holds, and their sums and first row."""
  out = workdir / 'embeddings.npz'
  _ran(_program('embed', f'--workdir={workdir}', '--split=test', f'--out={out}'))
  with np.load(out) as stored:
    features = stored['features'].astype(np.float64)
    return {
      'shape': list(features.shape),
      'sum': float(features.sum()),
      'sum_of_squares': float((features**2).sum()),
      'first_row': features[0, :8].tolist(),
      'labels': stored['labels'].tolist(),
      'indices_sum': int(stored['indices'].sum()),
      'checkpoint_step': int(stored['checkpoint_step']),
      'split': str(stored['split']),
      'class_names': stored['class_names'].tolist(),
    }


def inspected(workdir: pathlib.Path) -> dict:
  """false_negatives.json and the figures' names."""
  out = workdir / 'inspect'
  _ran(_program('inspect', f'--workdir={workdir}', f'--out={out}'))
  return {
    'false_negatives': json.loads((out / 'false_negatives.json').read_text()),
    'files': sorted(p.name for p in out.iterdir()),
  }


def exported(workdir: pathlib.Path) -> dict:
  """small_cnn has no torchvision model: the export's exit status and last line."""
  out = _program('export', f'--workdir={workdir}', '--format=torch', f'--out={workdir}/b.st')
  last = out.stderr.strip().splitlines()[-1]
  return {'returncode': out.returncode, 'message': last.split('] ', 1)[-1]}


def measure(scratch: pathlib.Path) -> dict:
  stopped = _copy(scratch, 'stopped')
  return {
    'resumed': resumed(scratch),
    'linear_eval': evaluated(stopped),
    'embed': embedded(stopped),
    'inspect': inspected(stopped),
    'export': exported(stopped),
  }


def _assert_close(actual, expected, where: str = '') -> None:
  """Equal structure and exact ints and strings; floats to float32 rounding."""
  if isinstance(expected, dict):
    assert sorted(actual) == sorted(expected), where
    for key in expected:
      _assert_close(actual[key], expected[key], f'{where}.{key}')
  elif isinstance(expected, list):
    assert len(actual) == len(expected), where
    for i, (a, e) in enumerate(zip(actual, expected)):
      _assert_close(a, e, f'{where}[{i}]')
  elif isinstance(expected, float):
    np.testing.assert_allclose(actual, expected, rtol=2e-5, atol=1e-6, err_msg=where)
  else:
    assert actual == expected, where


@pytest.mark.skipif(not FIXTURE.is_dir(), reason=f'no {FIXTURE}')
def test_the_stored_workdir_gives_the_figures_its_version_gave(tmp_path):
  """The same figures; this version adds the monitor's retrieval metrics (config.knn.retrieval,
  a free field: the stored config's lack of it is no difference) to the epoch it trains,
  and the run's method label to inspect's false_negatives.json."""
  expected = json.loads(EXPECTED.read_text())
  measured = measure(tmp_path)
  added = [
    {key: record.pop(key) for key in list(record) if retrieval_metrics.is_metric(key)}
    for record in measured['resumed']['records']
  ]
  assert [sorted(figures) for figures in added] == [[], [], ['map_at_r', 'precision_at_1']]
  assert all(0 < value <= 1 for value in added[-1].values()), added
  # and names the measured run's method in false_negatives.json (the stored run: H-SCL(β)).
  assert measured['inspect']['false_negatives'].pop('method_label') == 'H-SCL(β)'
  _assert_close(measured, expected)


if __name__ == '__main__':
  import tempfile

  with tempfile.TemporaryDirectory() as scratch:
    print(json.dumps(measure(pathlib.Path(scratch)), indent=1, sort_keys=True))
