"""What a GPU node without internet lacks, packed beside the repository, and unpacked there.

    python tools/gpu_bundle.py build --data=CIFAR10_FOLDER \
        --tin100_zip=../shared/data/tiny_imagenet/tiny-imagenet-200.zip   # where pip reaches PyPI
    python tools/gpu_bundle.py tin100 --zip=TINY_IMAGENET_ZIP --folder=/tmp/tin100  # no network
    python3 tools/gpu_bundle.py install                     # on the node: no network

The node (docs/scale.md, "The first hour on a new GPU or TPU") has Python 3.12 with jax
0.11 for CUDA 13, flax, optax, orbax-checkpoint, chex, numpy, scikit-learn, matplotlib,
torch and torchvision (NODE_HAS below: that image's package list). `build` writes into
bundle/ (ignored by git; the device tool carries it with `carry=['bundle']`):

- wheels/: one wheel of each package in WHEELS, the dependencies of the training and
  benchmark path (`hscl_jax.training`, `hscl_jax.main`, `linear_eval`, benchmarks/) that the
  node lacks, for CPython 3.12 on manylinux x86-64, at the versions of
  constraints-py312.txt, without their dependencies (those are on the node);
- cifar10.tar.gz: an image folder (train/<class>/*, test/<class>/*, the layout of
  configs/cifar10_folder.py), gzipped: the many small JPEGs of CIFAR-10 share their
  headers, which a solid archive stores once (the 60,000 JPEGs, 55 MB of files: 20 MB);
- tin100.tar.gz (`--tin100_zip`, or the `tin100` command alone, which needs no network):
  Tiny-ImageNet-100 in CIFAR-100's shape, the data of configs/tin100.py: the first 100
  classes of the zip's wnids.txt, their 250 training images each (train/) and their 50
  validation images each (test/), 25,000 + 5,000 images resized 64 -> 32 px with PIL's
  bilinear filter, which widens with the reduction (a 4 x 4 triangle for a halving, as
  tf.image.resize's antialias=True: antialiased, no aliasing of fine texture), saved as
  JPEG at quality 75 as the CIFAR-10 pack, under tin100/ with the classes' wnids.txt and
  words.txt (their order and names); `--folder` keeps the unpacked pack too (the local
  merge of tools/gpu_grid.py reads it);
- manifest.json: each file's size, the whole's, and the pack's images and build seconds.

`build` refuses a wheels/ folder that lacks one of WHEELS or holds another wheel (names
compared as pip compares them, PEP 503: tensorboardX's wheel is tensorboardx-*.whl), and
a bundle that, with the checkout's files, passes the 64 MiB a device command carries.

`install` puts the wheels into a target folder with pip (`--no-index --no-deps`: nothing
is fetched, the node's own jax and the rest stay as they are) and unpacks the data
(CIFAR-10 into --data_to itself, Tiny-ImageNet-100 into --data_to/tin100; `--data_sets`
picks some); then `export PYTHONPATH=SITE` (the folder it prints) makes them importable.
TensorFlow Datasets is not bundled: the folder dataset does not need it (only
`python -m hscl_jax.prepare` and the TFDS configs do).
"""

from __future__ import annotations

import argparse
import io
import json
import pathlib
import re
import subprocess
import sys
import tarfile
import time
import zipfile

REPO = pathlib.Path(__file__).resolve().parents[1]
BUNDLE = REPO / 'bundle'
DATA_ARCHIVE = 'cifar10.tar.gz'
SPLITS = ('train', 'test')
# Tiny-ImageNet-100: the folder's name is also what a run's config records (its basename).
TIN100 = 'tin100'
TIN100_ARCHIVE = f'{TIN100}.tar.gz'
TIN100_CLASSES = 100
TIN100_SIZE = 32
JPEG_QUALITY = 75  # the CIFAR-10 pack's ("CIFAR-10 (JPEG q75)")
# The data archives `install` knows: name -> (file, where it unpacks below --data_to).
DATA_SETS = {'cifar10': (DATA_ARCHIVE, '.'), TIN100: (TIN100_ARCHIVE, '.')}
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
CARRY_LIMIT = 64 * 2**20  # bytes a device command carries: the checkout and the bundle


def canonical(name: str) -> str:
  """A project name as pip compares it (PEP 503): runs of -, _ and . as one -, lower case
  (ml_collections = ML-Collections, tensorboardX = tensorboardx, zope.interface =
  zope-interface)."""
  return re.sub(r'[-_.]+', '-', name).lower()


def wheel_project(filename: str) -> str:
  """The canonical project of a wheel file (PEP 427: NAME-VERSION[-BUILD]-PY-ABI-PLATFORM
  .whl, the name's - written _)."""
  return canonical(filename.split('-')[0])


def check_wheels(folder: pathlib.Path, names) -> None:
  """folder holds one wheel of each of `names` and no other wheel, or SystemExit naming the
  missing and the extra ones (`install` installs whatever lies there)."""
  found = sorted(path.name for path in folder.glob('*.whl'))
  projects = [wheel_project(name) for name in found]
  wanted = {canonical(name) for name in names}
  missing = sorted(wanted - set(projects))
  extra = [name for name, project in zip(found, projects, strict=True)
           if project not in wanted or projects.count(project) > 1]  # fmt: skip
  if missing or extra:
    raise SystemExit(f'{folder}: no wheel of {missing}; not wanted or a second version: '
                     f'{extra}. One wheel of each of {", ".join(names)} belongs there: '
                     'delete the others and build again')  # fmt: skip


def checkout_bytes(repo: pathlib.Path) -> int | None:
  """The bytes a device command copies from the checkout besides bundle/: the files git
  tracks and the untracked ones it does not ignore; None outside a git checkout."""
  command = ['git', 'ls-files', '-z', '--cached', '--others', '--exclude-standard']
  try:
    listed = subprocess.run(command, cwd=repo, capture_output=True, check=True).stdout
  except (OSError, subprocess.CalledProcessError):
    return None
  paths = {repo / name for name in listed.decode().split('\0') if name}
  return sum(path.stat().st_size for path in paths if path.is_file())


def check_carry(bundle_bytes: int, tree_bytes: int | None) -> str:
  """What a device command would carry (the bundle and the checkout), or SystemExit above
  CARRY_LIMIT, where the device tool would refuse to start it."""
  if tree_bytes is None:
    return f'bundle {bundle_bytes / 2**20:.1f} MiB (not in a git checkout: the rest not counted)'
  total, mib = bundle_bytes + tree_bytes, lambda n: f'{n / 2**20:.1f} MiB'
  if total > CARRY_LIMIT:
    raise SystemExit(f'the bundle ({mib(bundle_bytes)}) and the checkout ({mib(tree_bytes)}) '
                     f'are {total} bytes, over the {mib(CARRY_LIMIT)} a device command '
                     'carries: drop a data set (build without --tin100_zip) or clean the '
                     'checkout')  # fmt: skip
  return f'carried with the checkout: {mib(total)} of {mib(CARRY_LIMIT)}'


def pinned(names, constraints: pathlib.Path) -> list[str]:
  """NAME==VERSION for each name, from the constraints file (names compared as pip does)."""
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


def downsized(image_bytes: bytes, size: int = TIN100_SIZE):
  """One image as RGB at size x size: PIL's bilinear filter spans the whole reduction
  (antialiased), unlike a bilinear that samples 2 x 2 source pixels. Grayscale -> RGB."""
  from PIL import Image

  with Image.open(io.BytesIO(image_bytes)) as image:
    return image.convert('RGB').resize((size, size), Image.Resampling.BILINEAR)


def tin_members(archive: zipfile.ZipFile, classes: int):
  """(the first `classes` wnids of the zip's wnids.txt, {split: [(member, wnid)]}): each
  class's train/<wnid>/images/* as train, its val/images/* (val_annotations.txt) as test."""
  names = archive.namelist()
  listing = sorted((n for n in names if n.endswith('wnids.txt')), key=lambda n: n.count('/'))
  if not listing:
    raise SystemExit(f'{archive.filename} holds no wnids.txt: pass tiny-imagenet-200.zip')
  root = listing[0][: -len('wnids.txt')]
  wnids = archive.read(listing[0]).decode().split()[:classes]
  if len(wnids) < classes:
    raise SystemExit(f'{listing[0]} lists {len(wnids)} classes, fewer than {classes}')
  wanted = set(wnids)
  train = [
    (name, name[len(root) :].split('/')[1])
    for name in sorted(names)
    if name.startswith(f'{root}train/') and name.lower().endswith('.jpeg')
    and name[len(root) :].split('/')[1] in wanted
  ]  # fmt: skip
  annotations = archive.read(f'{root}val/val_annotations.txt').decode().splitlines()
  labelled = (line.split('\t')[:2] for line in annotations if line.strip())
  test = sorted((f'{root}val/images/{file}', wnid) for file, wnid in labelled if wnid in wanted)
  return wnids, root, dict(train=train, test=test)


def pack_tin100(zip_path: pathlib.Path, folder: pathlib.Path, classes: int = TIN100_CLASSES):
  """The zip's first `classes` classes as an image folder (train/<wnid>/, test/<wnid>/,
  wnids.txt, words.txt), every image at TIN100_SIZE px, JPEG at JPEG_QUALITY.
  Returns {split: images}."""
  counts = {}
  with zipfile.ZipFile(zip_path) as archive:
    wnids, root, members = tin_members(archive, classes)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / 'wnids.txt').write_text(''.join(f'{wnid}\n' for wnid in wnids))
    words = archive.read(f'{root}words.txt').decode().splitlines()
    wanted = set(wnids)
    named = [line for line in words if line.split('\t')[0] in wanted]
    (folder / 'words.txt').write_text(''.join(f'{line}\n' for line in named))
    for split, pairs in members.items():
      for member, wnid in pairs:
        target = folder / split / wnid / (pathlib.PurePosixPath(member).stem + '.jpg')
        target.parent.mkdir(parents=True, exist_ok=True)
        downsized(archive.read(member)).save(target, 'JPEG', quality=JPEG_QUALITY)
      counts[split] = len(pairs)
  return counts


def archive_folder(folder: pathlib.Path, archive: pathlib.Path, name: str) -> None:
  """folder as archive (gzip), its contents under name/."""
  with tarfile.open(archive, 'w:gz', compresslevel=6) as tar:
    tar.add(folder, arcname=name)


def sizes(bundle: pathlib.Path) -> dict[str, int]:
  return {
    str(path.relative_to(bundle)): path.stat().st_size
    for path in sorted(bundle.rglob('*'))
    if path.is_file() and path.name != 'manifest.json'
  }


def write_manifest(bundle: pathlib.Path, **extra) -> dict:
  """bundle/manifest.json: every file's size, the wheels' and each data archive's, the
  whole; `extra` (e.g. the pack's image counts) merged into what it held."""
  path = bundle / 'manifest.json'
  manifest = json.loads(path.read_text()) if path.is_file() else {}
  files = sizes(bundle)
  wheels = sum(size for name, size in files.items() if name.endswith('.whl'))
  archives = [archive for archive, _ in DATA_SETS.values() if archive in files]
  manifest.update(extra, files=files, wheels_bytes=wheels, total_bytes=sum(files.values()))
  manifest['data_bytes'] = {archive: files[archive] for archive in archives}
  path.write_text(json.dumps(manifest, indent=2) + '\n')
  mib = lambda n: f'{n / 2**20:.1f} MiB'
  data = ', '.join(f'{archive} {mib(files[archive])}' for archive in archives)
  print(f'{bundle}: {len(files) - len(archives)} wheels {mib(wheels)}, {data or "no data"}; '
        f'in all {mib(sum(files.values()))}')  # fmt: skip
  return manifest


def add_tin100(
  bundle: pathlib.Path, zip_path: pathlib.Path, folder: str | None, classes: int = TIN100_CLASSES
) -> dict:
  """bundle/tin100.tar.gz from the zip (the unpacked pack kept in `folder` if given);
  returns what the manifest records of it: images per split, seconds to build."""
  import tempfile

  start = time.monotonic()
  with tempfile.TemporaryDirectory() as scratch:
    target = pathlib.Path(folder) if folder else pathlib.Path(scratch) / TIN100
    if target.name != TIN100:
      raise SystemExit(f'--folder={folder}: name the folder {TIN100} (e.g. /tmp/{TIN100}): '
                       "its name is what the runs' configs record")  # fmt: skip
    counts = pack_tin100(zip_path, target, classes)
    bundle.mkdir(parents=True, exist_ok=True)
    archive_folder(target, bundle / TIN100_ARCHIVE, TIN100)
  return dict(images=counts, build_seconds=round(time.monotonic() - start, 1))


def build(args) -> None:
  bundle = pathlib.Path(args.bundle)
  download_wheels(bundle / 'wheels', pathlib.Path(args.constraints))
  check_wheels(bundle / 'wheels', WHEELS)
  pack_data(pathlib.Path(args.data), bundle / DATA_ARCHIVE)
  extra = {}
  if args.tin100_zip:
    extra[TIN100] = add_tin100(bundle, pathlib.Path(args.tin100_zip), args.tin100_folder)
  finish(bundle, **extra)


def tin100(args) -> None:
  bundle = pathlib.Path(args.bundle)
  packed = add_tin100(bundle, pathlib.Path(args.zip), args.folder, args.classes)
  finish(bundle, **{TIN100: packed})


def finish(bundle: pathlib.Path, **extra) -> None:
  """The manifest written (`extra` merged into it), then what a device command would carry
  checked against CARRY_LIMIT."""
  manifest = write_manifest(bundle, **extra)
  bundle_bytes = manifest['total_bytes'] + (bundle / 'manifest.json').stat().st_size
  print(check_carry(bundle_bytes, checkout_bytes(REPO)))


def install(args) -> None:
  """The data into args.data_to, then the wheels into args.site (pip, no index, no
  dependencies); the data first, so that it is there whatever pip says."""
  bundle, site = pathlib.Path(args.bundle), pathlib.Path(args.site)
  unpacked = [name for name in args.data_sets if unpack(bundle, name, args.data_to)]
  print(f'data: {", ".join(unpacked) or "none"} from {bundle} into {pathlib.Path(args.data_to)}')
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


def unpack(bundle: pathlib.Path, name: str, data_to: str) -> bool:
  """The data set `name`'s archive unpacked below data_to, if the bundle holds it."""
  archive, below = DATA_SETS[name]
  if not (bundle / archive).is_file():
    return False
  with tarfile.open(bundle / archive) as tar:
    tar.extractall(pathlib.Path(data_to) / below, filter='data')
  return True


def parse_args(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--bundle', default=str(BUNDLE), help='the bundle folder')
  commands = parser.add_subparsers(dest='command', required=True)
  build_parser = commands.add_parser('build', help='download and pack (needs PyPI)')
  build_parser.add_argument('--data', required=True, help='CIFAR-10 image folder root')
  build_parser.add_argument(
    '--constraints', default=str(REPO / 'constraints-py312.txt'), help='the versions'
  )
  build_parser.add_argument('--tin100_zip', help='tiny-imagenet-200.zip: pack Tiny-ImageNet-100')
  build_parser.add_argument('--tin100_folder', help='keep the unpacked pack here (.../tin100)')
  tin_parser = commands.add_parser('tin100', help='pack Tiny-ImageNet-100 alone (no network)')
  tin_parser.add_argument('--zip', required=True, help='tiny-imagenet-200.zip')
  tin_parser.add_argument('--folder', help='keep the unpacked pack here (a folder named tin100)')
  tin_parser.add_argument('--classes', type=int, default=TIN100_CLASSES, help='the first N')
  install_parser = commands.add_parser('install', help='install and unpack (no network)')
  install_parser.add_argument('--site', default='/tmp/hscl_site', help='the wheels go here')
  install_parser.add_argument('--data_to', default='/tmp/hscl_data', help='the data goes here')
  install_parser.add_argument(
    '--data_sets', type=lambda text: [name for name in text.split(',') if name],
    default=list(DATA_SETS),
    help=f'which of {",".join(DATA_SETS)} to unpack (those the bundle holds; empty: none)',
  )  # fmt: skip
  args = parser.parse_args(argv)
  unknown = sorted(set(getattr(args, 'data_sets', ())) - set(DATA_SETS))
  if unknown:
    parser.error(f'--data_sets names {unknown}: choose from {",".join(DATA_SETS)}')
  return args


def main(argv=None):
  args = parse_args(argv)
  dict(build=build, tin100=tin100, install=install)[args.command](args)


if __name__ == '__main__':
  main()
