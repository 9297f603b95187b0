"""A test fails where it needs a package the README's test command does not install.

The README's command installs the `[test]` extra; a test that imports (itself, or through
our code it calls) a module of any other distribution passes on a machine where that
distribution happens to be installed and fails on a fresh one. This plugin records, for
each test, the top-level modules our code imports while the test's module is collected and
while the test sets up and runs (every `import` statement and `importlib.import_module`
call made from a file of this repository, and the module-level imports of every module of
ours they load), and the modules it asks about first (`pytest.importorskip`,
`importlib.util.find_spec`: a skip with its reason where they are missing). A test that
imported a module outside the fresh install without asking fails with the module, the
extra that declares it and the fix. Programs a test starts as subprocesses are not
followed.

    python -m pytest -q tests/test_package.py  # a test reaching an undeclared module fails
"""

from __future__ import annotations

import ast
import builtins
import functools
import importlib
import importlib.util
import os
import pathlib
import sys

import pytest
import requirements

REPO = requirements.REPO
README_EXTRAS = ('test',)  # what the README's test command installs
# The extras each folder's code runs with where its docs name none: the package with the
# trainer's, the suite and the scripts it tests with the README's test command, the
# development tooling with dev/README.md's. A test's own folder decides what it may import.
FOLDER_EXTRAS = {
  'hscl_jax': ('train',),
  'launch': ('train',),
  'tests': README_EXTRAS,
  'tools': README_EXTRAS,
  'benchmarks': README_EXTRAS,
  'dev': ('test', 'mutation', 'coverage'),
}


def extras_of_test(nodeid: str) -> tuple[str, ...]:
  """The extras the test command of a test's folder installs (tests/ and dev/tests/)."""
  return FOLDER_EXTRAS.get(nodeid.split('/', 1)[0], README_EXTRAS)


@functools.cache
def owner_distributions() -> dict[str, list[str]]:
  """{top-level module: the distributions that provide it}, PEP 503 names."""
  return {
    module: [requirements.distribution(d) for d in dists]
    for module, dists in importlib.metadata.packages_distributions().items()
  }


OURS = [str(REPO)]  # the folders whose files are ours (a test of the plugin adds its own)


def _is_ours(path: str | None) -> bool:
  """A file of this repository (not of a virtual environment kept inside it)."""
  return bool(path) and _is_our_file(path, tuple(OURS))


@functools.cache
def _is_our_file(path: str, ours: tuple[str, ...]) -> bool:
  resolved = os.path.realpath(path)
  inside = any(resolved.startswith(os.path.realpath(root) + os.sep) for root in ours)
  return inside and 'site-packages' not in resolved


@functools.cache
def _module_level_imports(path: str) -> frozenset[str]:
  """Absolute names a file imports when it is loaded: the statements outside functions,
  except those under `try: ... except ImportError` (they decide what a missing one does)."""
  found: set[str] = set()

  def visit(nodes):
    for node in nodes:
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        continue
      if isinstance(node, ast.Try) and _catches_import_error(node):
        visit(node.orelse + node.finalbody)
        continue
      if isinstance(node, ast.Import):
        found.update(alias.name for alias in node.names)
      elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        found.add(node.module)
        found.update(f'{node.module}.{alias.name}' for alias in node.names)
      visit(ast.iter_child_nodes(node))

  visit(ast.parse(pathlib.Path(path).read_text()).body)
  return frozenset(found)


def _catches_import_error(node: ast.Try) -> bool:
  names = {'ImportError', 'ModuleNotFoundError', 'Exception', 'BaseException'}
  for handler in node.handlers:
    caught = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    if handler.type is None or any(isinstance(c, ast.Name) and c.id in names for c in caught):
      return True
  return False


class Recorder:
  """The modules our code imports and the modules asked about, into the current record."""

  def __init__(self):
    self.record: dict[str, set[str]] | None = None

  def start(self) -> dict[str, set[str]]:
    self.record = {'imported': set(), 'asked': set()}
    return self.record

  def stop(self) -> None:
    self.record = None

  def imported(self, name: str, importer_file: str | None) -> None:
    if self.record is not None and name and _is_ours(importer_file):
      self.record['imported'].add(name)

  def asked(self, name: str, asker_file: str | None) -> None:
    if self.record is not None and name and _is_ours(asker_file):
      self.record['asked'].add(name.partition('.')[0])


def _install(recorder: Recorder) -> None:
  """Wrap the import statement, import_module, importorskip and find_spec (once per process:
  every Plugin shares RECORDER)."""
  original_import = builtins.__import__
  original_import_module = importlib.import_module
  original_importorskip = pytest.importorskip
  original_find_spec = importlib.util.find_spec

  def recording_import(name, globals=None, locals=None, fromlist=(), level=0):
    if level == 0 and globals is not None:
      recorder.imported(name, globals.get('__file__'))
      for item in fromlist or ():
        recorder.imported(f'{name}.{item}', globals.get('__file__'))
    return original_import(name, globals, locals, fromlist, level)

  def recording_import_module(name, package=None):
    if not name.startswith('.'):
      recorder.imported(name, sys._getframe(1).f_globals.get('__file__'))
    return original_import_module(name, package)

  def recording_importorskip(modname, *args, **kwargs):
    __tracebackhide__ = True  # a skip's location is the test's line, not this one
    recorder.asked(modname, sys._getframe(1).f_globals.get('__file__'))
    return original_importorskip(modname, *args, **kwargs)

  def recording_find_spec(name, package=None):
    recorder.asked(name, sys._getframe(1).f_globals.get('__file__'))
    return original_find_spec(name, package)

  builtins.__import__ = recording_import
  importlib.import_module = recording_import_module
  pytest.importorskip = recording_importorskip
  importlib.util.find_spec = recording_find_spec


def _reach(names: set[str]) -> set[str]:
  """The top-level third-party modules that importing `names` loads: each name's top level,
  and for a module of ours, its module-level imports, followed through our modules."""
  tops: set[str] = set()
  seen: set[str] = set()
  todo = list(names)
  while todo:
    name = todo.pop()
    if name in seen:
      continue
    seen.add(name)
    top = name.partition('.')[0]
    module = sys.modules.get(name)
    path = getattr(module, '__file__', None)
    if _is_ours(path):
      if path.endswith('.py'):
        todo.extend(_module_level_imports(path))
    elif _is_ours(getattr(sys.modules.get(top), '__file__', None)):
      continue  # `from ours import name`: a name defined in our module, not a module
    elif module is not None or name == top:
      tops.add(top)
  return tops - set(sys.stdlib_module_names) - {'__future__'}


def missing_on_a_fresh_install(
  record: dict[str, set[str]], extras: tuple[str, ...] = README_EXTRAS
) -> dict[str, list[str]]:
  """{module: the distributions that provide it} for each module the record imported that a
  fresh install of `extras` lacks and that was not asked about."""
  fresh = requirements.installed_by(*extras)
  # Asking for a module guards what its distributions bring too (cosmic-ray brings parso).
  asked = requirements.with_requirements(
    d for module in record['asked'] for d in owner_distributions().get(module, ())
  )
  missing = {}
  for top in sorted(_reach(record['imported']) - record['asked']):
    owners = owner_distributions().get(top)
    if owners is None and top in sys.modules:
      continue  # loaded, yet no distribution's: built in, or a module a test wrote itself
    if owners is None or not set(owners) & fresh and not set(owners) <= asked:
      missing[top] = owners or [requirements.distribution(top)]
  return missing


def explain(missing: dict[str, list[str]], extras: tuple[str, ...] = README_EXTRAS) -> str:
  """What each missing module is, which extra declares it, and the two fixes."""
  installed = ','.join(extras)
  lines = []
  for module, owners in missing.items():
    declaring = sorted({e for d in owners for e in requirements.extras_providing(d)})
    where = f"setup.py's [{'], ['.join(declaring)}]" if declaring else 'no extra of setup.py'
    lines.append(
      f'{module} ({", ".join(owners)}: declared in {where}) is not installed by '
      f"pip install -e '.[{installed}]', so this test fails on a fresh machine. Fix: declare "
      f'it in [{extras[0]}], or call pytest.importorskip({module!r}, reason='
      f"'needs the [{declaring[0] if declaring else 'EXTRA'}] extra') before the code that "
      'imports it.'
    )
  return '\n'.join(lines)


RECORDER = Recorder()
_install(RECORDER)


def register(config) -> None:
  """The plugin, once per session (tests/conftest.py and dev/tests/conftest.py both ask)."""
  if not config.pluginmanager.has_plugin('declared_imports'):
    config.pluginmanager.register(Plugin(), 'declared_imports')


class Plugin:
  """Each test checked against the extras of its folder's test command (`extras_of_test`).
  Old-style hook wrappers: pytest 6.2.5 (setup.py's floor) knows no other."""

  def __init__(self):
    self.recorder = RECORDER
    self.collected: dict[str, dict[str, set[str]]] = {}
    self.running: dict[str, dict[str, set[str]]] = {}

  @pytest.hookimpl(hookwrapper=True)
  def pytest_make_collect_report(self, collector):
    if isinstance(collector, pytest.Module):
      self.collected[collector.nodeid] = self.recorder.start()
    yield
    self.recorder.stop()

  @pytest.hookimpl(hookwrapper=True)
  def pytest_runtest_setup(self, item):
    self.running[item.nodeid] = self.recorder.start()
    yield
    self.recorder.stop()

  @pytest.hookimpl(hookwrapper=True)
  def pytest_runtest_call(self, item):
    self.recorder.record = self.running.setdefault(item.nodeid, self.recorder.start())
    yield
    self.recorder.stop()

  @pytest.hookimpl(hookwrapper=True)
  def pytest_runtest_makereport(self, item, call):
    outcome = yield
    report = outcome.get_result()
    record = self.running.pop(item.nodeid, None) if call.when == 'call' else None
    if record is None or report.skipped:
      return
    module = self.collected.get(item.nodeid.split('::')[0], {'imported': set(), 'asked': set()})
    merged = {key: record[key] | module[key] for key in record}
    extras = extras_of_test(item.nodeid)
    missing = missing_on_a_fresh_install(merged, extras)
    if missing and report.passed:
      report.outcome, report.longrepr = 'failed', explain(missing, extras)
    elif missing:
      report.sections.append(('undeclared imports', explain(missing, extras)))
