"""graphs/prepare: a TU collection's zip downloaded and unpacked by the prepare program, and a
failed download in one line."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile

import pytest

from graphs.test_data import toy_graphs
from graphs.test_data import write_tu
from hscl_jax.graphs import data
from hscl_jax.graphs import prepare as graph_prepare

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_prepare_downloads_and_unpacks_a_tu_zip(tmp_path):
  source = write_tu(str(tmp_path / 'src'), 'ZIPPED', toy_graphs(12))
  archive = tmp_path / 'ZIPPED.zip'
  with zipfile.ZipFile(archive, 'w') as z:
    for name in os.listdir(source):
      z.write(os.path.join(source, name), f'ZIPPED/{name}')
  target = tmp_path / 'data'
  proc = subprocess.run(
    [
      sys.executable,
      '-m',
      'hscl_jax.prepare',
      '--dataset=ZIPPED',
      f'--data_dir={target}',
      f'--url={archive.as_uri()}',
    ],
    cwd=REPO,
    env={**os.environ, 'PYTHONPATH': REPO},
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert f'ZIPPED is ready in {target / "ZIPPED"}' in proc.stdout
  assert data.load_tu('ZIPPED', str(target)).num_graphs == 12
  with pytest.raises(data.GraphDataError, match='download failed.*Fix: '):
    graph_prepare.prepare_tu('ZIPPED', str(target), (tmp_path / 'absent.zip').as_uri())
