"""The module -> tests map, measured: which test files execute each module's lines.

A hand-kept map misses test files that exercise a module (issue 48: a survivor was killed
by a file the map did not list for its module). This runs the tests under coverage with a
context per test (`--cov-context=test`), and keeps, for each measured module, the test
files whose tests execute its lines (code run outside a test, at collection or in a
program a test starts as a subprocess, has no test to credit), with the lines each
executes. Measured on a copy of the last commit, as the mutants run (a test that needs
a file outside the tree skips there as it does for them); stored in map.json beside this
file with the date, the commit and the command:

    python tools/mutation map                        # the whole suite (long: run it niced)
    python tools/mutation map tests/test_knn.py      # these test files' map alone

`score.py` takes a module's test files from it (with the hand-kept ones), and plants each
mutant against the files that execute its statement.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import pathlib
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[2]
MAP = pathlib.Path(__file__).with_name('map.json')
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
    *(sys.executable, '-m', 'pytest', '-q', '-rf', '-p', 'no:randomly'),
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


def test_files(data, path: pathlib.Path) -> dict[str, set[int]]:
  """{test file: the lines of `path` its tests execute} from coverage data with contexts
  `tests/test_x.py::test_y|run` (the empty context, code outside any test, is left out)."""
  files: dict[str, set[int]] = {}
  for line, contexts in (data.contexts_by_lineno(str(path)) or {}).items():
    for context in contexts:
      if '::' in context:
        files.setdefault(context.split('::', 1)[0], set()).add(line)
  return files


def derive(data, root: pathlib.Path, modules: list[str]) -> dict[str, dict]:
  """{module: {'sha256': its source's, 'tests': {test file: its lines as ranges}}}."""
  derived = {}
  for module in modules:
    path = (root / module).resolve()
    files = test_files(data, path)
    derived[module] = {
      'sha256': hashlib.sha256(path.read_bytes()).hexdigest(),
      'tests': {name: ranges(lines) for name, lines in sorted(files.items())},
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
    env = dict(os.environ, COVERAGE_FILE=str(data_file), PYTHONPATH=str(tree))
    result = subprocess.run(command(tests), cwd=tree, env=env, capture_output=True, text=True)
    if result.returncode not in (0, 1):  # 1: some test failed; the map is still measured
      tail = (result.stdout + result.stderr).strip().splitlines()[-3:]
      sys.exit(f'the tests under coverage did not run: {" | ".join(tail)}')
    data = coverage.CoverageData(basename=str(data_file))
    data.read()
    modules = derive(data, tree, measured_modules(tree))
  lines = result.stdout.strip().splitlines()
  return {
    'measured': datetime.date.today().isoformat(),
    'commit': commit,
    'command': ' '.join(['python tools/mutation map', *tests]),
    'outcome': (lines or [''])[-1],
    'failed': failed_tests(lines),  # a test failing under coverage: its lines may be missing
    'modules': modules,
  }


def failed_tests(lines: list[str]) -> list[str]:
  """The ids of the tests pytest's `-rf` summary names (`FAILED tests/x.py::t - why`)."""
  return sorted(line.split()[1] for line in lines if line.startswith('FAILED '))


def _commit(ref: str) -> str:
  head = subprocess.run(['git', 'rev-parse', ref], cwd=ROOT, capture_output=True, text=True)
  return head.stdout.strip()


def load(path: pathlib.Path = MAP) -> dict[str, dict]:
  """The stored map's modules ({} where none is stored)."""
  return json.loads(path.read_text())['modules'] if path.exists() else {}


def files_running(entry: dict | None, source: bytes, lines: range) -> list[str] | None:
  """The test files that execute any of `lines` of a module whose map entry is `entry`;
  None where that cannot be told (no entry, or the module changed since it was measured:
  its lines moved)."""
  if not entry or entry['sha256'] != hashlib.sha256(source).hexdigest():
    return None
  wanted = set(lines)
  return [name for name, text in entry['tests'].items() if wanted & parse_ranges(text)]


def main() -> int:
  tests = sys.argv[1:] or ['tests']
  record = measure(tests)
  MAP.write_text(json.dumps(record, indent=1, sort_keys=True) + '\n')
  reached = sum(bool(m['tests']) for m in record['modules'].values())
  print(f'{MAP.relative_to(ROOT)}: {reached} of {len(record["modules"])} modules reached')
  print(record['outcome'])
  return 0


if __name__ == '__main__':
  sys.exit(main())
