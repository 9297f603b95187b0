"""Prepares a dataset once per data_dir: a TFDS one (download + conversion to array_record)
or a TU Dortmund graph dataset.

  python -m hscl_jax.prepare --dataset=cifar10 [--data_dir=DIR] [--manual_dir=DIR]
  python -m hscl_jax.prepare --dataset=MUTAG [--data_dir=DIR] [--url=URL]

Any other name than a TFDS dataset is a TU Dortmund graph dataset: its zip is downloaded
and unpacked into DIR/NAME (the graph experiment's --config.data_dir is then DIR).

TFDS datasets need TensorFlow, which TFDS uses to write the files: pip install -e
'.[prepare]'. Training then reads the array_record files without TensorFlow. On a machine
without internet, put the official archive (e.g. cifar-10-binary.tar.gz) in a folder and
pass it as --manual_dir. The work is done by hscl_jax.data.tfds_prepare and
hscl_jax.graphs.prepare.
"""

from __future__ import annotations

from absl import app
from absl import flags

from hscl_jax import errors
from hscl_jax.config import command_line
from hscl_jax.data import tfds_prepare
from hscl_jax.data.sources import DATASETS
from hscl_jax.data.tfds_sources import TFDS_DATASETS
from hscl_jax.graphs import prepare as graph_prepare

_DATASET = flags.DEFINE_string(
  'dataset',
  None,
  f'Dataset to prepare: one of {", ".join(sorted(TFDS_DATASETS))} (digits '
  'and image_folder need no preparation), or a TU Dortmund graph dataset name (e.g. MUTAG).',
)
_DATA_DIR = flags.DEFINE_string(
  'data_dir', None, 'TFDS data directory (default: $TFDS_DATA_DIR or ~/tensorflow_datasets).'
)
_MANUAL_DIR = flags.DEFINE_string(
  'manual_dir', None, 'Folder holding the official archive, for machines without internet.'
)
_URL = flags.DEFINE_string(
  'url', None, 'Graph datasets: the zip to fetch (default: the TU collection).'
)


def _prepare_from_flags() -> None:
  dataset = _DATASET.value
  if dataset not in TFDS_DATASETS:
    folder = graph_prepare.prepare_tu(dataset, _DATA_DIR.value, _URL.value)
    print(f'{dataset} is ready in {folder}')
    return
  sizes = tfds_prepare.prepare(dataset, _DATA_DIR.value, _MANUAL_DIR.value)
  print(f'{dataset} is ready (array_record), split sizes: {sizes}')


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {" ".join(argv[1:])}')
  if not _DATASET.value:
    raise SystemExit('--dataset is required, e.g. python -m hscl_jax.prepare --dataset=cifar10')
  if _DATASET.value in set(DATASETS) - set(TFDS_DATASETS):
    raise SystemExit(f'--dataset={_DATASET.value} needs no preparation')
  errors.exit_on_user_error(_prepare_from_flags)


def run():
  """The `hscl-prepare` console script; `python -m hscl_jax.prepare` runs it too."""
  command_line.run(main)


if __name__ == '__main__':
  run()
