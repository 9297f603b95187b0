"""The toy TU collection (tests/graphs/test_data.py's toy_graphs) in a folder of its own."""

from __future__ import annotations

import pytest

from graphs.test_data import toy_graphs
from graphs.test_data import write_tu


@pytest.fixture
def toy_dir(tmp_path):
  write_tu(str(tmp_path), 'TOY', toy_graphs())
  return str(tmp_path)
