"""A pytest plugin: each test's seconds (setup, call and teardown together) and the shared
fixtures it uses, by node id, written as JSON to the file $HSCL_TEST_SECONDS names when the
session ends: {'seconds': {test: s}, 'shared': {test: [fixture keys]}}. Under xdist the
controller sees every worker's reports and writes; the workers do not (a worker sends a
test's fixtures in its report's user_properties). The measured map (`coverage_map.py`)
loads it (`-p mutation.timings`) to order a mutant's tests quickest first, to bound their
time, and to credit a fixture's set-up to every test that uses its value."""

from __future__ import annotations

import inspect
import json
import os
import pathlib

ENV = 'HSCL_TEST_SECONDS'
SHARED = 'mutation.shared_fixtures'  # the user_properties key a worker sends them under
_SECONDS: dict[str, float] = {}
_SHARED: dict[str, list[str]] = {}


def is_the_projects(definition, root: pathlib.Path) -> bool:
  """Whether a fixture is defined by the project's own test code: pytest's and plugins'
  (`tmp_path_factory`, xdist's `worker_id`) are shared by nearly every test and run none
  of the project's code."""
  source = pathlib.Path(inspect.getsourcefile(definition.func) or '/').resolve()
  return source.is_relative_to(root) and 'site-packages' not in source.parts


def shared_fixtures(item) -> list[str]:
  """Keys of the project's fixtures wider than a test that `item` uses, directly or through
  another fixture: a module's fixture keyed by its file, a class's by its class, a
  session's (or package's) by where it is defined. A coverage context credits such a
  fixture's lines to the one test whose set-up ran it; every test with its key reads its
  value."""
  keys, root = [], item.config.rootpath.resolve()
  for name in item.fixturenames:
    definitions = item._fixtureinfo.name2fixturedefs.get(name)
    if not definitions or not is_the_projects(definitions[-1], root):  # or a parameter
      continue
    scope = definitions[-1].scope
    if scope == 'module':
      keys.append(f'{item.nodeid.split("::", 1)[0]}::{name}')
    elif scope == 'class' and item.cls is not None:
      keys.append(f'{item.nodeid.rsplit("::", 1)[0]}::{name}')
    elif scope in ('session', 'package'):
      keys.append(f'{definitions[-1].baseid or "<session>"}::{name}')
  return sorted(keys)


def pytest_runtest_setup(item) -> None:
  item.user_properties.append((SHARED, shared_fixtures(item)))


def pytest_runtest_logreport(report) -> None:
  _SECONDS[report.nodeid] = _SECONDS.get(report.nodeid, 0.0) + report.duration
  for key, value in report.user_properties:
    if key == SHARED:
      _SHARED[report.nodeid] = list(value)


def pytest_sessionfinish(session) -> None:
  path = os.environ.get(ENV)
  if path and not hasattr(session.config, 'workerinput'):  # a worker's are the controller's
    record = {'seconds': _SECONDS, 'shared': _SHARED}
    pathlib.Path(path).write_text(json.dumps(record, indent=0, sort_keys=True))
