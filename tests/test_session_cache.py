"""tests/conftest.py's compilation cache: one directory for the session, used by every
worker, removed at the end (a run that left one per session would fill /tmp); and its
compiler flags, which the programs the tests start inherit."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import xla_flags

REPO = pathlib.Path(__file__).resolve().parents[1]

# A pytest plugin each process of the inner session loads (-p): after each test it
# compiles a program and records the cache directory, what it holds, and the process.
PROBE = """
import json, os, pathlib

def pytest_runtest_teardown(item):
  import jax
  jax.jit(lambda x: x * 3 + 1)(2.0).block_until_ready()
  directory = os.environ['JAX_COMPILATION_CACHE_DIR']
  record = dict(pid=os.getpid(), directory=directory, entries=len(os.listdir(directory)))
  out = pathlib.Path(os.environ['PROBE_OUT'], item.name + '.json')
  out.write_text(json.dumps(record))
"""


def _probed_session(tmp_path, **env_extra):
  """Runs two cheap tests of two files on 2 workers with the probe; its records."""
  for name in ('plugin', 'tmp', 'out'):
    (tmp_path / name).mkdir()
  (tmp_path / 'plugin' / 'cache_probe.py').write_text(PROBE)
  env = {k: v for k, v in os.environ.items() if not k.startswith('JAX_PERSISTENT_CACHE')}
  env.pop('JAX_COMPILATION_CACHE_DIR', None)
  env.update(
    TMPDIR=str(tmp_path / 'tmp'),
    PROBE_OUT=str(tmp_path / 'out'),
    PYTHONPATH=os.pathsep.join([str(tmp_path / 'plugin'), env.get('PYTHONPATH', '')]),
    **env_extra,
  )
  selected = [  # two files, so two groups: one per worker
    'tests/end_to_end/test_readme_setup.py::test_the_test_command_says_it_runs_in_parallel_and_how_long_it_takes',
    'tests/test_launch.py::test_extra_overrides_and_label_positives',
  ]
  result = subprocess.run(
    [sys.executable, '-m', 'pytest', '-q', '-n', '2', '-p', 'cache_probe', *selected],
    cwd=REPO,
    env=env,
    capture_output=True,
    text=True,
    check=False,
  )
  assert result.returncode == 0, result.stdout + result.stderr
  records = [json.loads(p.read_text()) for p in (tmp_path / 'out').iterdir()]
  assert len(records) == 2 and len({r['pid'] for r in records}) == 2, records
  assert all(r['entries'] >= 1 for r in records), records  # every compilation kept
  (directory,) = {r['directory'] for r in records}
  return pathlib.Path(directory)


def test_workers_share_one_cache_in_tmpdir_that_is_removed_after(tmp_path):
  directory = _probed_session(tmp_path)
  assert directory.parent == tmp_path / 'tmp', directory
  assert directory.name.startswith('hscl_jax_tests_xla_cache_')
  assert not directory.exists()


def test_a_cache_the_user_set_is_used_and_kept(tmp_path):
  """With its own settings: conftest sets none where the user set the directory."""
  mine = tmp_path / 'mine'
  settings = dict(
    JAX_COMPILATION_CACHE_DIR=str(mine),
    JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS='0',
    JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES='0',
  )
  assert _probed_session(tmp_path, **settings) == mine
  assert len(list(mine.iterdir())) >= 1
  assert not list((tmp_path / 'tmp').glob('hscl_jax_tests_xla_cache_*'))


def test_the_settings_are_o1_with_the_classic_emitters_or_o0_and_the_users_are_kept():
  """xla_flags.session_flags: each branch, the user's settings, and the session's own flags
  (set by conftest) left as they are; a started program inherits them."""
  yes, no = (lambda flag: True), (lambda flag: False)
  devices = '--xla_force_host_platform_device_count=4'
  classic = f'{devices} {xla_flags.CLASSIC_EMITTERS} --xla_backend_optimization_level=1'
  assert xla_flags.session_flags('', yes) == classic
  assert xla_flags.session_flags('', no) == f'{devices} --xla_backend_optimization_level=0'
  users = '--xla_backend_optimization_level=2 --xla_force_host_platform_device_count=8'
  assert xla_flags.session_flags(users, yes) == users
  mlir = '--xla_cpu_use_fusion_emitters=true'
  assert (
    xla_flags.session_flags(mlir, yes) == f'{mlir} {devices} --xla_backend_optimization_level=0'
  )
  session = os.environ['XLA_FLAGS']
  assert 'xla_backend_optimization_level' in session, session
  assert xla_flags.session_flags(session, yes) == session  # a worker keeps the session's
  started = xla_flags.with_devices(2).split()
  assert started == [f for f in session.split() if 'device_count' not in f] + [
    '--xla_force_host_platform_device_count=2'
  ]


def test_a_flag_xla_does_not_know_is_not_accepted():
  assert xla_flags.accepted('--xla_force_host_platform_device_count=2')
  assert not xla_flags.accepted('--xla_cpu_no_such_flag=1')
