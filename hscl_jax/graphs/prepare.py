"""Downloads a TU Dortmund graph dataset (NAME.zip) and unpacks it into DATA_DIR/NAME/."""

from __future__ import annotations

import io
import os
import urllib.error
import urllib.request
import zipfile

from hscl_jax.graphs import data

TU_URL = 'https://www.chrsmrrs.com/graphkerneldatasets/{name}.zip'
DEFAULT_DATA_DIR = os.path.join('~', 'graph_datasets')


def prepare_tu(name: str, data_dir: str | None = None, url: str | None = None) -> str:
  """Fetches NAME.zip (``url``, default the TU collection) into DATA_DIR/NAME; returns that folder.

  The files are checked by reading them; a download or format problem raises
  GraphDataError with one line naming the file and the fix.
  """
  data_dir = os.path.expanduser(data_dir or DEFAULT_DATA_DIR)
  url = url or TU_URL.format(name=name)
  try:
    with urllib.request.urlopen(url, timeout=60) as response:
      payload = response.read()
  except (urllib.error.URLError, OSError) as e:
    raise data.GraphDataError(
      f'{url}: download failed ({e}). Fix: check the dataset name (TU Dortmund spelling, e.g. '
      'MUTAG, PTC_MR, IMDB-BINARY) and the network, or unpack NAME.zip into '
      f'{data_dir} yourself'
    ) from None
  try:
    archive = zipfile.ZipFile(io.BytesIO(payload))
  except zipfile.BadZipFile:
    raise data.GraphDataError(
      f'{url}: not a zip archive. Fix: pass the URL of the TU Dortmund NAME.zip'
    ) from None
  members = [m for m in archive.namelist() if m.startswith(f'{name}/') and '..' not in m]
  if not members:
    raise data.GraphDataError(
      f'{url}: the archive has no {name}/ folder. Fix: pass the URL of {name}.zip'
    )
  os.makedirs(data_dir, exist_ok=True)
  archive.extractall(data_dir, members)
  data.load_tu(name, data_dir)  # fails with the file and the fix if something is off
  return os.path.join(data_dir, name)
