"""rundir/trained_run: which checkpoint a trained run's encoder is restored from when some
of several are damaged, and which step a refusal suggests (one that restores)."""

from __future__ import annotations

import shutil

from acceptance import refused
import jax
import numpy as np
import pytest

from hscl_jax import models
from hscl_jax.rundir import checkpoints
from hscl_jax.rundir import layout
from hscl_jax.rundir import trained_run

IMAGE_SHAPE = (8, 8, 3)


@pytest.fixture(scope='module')
def model(tiny_config):
  return models.create_model(tiny_config().model)


@pytest.fixture
def workdir(tmp_path, model):
  """Checkpoints 4, 8 and 12 of the model's variables (each from its step's key), 12's
  state removed (a damaged newest checkpoint)."""
  checkpointer = checkpoints.Checkpointer(str(tmp_path), keep=3)
  for step in (4, 8, 12):
    variables = models.initialize(model, jax.random.key(step), IMAGE_SHAPE)
    checkpointer.save(step, variables, {'served': step})
  checkpointer.close()
  shutil.rmtree(tmp_path / layout.CHECKPOINT_DIR / '12' / checkpoints.STATE)
  return tmp_path


def _encoder_kernels(variables):
  return jax.tree.leaves(variables['params']['encoder'])


def _restored_from(model, step):
  return _encoder_kernels(models.initialize(model, jax.random.key(step), IMAGE_SHAPE))


def test_a_damaged_step_asked_for_is_refused_suggesting_the_newest_that_restores(workdir, model):
  with refused(
    r'^checkpoint step 12 cannot be used: .* Usable steps: \[4, 8\]; pass --checkpoint_step=8\.$',
    trained_run.LinearEvalError,
  ):
    trained_run.restore_usable_encoder(str(workdir), 12, model, IMAGE_SHAPE)
  step, variables = trained_run.restore_usable_encoder(str(workdir), 8, model, IMAGE_SHAPE)
  assert step == 8
  for got, want in zip(_encoder_kernels(variables), _restored_from(model, 8), strict=True):
    np.testing.assert_array_equal(got, want)


def test_the_latest_skips_a_damaged_newest_checkpoint(workdir, model):
  step, variables = trained_run.restore_usable_encoder(str(workdir), 'latest', model, IMAGE_SHAPE)
  assert step == 8
  for got, want in zip(_encoder_kernels(variables), _restored_from(model, 8), strict=True):
    np.testing.assert_array_equal(got, want)
  assert set(variables['params']) == {'encoder'}  # the head is not read
