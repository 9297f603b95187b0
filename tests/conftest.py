"""Test set-up: 4 fake CPU devices, set before JAX is imported anywhere; a trained digits run
shared by the tests that read one."""

from __future__ import annotations

import os
import pathlib
import shutil
import sys
import tempfile

import covering
import pytest
import xla_flags

os.environ.setdefault('JAX_PLATFORMS', 'cpu')
# 4 fake devices and the compiler settings (tests/xla_flags.py), chosen once by the process
# that starts the session: its workers and the programs the tests start inherit them.
os.environ['XLA_FLAGS'] = xla_flags.session_flags(os.environ.get('XLA_FLAGS', ''))

# One XLA compilation cache for the session, every compilation kept: the workers and the
# programs the tests start (many compile the same digits run) read what another process
# compiled. The process that made it (the controller, or the only process with -n 0)
# removes it at the end; a cache the user set is used as it is.
_OWN_CACHE = None
if 'JAX_COMPILATION_CACHE_DIR' not in os.environ:
  _OWN_CACHE = tempfile.mkdtemp(prefix='hscl_jax_tests_xla_cache_')
  os.environ['JAX_COMPILATION_CACHE_DIR'] = _OWN_CACHE
  os.environ.setdefault('JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS', '0')
  os.environ.setdefault('JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES', '0')


def pytest_sessionfinish(session, exitstatus):
  del session, exitstatus
  if _OWN_CACHE is not None:
    shutil.rmtree(_OWN_CACHE, ignore_errors=True)


REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which reads the groups
def pytest_collection_modifyitems(config, items):
  """Every test in its file's xdist group (pytest.ini's `--dist loadgroup`: a worker
  builds the file's module fixtures once); the files that read the session's digits run
  share one group, so it is trained once. The cases of a `covering` test outside its
  cover are marked slow (tests/covering.py), before `-m` deselects."""
  covering.mark_beyond_the_cover(items, every_test=config.getoption('covering_only'))

  def file_of(item):
    """Its path under tests/: test_layout.py and rundir/test_layout.py are two files."""
    return item.nodeid.split('::')[0].removeprefix('tests/')

  shared = {file_of(item) for item in items if 'digits_run' in item.fixturenames}
  group = {item: 'digits_run' if file_of(item) in shared else file_of(item) for item in items}
  for item in items:
    item.add_marker(pytest.mark.xdist_group(group[item]))
  # The longest groups first (pytest_configure keeps xdist from reordering them): a long
  # file handed out last kept one worker busy while the other had finished (a stable sort:
  # each file's tests keep their order).
  items.sort(key=lambda item: _rank(group[item]))
  if config.getoption('reverse_within_files'):
    items[:] = reversed_within_files(items)


def reversed_within_files(items):
  """Each file's tests in reverse order, the files in theirs: a test that changes what its
  file's shared fixtures hold fails the tests that ran before it."""
  by_file = {}
  for item in items:
    by_file.setdefault(item.nodeid.split('::')[0], []).append(item)
  return [item for tests in by_file.values() for item in reversed(tests)]


# The groups that took longest, longest first (summed test times, 2 cores, 2026-11-29; the
# SLURM jobs first also overlap their waits for the scheduler with the other worker's work).
LONGEST_FIRST = (
  'test_slurm.py',
  'end_to_end/test_train.py',
  'losses/test_queue.py',
  'training/test_queue.py',
  'losses/test_kernel.py',
  'losses/test_composition.py',
  'losses/test_transforms.py',
  'graphs/test_train.py',
  'models/test_resnet.py',
  'end_to_end/test_multiprocess.py',
  'losses/test_processes.py',
  'test_benchmarks.py',
  'digits_run',
)


def pytest_addoption(parser):
  parser.addoption(
    '--covering-only',
    action='store_true',
    help='every parametrised test runs the cover of its cases only (tests/covering.py); '
    '-m slow adds the rest',
  )
  parser.addoption(
    '--reverse-within-files',
    action='store_true',
    help="each file's tests in reverse order: finds tests that depend on their order",
  )


def pytest_configure(config):
  """xdist keeps the collection's order of the groups."""
  keep_the_group_order(config)


def keep_the_group_order(config):
  """xdist (3.6 and newer) orders the groups by their number of tests unless told not to;
  its floor in setup.py has no such option and keeps the collection's order."""
  if hasattr(config.option, 'loadscopereorder'):
    config.option.loadscopereorder = False


def _rank(group):
  return LONGEST_FIRST.index(group) if group in LONGEST_FIRST else len(LONGEST_FIRST)


def pytest_xdist_auto_num_workers(config):
  """`-n auto` (pytest.ini): one worker per core, at most 4. Most of a test's time is XLA
  compiling a program on one core: one process keeps 2 cores 60 % busy, 2 workers 85 %,
  and 3 workers on 2 cores took 10 % longer than 2 (the times:
  docs/results/test_suite/measurements.md). Each worker holds its own JAX (1-5 GB), and
  beyond 4 the longest file (tests/end_to_end/test_train.py, ~4 min) sets the wall time anyway."""
  del config
  cores = len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count()
  return max(1, min(4, cores or 1))


@pytest.hookimpl(trylast=True)
def pytest_xdist_setupnodes(config, specs):
  """One "bringing up nodes..." line: xdist's reporter writes it at start-up and, when the
  output is not a terminal (CI, a log file), again after collection."""
  del specs
  reporter = config.pluginmanager.get_plugin('terminaldistreporter')
  if reporter is not None:
    reporter.ensure_show_status = lambda: None  # its first line is already written


@pytest.fixture(scope='session')
def digits_run(tmp_path_factory):
  """One epoch of H-SCL on digits over the 4 fake devices, trained once per session for
  the tests that read a finished run: (workdir, config, loop.TrainResult)."""
  if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # `from configs import ...`, as from the repo root
  from configs import digits
  from hscl_jax.training import loop

  config = digits.get_config()
  config.num_epochs = 1
  config.optimizer.warmup_epochs = 0.0
  config.knn.every_epochs = 0
  workdir = tmp_path_factory.mktemp('digits_run')
  return workdir, config, loop.train_and_evaluate(config, str(workdir))


@pytest.fixture(scope='session')
def tiny_config():
  """The unit tests' shared config: `tiny_config()` is a fresh copy to change (a frozen
  one's `ConfigDict(...)` shares its sections). H-SCL(β) on digits with a small head, 16
  samples a batch, 3 epochs, a cosine schedule after one warm-up epoch, no kNN."""
  if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # `from configs import ...`, as from the repo root
  from configs import digits

  def make():
    config = digits.get_config()
    config.batch_size = 16
    config.num_epochs = 3
    config.model.head_hidden, config.model.head_out = 32, 16
    config.knn.every_epochs = 0
    return config

  return make
