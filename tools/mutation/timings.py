"""A pytest plugin: each test's seconds (setup, call and teardown together) by node id,
written as JSON to the file $HSCL_TEST_SECONDS names when the session ends. Under xdist the
controller sees every worker's reports and writes; the workers do not. The measured map
(`coverage_map.py`) loads it (`-p mutation.timings`) to order a mutant's tests quickest
first and to bound their time."""

from __future__ import annotations

import json
import os
import pathlib

ENV = 'HSCL_TEST_SECONDS'
_SECONDS: dict[str, float] = {}


def pytest_runtest_logreport(report) -> None:
  _SECONDS[report.nodeid] = _SECONDS.get(report.nodeid, 0.0) + report.duration


def pytest_sessionfinish(session) -> None:
  path = os.environ.get(ENV)
  if path and not hasattr(session.config, 'workerinput'):  # a worker's are the controller's
    pathlib.Path(path).write_text(json.dumps(_SECONDS, indent=0, sort_keys=True))
