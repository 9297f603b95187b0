"""What a GPU node without internet lacks, packed beside the repository, and unpacked there.

    python tools/gpu_bundle.py build --data=CIFAR10_FOLDER   # where pip reaches PyPI
    python3 tools/gpu_bundle.py install                     # on the node: no network

The node (docs/scale.md, "The first hour on a new GPU or TPU") has Python 3.12 with jax
0.11 for CUDA 13, flax, optax, orbax-checkpoint, chex, numpy, scikit-learn, matplotlib,
torch and torchvision (NODE_HAS below: that image's package list). `build` writes into
bundle/ (ignored by git; the device tool carries it with `carry=['bundle']`):

- wheels/: one wheel of each package in WHEELS, the dependencies of the training and
  benchmark path (`hscl_jax.train`, `hscl_jax.main`, `linear_eval`, benchmarks/) that the
  node lacks, for CPython 3.12 on manylinux x86-64, at the versions of
  constraints-py312.txt, without their dependencies (those are on the node);
- cifar10.tar.gz: an image folder (train/<class>/*, test/<class>/*, the layout of
  configs/cifar10_folder.py), gzipped: the many small JPEGs of CIFAR-10 share their
  headers, which a solid archive stores once (the 60,000 JPEGs, 55 MB of files: 20 MB);
- manifest.json: each file's size.

`install` puts the wheels into a target folder with pip (`--no-index --no-deps`: nothing
is fetched, the node's own jax and the rest stay as they are) and unpacks the data; then
`export PYTHONPATH=SITE` (the folder it prints) makes them importable. TensorFlow Datasets
is not bundled: the folder dataset does not need it (only `python -m hscl_jax.prepare` and
the TFDS configs do).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys
import tarfile

REPO = pathlib.Path(__file__).resolve().parents[1]
BUNDLE = REPO / 'bundle'
DATA_ARCHIVE = 'cifar10.tar.gz'
SPLITS = ('train', 'test')
# The node's packages that the project imports (the rest of its image list is not ours).
NODE_HAS = (
  'absl-py', 'chex', 'cloudpickle', 'etils', 'flax', 'fsspec', 'jax', 'jaxlib', 'matplotlib',
  'msgpack', 'numpy', 'optax', 'orbax-checkpoint', 'packaging', 'pillow', 'protobuf', 'psutil',
  'pyyaml', 'scikit-learn', 'tensorstore', 'torch', 'torchvision', 'typing-extensions', 'zipp',
)  # fmt: skip
# What the node lacks: ml_collections (configs), grain (the loaders) and its array_record
# and portpicker, tensorboardX (metrics), importlib_resources (etils' epath needs it).
WHEELS = (
  'grain', 'array_record', 'portpicker', 'ml_collections', 'tensorboardX', 'importlib_resources',
)  # fmt: skip
# The platforms pip may take a wheel for (it matches a manylinux tag only as written).
PLATFORMS = (
  'manylinux_2_28_x86_64', 'manylinux_2_27_x86_64', 'manylinux_2_17_x86_64',
  'manylinux2014_x86_64', 'manylinux1_x86_64',
)  # fmt: skip


def pinned(names, constraints: pathlib.Path) -> list[str]:
  """NAME==VERSION for each name, from the constraints file (names compared as pip does)."""
  canonical = lambda name: name.lower().replace('_', '-')
  versions = {}
  for line in constraints.read_text().splitlines():
    if '==' in line and not line.startswith('#'):
      name, version = line.split('==')
      versions[canonical(name)] = version.strip()
  missing = [name for name in names if canonical(name) not in versions]
  if missing:
    raise SystemExit(f'{constraints} pins no version of {missing}: add them there first')
  return [f'{name}=={versions[canonical(name)]}' for name in names]


def download_wheels(out: pathlib.Path, constraints: pathlib.Path) -> None:
  out.mkdir(parents=True, exist_ok=True)
  for old in out.glob('*.whl'):
    old.unlink()  # one version of each: two would stop the install
  platforms = [f'--platform={platform}' for platform in PLATFORMS]
  subprocess.run(
    [sys.executable, '-m', 'pip', 'download', '-q', '--no-deps', '--only-binary=:all:',
     '--python-version=3.12', '--implementation=cp', *platforms, f'--dest={out}',
     *pinned(WHEELS, constraints)],
    check=True,
  )  # fmt: skip


def pack_data(folder: pathlib.Path, archive: pathlib.Path) -> None:
  """folder's train/ and test/ as archive (gzip), paths relative to folder."""
  missing = [split for split in SPLITS if not (folder / split).is_dir()]
  if missing:
    raise SystemExit(f'--data={folder} has no {"/, ".join(missing)}/ folder: pass the root of '
                     'an image folder with train/<class>/ and test/<class>/')  # fmt: skip
  with tarfile.open(archive, 'w:gz', compresslevel=6) as tar:
    for split in SPLITS:
      tar.add(folder / split, arcname=split)


def sizes(bundle: pathlib.Path) -> dict[str, int]:
  return {
    str(path.relative_to(bundle)): path.stat().st_size
    for path in sorted(bundle.rglob('*'))
    if path.is_file() and path.name != 'manifest.json'
  }


def build(args) -> None:
  bundle = pathlib.Path(args.bundle)
  download_wheels(bundle / 'wheels', pathlib.Path(args.constraints))
  pack_data(pathlib.Path(args.data), bundle / DATA_ARCHIVE)
  files = sizes(bundle)
  wheels = sum(size for name, size in files.items() if name.endswith('.whl'))
  manifest = dict(files=files, wheels_bytes=wheels, data_bytes=files[DATA_ARCHIVE])
  (bundle / 'manifest.json').write_text(json.dumps(manifest, indent=2) + '\n')
  mib = lambda n: f'{n / 2**20:.1f} MiB'
  print(f'{bundle}: {len(files) - 1} wheels {mib(wheels)}, data {mib(files[DATA_ARCHIVE])}, '
        f'in all {mib(sum(files.values()))}')  # fmt: skip


def install(args) -> None:
  """The data into args.data_to, then the wheels into args.site (pip, no index, no
  dependencies); the data first, so that it is there whatever pip says."""
  bundle, site = pathlib.Path(args.bundle), pathlib.Path(args.site)
  archive = bundle / DATA_ARCHIVE
  if archive.is_file():
    with tarfile.open(archive) as tar:
      tar.extractall(args.data_to, filter='data')
    print(f'data: {pathlib.Path(args.data_to)}')
  else:
    print(f'data: none in {bundle}')
  wheels = sorted(str(path) for path in (bundle / 'wheels').glob('*.whl'))
  if wheels and sys.version_info[:2] != (3, 12):
    raise SystemExit(f'the wheels are for CPython 3.12, this is {sys.version.split()[0]}: run '
                     'this with the Python 3.12 that will use them')  # fmt: skip
  if wheels:
    subprocess.run(
      [sys.executable, '-m', 'pip', 'install', '-q', '--no-index', '--no-deps', '--no-compile',
       '--no-cache-dir', '--upgrade', f'--target={site}', *wheels],
      check=True,
    )  # fmt: skip
  print(f'installed {len(wheels)} wheels into {site}: export PYTHONPATH={site}')


def parse_args(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--bundle', default=str(BUNDLE), help='the bundle folder')
  commands = parser.add_subparsers(dest='command', required=True)
  build_parser = commands.add_parser('build', help='download and pack (needs PyPI)')
  build_parser.add_argument('--data', required=True, help='CIFAR-10 image folder root')
  build_parser.add_argument(
    '--constraints', default=str(REPO / 'constraints-py312.txt'), help='the versions'
  )
  install_parser = commands.add_parser('install', help='install and unpack (no network)')
  install_parser.add_argument('--site', default='/tmp/hscl_site', help='the wheels go here')
  install_parser.add_argument('--data_to', default='/tmp/hscl_data', help='the data goes here')
  return parser.parse_args(argv)


def main(argv=None):
  args = parse_args(argv)
  (build if args.command == 'build' else install)(args)


if __name__ == '__main__':
  main()
