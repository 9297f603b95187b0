"""rundir/layout: the names a run writes at the top of its workdir, the temporary file of
each atomic write, and which entries a run stopped before its first checkpoint may remove
(`is_run_entry`)."""

from __future__ import annotations

import pytest

from hscl_jax.rundir import layout

NAMES = (
  layout.CONFIG_FILE,
  layout.METRICS_FILE,
  layout.STEPS_FILE,
  layout.EVENTS_DIR,
  layout.PROFILE_DIR,
  layout.CHECKPOINT_DIR,
  layout.UNUSABLE_DIR,
  layout.LOCK_FILE,
)


def test_the_names_are_distinct_and_the_run_entries_all_but_the_lock():
  assert len(set(NAMES)) == len(NAMES)
  assert layout.RUN_ENTRIES == set(NAMES) - {layout.LOCK_FILE}


@pytest.mark.parametrize('name', sorted(layout.RUN_ENTRIES))
def test_a_temporary_is_hidden_beside_its_file_and_its_own_per_write(name):
  temporaries = {layout.temporary(name) for _ in range(20)}
  assert len(temporaries) == 20
  for temporary in temporaries:
    assert temporary.startswith(f'.{name}.') and temporary.endswith('.tmp')
    assert layout.is_temporary_of(temporary, name)
    assert layout.is_run_entry(temporary) and layout.is_run_entry(name)
    others = layout.RUN_ENTRIES - {name}
    assert not any(layout.is_temporary_of(temporary, other) for other in others)


@pytest.mark.parametrize(
  'entry',
  [
    layout.LOCK_FILE,  # the lock removes itself
    f'.{layout.LOCK_FILE}.0123456789ab.tmp',
    'notes.txt',
    f'{layout.CONFIG_FILE}.bak',  # a user's copy beside it
    f'{layout.CONFIG_FILE}.0123456789ab.tmp',  # not hidden: not an atomic write's
    f'.{layout.CONFIG_FILE}.0123456789ab',  # not a temporary's ending
    f'{layout.EVENTS_DIR}/{layout.STEP_EVENTS_DIR}',
  ],
)
def test_other_entries_are_never_the_runs(entry):
  assert not layout.is_run_entry(entry)
