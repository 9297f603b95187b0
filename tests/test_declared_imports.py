"""Every package a test or our code imports is declared where the README's commands install it.

The plugin (tests/declared_imports.py) is run on probe test files against a distribution
made here (`probe-dist`, installed nowhere but on the probes' path): a test that imports it
fails naming it, one that asks first (importorskip, find_spec) skips or passes. Then every
import statement of hscl_jax/, tests/, tools/, benchmarks/, launch/ and dev/ is checked
against the extras its file's docs name.
"""

from __future__ import annotations

import ast
import functools
import os
import pathlib
import subprocess
import sys
import textwrap

import declared_imports
import requirements

REPO = requirements.REPO

_CONFTEST = """
import sys
sys.path.insert(0, {tests!r})
import declared_imports
declared_imports.OURS.append({ours!r})

def pytest_configure(config):
  declared_imports.register(config)
"""


def _distribution(site: pathlib.Path, name: str, module: str, requires=()) -> None:
  """An installed distribution `name` providing the top-level `module` (a module that
  records each import of it)."""
  info = site / f'{name.replace("-", "_")}-1.0.dist-info'
  info.mkdir(parents=True)
  lines = [f'Name: {name}', 'Version: 1.0', *(f'Requires-Dist: {r}' for r in requires)]
  (info / 'METADATA').write_text('Metadata-Version: 2.1\n' + '\n'.join(lines) + '\n')
  (info / 'top_level.txt').write_text(module + '\n')
  (info / 'RECORD').write_text(f'{module}.py,,\n')
  (site / f'{module}.py').write_text('VALUE = 1\n')


def _run_probes(tmp_path, files: dict[str, str]) -> subprocess.CompletedProcess:
  site, ours = tmp_path / 'lib' / 'site-packages', tmp_path / 'ours'
  _distribution(site, 'probe-dist', 'probe_module')
  _distribution(site, 'probe-guard', 'probe_guard', requires=['probe-brought'])
  _distribution(site, 'probe-brought', 'probe_brought')
  ours.mkdir()
  (tmp_path / 'elsewhere').mkdir()  # a module a test writes and imports: no package
  (tmp_path / 'elsewhere' / 'probe_own.py').write_text('VALUE = 2\n')
  (ours / 'conftest.py').write_text(_CONFTEST.format(tests=str(REPO / 'tests'), ours=str(ours)))
  for name, text in files.items():
    (ours / name).write_text(textwrap.dedent(text))
  path = [str(site), str(ours), str(tmp_path / 'elsewhere')]
  env = {**os.environ, 'PYTHONPATH': os.pathsep.join(path)}
  command = [sys.executable, '-m', 'pytest', '-p', 'no:cacheprovider', '-p', 'no:xdist', '-v']
  return subprocess.run(
    [*command, '-rs', str(ours)], cwd=ours, env=env, capture_output=True, text=True, timeout=120
  )


def _outcomes(out: subprocess.CompletedProcess) -> dict[str, str]:
  """{test name: PASSED, FAILED or SKIPPED} from -v's line per test."""
  found = {}
  for line in out.stdout.splitlines():
    test, _, rest = line.partition(' ')
    if '::' in test and rest.split(' ')[0] in ('PASSED', 'FAILED', 'SKIPPED'):
      found[test.split('::')[1]] = rest.split(' ')[0]
  return found


def test_a_test_that_imports_an_undeclared_package_fails_and_one_that_asks_first_does_not(tmp_path):
  """Directly, through a function of ours that imports it, and through a module of ours
  that imports it at its top (loaded by an earlier file too: followed statically);
  importorskip and find_spec guard it, and asking for a distribution guards what it
  brings. Packages of the [test] extra, the standard library and a module a test wrote
  itself never fail."""
  out = _run_probes(
    tmp_path,
    files := {
      'ours_lib.py': 'import probe_module\n',
      'ours_lazy.py': 'def value():\n  import probe_module\n  return probe_module.VALUE\n',
      'test_a.py': """
        import importlib.util, json
        import numpy, pytest
        import ours_lazy

        def test_direct():
          import probe_module
        def test_through_our_function():
          assert ours_lazy.value() == 1
        def test_asks_first():
          pytest.importorskip('probe_module')
          assert ours_lazy.value() == 1
        def test_asks_with_find_spec():
          if importlib.util.find_spec('probe_module') is not None:
            import probe_module
        def test_brought_by_what_it_asked_for():
          pytest.importorskip('probe_guard')
          import probe_brought
        def test_declared_and_standard():
          assert numpy.ones(1).sum() == 1 and json.dumps(1) == '1'
        def test_a_module_of_its_own():
          import probe_own
          assert probe_own.VALUE == 2
        def test_skips_before_importing():
          pytest.importorskip('not_installed_anywhere')
          import probe_module
        def test_fails_anyway():
          import probe_module
          assert False, 'its own failure'
      """,
      'test_b.py': 'import ours_lib\n\ndef test_module_level_first():\n  pass\n',
      'test_c.py': 'import ours_lib\n\ndef test_module_level_again():\n  pass\n',
    },
  )
  assert _outcomes(out) == {
    'test_direct': 'FAILED',
    'test_through_our_function': 'FAILED',
    'test_asks_first': 'PASSED',
    'test_asks_with_find_spec': 'PASSED',
    'test_brought_by_what_it_asked_for': 'PASSED',
    'test_declared_and_standard': 'PASSED',
    'test_a_module_of_its_own': 'PASSED',
    'test_skips_before_importing': 'SKIPPED',
    'test_fails_anyway': 'FAILED',
    'test_module_level_first': 'FAILED',
    'test_module_level_again': 'FAILED',
  }, out.stdout[-3000:] + out.stderr[-2000:]
  message = (
    'probe_module (probe-dist: declared in no extra of setup.py) is not installed by pip '
    "install -e '.[test]', so this test fails on a fresh machine. Fix: declare it in [test], "
    "or call pytest.importorskip('probe_module', reason='needs the [EXTRA] extra') before "
    'the code that imports it.'
  )
  assert out.stdout.count(message) == 5  # test_fails_anyway's own failure, with a section
  assert 'its own failure' in out.stdout and 'undeclared imports' in out.stdout
  asks = "pytest.importorskip('not_installed_anywhere')"
  line = next(i for i, text in enumerate(files['test_a.py'].splitlines(), 1) if asks in text)
  assert f"SKIPPED [1] test_a.py:{line}: could not import 'not_installed_anywhere'" in out.stdout


def test_the_message_names_the_extra_that_declares_the_package():
  """cosmic-ray is setup.py's [mutation] extra: the fix names it."""
  text = declared_imports.explain({'cosmic_ray': ['cosmic-ray']})
  assert "declared in setup.py's [mutation]" in text
  assert "pytest.importorskip('cosmic_ray', reason='needs the [mutation] extra')" in text
  assert "pip install -e '.[test,mutation]'" in declared_imports.explain(
    {'cosmic_ray': ['cosmic-ray']}, ('test', 'mutation')
  )
  assert declared_imports.extras_of_test('dev/tests/test_x.py::t') == (
    'test',
    'mutation',
    'coverage',
  )
  assert declared_imports.extras_of_test('tests/test_x.py::t') == ('test',)


def test_a_fresh_install_of_an_extra_brings_its_requirements_transitively():
  """The [test] extra's closure holds what pip installs for it (pytest brings pluggy; jax
  brings jaxlib) and not what only another extra declares."""
  fresh = requirements.installed_by('test')
  assert {'pytest', 'pluggy', 'jax', 'jaxlib', 'flax', 'numpy'} <= fresh
  assert not {'cosmic-ray', 'coverage', 'torch', 'tensorflow-cpu'} & fresh
  assert requirements.extras_providing('cosmic-ray') == ['mutation']
  assert requirements.extras_providing('jax') == ['']


FOLDER_EXTRAS = declared_imports.FOLDER_EXTRAS
_ASKING = ('importorskip', 'find_spec')


@functools.cache
def _ours(top: str) -> bool:
  """A module of this repository: a top-level folder or file, or one of a code folder's."""
  places = [REPO, *(REPO / folder for folder in FOLDER_EXTRAS)]
  return any((place / top).is_dir() or (place / f'{top}.py').is_file() for place in places)


def _named_extras(path: pathlib.Path, tree: ast.Module) -> tuple[str, ...]:
  """The extras a module's docstring names (`[report]`, `.[bench]`), or its packages'."""
  texts = [ast.get_docstring(tree) or '']
  for package in path.parents:
    if package == REPO or not (package / '__init__.py').is_file():
      break
    if package != path.parent or path.name != '__init__.py':
      texts.append(ast.get_docstring(ast.parse((package / '__init__.py').read_text())) or '')
  text = '\n'.join(texts)
  return tuple(e for e in requirements.extras() if f'[{e}]' in text or f',{e}]' in text)


def _asked_in(scope: ast.AST) -> set[str]:
  """Top-level modules a scope asks for before relying on them (importorskip, find_spec)."""
  asked = set()
  for node in ast.walk(scope):
    if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
      name = getattr(node.func, 'attr', getattr(node.func, 'id', ''))
      if name in _ASKING and isinstance(node.args[0].value, str):
        asked.add(node.args[0].value.partition('.')[0])
  return asked


def _import_sites(tree: ast.Module):
  """(line, top-level module, guarded) of every absolute import: guarded where a `try`
  around it catches ImportError, or its function (or module) asks for the module."""

  def visit(node, scope, guarded):
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
      scope = node
    if isinstance(node, ast.Try) and declared_imports._catches_import_error(node):
      for child in node.body:
        yield from visit(child, scope, True)
      for child in node.handlers + node.orelse + node.finalbody:
        yield from visit(child, scope, guarded)
      return
    names = []
    if isinstance(node, ast.Import):
      names = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
      names = [node.module]
    for name in names:
      top = name.partition('.')[0]
      yield node.lineno, top, guarded or top in _asked_in(scope)
    for child in ast.iter_child_nodes(node):
      yield from visit(child, scope, guarded)

  yield from visit(tree, tree, False)


def _owners(top: str) -> set[str]:
  """The distributions providing a top-level module; where none installed here does, the
  distribution of its name (cosmic_ray -> cosmic-ray)."""
  return set(declared_imports.owner_distributions().get(top) or [requirements.distribution(top)])


def test_every_import_is_of_the_extra_its_code_documents_or_asked_for_first():
  """Each absolute import of a third-party module in our code is installed by the extras of
  its folder (FOLDER_EXTRAS) or those its module docstring names, or sits where a missing
  one is handled: under `try ... except ImportError`, or in a function (or module) that
  asks for it first (pytest.importorskip, importlib.util.find_spec). Every such module is
  declared somewhere in setup.py."""
  undeclared, unguarded = [], []
  for folder, extras in FOLDER_EXTRAS.items():
    for path in sorted((REPO / folder).rglob('*.py')):
      tree = ast.parse(path.read_text())
      named = tuple(e for e in _named_extras(path, tree) if e not in extras)
      installed = requirements.installed_by(*extras, *named)
      for line, top, guarded in _import_sites(tree):
        if top in sys.stdlib_module_names or top == '__future__' or _ours(top):
          continue
        owners, where = _owners(top), f'{path.relative_to(REPO)}:{line} {top}'
        if not owners & (requirements.declared() | requirements.installed_by()):
          undeclared.append(where)
        elif not owners & installed and not guarded:
          unguarded.append(f'{where} ({sorted(owners)}; extras {extras + named})')
  assert not undeclared + unguarded, '\n'.join(
    ['imported, declared in no extra of setup.py:', *undeclared]
    + ["imported, not installed by its code's extras, nor asked for first:", *unguarded]
  )
