"""dev/mutation/score.py's own logic, with no mutant run and without cosmic-ray: the map
covers every module, the sample is seeded and order-free, --all allocates by lines, the
score arithmetic, annotations and non-operator stars never drawn, equivalents read and
named by their lines."""

from __future__ import annotations

import hashlib
import os
import pathlib
import re
import shlex
import signal
import subprocess
import sys
import time

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / 'dev'))
from mutation import coverage_map
from mutation import score as mutation_score

# The measurements log holds the commands of the recorded samples; docs/testing.md the how-to.
LOG = REPO / 'docs/results/test_suite/measurements.md'
GPU_PROGRAMS = [
  'benchmarks/accelerator.py',
  'benchmarks/torch_reference.py',
  'tools/first_light.py',
  'tools/gpu_bundle.py',
]


def test_every_module_of_the_package_has_its_existing_test_files():
  """hscl_jax/ and the programs outside it that spend GPU time, each by hand and in the
  map the tool uses."""
  modules = sorted(str(p.relative_to(REPO)) for p in (REPO / 'hscl_jax').rglob('*.py'))
  modules = sorted(modules + GPU_PROGRAMS)
  assert sorted(mutation_score.HAND_TESTS_OF) == sorted(mutation_score.TESTS_OF) == modules
  assert mutation_score.package_modules() == modules
  for module, tests in mutation_score.TESTS_OF.items():
    assert tests, module
    assert (
      tests[: len(mutation_score.HAND_TESTS_OF[module])] == mutation_score.HAND_TESTS_OF[module]
    )
    for test in tests:
      assert (REPO / test).is_file(), (module, test)


def test_all_samples_the_gpu_programs_too():
  plan = mutation_score.allocate(
    {m: mutation_score.code_lines(REPO / m) for m in mutation_score.package_modules()}, 200
  )
  assert all(plan[m] >= 1 for m in GPU_PROGRAMS)


def test_the_map_takes_the_hand_listed_files_first_then_the_measured_ones():
  hand = {'a.py': ('tests/t2.py',), 'b.py': ('tests/t1.py',)}
  measured = {
    'a.py': {'tests': {'tests/t3.py': '1', 'tests/t1.py': '2', 'tests/t2.py': '3'}},
    'c.py': {'tests': {'tests/t9.py': '1'}},
  }
  assert mutation_score.merged(hand, measured) == {
    'a.py': ('tests/t2.py', 'tests/t1.py', 'tests/t3.py'),
    'b.py': ('tests/t1.py',),  # not measured: the hand's alone
    'c.py': ('tests/t9.py',),
  }


def test_lines_are_stored_as_ranges():
  lines = [1, 2, 3, 7, 9, 10]
  assert coverage_map.ranges(lines[::-1]) == '1-3,7,9-10'
  assert coverage_map.parse_ranges('1-3,7,9-10') == set(lines)
  assert coverage_map.ranges([]) == '' and coverage_map.parse_ranges('') == set()


def test_a_mutant_runs_the_files_that_execute_its_statement(monkeypatch):
  """Those of the module's files the measured map finds executing the mutated statement
  (in the map's order); all of them where the map cannot tell."""
  source = 'def f(x):\n  y = (x +\n       1)\n  return y\n'
  module = 'hscl_jax/m.py'
  entry = {
    'sha256': hashlib.sha256(source.encode()).hexdigest(),
    'tests': {'tests/a.py': '1-4', 'tests/b.py': '1,4', 'tests/c.py': '3'},
  }
  monkeypatch.setitem(mutation_score.TESTS_OF, module, ('tests/c.py', 'tests/b.py', 'tests/a.py'))
  monkeypatch.setattr(mutation_score, 'MEASURED', {module: entry})
  monkeypatch.setattr(mutation_score, 'MEASURED_TESTS', {})  # no map by test here
  at = lambda line: type('Mutation', (), {'start_pos': (line, 0), 'operator_name': 'core/X'})
  tests_for = lambda line: mutation_score.tests_for(module, source, at(line))
  assert tests_for(2) == ('tests/c.py', 'tests/a.py')  # the statement spans lines 2-3
  assert tests_for(4) == ('tests/b.py', 'tests/a.py')
  # A file that reaches the module through a program it starts runs with those that
  # execute the statement: the program may run it too (the map cannot tell).
  monkeypatch.setitem(mutation_score.UNCREDITED, module, ('tests/c.py',))
  assert tests_for(4) == ('tests/c.py', 'tests/b.py', 'tests/a.py')
  entry['tests'] = {'tests/a.py': '1'}
  assert tests_for(4) == mutation_score.TESTS_OF[module]  # no file runs it: all of them
  entry['sha256'] = 'the module changed since'
  assert tests_for(1) == mutation_score.TESTS_OF[module]
  command = mutation_score.test_command(module, files=('tests/b.py',)).split()
  assert command[-1] == 'tests/b.py' and 'tests/a.py' not in command


def test_the_map_is_measured_from_the_tests_that_execute_each_module(tmp_path):
  """Two test files of a probe: one runs errors.fail, the other disk_full_message and
  rundir/lock's import only (at collection: no test's). Measured in a copy of the last
  commit: every measured module gets an entry with the digest of its committed source."""
  if not (REPO / '.git').exists():  # the map itself runs the suite in such a copy
    pytest.skip('measures a copy of the last commit: needs a git checkout, this is a copy')
  (tmp_path / 'test_fails.py').write_text(
    'import pytest\nfrom hscl_jax import errors\n\n'
    'def test_fails(tmp_path):\n  with pytest.raises(errors.ConfigError):\n'
    "    errors.fail('x', 'bad', 'fix')\n"
  )
  (tmp_path / 'test_message.py').write_text(
    'from hscl_jax import errors\nfrom hscl_jax.rundir import lock\n\n'
    "def test_message():\n  assert '/w.' in errors.disk_full_message('/w')\n"
  )
  (tmp_path / 'test_shared.py').write_text(
    'import pytest\nfrom hscl_jax import errors\n\n'
    "@pytest.fixture(scope='module')\ndef message():\n  return errors.disk_full_message('/w')\n\n"
    'def test_sets_up(message, tmp_path):\n  pass\n\n'
    "def test_reads(message):\n  assert '/w.' in message\n"
  )
  (tmp_path / 'pytest.ini').write_text((REPO / 'pytest.ini').read_text())
  probes = [str(tmp_path / f'test_{name}.py') for name in ('fails', 'message', 'shared')]
  record = coverage_map.measure(['-n', '0', '--dist=no', *probes])  # one process: quicker
  modules = record['modules']
  assert sorted(modules) == mutation_score.package_modules()
  errors = modules['hscl_jax/errors.py']
  assert sorted(errors['tests']) == ['test_fails.py', 'test_message.py', 'test_shared.py']
  committed = subprocess.run(
    ['git', 'show', 'HEAD:hscl_jax/errors.py'], cwd=REPO, capture_output=True, check=True
  ).stdout
  raised = next(
    n
    for n, line in enumerate(committed.decode().splitlines(), 1)
    if line.strip().startswith('raise ')
  )
  assert raised in coverage_map.parse_ranges(errors['tests']['test_fails.py'])
  assert raised not in coverage_map.parse_ranges(errors['tests']['test_message.py'])
  assert modules['hscl_jax/rundir/lock.py']['tests'] == {}  # imported, never called
  assert modules['hscl_jax/evaluation/knn.py']['tests'] == {}
  assert errors['sha256'] == hashlib.sha256(committed).hexdigest()
  # The map by test: each test's lines (without xdist's group in its id) and its seconds.
  by_test = record['by_test']
  tests = by_test['modules']['hscl_jax/errors.py']['tests']
  # A module fixture is set up in its first user's set-up: credited to the other too, not
  # to a test sharing only pytest's own session fixtures with it (`tmp_path`'s factory).
  shared = ['test_shared.py::test_reads', 'test_shared.py::test_sets_up']
  assert sorted(tests) == ['test_fails.py::test_fails', 'test_message.py::test_message', *shared]
  assert raised in coverage_map.parse_ranges(tests['test_fails.py::test_fails'])
  message = coverage_map.parse_ranges(tests['test_message.py::test_message'])
  assert all(coverage_map.parse_ranges(tests[test]) == message for test in shared)
  assert not message & coverage_map.parse_ranges(tests['test_fails.py::test_fails'])
  assert sorted(by_test['seconds']) == sorted(tests) and min(by_test['seconds'].values()) > 0
  head_knn = subprocess.run(
    ['git', 'show', 'HEAD:tests/test_knn.py'], cwd=REPO, capture_output=True, check=True
  ).stdout  # the test files' digests are the measured commit's
  assert by_test['files']['tests/test_knn.py'] == hashlib.sha256(head_knn).hexdigest()
  assert record['outcome'].startswith('4 passed') and len(record['commit']) == 40
  assert record['failed'] == []
  summary = ['x', 'FAILED tests/test_b.py::test_y[a b]@test_b.py - AssertionError: no - b']
  assert coverage_map.failed_tests([*summary, 'FAILED tests/a.py::t']) == [
    'tests/a.py::t',
    'tests/test_b.py::test_y[a b]',
  ]


def test_the_stored_map_is_kept_on_help_and_where_no_test_ran(tmp_path, monkeypatch, capsys):
  """`map --help` prints the usage and runs nothing (pytest would take the flag, run no test
  and the empty map would replace the committed one); a run where no test ran (pytest's
  --collect-only, a -k that selects none) exits naming it, both maps left as they were."""
  stored, by_test = tmp_path / 'map.json', tmp_path / 'map_tests.json'
  stored.write_text('{"kept": 1}\n')
  monkeypatch.setattr(coverage_map, 'MAP', stored)
  monkeypatch.setattr(coverage_map, 'TESTS_MAP', by_test)
  measured = []
  empty = {'outcome': 'no tests ran in 0.5s', 'modules': {}, 'by_test': {'seconds': {}}}
  empty |= {'measured': '2026-11-29', 'commit': 'c' * 40, 'command': 'map', 'failed': []}
  monkeypatch.setattr(coverage_map, 'measure', lambda tests: measured.append(tests) or empty)
  for flag in ('--help', '-h'):
    monkeypatch.setattr(sys, 'argv', ['dev/mutation map', 'tests/test_knn.py', flag])
    assert coverage_map.main() == 0
    assert 'usage: python dev/mutation map' in capsys.readouterr().out
  assert measured == []
  monkeypatch.setattr(sys, 'argv', ['dev/mutation map', '--collect-only'])
  with pytest.raises(SystemExit, match='no test ran [(]no tests ran in 0.5s[)]: map.json kept'):
    coverage_map.main()
  assert measured == [['--collect-only']]
  assert stored.read_text() == '{"kept": 1}\n' and not by_test.exists()


def test_a_shared_fixtures_set_up_is_credited_to_each_test_that_uses_it():
  """A session fixture runs in the set-up of its first user only (line 5, `a.py::t1`);
  `b.py::t2` reads its value and is credited too. What a test runs itself (line 6), and
  set-ups of function fixtures (line 7, `b.py::t3`, sharing nothing), stay the test's."""

  class Data:
    def contexts_by_lineno(self, path):
      del path
      return {5: ['a.py::t1@a.py|setup'], 6: ['a.py::t1|run', ''], 7: ['b.py::t3|setup']}

  shared = {'a.py::t1@a.py': ['tests::f'], 'b.py::t2': ['tests::f', 'b.py::g'], 'b.py::t3': []}
  found = coverage_map.test_contexts(Data(), pathlib.Path('m.py'), shared)
  assert found == {'a.py::t1': {5, 6}, 'b.py::t2': {5}, 'b.py::t3': {7}}
  assert coverage_map.test_contexts(Data(), pathlib.Path('m.py')) == {
    'a.py::t1': {5, 6},
    'b.py::t3': {7},
  }
  assert coverage_map.test_files(Data(), pathlib.Path('m.py'), shared) == {
    'a.py': {5, 6},
    'b.py': {5, 7},
  }


def names_module(text: str, module: str) -> bool:
  """Whether a test file's text imports or starts `module` (repository-relative path): its
  dotted name (a package's for `__init__` and `__main__`), or `from parent import leaf`."""
  parts = module.removesuffix('.py').split('/')
  dotted = '.'.join(p for p in parts if p not in ('__init__', '__main__'))
  parent, _, leaf = dotted.rpartition('.')
  imported = rf'from {re.escape(parent)} import [^\n]*\b{leaf}\b'
  return dotted in text or bool(parent and re.search(imported, text))


def test_names_module_reads_imports_and_programs():
  assert names_module(
    'from hscl_jax.evaluation import features, knn\n', 'hscl_jax/evaluation/knn.py'
  )
  assert names_module("['-m', 'hscl_jax.graphs']", 'hscl_jax/graphs/__main__.py')
  assert names_module('import hscl_jax.experiments.compare\n', 'hscl_jax/experiments/compare.py')
  assert not names_module('from hscl_jax.evaluation import knnx\n', 'hscl_jax/evaluation/knn.py')
  assert not names_module('from hscl_jax.data import errors\n', 'hscl_jax/errors.py')


def test_the_stored_map_agrees_with_the_hand_map():
  """The measured map (dev/mutation/map.json) covers every module, names only test files
  that exist, and finds every hand-listed file executing its module, except those listed
  with a reason in UNCREDITED (a program the file starts, values made at import, code run
  once per process). A module no test's context reaches runs only at import or in
  programs: each of its hand-listed files must name it. An entry not measured (a module
  split from another since: `sha256` null) carries its original's test files and no lines:
  its hand-listed files that they miss must name it too, or be in UNCREDITED."""
  if not coverage_map.MAP.exists():
    pytest.skip('dev/mutation/map.json is not measured yet: python dev/mutation map')
  measured = coverage_map.load()
  assert sorted(measured) == mutation_score.package_modules()
  for module, entry in measured.items():
    for test in entry['tests']:
      assert (REPO / test).is_file(), (module, test)
    missing = set(mutation_score.HAND_TESTS_OF[module]) - set(entry['tests'])
    unexplained = missing - set(mutation_score.UNCREDITED.get(module, ()))
    if not entry['tests'] or entry['sha256'] is None:
      unexplained = {f for f in unexplained if not names_module((REPO / f).read_text(), module)}
    assert not unexplained, (module, unexplained)
    if entry['sha256'] is None:  # not measured: no lines, and the module it was split from
      assert set(entry['tests'].values()) <= {''}, module
      assert entry.get('split_from', '').startswith('hscl_jax/') or not entry['tests'], module


def test_the_sample_is_seeded_and_independent_of_the_listing_order():
  ids = [f'core/Op#{i:05d}' for i in range(40)]
  first = mutation_score.draw(ids, 7, seed=3, module='hscl_jax/evaluation/knn.py')
  assert len(first) == len(set(first)) == 7 and set(first) <= set(ids)
  assert mutation_score.draw(ids[::-1], 7, seed=3, module='hscl_jax/evaluation/knn.py') == first
  assert mutation_score.draw(ids, 7, seed=4, module='hscl_jax/evaluation/knn.py') != first
  assert mutation_score.draw(ids, 7, seed=3, module='hscl_jax/training/optimizers.py') != first
  # The sample of a larger size is another draw, not the smaller one extended; at or
  # above the count, every mutant.
  assert mutation_score.draw(ids, 40, seed=3, module='m') == sorted(ids)
  assert mutation_score.draw(ids, 41, seed=3, module='m') == sorted(ids)


def test_all_allocates_the_total_in_proportion_to_lines_by_largest_remainder():
  # 200 over 10/30/60 lines: exactly 20/60/120.
  assert mutation_score.allocate({'a': 10, 'b': 30, 'c': 60}, 200) == {'a': 20, 'b': 60, 'c': 120}
  # 10 over 1/1/1: shares 3.33 each; the one left over goes to the first by name.
  assert mutation_score.allocate({'b': 1, 'a': 1, 'c': 1}, 10) == {'a': 4, 'b': 3, 'c': 3}
  # 7 over 5/3/2 lines: exact 3.5, 2.1, 1.4 -> 3, 2, 1 and the remainders .5, .1, .4
  # give the last one to 'a', then nothing is left.
  assert mutation_score.allocate({'a': 5, 'b': 3, 'c': 2}, 7) == {'a': 4, 'b': 2, 'c': 1}
  lines = {m: mutation_score.code_lines(REPO / m) for m in mutation_score.package_modules()}
  plan = mutation_score.allocate(lines, 200)
  assert sum(plan.values()) == 200
  biggest = max(lines, key=lines.get)
  assert abs(plan[biggest] - 200 * lines[biggest] / sum(lines.values())) < 1


def test_a_recheck_of_all_reruns_the_sample_as_drawn_though_lines_moved(tmp_path, monkeypatch):
  """The allocation is stored when the sample is drawn; a recheck reads it back, where
  today's lines would allocate otherwise. --plan neither reads nor writes it."""
  monkeypatch.setattr(mutation_score, 'SESSIONS', tmp_path)
  monkeypatch.setattr(mutation_score, 'package_modules', lambda: ['hscl_jax/a.py', 'hscl_jax/b.py'])
  lines = {'hscl_jax/a.py': 30, 'hscl_jax/b.py': 70}
  monkeypatch.setattr(mutation_score, 'code_lines', lambda path: lines[f'hscl_jax/{path.name}'])
  assert mutation_score.all_plan(10, 0, stored=True, store=True) == {
    'hscl_jax/a.py': 3,
    'hscl_jax/b.py': 7,
  }  # nothing stored yet: today's allocation, and a recheck stores nothing
  assert not list(tmp_path.iterdir())
  drawn = mutation_score.all_plan(10, 0, stored=False, store=True)
  lines.update({'hscl_jax/a.py': 70, 'hscl_jax/b.py': 30})  # code moved from b to a
  assert mutation_score.all_plan(10, 0, stored=False, store=False) == {
    'hscl_jax/a.py': 7,
    'hscl_jax/b.py': 3,
  }
  assert (
    mutation_score.all_plan(10, 0, stored=True, store=True)
    == drawn
    == {'hscl_jax/a.py': 3, 'hscl_jax/b.py': 7}
  )
  assert mutation_score.all_plan(10, 1, stored=True, store=True)['hscl_jax/a.py'] == 7


def test_code_lines_skip_blank_and_comment_lines(tmp_path):
  path = tmp_path / 'm.py'
  path.write_text('# a comment\n\nx = 1  # counted\n    # indented comment\ny = 2\n')
  assert mutation_score.code_lines(path) == 2


def test_the_score_is_assertion_kills_over_the_viable_non_equivalent_sample():
  outcomes = ['assertion'] * 6 + ['crash', 'timeout', 'survived', 'equivalent', 'equivalent']
  t = mutation_score.tally([*outcomes, 'not viable'])
  assert (t.sampled, t.assertion, t.crash, t.timeout, t.survived, t.equivalent) == (
    12,
    6,
    1,
    1,
    1,
    2,
  )
  assert (t.not_viable, t.scored) == (1, 9)
  assert t.score == pytest.approx(6 / 9)
  assert t.detected == pytest.approx(8 / 9)  # crashes and timeouts are kills too
  both = t + mutation_score.tally(['assertion', 'survived', 'not viable'])
  assert (both.sampled, both.assertion, both.survived, both.not_viable) == (15, 7, 2, 2)
  assert both.score == 7 / 11
  assert mutation_score.tally(['equivalent', 'not viable']).score is None
  assert mutation_score.tally(['not viable']).detected is None
  assert mutation_score.format_row(t).split()[-4:] == ['67', '%', '89', '%']


_SOURCE = """def f(a, b):
  if a < b:
    c = (a
         * b)
    return c << 1
  else:
    return [x
            for x in a]
"""


@pytest.mark.parametrize(
  'line,lines',
  [
    (2, range(2, 3)),  # a compound statement: its header, not its body
    (4, range(3, 5)),  # a statement over two lines
    (5, range(5, 6)),
    (8, range(7, 9)),  # in the else branch
    (1, range(1, 2)),
  ],
)
def test_the_mutated_statement_spans_its_lines(line, lines):
  assert mutation_score.statement_lines(_SOURCE, line) == lines


def _failure(exception, frames):
  trace = '\n'.join(frames)
  return f'{trace}\n=== short test summary info ===\nFAILED tests/test_x.py::test_y - {exception}\n'


@pytest.mark.parametrize(
  'exception,frames,viable',
  [
    # The mutated statement itself cannot run: not viable.
    (
      "TypeError: unsupported operand type(s) for <<: 'float' and 'int'",
      ['tests/test_x.py:9: in test_y', 'hscl_jax/m.py:4: TypeError'],
      False,
    ),
    # Raised inside JAX, called from the mutated statement: not viable.
    (
      'TypeError: xor does not accept dtype float32',
      ['hscl_jax/m.py:3: in f', '/site-packages/jax/_src/ufuncs.py:1371: TypeError'],
      False,
    ),
    # A TypeError elsewhere in the module: the mutant ran and changed what came after.
    ('TypeError: unsupported operand', ['hscl_jax/m.py:7: TypeError'], True),
    # In another module of the package, called from the mutated line.
    ('TypeError: bad', ['hscl_jax/m.py:4: in f', 'hscl_jax/other.py:4: TypeError'], True),
    # Another exception at the mutated statement is behaviour (a refusal, a shape).
    ('ValueError: shapes differ', ['hscl_jax/m.py:4: ValueError'], True),
    ('AssertionError: 1 != 2', ['tests/test_x.py:9: AssertionError'], True),
  ],
)
def test_a_mutant_is_not_viable_only_if_its_statement_raises_a_type_error(
  exception, frames, viable
):
  output = _failure(exception, frames)
  assert mutation_score.raised_by_mutated_statement(output, 'hscl_jax/m.py', range(3, 5)) != viable


def test_mutants_inside_annotations_are_found_by_position():
  source = 'def f(x: int | None, y=1 | 2) -> list[int]:\n  z: dict[str, int] = {}\n  return x\n'
  spans = mutation_score.annotation_lines(source)
  line1 = source.splitlines()[0]
  assert (1, line1.index('|')) in spans  # int | None
  assert (1, line1.index('1 | 2') + 2) not in spans  # a default is code
  assert (1, line1.index('list')) in spans
  assert (2, source.splitlines()[1].index('dict')) in spans
  assert (2, source.splitlines()[1].index('{}')) not in spans
  assert not any(line == 3 for line, _ in spans)


def test_stars_that_are_no_operator_are_found_by_position():
  source = 'def f(a, *, b):\n  return g(*a, **b) * 2 ** 3 + [*x] + f(x)*y\n'
  line2 = source.splitlines()[1]
  assert mutation_score.signature_stars(source) == {
    (1, 9),  # the keyword-only marker
    (2, line2.index('*a')),
    (2, line2.index('**b')),
    (2, line2.index('*x')),
  }  # not the products `* 2`, `)*y` nor the power `** 3`
  # After a line break (and a comment) the token before is still the comma.
  source = 'x = {\n  "a": 1,  # one\n  **other,\n}\ny = (a\n  * b)\n'
  assert mutation_score.signature_stars(source) == {(3, 2)}


def test_equivalents_are_named_by_their_changed_line(tmp_path):
  diff = (
    '--- mutation diff ---\n--- a/hscl_jax/x.py\n+++ b/hscl_jax/x.py\n@@ -1,3 +1,3 @@\n'
    ' a = 1\n-  if n >= 0:\n+  if n > 0:\n b = 2\n'
  )
  assert mutation_score.changed_lines(diff) == ('if n >= 0:', 'if n > 0:')
  path = tmp_path / 'eq.toml'
  path.write_text(
    '[[equivalent]]\nmodule = "hscl_jax/x.py"\noriginal = "if n >= 0:"\n'
    'mutated = "if n > 0:"\nreason = "n is never 0"\n'
  )
  assert mutation_score.load_equivalents(path) == {
    ('hscl_jax/x.py', 'if n >= 0:', 'if n > 0:'): 'n is never 0'
  }


def test_a_listed_equivalent_that_is_killed_keeps_its_kill_and_is_named(monkeypatch, capsys):
  """A mutant equivalents.toml lists that a test fails: either the reason is wrong or the
  test fails without the mutant (the loss kernel's `t // 6` was 'killed' by a test that
  failed after another had changed their shared config). Its kill stands, its line and
  the report say it is listed, and a recheck runs it again; survived, it is equivalent."""
  work_item = pytest.importorskip('cosmic_ray.work_item')
  diff = (
    '--- mutation diff ---\n--- a/hscl_jax/m.py\n+++ b/hscl_jax/m.py\n@@ -1 +1 @@\n'
    '-x = t / 6\n+x = t // 6\n'
  )
  listed = {('hscl_jax/m.py', 'x = t / 6', 'x = t // 6'): 't < 1 where it runs'}
  killed = lambda exception: work_item.WorkResult(
    worker_outcome=work_item.WorkerOutcome.NORMAL,
    output=_summary(f'FAILED tests/t.py::a - {exception}'),
    test_outcome=work_item.TestOutcome.KILLED,
    diff=diff,
  )
  survived = work_item.WorkResult(
    worker_outcome=work_item.WorkerOutcome.NORMAL,
    test_outcome=work_item.TestOutcome.SURVIVED,
    diff=diff,
  )
  outcome = lambda r, eq: mutation_score.outcome_of(r, eq, 'hscl_jax/m.py', range(1, 2))
  crash, other = killed('ValueError: protocol must be one of'), killed('AssertionError: 1 != 2')
  assert outcome(crash, listed) == (
    'crash',
    f'{mutation_score.LISTED_YET_KILLED}: ValueError: protocol must be one of',
  )
  assert outcome(crash, {}) == ('crash', 'ValueError: protocol must be one of')
  assert outcome(other, listed)[0] == 'assertion'
  assert outcome(other, listed)[1].startswith(mutation_score.LISTED_YET_KILLED)
  assert outcome(survived, listed) == ('equivalent', 't < 1 where it runs')

  position = type('Mutation', (), {'start_pos': (1, 0), 'operator_name': 'core/X'})
  results = [('killed', other), ('passed', survived)]
  items = [type('Item', (), {'job_id': job, 'mutations': [position]}) for job, _ in results]
  db = type('Db', (), {'work_items': items, 'results': results})
  assert mutation_score.rechecked(db, 'hscl_jax/m.py', 'x = t / 6\n', listed) == {'killed'}
  assert mutation_score.rechecked(db, 'hscl_jax/m.py', 'x = t / 6\n', {}) == {'passed'}

  done = [(position, other), (position, survived)]
  monkeypatch.setattr(mutation_score, 'results', lambda module, path: (2, done))
  monkeypatch.setattr(mutation_score, 'load_reach', lambda module: None)
  monkeypatch.setattr(mutation_score, 'ROOT', REPO)
  monkeypatch.setattr(mutation_score, 'session_path', lambda *args: None)
  as_errors = {('hscl_jax/errors.py', *key[1:]): why for key, why in listed.items()}
  total = mutation_score.report({'hscl_jax/errors.py': 2}, 0, as_errors)
  printed = capsys.readouterr().out
  assert (total.assertion, total.equivalent) == (1, 1)
  assert f'{mutation_score.LISTED_YET_KILLED}:\n' in printed and '+x = t // 6' in printed


def test_the_checked_in_equivalents_name_known_modules_and_give_reasons():
  for (module, original, mutated), reason in mutation_score.load_equivalents().items():
    assert module in mutation_score.TESTS_OF
    assert original != mutated and reason.strip()
    # Not stale: each changed line (a mutant of a call over several lines changes several)
    # is still a line of the module.
    lines = {line.strip() for line in (REPO / module).read_text().splitlines()}
    assert set(original.split('\n')) <= lines, (module, original)


def test_a_crash_of_the_mutated_statement_is_classified_not_viable():
  work_item = pytest.importorskip('cosmic_ray.work_item')
  output = _failure(
    "TypeError: unsupported operand type(s) for <<: 'float'", ['hscl_jax/m.py:4: TypeError']
  )
  result = work_item.WorkResult(
    worker_outcome=work_item.WorkerOutcome.NORMAL,
    output=output,
    test_outcome=work_item.TestOutcome.KILLED,
  )
  outcome = lambda lines: mutation_score.outcome_of(result, {}, 'hscl_jax/m.py', lines)[0]
  assert (outcome(range(3, 5)), outcome(range(5, 6)), outcome(None)) == (
    'not viable',
    'crash',
    'crash',
  )


def _summary(*lines):
  return 'tracebacks\n=== short test summary info ===\n' + '\n'.join(lines) + '\n'


def test_a_crash_is_an_assertion_kill_if_any_test_fails_on_an_assertion():
  """The second run of a crash (every test, no -x): the first failure is a refusal of a
  valid input elsewhere, a later test asserts on the changed behaviour."""
  crash = 'FAILED tests/test_a.py::test_trains - hscl_jax.errors.ConfigError: batch_size'
  asserted = 'FAILED tests/test_b.py::test_bound - Failed: DID NOT RAISE <class ValueError>'
  every = lambda output: mutation_score.handwritten.classify(1, output)
  assert every(_summary(crash, asserted)) == (
    'assertion',
    'Failed: DID NOT RAISE <class ValueError>',
  )
  assert every(_summary(crash, 'ERROR tests/test_b.py::test_c - OSError: disk'))[0] == 'crash'
  assert every(_summary(crash))[1] == 'hscl_jax.errors.ConfigError: batch_size'
  assert every(_summary(asserted, crash))[0] == 'assertion'


def test_captured_log_lines_are_not_taken_for_the_summary():
  """A logger's ERROR line in the captured log (its level padded with spaces) precedes the
  summary; the failure is the TypeError the mutated statement raised."""
  log = (
    'ERROR    absl:future.py:387 [process=0][thread=Thread-3] _SignalingThread.run() raised '
    "an exception: unsupported operand type(s) for ** or pow(): 'PosixGPath' and 'str'"
  )
  type_error = "TypeError: unsupported operand type(s) for ** or pow(): 'PosixGPath' and 'str'"
  output = log + '\n' + _failure(type_error, ['hscl_jax/m.py:4: TypeError'])
  assert mutation_score.handwritten.summary_lines(output) == [
    f'FAILED tests/test_x.py::test_y - {type_error}'
  ]
  assert mutation_score.raised_by_mutated_statement(output, 'hscl_jax/m.py', range(4, 5))
  collection = 'ERROR tests/test_x.py - ModuleNotFoundError: No module named jax'
  assert mutation_score.handwritten.summary_lines(log + '\n' + collection) == [collection]


def test_the_second_run_of_a_crash_decides_and_is_never_judged_not_viable():
  work_item = pytest.importorskip('cosmic_ray.work_item')
  type_error = _failure(
    'TypeError: unsupported operand type(s) for <<', ['hscl_jax/m.py:4: TypeError']
  )
  result = lambda output: work_item.WorkResult(
    worker_outcome=work_item.WorkerOutcome.NORMAL,
    output=output,
    test_outcome=work_item.TestOutcome.KILLED,
  )
  outcome = lambda r: mutation_score.outcome_of(r, {}, 'hscl_jax/m.py', range(3, 5))[0]
  assert outcome(result(type_error)) == 'not viable'
  assert outcome(result(mutation_score.EVERY_TEST + type_error)) == 'crash'
  asserted = _summary('FAILED tests/test_x.py::test_z - AssertionError: 3 != 4')
  assert outcome(result(mutation_score.EVERY_TEST + type_error + asserted)) == 'assertion'


def test_the_second_run_has_every_test_and_the_first_stops_at_one():
  first = mutation_score.test_command('hscl_jax/evaluation/knn.py').split()
  every = mutation_score.test_command('hscl_jax/evaluation/knn.py', first_failure=False).split()
  assert '-x' in first and '-x' not in every
  assert [a for a in first if a != '-x'] == every
  # The module's own test file among those run (the measured map may add files after it).
  assert 'tests/test_knn.py' in every and '-rfE' in every


def test_a_replaced_handler_catches_nothing_and_what_it_caught_propagates(tmp_path):
  """cosmic-ray's ExceptionReplacer writes `except CosmicRayTestingException`, a name its
  own process defines: in the mutants' test runs the plugin the command loads defines it,
  so a replaced handler lets its OSError through instead of raising NameError."""
  (tmp_path / 'test_probe.py').write_text(
    'import pytest\n\n'
    'def test_the_handler_catches_nothing():\n'
    '  with pytest.raises(OSError):\n'
    '    try:\n'
    "      raise OSError('no /proc')\n"
    '    except (CosmicRayTestingException, ValueError):  # noqa: F821\n'
    '      pass\n'
  )
  command = shlex.split(mutation_score.test_command('hscl_jax/evaluation/knn.py'))
  assert command[command.index('-p', command.index('no:cacheprovider')) + 1] == (
    'mutation.cosmic_names'
  )
  options = [a for a in command[3:] if not a.startswith('tests/')]  # the tests' files out
  env = dict(os.environ, PYTHONPATH=str(REPO / 'dev'))
  ran = subprocess.run(
    [*command[:3], *options, str(tmp_path / 'test_probe.py')],
    cwd=tmp_path,
    env=env,
    capture_output=True,
    text=True,
  )
  assert ran.returncode == 0, ran.stdout[-2000:]


def _score_commands(path: pathlib.Path) -> list[list[str]]:
  """The arguments of the score commands in a file: in code blocks (a line of their own)
  and in code spans (over line breaks), by either name of the tool; the tool's name alone,
  in a sentence, is none."""
  text, commands = path.read_text(), []
  for tool in ('python dev/mutation_score.py', 'python dev/mutation score'):
    commands += [line.strip() for line in text.splitlines() if line.strip().startswith(tool)]
    commands += [' '.join(span.split()) for span in re.findall(f'`({tool}[^`]*)`', text)]
  arguments = [
    re.sub(r'^python dev/mutation(_score\.py| score)', '', c).split('#')[0].split()
    for c in commands
  ]
  return [argv for argv in arguments if argv]


def test_every_command_the_docs_show_parses_and_names_existing_modules():
  """The how-to's commands (docs/testing.md, dev/README.md, the tool's docstrings) parse and
  name modules of today's tree; the measurements log's, a dated record of what ran then
  (under the module paths of their day), parse."""
  current = [
    REPO / 'docs/testing.md',
    REPO / 'dev/README.md',
    REPO / 'dev/mutation/score.py',
    REPO / 'dev/mutation/__main__.py',
  ]
  commands = [argv for path in current for argv in _score_commands(path)]
  recorded = _score_commands(LOG)
  assert len(commands) >= 9 and len(recorded) >= 9
  for argv in commands + recorded:
    args = mutation_score.make_parser().parse_args(argv)
    assert args.all or args.modules, argv
  for argv in commands:
    modules = mutation_score.make_parser().parse_args(argv).modules
    assert all(module in mutation_score.TESTS_OF for module in modules), argv
    assert all((REPO / module).is_file() for module in modules), argv


def test_every_map_command_the_docs_show_names_existing_tests():
  """`python dev/mutation map [PYTEST_ARGS]`: its arguments go to pytest, which would run
  no test on a misspelt path (and the tool would refuse to write the map). The measurements
  log's are a dated record: they name test files, as they were then."""
  tool = 'python dev/mutation map'
  commands = lambda *paths: [
    line.split(tool, 1)[1].split('#')[0].split()
    for path in paths
    for line in path.read_text().splitlines()
    if tool + ' ' in line + ' ' and 'usage:' not in line and f"'{tool}'" not in line
  ]
  current = commands(
    REPO / 'docs/testing.md', REPO / 'dev/README.md', REPO / 'dev/mutation/coverage_map.py'
  )
  assert len(current) >= 4 and [] in current
  for words in current:
    assert all((REPO / word.split('::')[0]).exists() for word in words), words
  for words in commands(LOG):
    assert all(word.startswith(('tests/', '-')) for word in words), words


def test_a_signal_kills_the_running_test_command_and_removes_the_copy(tmp_path):
  """What `kill` of the tool left behind before: the test command, in a session of its own,
  and the tree's copy. Here a child in its own session stands for the test command."""
  script = f"""
import os, signal, subprocess, sys, tempfile, time
sys.path.insert(0, {str(REPO / 'dev')!r})
from mutation import score
signal.signal(signal.SIGTERM, score.stop_on_signal)
with tempfile.TemporaryDirectory(dir={str(tmp_path)!r}) as copy:
  child = subprocess.Popen(['sleep', '60'], start_new_session=True)
  print(child.pid, copy, flush=True)
  time.sleep(60)
"""
  proc = subprocess.Popen([sys.executable, '-c', script], stdout=subprocess.PIPE, text=True)
  child, copy = proc.stdout.readline().split()
  assert pathlib.Path(copy).is_dir() and int(child) in mutation_score.child_pids(proc.pid)
  proc.send_signal(signal.SIGTERM)
  assert proc.wait(timeout=30) == 128 + signal.SIGTERM
  assert not pathlib.Path(copy).exists()
  deadline = time.monotonic() + 10
  while pathlib.Path(f'/proc/{child}').exists() and time.monotonic() < deadline:
    time.sleep(0.1)  # a killed child is a zombie until init reaps it
  status = pathlib.Path(f'/proc/{child}/stat')
  assert not status.exists() or status.read_text().rsplit(')', 1)[1].split()[0] == 'Z'


def test_a_recheck_runs_the_survivors_crashes_and_timeouts_again():
  """And a drawn mutant without a result; not the assertion kills, the not viable, the
  equivalents or the undrawn mutants."""
  work_item = pytest.importorskip('cosmic_ray.work_item')
  killed, survived = work_item.TestOutcome.KILLED, work_item.TestOutcome.SURVIVED
  normal = work_item.WorkerOutcome.NORMAL
  outputs = {
    'asserted': (killed, _summary('FAILED tests/t.py::a - AssertionError: 1 != 2')),
    'crashed': (killed, _summary('FAILED tests/t.py::b - ValueError: refused')),
    'timed out': (killed, 'timeout'),
    'survived': (survived, ''),
    'not viable': (killed, _failure('TypeError: bad operand', ['hscl_jax/m.py:1: TypeError'])),
  }
  results = [
    (job, work_item.WorkResult(worker_outcome=normal, output=o, test_outcome=t))
    for job, (t, o) in outputs.items()
  ]
  results.append(('undrawn', work_item.WorkResult(worker_outcome=work_item.WorkerOutcome.SKIPPED)))
  position = type('Mutation', (), {'start_pos': (1, 0), 'operator_name': 'core/NumberReplacer'})
  jobs = [job for job, _ in results] + ['never run']
  items = [type('Item', (), {'job_id': job, 'mutations': [position]}) for job in jobs]
  db = type('Db', (), {'work_items': items, 'results': results})
  assert mutation_score.rechecked(db, 'hscl_jax/m.py', 'x = a << 1\n', {}) == {
    'crashed',
    'timed out',
    'survived',
    'never run',
  }
  listed = {('hscl_jax/m.py', '', ''): 'its one-line diff is listed as equivalent'}
  assert 'survived' not in mutation_score.rechecked(db, 'hscl_jax/m.py', 'x = a << 1\n', listed)


_DECORATED = """class M:
  size: int

  @nn.compact
  def __call__(self, x):
    \"\"\"Docstring.\"\"\"
    y = f(x,
          1)
    return y
"""


@pytest.mark.parametrize(
  'line,operator,lines',
  [
    (4, 'core/RemoveDecorator', range(7, 9)),  # the body's first statement, not the docstring
    (7, 'core/NumberReplacer', range(7, 9)),
    (4, 'core/NumberReplacer', range(4, 5)),
  ],
)
def test_a_removed_decorator_is_run_by_the_calls_of_its_function(line, operator, lines):
  assert mutation_score.reach_lines(_DECORATED, line, operator) == lines


def _sections(*failures):
  """pytest's long report of (test, frames, exception) failures, then its short summary."""
  report = ['=== FAILURES ===']
  for test, frames, exception in failures:
    report += [f'_____ {test} _____', *frames, f'E   {exception}']
  summary = [f'FAILED tests/t.py::{test} - {exception}' for test, _, exception in failures]
  return '\n'.join(report) + '\n' + _summary(*summary)


def _raise_line(module):
  lines = (REPO / module).read_text().splitlines()
  return next(n for n, line in enumerate(lines, 1) if line.strip().startswith('raise '))


@pytest.mark.parametrize(
  'failed,reach,everywhere',
  [
    (('a', 'b'), {'tests/t.py::a', 'tests/t.py::b'}, True),
    (('a', 'b', 'c'), {'tests/t.py::a'}, True),  # others fail too: they do not count
    (('a',), {'tests/t.py::a', 'tests/t.py::b'}, False),  # b runs it and passes
    (('a',), {'tests/t.py::a', mutation_score.OUTSIDE}, False),  # run outside a test too
    (('a',), set(), False),  # no test runs it: nothing shows it cannot run
    (('a',), None, False),  # not measured
  ],
)
def test_a_crash_is_not_viable_when_every_test_that_runs_it_fails(failed, reach, everywhere):
  frames = ['hscl_jax/evaluation/knn.py:2: in f', '/site-packages/jax/_src/x.py:9: TypeError']
  output = _sections(*((test, frames, 'TypeError: bad shape') for test in failed))
  reach = None if reach is None else frozenset(reach)
  assert mutation_score.fails_every_test_that_runs_it(output, reach) == everywhere


def test_a_refusal_of_the_package_is_behaviour_even_if_every_test_meets_it():
  """A mutant that refuses valid input fails every test; a test of the bound would see it
  accept the invalid one. So a failure ending on a `raise` of hscl_jax/ keeps it a crash."""
  reach = frozenset({'tests/t.py::a', 'tests/t.py::b'})
  elsewhere = ['hscl_jax/evaluation/knn.py:2: in f', '/site-packages/numpy/x.py:9: ValueError']
  refusal = [
    'hscl_jax/errors.py:20: in g',
    f'hscl_jax/errors.py:{_raise_line("hscl_jax/errors.py")}: ConfigError',
  ]
  both = _sections(('a', elsewhere, 'ValueError: no'), ('b', refusal, 'ConfigError: no'))
  assert not mutation_score.fails_every_test_that_runs_it(both, reach)
  deep = [
    'hscl_jax/evaluation/knn.py:2: in f',
    *refusal[1:],
    '/site-packages/numpy/x.py:9: ValueError',
  ]
  outer = _sections(('a', elsewhere, 'ValueError: no'), ('b', deep[:2], 'ConfigError: no'))
  assert not mutation_score.fails_every_test_that_runs_it(outer, reach)
  neither = _sections(('a', elsewhere, 'ValueError: no'), ('b', elsewhere, 'ValueError: no'))
  assert mutation_score.fails_every_test_that_runs_it(neither, reach)
  assert mutation_score.failed_tests(both) == set(reach)


def test_only_a_crash_of_the_run_with_every_test_is_judged_by_its_reach():
  work_item = pytest.importorskip('cosmic_ray.work_item')
  frames = ['hscl_jax/evaluation/knn.py:2: in f', '/site-packages/jax/x.py:9: ValueError']
  crash = _sections(('a', frames, 'ValueError: bad shape'))
  result = lambda output: work_item.WorkResult(
    worker_outcome=work_item.WorkerOutcome.NORMAL,
    output=output,
    test_outcome=work_item.TestOutcome.KILLED,
  )
  reach = frozenset({'tests/t.py::a'})
  outcome = lambda output, r: mutation_score.outcome_of(
    result(output), {}, 'hscl_jax/evaluation/knn.py', range(2, 3), r
  )
  every = mutation_score.EVERY_TEST
  assert outcome(every + crash, reach) == (
    'not viable',
    'fails all 1 tests that run it: ValueError: bad shape',
  )
  assert outcome(every + crash, None)[0] == 'crash'
  assert outcome(crash, reach)[0] == 'crash'  # the -x run: one test, the others unknown
  asserted = _summary('FAILED tests/t.py::z - AssertionError: 3 != 4')
  assert outcome(every + crash + asserted, reach)[0] == 'assertion'


def test_the_reach_names_the_tests_that_run_each_line(tmp_path, monkeypatch):
  """Measured on errors.fail (a `raise` on line 37) by a test file of three tests, stored
  with the module's fingerprint and read back only while that holds."""
  probe = tmp_path / 'test_probe.py'
  probe.write_text(
    'import pytest\nfrom hscl_jax import errors\n\n'
    'def test_fails():\n  with pytest.raises(errors.ConfigError):\n'
    "    errors.fail('x', 'bad', 'fix')\n\n"
    "def test_message():\n  assert '/w.' in errors.disk_full_message('/w')\n\n"
    'def test_nothing():\n  assert True\n'
  )
  # The suite's pytest.ini (xdist's `--dist loadgroup` once hid every test's context).
  (tmp_path / 'pytest.ini').write_text((REPO / 'pytest.ini').read_text())
  module, sibling = 'hscl_jax/errors.py', 'hscl_jax/__init__.py'
  monkeypatch.setitem(mutation_score.TESTS_OF, module, (str(probe),))
  monkeypatch.setitem(mutation_score.TESTS_OF, sibling, (str(probe),))
  monkeypatch.setattr(mutation_score, 'SESSIONS', tmp_path)
  monkeypatch.setattr(mutation_score, 'fingerprint', lambda module, tree=None: f'{module} today')
  monkeypatch.chdir(REPO)
  assert mutation_score.sharing_tests(module) == [sibling, module]
  mutation_score.measure_reach(module)
  reach = mutation_score.load_reach(module)
  # The same run measured the module with the same tests, under its own fingerprint: the
  # package's __init__ runs only at the probe's import, at collection.
  assert set(mutation_score.reach_of(mutation_score.load_reach(sibling), range(1, 1000))) == {
    mutation_score.OUTSIDE
  }
  assert sorted(p.name for p in tmp_path.glob('*.reach.json')) == [
    'hscl_jax____init__.py.reach.json',
    'hscl_jax__errors.py.reach.json',
  ]
  line = _raise_line(module)
  assert reach[line] == {'test_probe.py::test_fails'}
  body = mutation_score.reach_lines((REPO / module).read_text(), line, 'core/NumberReplacer')
  assert mutation_score.reach_of(reach, body) == {'test_probe.py::test_fails'}
  assert mutation_score.reach_of(reach, range(1, 1000)) >= {
    'test_probe.py::test_fails',
    'test_probe.py::test_message',
    mutation_score.OUTSIDE,  # the import, at collection
  }
  assert 'test_probe.py::test_nothing' not in mutation_score.reach_of(reach, range(1, 1000))
  monkeypatch.setattr(mutation_score, 'fingerprint', lambda module, tree=None: 'tests changed')
  assert mutation_score.load_reach(module) is None


def test_the_reach_of_a_program_outside_the_package_is_measured(tmp_path, monkeypatch):
  """The GPU programs are sampled too: their lines' tests are measured as the package's."""
  probe = tmp_path / 'test_probe.py'
  probe.write_text(
    f'import sys\nsys.path.insert(0, {str(REPO / "tools")!r})\nimport gpu_bundle\n\n'
    "def test_line():\n  assert gpu_bundle.check_carry(2**20, None).startswith('bundle 1.0')\n"
  )
  (tmp_path / 'pytest.ini').write_text((REPO / 'pytest.ini').read_text())
  module = 'tools/gpu_bundle.py'
  monkeypatch.setitem(mutation_score.TESTS_OF, module, (str(probe),))
  monkeypatch.setattr(mutation_score, 'SESSIONS', tmp_path)
  monkeypatch.setattr(mutation_score, 'fingerprint', lambda module, tree=None: f'{module} today')
  monkeypatch.chdir(REPO)
  mutation_score.measure_reach(module)
  lines = (REPO / module).read_text().splitlines()
  returned = next(n for n, line in enumerate(lines, 1) if "return f'bundle " in line)
  assert mutation_score.load_reach(module)[returned] == {'test_probe.py::test_line'}


def test_the_old_names_run_the_one_entry_point():
  """`python dev/mutation_test.py ...` is `python dev/mutation handwritten ...`; an
  unknown command is refused with the commands there are."""
  run = lambda *argv: subprocess.run(
    [sys.executable, *argv], cwd=REPO, capture_output=True, text=True, timeout=120
  )
  alias, entry = (
    run('dev/mutation_test.py', '--list'),
    run('dev/mutation', 'handwritten', '--list'),
  )
  assert alias.returncode == entry.returncode == 0, alias.stderr + entry.stderr
  names = [line.split()[0] for line in entry.stdout.splitlines()]
  assert alias.stdout == entry.stdout and 'threshold_strict' in names
  wrong = run('dev/mutation', 'scores')
  assert wrong.returncode != 0 and 'score, handwritten' in wrong.stderr and 'scores' in wrong.stderr


def test_each_test_files_baseline_runs_once_per_tree_and_a_set_sums_them(monkeypatch, tmp_path):
  """A set of files' baseline (the mutants' timeout) is the sum of its files' times, each
  file run alone once per copied tree, however many sets and processes share it (stored
  beside the sessions); another tree measures again; a failing file stops; a mutant's
  files run the quickest first."""
  runs, seconds = [], {'tests/a.py': 2.0, 'tests/b.py': 3.0, 'tests/c.py': 5.0}
  clock = [0.0]

  def run(command, **kwargs):
    runs.append(command[-1])
    clock[0] += seconds[command[-1]]
    return subprocess.CompletedProcess(command, 1 if command[-1] == 'tests/c.py' else 0, '', '')

  tree = tmp_path / 'copy'
  tree.mkdir()
  (tree / 'x.py').write_text('one')
  monkeypatch.chdir(tree)
  monkeypatch.setattr(mutation_score, 'SESSIONS', tmp_path / 'sessions')
  monkeypatch.setattr(mutation_score, 'BASELINES', tmp_path / 'sessions' / 'baselines.json')
  monkeypatch.setattr(mutation_score, '_BASELINES', {})
  monkeypatch.setattr(mutation_score.subprocess, 'run', run)
  monkeypatch.setattr(mutation_score.time, 'time', lambda: clock[0])
  monkeypatch.setitem(mutation_score.TESTS_OF, 'm.py', ('tests/b.py', 'tests/a.py'))
  assert mutation_score.baseline_seconds('m.py', ('tests/b.py', 'tests/a.py')) == 5.0
  assert mutation_score.baseline_seconds('m.py', ('tests/b.py',)) == 3.0
  assert mutation_score.baseline_seconds('m.py') == 5.0  # the module's files
  assert runs == ['tests/b.py', 'tests/a.py']
  assert mutation_score.fastest_first(('tests/b.py', 'tests/a.py')) == ('tests/a.py', 'tests/b.py')
  mutation_score._BASELINES.clear()  # another process on the same tree: stored
  assert mutation_score.baseline_seconds('m.py') == 5.0 and len(runs) == 2
  mutation_score._BASELINES.clear()
  mutation_score.tree_digest.cache_clear()
  (tree / 'x.py').write_text('two')  # another tree: measured again
  assert mutation_score.baseline_seconds('m.py', ('tests/a.py',)) == 2.0
  assert runs[2:] == ['tests/a.py']
  with pytest.raises(SystemExit, match='m.py: tests/c.py fails before any mutant'):
    mutation_score.baseline_seconds('m.py', ('tests/a.py', 'tests/c.py'))
  mutation_score.tree_digest.cache_clear()


def test_a_mutant_runs_the_tests_that_execute_its_statement_quickest_first(monkeypatch):
  """With the map by test: the tests executing the statement, less those failing under
  coverage, grouped by file (files by their quickest test), quickest first, then the
  module's UNCREDITED files whole; quoted for cosmic-ray's split; timed by the map."""
  source = 'def f(x):\n  y = x + 1\n  return y\n'
  module = 'hscl_jax/m.py'
  by_test = {
    'modules': {
      module: {
        'sha256': hashlib.sha256(source.encode()).hexdigest(),
        'tests': {
          'tests/a.py::t[a b]': '2',
          'tests/a.py::slow': '1-3',
          'tests/b.py::t': '2-3',
          'tests/b.py::broken': '2',
          'tests/c.py::elsewhere': '3',
        },
      }
    },
    'seconds': {'tests/a.py::t[a b]': 4.0, 'tests/a.py::slow': 9.0, 'tests/b.py::t': 1.0},
    'failed': ['tests/b.py::broken'],
    'files': {'tests/a.py': 'a as measured', 'tests/b.py': 'b as measured'},
  }
  monkeypatch.setattr(mutation_score, 'MEASURED_TESTS', by_test)
  file_map = {'sha256': by_test['modules'][module]['sha256'], 'tests': {'tests/b.py': '2'}}
  monkeypatch.setattr(mutation_score, 'MEASURED', {module: file_map})
  monkeypatch.setattr(coverage_map, 'digest', lambda path: f'{path.stem} as measured')
  monkeypatch.setitem(mutation_score.TESTS_OF, module, ('tests/b.py',))
  monkeypatch.setitem(mutation_score.UNCREDITED, module, ('tests/e.py',))
  at = type('Mutation', (), {'start_pos': (2, 0), 'operator_name': 'core/X'})
  chosen = mutation_score.tests_for(module, source, at)
  assert chosen == ('tests/b.py::t', 'tests/a.py::t[a b]', 'tests/a.py::slow', 'tests/e.py')
  command = shlex.split(mutation_score.test_command(module, files=chosen))
  assert command[-4:] == list(chosen) and '-x' in command
  assert mutation_score.fastest_first(chosen[:3]) == chosen[:3]  # ordered already
  # A file of the module's changed since the map by test (new tests it cannot know, which
  # may execute the statement where none of the file's did): run whole, in place of its
  # tests.
  monkeypatch.setitem(mutation_score.TESTS_OF, module, ('tests/b.py', 'tests/d.py'))
  by_test['files']['tests/d.py'] = 'd as measured'
  monkeypatch.setattr(coverage_map, 'digest', lambda path: f'{path.stem} edited')
  assert mutation_score.tests_for(module, source, at) == (
    'tests/a.py::t[a b]',
    'tests/a.py::slow',
    'tests/b.py',
    'tests/d.py',
    'tests/e.py',
  )
  # Their time bound: the recorded seconds, and each file's start; no run.
  monkeypatch.setattr(mutation_score, 'stored_baselines', lambda tree: {})
  monkeypatch.setattr(mutation_score.subprocess, 'run', None)  # a run would fail here
  startup = mutation_score.STARTUP_SECONDS
  assert mutation_score.baseline_seconds(module, chosen[:3]) == 14.0 + 2 * startup
  # A changed module: the map by test cannot tell; the file map decides.
  monkeypatch.setattr(mutation_score, 'MEASURED', {})
  monkeypatch.setitem(mutation_score.TESTS_OF, module, ('tests/a.py',))
  assert mutation_score.tests_for(module, source + '\n', at) == ('tests/a.py',)


def _stamped_tree(tmp_path, monkeypatch):
  """A tree of one module and its test file, its session stored and stamped as
  `open_session` stamps it; (tree, the stamp's path, a restamp of it)."""
  tree, module = tmp_path / 'tree', 'pkg/m.py'
  (tree / 'pkg').mkdir(parents=True)
  (tree / 'tests').mkdir()
  (tree / module).write_text('def f(x):\n  return x + 1\n')
  (tree / 'tests/conftest.py').write_text('')
  (tree / 'tests/test_m.py').write_text(
    'def test_a():\n  assert 1\n\n\nclass TestB:\n  def test_c(self):\n    assert 1\n'
  )
  monkeypatch.setattr(mutation_score, 'SESSIONS', tmp_path / 'sessions')
  monkeypatch.setitem(mutation_score.TESTS_OF, module, ('tests/test_m.py',))
  session = mutation_score.session_path(module, 3, 0)
  session.parent.mkdir()
  session.write_bytes(b'results')
  stamp = session.with_suffix('.json')
  stamp.write_text(mutation_score.json.dumps(mutation_score.stamp_record(module, tree=tree)))
  return tree, stamp, lambda: mutation_score.restamp(module, 3, 0, tree=tree)


def test_a_restamp_keeps_a_session_whose_tests_were_only_added(tmp_path, monkeypatch):
  tree, stamp, restamp = _stamped_tree(tmp_path, monkeypatch)
  fingerprint = lambda: mutation_score.fingerprint('pkg/m.py', tree)
  before = fingerprint()
  assert restamp() == (True, 'pkg/m.py: unchanged')
  tests = tree / 'tests/test_m.py'
  tests.write_text(tests.read_text() + '\n\ndef test_d():\n  assert 2\n\n\ndef test_e():\n  pass\n')
  assert fingerprint() != before
  assert mutation_score.stamped_fingerprint(stamp) == before  # the session would start again
  assert restamp() == (True, 'pkg/m.py: restamped (2 tests added)')
  assert mutation_score.stamped_fingerprint(stamp) == fingerprint()
  assert mutation_score.json.loads(stamp.read_text())['tests'] == {
    'tests/test_m.py': ['TestB::test_c', 'test_a', 'test_d', 'test_e']
  }


@pytest.mark.parametrize(
  'change, why',
  [
    ('module', 'its code changed'),
    ('conftest', 'tests/conftest.py'),
    ('removed', 'tests removed: tests/test_m.py::TestB::test_c'),
    ('dropped', 'test files no longer among its tests: tests/test_m.py'),
  ],
)
def test_a_restamp_refuses_more_than_added_tests_and_keeps_the_stamp(
  tmp_path, monkeypatch, change, why
):
  tree, stamp, restamp = _stamped_tree(tmp_path, monkeypatch)
  stamped = stamp.read_text()
  tests = tree / 'tests/test_m.py'
  tests.write_text(tests.read_text() + '\n\ndef test_d():\n  assert 2\n')  # added besides
  if change == 'module':
    (tree / 'pkg/m.py').write_text('def f(x):\n  return x + 2\n')
  elif change == 'conftest':
    (tree / 'tests/conftest.py').write_text('import os\n')
  elif change == 'removed':
    tests.write_text(tests.read_text().replace('def test_c', 'def helper_c'))
  else:
    (tree / 'tests/test_other.py').write_text('def test_x():\n  pass\n')
    monkeypatch.setitem(mutation_score.TESTS_OF, 'pkg/m.py', ('tests/test_other.py',))
  ok, message = restamp()
  assert not ok and why in message and 'run its session again' in message, message
  assert stamp.read_text() == stamped


def test_a_restamp_upgrades_a_bare_stamp_only_while_it_matches(tmp_path, monkeypatch):
  """Stamps held the bare fingerprint before they recorded their tests: one that still
  matches gets its record; one that does not cannot tell what changed, and is refused."""
  tree, stamp, restamp = _stamped_tree(tmp_path, monkeypatch)
  bare = mutation_score.json.dumps(mutation_score.fingerprint('pkg/m.py', tree))
  stamp.write_text(bare)
  assert restamp() == (True, 'pkg/m.py: unchanged; its stamp now records its tests')
  assert mutation_score.json.loads(stamp.read_text()) == mutation_score.stamp_record(
    'pkg/m.py', tree=tree
  )
  stamp.write_text(bare)
  tests = tree / 'tests/test_m.py'
  tests.write_text(tests.read_text() + '\n\ndef test_d():\n  assert 2\n')
  ok, message = restamp()
  assert not ok and 'predates recorded tests' in message
  assert stamp.read_text() == bare
  mutation_score.session_path('pkg/m.py', 3, 0).unlink()
  assert restamp() == (False, 'pkg/m.py: no stored session (n=3, seed=0): run it first')


def test_restamp_is_one_of_the_stored_samples_commands(tmp_path, monkeypatch, capsys):
  """`--restamp` of a stored sample says what it did per module and exits 1 where it
  refused; with `--report` it is refused, and of a sample never run too."""
  monkeypatch.setattr(mutation_score, 'SESSIONS', tmp_path)
  session = mutation_score.session_path('hscl_jax/evaluation/knn.py', 7, 0)
  session.write_bytes(b'results')
  stamp = session.with_suffix('.json')
  stamp.write_text(
    mutation_score.json.dumps(mutation_score.stamp_record('hscl_jax/evaluation/knn.py'))
  )
  monkeypatch.setattr(
    sys, 'argv', ['score', 'hscl_jax/evaluation/knn.py', '--restamp', '--sample', '7']
  )
  assert mutation_score.main() == 0
  assert capsys.readouterr().out == 'hscl_jax/evaluation/knn.py: unchanged\n'
  stamp.write_text(mutation_score.json.dumps('another tree'))
  assert mutation_score.main() == 1
  assert 'hscl_jax/evaluation/knn.py: not restamped' in capsys.readouterr().out
  session.unlink()
  for argv, error in (
    (
      ['hscl_jax/evaluation/knn.py', '--restamp', '--report'],
      'one of --recheck, --report and --restamp',
    ),
    (
      ['hscl_jax/evaluation/knn.py', '--restamp', '--sample', '7'],
      '--restamp: no stored sample of hscl_jax/evaluation/knn.py',
    ),
  ):
    monkeypatch.setattr(sys, 'argv', ['score', *argv])
    with pytest.raises(SystemExit):
      mutation_score.main()
    assert error in capsys.readouterr().err
