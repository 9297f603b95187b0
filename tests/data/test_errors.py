"""data/errors: each error of the input pipeline is a user error, so a program ends on its
one line with status 1 and no traceback (errors.exit_on_user_error), and the built-in
error its callers catch (a missing dataset is a FileNotFoundError, a bad name a ValueError)."""

from __future__ import annotations

from absl import logging
import pytest

from hscl_jax import errors
from hscl_jax.data import errors as data_errors

BUILT_IN = {
  data_errors.UnknownDatasetError: ValueError,
  data_errors.DatasetNotPreparedError: FileNotFoundError,
  data_errors.ImageFolderError: ValueError,
  data_errors.PreparationError: RuntimeError,
}


@pytest.mark.parametrize('error', list(BUILT_IN), ids=lambda error: error.__name__)
def test_a_data_error_ends_a_program_on_its_one_line(error, monkeypatch):
  logged = []
  monkeypatch.setattr(logging, 'error', lambda form, message: logged.append(form % message))

  def work():
    raise error('no images under /data/x. Fix: pass --config.folder')

  with pytest.raises(SystemExit) as exit_:
    errors.exit_on_user_error(work)
  assert exit_.value.code == 1
  assert logged == ['no images under /data/x. Fix: pass --config.folder']
  with pytest.raises(BUILT_IN[error]):
    work()
