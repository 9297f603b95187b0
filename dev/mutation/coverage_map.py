"""The module -> tests map, measured: which test files execute each module's lines.

A hand-kept map misses test files that exercise a module (issue 48: a survivor was killed
by a file the map did not list for its module). This runs the tests under coverage with a
context per test (`--cov-context=test`), and keeps, for each measured module, the test
files whose tests execute its lines (code run outside a test, at collection or in a
program a test starts as a subprocess, has no test to credit), with the lines each
executes. Measured on a copy of the last commit, as the mutants run (a test that needs
a file outside the tree skips there as it does for them); stored in map.json beside this
file with the date, the commit and the command:

    python dev/mutation map                        # the whole suite (long: run it niced)
    python dev/mutation map tests/test_knn.py      # these test files' map alone

`score.py` takes a module's test files from it (with the hand-kept ones), and plants each
mutant against the files that execute its statement.

A module moved since keeps its entry under its new path (its digest tells whether its lines
still hold). A module split from another since has an entry that was not measured:
`"sha256": null`, `"split_from"` the original, and the original's test files with no lines;
its mutants run all its test files, as those of a changed module do, until the map is
measured again.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile

from mutation import timings

ROOT = pathlib.Path(__file__).resolve().parents[2]
MAP = pathlib.Path(__file__).with_name('map.json')
# The map by test (each test's lines, its seconds): a mutant runs the tests that execute its
# statement, not whole files. Large and measured here: kept beside the sessions, not committed.
TESTS_MAP = ROOT / '.mutation_sessions' / 'map_tests.json'
# Code outside hscl_jax/ that spends GPU time: measured too (issue 48 item 3).
OUTSIDE_PACKAGE = (
  'benchmarks/accelerator.py',
  'benchmarks/torch_reference.py',
  'tools/first_light.py',
  'tools/gpu_bundle.py',
)


def measured_modules(root: pathlib.Path = ROOT) -> list[str]:
  """Every module of hscl_jax/ and the GPU programs outside it, repository-relative."""
  package = [str(p.relative_to(root)) for p in (root / 'hscl_jax').rglob('*.py')]
  return sorted(package + [m for m in OUTSIDE_PACKAGE if (root / m).is_file()])


def command(tests: list[str]) -> list[str]:
  """The tests under coverage, a context per test; in a fixed order (-p no:randomly), with
  pytest.ini's workers (xdist records each test's context); a file that fails to import
  does not stop the others."""
  cover = [f'--cov={folder}' for folder in ('hscl_jax', 'tools', 'benchmarks')]
  return [
    *(sys.executable, '-m', 'pytest', '-q', '-rf', '-p', 'no:randomly', '-p', 'mutation.timings'),
    *(*cover, '--cov-context=test', '--cov-report=', '--continue-on-collection-errors'),
    *tests,
  ]


def ranges(lines) -> str:
  """'1-3,7' for [1, 2, 3, 7]: lines compactly."""
  spans, lines = [], sorted(lines)
  for line in lines:
    if spans and line == spans[-1][1] + 1:
      spans[-1][1] = line
    else:
      spans.append([line, line])
  return ','.join(str(a) if a == b else f'{a}-{b}' for a, b in spans)


def parse_ranges(text: str) -> set[int]:
  lines = set()
  for span in filter(None, text.split(',')):
    first, _, last = span.partition('-')
    lines.update(range(int(first), int(last or first) + 1))
  return lines


def node_id(name: str) -> str:
  """A test's id as pytest takes it on the command line: without the `@group` that xdist's
  loadgroup appends (tests/conftest.py groups each file's tests)."""
  return re.sub(r'@[\w.-]+$', '', name)


def test_contexts(data, path: pathlib.Path, shared: dict | None = None) -> dict[str, set[int]]:
  """{test id: the lines of `path` it executes} from coverage data with contexts
  `tests/test_x.py::test_y[p]|run` (setup, run and teardown together; the empty context,
  code outside any test, is left out). A line run in a test's set-up may be a fixture wider
  than the test, set up once for all its users: with `shared` ({test: its shared fixtures'
  keys}, from the timings plugin), it is credited to every test sharing one with it too."""
  users: dict[str, set[str]] = {}
  for test, keys in (shared or {}).items():
    for key in keys:
      users.setdefault(key, set()).add(node_id(test))
  sharing = lambda test: set().union(*(users[k] for k in (shared or {}).get(test, ())))
  tests: dict[str, set[int]] = {}
  for line, contexts in (data.contexts_by_lineno(str(path)) or {}).items():
    for context in contexts:
      if '::' not in context:
        continue
      test, _, phase = context.rpartition('|')
      for credited in {node_id(test)} | (sharing(test) if phase == 'setup' else set()):
        tests.setdefault(credited, set()).add(line)
  return tests


def test_files(data, path: pathlib.Path, shared: dict | None = None) -> dict[str, set[int]]:
  """{test file: the lines of `path` its tests execute}."""
  files: dict[str, set[int]] = {}
  for test, lines in test_contexts(data, path, shared).items():
    files.setdefault(test.split('::', 1)[0], set()).update(lines)
  return files


def digest(path: pathlib.Path) -> str | None:
  return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


def derive(
  data, root: pathlib.Path, modules: list[str], by=test_files, shared: dict | None = None
) -> dict[str, dict]:
  """{module: {'sha256': its source's, 'tests': {test file (or test, `by=test_contexts`):
  its lines as ranges}}}; `shared` as test_contexts takes it."""
  derived = {}
  for module in modules:
    path = (root / module).resolve()
    found = by(data, path, shared)
    derived[module] = {
      'sha256': digest(path),
      'tests': {name: ranges(lines) for name, lines in sorted(found.items())},
    }
  return derived


def measure(tests: list[str], ref: str = 'HEAD') -> dict:
  """Run `tests` (pytest's arguments) under coverage in a copy of commit `ref` (as the
  mutants run: PYTHONPATH on the copy), and derive the map of its every measured module."""
  import coverage

  from mutation import handwritten  # its copy of a tree

  commit = _commit(ref)  # read now: HEAD may move while the suite runs
  with tempfile.TemporaryDirectory(prefix='hscl_map_') as scratch:
    tree, data_file = pathlib.Path(scratch) / 'tree', pathlib.Path(scratch) / '.coverage'
    tree.mkdir()
    handwritten.copy_tree(str(tree), ref)
    seconds_file = pathlib.Path(scratch) / 'seconds.json'
    env = dict(
      os.environ,
      COVERAGE_FILE=str(data_file),
      PYTHONPATH=os.pathsep.join([str(tree), str(tree / 'dev')]),  # and the timings plugin
      **{timings.ENV: str(seconds_file)},
    )
    result = subprocess.run(command(tests), cwd=tree, env=env, capture_output=True, text=True)
    if result.returncode not in (0, 1):  # 1: some test failed; the map is still measured
      tail = (result.stdout + result.stderr).strip().splitlines()[-3:]
      sys.exit(f'the tests under coverage did not run: {" | ".join(tail)}')
    data = coverage.CoverageData(basename=str(data_file))
    data.read()
    timed = json.loads(seconds_file.read_text()) if seconds_file.exists() else {}
    shared = timed.get('shared', {})
    modules = derive(data, tree, measured_modules(tree), shared=shared)
    by_test = derive(data, tree, measured_modules(tree), by=test_contexts, shared=shared)
    seconds = {node_id(test): time for test, time in timed.get('seconds', {}).items()}
    # The test files as measured (the copy's, not the working tree's): a file edited
    # since holds tests the map does not know.
    files = {str(f.relative_to(tree)): digest(f) for f in sorted((tree / 'tests').glob('*.py'))}
  lines = result.stdout.strip().splitlines()
  return {
    'measured': datetime.date.today().isoformat(),
    'commit': commit,
    'command': ' '.join(['python dev/mutation map', *tests]),
    'outcome': (lines or [''])[-1],
    'failed': failed_tests(lines),  # a test failing under coverage: its lines may be missing
    'modules': modules,
    'by_test': {'modules': by_test, 'seconds': seconds, 'files': files},  # main() keeps it apart
  }


def failed_tests(lines: list[str]) -> list[str]:
  """The ids of the tests pytest's `-rf` summary names (`FAILED tests/x.py::t - why`)."""
  failed = (line.removeprefix('FAILED ').split(' - ', 1)[0] for line in lines)
  return sorted(node_id(test) for test, line in zip(failed, lines) if line.startswith('FAILED '))


def _commit(ref: str) -> str:
  head = subprocess.run(['git', 'rev-parse', ref], cwd=ROOT, capture_output=True, text=True)
  return head.stdout.strip()


def load(path: pathlib.Path = MAP) -> dict[str, dict]:
  """The stored map's modules ({} where none is stored)."""
  return json.loads(path.read_text())['modules'] if path.exists() else {}


def files_running(entry: dict | None, source: bytes, lines: range) -> list[str] | None:
  """The test files (or, of the map by test, the tests) that execute any of `lines` of a
  module whose map entry is `entry`;
  None where that cannot be told (no entry, an entry not measured, or the module changed
  since it was measured: its lines moved)."""
  if not entry or entry['sha256'] != hashlib.sha256(source).hexdigest():
    return None
  wanted = set(lines)
  return [name for name, text in entry['tests'].items() if wanted & parse_ranges(text)]


def changed_files(by_test: dict, files, root: pathlib.Path = ROOT) -> list[str]:
  """Those of `files` whose text changed since the map by test was measured (their new
  tests are not in it: a recheck after tests were added must run them), or all of them
  where it recorded no digests."""
  recorded = by_test.get('files')
  if recorded is None:
    return list(files)
  return [f for f in files if recorded.get(f) != digest(root / f)]


def load_tests(path: pathlib.Path = TESTS_MAP) -> dict:
  """The stored map by test ({} where none is stored here)."""
  return json.loads(path.read_text()) if path.exists() else {}


def tests_running(by_test: dict, module: str, source: bytes, lines: range) -> tuple[str, ...]:
  """The tests that execute any of `lines` of `module` by the map by test (none where it
  cannot tell: not measured here, or the module changed since), less those that failed
  under coverage; grouped by file (a file's module fixtures are set up once), the files
  in the order of their quickest test, each file's tests quickest first."""
  running = files_running(by_test.get('modules', {}).get(module), source, lines) or ()
  failed, seconds = set(by_test.get('failed', ())), by_test.get('seconds', {})
  tests = [test for test in running if test not in failed]
  time_of = lambda test: seconds.get(test, float('inf'))
  by_file: dict[str, list[str]] = {}
  for test in sorted(tests, key=lambda t: (time_of(t), t)):
    by_file.setdefault(test.split('::', 1)[0], []).append(test)
  return tuple(test for group in by_file.values() for test in group)


USAGE = """usage: python dev/mutation map [PYTEST_ARGS ...]

Measure which test files (and tests) execute each module's lines: the suite (or the test
files given) under coverage in a copy of the last commit. Writes dev/mutation/map.json
(committed) and .mutation_sessions/map_tests.json. The whole suite takes 10-40 minutes
on two cores: run it niced."""


def main() -> int:
  tests = sys.argv[1:] or ['tests']
  if {'-h', '--help'} & set(tests):  # pytest would print its own help and run no test
    print(USAGE)
    return 0
  record = measure(tests)
  by_test = record.pop('by_test')
  if not by_test['seconds']:  # a map of no test would replace the stored one with nothing
    sys.exit(f'no test ran ({record["outcome"] or "no output"}): {MAP.name} kept as it was')
  TESTS_MAP.parent.mkdir(exist_ok=True)
  kept = {key: record[key] for key in ('measured', 'commit', 'command', 'failed')}
  TESTS_MAP.write_text(json.dumps({**kept, **by_test}, sort_keys=True) + '\n')
  MAP.write_text(json.dumps(record, indent=1, sort_keys=True) + '\n')
  reached = sum(bool(m['tests']) for m in record['modules'].values())
  print(f'{os.path.relpath(MAP, ROOT)}: {reached} of {len(record["modules"])} modules reached')
  print(record['outcome'])
  return 0


if __name__ == '__main__':
  sys.exit(main())
