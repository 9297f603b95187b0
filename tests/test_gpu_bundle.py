"""tools/gpu_bundle.py's build without a network: project names compared as pip compares
them (PEP 503), the wheels/ folder checked against WHEELS (one wheel each, nothing else),
the 64 MiB a device command carries, and what the bundle holds. Fake wheel files, no pip.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import tarfile
import types

from packaging.utils import canonicalize_name
import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / 'tools')]  # a script, imported as such

from acceptance import accepted  # noqa: E402
import gpu_bundle  # noqa: E402

BUNDLE_SCRIPT = pathlib.Path(gpu_bundle.__file__)

# WHEELS as `pip download` names their files (tensorboardX's in lower case, PEP 427's _).
NODE_WHEELS = (
  'grain-0.2.18-cp312-cp312-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl',
  'array_record-0.8.6-cp312-cp312-manylinux2014_x86_64.manylinux_2_17_x86_64.whl',
  'portpicker-1.6.0-py3-none-any.whl',
  'ml_collections-1.1.0-py3-none-any.whl',
  'tensorboardx-2.6.5-py3-none-any.whl',
  'importlib_resources-7.1.0-py3-none-any.whl',
)


def test_project_names_compare_as_pip_compares_them():
  spellings = {
    'ml-collections': ['ml_collections', 'ML-Collections', 'ml.collections', 'ml__collections'],
    'typing-extensions': ['typing_extensions', 'typing-extensions', 'Typing.Extensions'],
    'flax': ['Flax', 'flax', 'FLAX'],
    'tensorboardx': ['tensorboardX'],
    'zope-interface': ['zope.interface', 'zope_interface', 'zope-_.interface'],
  }
  for expected, names in spellings.items():
    for name in names:
      assert gpu_bundle.canonical(name) == expected == canonicalize_name(name), name
  assert gpu_bundle.wheel_project(NODE_WHEELS[4]) == 'tensorboardx'
  assert gpu_bundle.wheel_project('zope.interface-6.0-cp312-cp312-linux.whl') == 'zope-interface'
  assert gpu_bundle.wheel_project('ml_collections-1.1.0-1-py3-none-any.whl') == 'ml-collections'


def test_the_pins_are_found_whatever_the_spelling(tmp_path):
  constraints = tmp_path / 'constraints.txt'
  constraints.write_text(
    '# comment: grain==0.1.0 is not a pin\nFlax==0.12.12\nML-Collections==1.1.0\n'
    'typing_extensions==4.16.0\nzope.interface==6.0\ntensorboardx==2.6.5\n'
  )
  names = ('flax', 'ml_collections', 'typing-extensions', 'zope_interface', 'tensorboardX')
  assert gpu_bundle.pinned(names, constraints) == [
    'flax==0.12.12', 'ml_collections==1.1.0', 'typing-extensions==4.16.0',
    'zope_interface==6.0', 'tensorboardX==2.6.5',
  ]  # fmt: skip
  with pytest.raises(SystemExit, match=r"pins no version of \['grain'\]: add them there first"):
    gpu_bundle.pinned(('grain', 'flax'), constraints)
  assert gpu_bundle.pinned(gpu_bundle.WHEELS, REPO / 'constraints-py312.txt')  # all pinned


def fake_wheels(folder: pathlib.Path, names=NODE_WHEELS) -> None:
  folder.mkdir(parents=True, exist_ok=True)
  for i, name in enumerate(names):
    (folder / name).write_bytes(b'w' * (100 + i))


def test_the_wheels_folder_holds_one_wheel_of_each_and_nothing_else(tmp_path):
  fake_wheels(tmp_path)
  with accepted('one wheel of each', refusals=(SystemExit,), source=BUNDLE_SCRIPT):
    gpu_bundle.check_wheels(tmp_path, gpu_bundle.WHEELS)  # tensorboardX = tensorboardx
  (tmp_path / NODE_WHEELS[3]).unlink()
  with pytest.raises(SystemExit, match=r"no wheel of \['ml-collections'\]; .*: \[\]"):
    gpu_bundle.check_wheels(tmp_path, gpu_bundle.WHEELS)
  fake_wheels(tmp_path, [NODE_WHEELS[3], 'grain-0.2.17-cp312-cp312-manylinux_2_28_x86_64.whl'])
  with pytest.raises(SystemExit, match=r"no wheel of \[\]; .*: \['grain-0.2.17-.*', 'grain-0.2.18"):
    gpu_bundle.check_wheels(tmp_path, gpu_bundle.WHEELS)  # two versions: pip would refuse
  (tmp_path / 'grain-0.2.17-cp312-cp312-manylinux_2_28_x86_64.whl').unlink()
  (tmp_path / 'numpy-2.3.0-cp312-cp312-manylinux_2_28_x86_64.whl').touch()
  with pytest.raises(SystemExit, match=r"version: \['numpy-2.3.0-cp312"):
    gpu_bundle.check_wheels(tmp_path, gpu_bundle.WHEELS)  # would replace the node's numpy


def test_a_bundle_of_exactly_the_carry_limit_is_taken_and_one_byte_more_refused():
  limit = gpu_bundle.CARRY_LIMIT
  assert limit == 64 * 2**20
  assert gpu_bundle.check_carry(limit - 10 * 2**20, 10 * 2**20) == (
    'carried with the checkout: 64.0 MiB of 64.0 MiB'
  )
  with pytest.raises(SystemExit, match=f'are {limit + 1} bytes, over the 64.0 MiB'):
    gpu_bundle.check_carry(limit - 10 * 2**20 + 1, 10 * 2**20)
  with pytest.raises(SystemExit, match=r'the bundle \(54.0 MiB\) and the checkout \(10.0 MiB\)'):
    gpu_bundle.check_carry(limit - 10 * 2**20 + 1, 10 * 2**20)
  # No git: the bundle alone, in MiB (3.5, where a remainder of 2**20 would read 0.5).
  assert gpu_bundle.check_carry(7 * 2**19, None) == (
    'bundle 3.5 MiB (not in a git checkout: the rest not counted)'
  )


def test_the_tin100_pack_reports_its_build_time(tmp_path, monkeypatch):
  """`build_seconds`: the clock's difference over the pack and its archive (12.5 s from
  100.0 to 112.5), the pack's counts as they come."""
  clock = iter([100.0, 112.5])
  monkeypatch.setattr(gpu_bundle.time, 'monotonic', lambda: next(clock))
  monkeypatch.setattr(gpu_bundle, 'pack_tin100', lambda zip_path, target, classes: {'train': 3})
  monkeypatch.setattr(gpu_bundle, 'archive_folder', lambda folder, archive, name: None)
  added = gpu_bundle.add_tin100(tmp_path / 'bundle', tmp_path / 'tin.zip', None)
  assert added == {'images': {'train': 3}, 'build_seconds': 12.5}


def test_the_checkout_counts_tracked_and_unignored_files(tmp_path):
  git = lambda *words: subprocess.run(
    ['git', *words], cwd=tmp_path, check=True, capture_output=True
  )
  git('init', '-q')
  (tmp_path / '.gitignore').write_text('bundle/\n')  # 8 bytes
  (tmp_path / 'tracked.py').write_bytes(b't' * 100)
  git('add', '.gitignore', 'tracked.py')
  (tmp_path / 'new.md').write_bytes(b'n' * 50)  # untracked, not ignored: carried too
  (tmp_path / 'bundle').mkdir()
  (tmp_path / 'bundle' / 'cifar10.tar.gz').write_bytes(b'b' * 1000)  # counted as the bundle
  assert gpu_bundle.checkout_bytes(tmp_path) == 8 + 100 + 50
  assert gpu_bundle.checkout_bytes(tmp_path / 'bundle') == 0  # ignored below
  outside = tmp_path.parent / f'{tmp_path.name}_not_git'
  outside.mkdir()
  assert gpu_bundle.checkout_bytes(outside) is None


def image_folder(root: pathlib.Path) -> list[str]:
  """train/ and test/ of two classes (bytes, not images: the pack copies files), and a
  file beside them that is not data; returns the archive's expected members."""
  members = []
  for split, count in (('train', 3), ('test', 2)):
    members.append(split)
    for label in ('cat', 'dog'):
      (root / split / label).mkdir(parents=True)
      members.append(f'{split}/{label}')
      for i in range(count):
        (root / split / label / f'{i}.jpg').write_bytes(b'j' * 10)
        members.append(f'{split}/{label}/{i}.jpg')
  (root / 'README.txt').write_text('not data')
  return members


def test_build_packs_the_wheels_and_the_splits_and_checks_both(tmp_path, monkeypatch):
  members = image_folder(tmp_path / 'images')
  monkeypatch.setattr(gpu_bundle, 'download_wheels', lambda out, constraints: fake_wheels(out))
  bundle = tmp_path / 'bundle'
  gpu_bundle.main([f'--bundle={bundle}', 'build', f'--data={tmp_path / "images"}'])
  with tarfile.open(bundle / gpu_bundle.DATA_ARCHIVE) as tar:
    assert sorted(tar.getnames()) == sorted(members)  # relative paths, README left out
  manifest = json.loads((bundle / 'manifest.json').read_text())
  wheel_sizes = {f'wheels/{name}': 100 + i for i, name in enumerate(NODE_WHEELS)}
  archive_size = (bundle / gpu_bundle.DATA_ARCHIVE).stat().st_size
  assert manifest['files'] == dict(wheel_sizes, **{gpu_bundle.DATA_ARCHIVE: archive_size})
  assert manifest['wheels_bytes'] == sum(wheel_sizes.values()) == 615
  assert manifest['total_bytes'] == 615 + archive_size
  assert manifest['data_bytes'] == {gpu_bundle.DATA_ARCHIVE: archive_size}
  # The whole bundle (the manifest too) and the checkout against the limit: at it, taken.
  carried = 615 + archive_size + (bundle / 'manifest.json').stat().st_size + 1000
  monkeypatch.setattr(gpu_bundle, 'checkout_bytes', lambda repo: 1000)
  monkeypatch.setattr(gpu_bundle, 'CARRY_LIMIT', carried)
  gpu_bundle.main([f'--bundle={bundle}', 'build', f'--data={tmp_path / "images"}'])
  monkeypatch.setattr(gpu_bundle, 'CARRY_LIMIT', carried - 1)
  with pytest.raises(SystemExit, match=f'are {carried} bytes, over the 0.0 MiB'):
    gpu_bundle.main([f'--bundle={bundle}', 'build', f'--data={tmp_path / "images"}'])
  short = lambda out, constraints: fake_wheels(out, NODE_WHEELS[1:])
  monkeypatch.setattr(gpu_bundle, 'download_wheels', short)
  (bundle / gpu_bundle.DATA_ARCHIVE).unlink()
  for wheel in (bundle / 'wheels').glob('*.whl'):
    wheel.unlink()  # as download_wheels does
  with pytest.raises(SystemExit, match=r"no wheel of \['grain'\]"):
    gpu_bundle.main([f'--bundle={bundle}', 'build', f'--data={tmp_path / "images"}'])
  assert not (bundle / gpu_bundle.DATA_ARCHIVE).exists()  # refused before packing


def test_install_unpacks_the_data_sets_named_and_none_when_none_is(tmp_path):
  image_folder(tmp_path / 'images')
  (tmp_path / 'bundle').mkdir()
  gpu_bundle.pack_data(tmp_path / 'images', tmp_path / 'bundle' / gpu_bundle.DATA_ARCHIVE)
  install = lambda target, *words: gpu_bundle.main([
    f'--bundle={tmp_path / "bundle"}', 'install', f'--site={tmp_path / "site"}',
    f'--data_to={tmp_path / target}', *words,
  ])  # fmt: skip
  install('none', '--data_sets=')  # the wheels alone (here none)
  assert not (tmp_path / 'none').exists()
  install('cifar10', '--data_sets=cifar10')
  assert sorted(p.name for p in (tmp_path / 'cifar10' / 'train' / 'cat').iterdir()) == [
    '0.jpg', '1.jpg', '2.jpg'
  ]  # fmt: skip
  with pytest.raises(SystemExit):
    install('other', '--data_sets=cifar100')


def test_install_refuses_wheels_on_another_python_naming_the_version_running(tmp_path, monkeypatch):
  """The wheels are CPython 3.12's: another Python is refused before pip, by a message that
  names the version running (sys.version's first word, not its compiler's)."""
  (tmp_path / 'bundle' / 'wheels').mkdir(parents=True)
  (tmp_path / 'bundle' / 'wheels' / 'grain-0.2.16-py3-none-any.whl').write_bytes(b'')
  running = types.SimpleNamespace(
    version_info=(3, 13, 1, 'final', 0),
    version='3.13.1 (main, Dec  3 2024, 17:59:52) [GCC 14.2.0]',
    executable='/nowhere/python3.13',  # pip is never started
  )
  monkeypatch.setattr(gpu_bundle, 'sys', running)
  message = r'for CPython 3\.12, this is 3\.13\.1: run this with the Python 3\.12'
  with pytest.raises(SystemExit, match=message):
    gpu_bundle.main([f'--bundle={tmp_path / "bundle"}', 'install', '--data_sets=',
                     f'--site={tmp_path / "site"}', f'--data_to={tmp_path / "data"}'])  # fmt: skip
  assert not (tmp_path / 'site').exists()
