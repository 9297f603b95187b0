"""Prepares a TFDS dataset (download + conversion to array_record), once per data_dir.

  python -m hscl_jax.prepare --dataset=cifar10 [--data_dir=DIR] [--manual_dir=DIR]
  python -m hscl_jax.prepare --dataset=MUTAG [--data_dir=DIR] [--url=URL]

Any other name than a TFDS dataset is a TU Dortmund graph dataset: its zip is downloaded
and unpacked into DIR/NAME (the graph experiment's --config.data_dir is then DIR).

Needs TensorFlow, which TFDS uses to write the files: pip install -e '.[prepare]'.
Training then reads the array_record files without TensorFlow. On a machine
without internet, put the official archive (e.g. cifar-10-binary.tar.gz) in a
folder and pass it as --manual_dir.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import sys

from hscl_jax.data.sources import DATASETS
from hscl_jax.data.tfds_sources import TFDS_DATASETS

NEEDS_TENSORFLOW = ("Preparing a TFDS dataset needs TensorFlow, which is not installed. "
                    "Install the extra with:  pip install -e '.[prepare]'")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(
      prog='python -m hscl_jax.prepare',
      description='Download a TFDS dataset and convert it to array_record for hscl_jax.')
  parser.add_argument('--dataset', required=True,
                      help=f'dataset to prepare: one of {", ".join(sorted(TFDS_DATASETS))} '
                           '(digits and image_folder need no preparation), or a TU Dortmund '
                           'graph dataset name (e.g. MUTAG)')
  parser.add_argument('--data_dir', default=None,
                      help='TFDS data directory (default: $TFDS_DATA_DIR or ~/tensorflow_datasets)')
  parser.add_argument('--manual_dir', default=None,
                      help='folder holding the official archive, for machines without internet')
  parser.add_argument('--url', default=None,
                      help='graph datasets: the zip to fetch (default: the TU collection)')
  args = parser.parse_args(argv)
  if args.dataset in set(DATASETS) - set(TFDS_DATASETS):
    parser.error(f'--dataset={args.dataset} needs no preparation')
  return args


def require_tensorflow() -> None:
  """Exits with the install command when TensorFlow is missing (checked without importing it)."""
  if importlib.util.find_spec('tensorflow') is None:
    raise SystemExit(NEEDS_TENSORFLOW)


def check_manual_dir(dataset: str, manual_dir: str | None) -> None:
  """With --manual_dir, the official archive must be there (else TFDS would try to download)."""
  if manual_dir is None:
    return
  archive = os.path.join(manual_dir, TFDS_DATASETS[dataset].archive)
  if not os.path.isfile(archive):
    raise SystemExit(f'--manual_dir={manual_dir} has no {TFDS_DATASETS[dataset].archive}; '
                     f'expected the official archive at {archive}')


def prepare(dataset: str, data_dir: str | None = None, manual_dir: str | None = None) -> dict:
  """Downloads (or reads from manual_dir) and writes array_record files; returns split sizes."""
  check_manual_dir(dataset, manual_dir)
  require_tensorflow()
  import tensorflow_datasets as tfds

  builder = tfds.builder(dataset, data_dir=data_dir, file_format='array_record')
  download_config = tfds.download.DownloadConfig(manual_dir=manual_dir)
  builder.download_and_prepare(download_config=download_config, file_format='array_record')
  return {str(split): info.num_examples for split, info in builder.info.splits.items()}


def main(argv: list[str] | None = None) -> None:
  args = parse_args(argv)
  if args.dataset not in TFDS_DATASETS:
    from hscl_jax.graphs import data as graph_data
    from hscl_jax.graphs import prepare as graph_prepare
    try:
      folder = graph_prepare.prepare_tu(args.dataset, args.data_dir, args.url)
    except graph_data.GraphDataError as e:  # one line and the fix, as the TFDS errors above
      raise SystemExit(str(e)) from None
    print(f'{args.dataset} is ready in {folder}')
    return
  sizes = prepare(args.dataset, args.data_dir, args.manual_dir)
  print(f'{args.dataset} is ready (array_record), split sizes: {sizes}')


if __name__ == '__main__':
  main(sys.argv[1:])
