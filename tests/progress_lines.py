"""The progress line's one format, and the lines a test's callers logged through it."""

from __future__ import annotations

import os
import re

# `[HEAD  ]UNIT done/total (p%)[  DETAIL]  R RATE_UNIT/s  [E elapsed, ]ETA T`, or before
# any unit is timed `...[  DETAIL]  [E elapsed, ]RATE_UNIT/s and ETA after UNIT n` (units
# left) or `...[  DETAIL]  [E elapsed, ]ETA T` (none): never a NaN rate or an unknown ETA.
_DURATION = r'\d+[hms](?:\d\d[ms])?'
LINE = re.compile(
  r'(?:(?P<head>.+?)  )?(?P<unit>[a-z]+) (?P<done>\d+)/(?P<total>\d+) \((?P<percent>\d+)%\)'
  r'(?:  (?P<detail>.+?))?  (?:(?P<rate>\d+|inf) (?P<rate_unit>[a-z]+)/s  )?'
  rf'(?:(?P<elapsed>{_DURATION}) elapsed, )?'
  rf'(?:ETA (?P<eta>{_DURATION})|(?P<unknown>[a-z]+)/s and ETA after [a-z]+ \d+)'
)
PROGRESS_MODULE = os.path.join('hscl_jax', 'progress.py')


def progress_lines(caplog) -> list[str]:
  """The messages logged by the progress line's own logging call; each in the one format."""
  lines = [r.getMessage() for r in caplog.records if r.pathname.endswith(PROGRESS_MODULE)]
  assert all(LINE.fullmatch(line) for line in lines), lines
  return lines
