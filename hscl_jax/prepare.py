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

import dataclasses
import importlib.util
import os

from absl import app
from absl import flags

from hscl_jax.data.sources import DATASETS
from hscl_jax.data.tfds_sources import TFDS_DATASETS

NEEDS_TENSORFLOW = (
  'Preparing a TFDS dataset needs TensorFlow, which is not installed. '
  "Install the extra with:  pip install -e '.[prepare]'"
)

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


@dataclasses.dataclass(frozen=True)
class Args:
  dataset: str
  data_dir: str | None
  manual_dir: str | None
  url: str | None


def _args_from_flags() -> Args:
  if not _DATASET.value:
    raise SystemExit('--dataset is required, e.g. python -m hscl_jax.prepare --dataset=cifar10')
  if _DATASET.value in set(DATASETS) - set(TFDS_DATASETS):
    raise SystemExit(f'--dataset={_DATASET.value} needs no preparation')
  return Args(_DATASET.value, _DATA_DIR.value, _MANUAL_DIR.value, _URL.value)


def parse_args(argv: list[str]) -> Args:
  """The flags in `argv` (without the program name), as the command line would set them."""
  flags.FLAGS.unparse_flags()
  try:
    flags.FLAGS(['prepare', *argv])
  except flags.Error as e:
    raise SystemExit(str(e)) from None
  return _args_from_flags()


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
    raise SystemExit(
      f'--manual_dir={manual_dir} has no {TFDS_DATASETS[dataset].archive}; '
      f'expected the official archive at {archive}'
    )


def prepare(dataset: str, data_dir: str | None = None, manual_dir: str | None = None) -> dict:
  """Downloads (or reads from manual_dir) and writes array_record files; returns split sizes."""
  check_manual_dir(dataset, manual_dir)
  require_tensorflow()
  import tensorflow_datasets as tfds

  builder = tfds.builder(dataset, data_dir=data_dir, file_format='array_record')
  download_config = tfds.download.DownloadConfig(manual_dir=manual_dir)
  builder.download_and_prepare(download_config=download_config, file_format='array_record')
  return {str(split): info.num_examples for split, info in builder.info.splits.items()}


def run(args: Args) -> None:
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


def main(argv: list[str]) -> None:
  """The command line `python -m hscl_jax.prepare ARGV...` (ARGV without the program name)."""
  run(parse_args(argv))


def _main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {" ".join(argv[1:])}')
  run(_args_from_flags())


if __name__ == '__main__':
  app.run(_main)
