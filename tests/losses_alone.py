"""The losses installed alone (`pip install hscl_jax`, no extra): run by .ci/run with the
Python of a fresh venv holding the package without its `[train]` extra, before the extra
is added (a script, not a pytest module: pytest is not installed there).

Checks that none of the trainer's dependencies is importable, that the four losses run
(jitted, with gradients) and UCL equals NT-Xent written here in float64 NumPy, that the
class-aware sampler (hscl_jax.data.sampling) makes its batches and refusals, and that
importing a training module, or running a program, fails with one line naming the extra.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np

import hscl_jax
from hscl_jax import losses


def nt_xent(features: np.ndarray, temperature: float) -> float:
  """SimCLR's NT-Xent over 2 views: each of the 2B rows against the other 2B - 1."""
  z = features.transpose(1, 0, 2).reshape(-1, features.shape[-1]).astype(np.float64)
  batch = features.shape[0]
  logits = z @ z.T / temperature
  np.fill_diagonal(logits, -np.inf)
  positive = np.roll(np.arange(2 * batch), batch)  # row i's other view
  log_denominator = np.log(np.exp(logits).sum(axis=1))
  return float(np.mean(log_denominator - logits[np.arange(2 * batch), positive]))


def check_no_trainer_dependency() -> None:
  present = sorted(m for m in hscl_jax.TRAINER_MODULES if importlib.util.find_spec(m))
  assert not present, f'the trainer dependencies {present} are installed: not a bare install'


def check_losses() -> None:
  rng = np.random.default_rng(0)
  z = rng.normal(size=(8, 2, 16)).astype(np.float32)
  z /= np.linalg.norm(z, axis=-1, keepdims=True)
  labels = jnp.asarray([0, 1, 2, 0, 1, 2, 0, 1])
  value = jax.jit(lambda z: losses.ucl(z, temperature=0.5))(z)
  np.testing.assert_allclose(float(value), nt_xent(z, 0.5), rtol=1e-5)
  for loss in (
    lambda z: losses.hucl(z, beta=1.0),
    lambda z: losses.scl(z, labels),
    lambda z: losses.hscl(z, labels, hardening=losses.exponential(1.0)),
  ):
    value, grad = jax.jit(jax.value_and_grad(loss))(z)
    assert np.isfinite(float(value)) and np.all(np.isfinite(grad)) and np.any(grad != 0)


def check_sampler() -> None:
  """The class-aware sampler is NumPy only: each batch of 12 holds 3 samples of each of 4
  distinct classes, no example twice, and a value the data cannot meet is refused."""
  from hscl_jax.data import sampling

  labels = np.repeat(np.arange(6), [9, 6, 12, 7, 6, 8])
  order = sampling.EpochOrder(
    len(labels), labels=labels, global_batch_size=12, seed=0, samples_per_class=3
  )
  batches = order(0).reshape(order.steps_per_epoch, 12)
  assert len(set(batches.ravel().tolist())) == batches.size
  for batch in batches:
    counts = np.unique(labels[batch], return_counts=True)[1]
    assert sorted(counts.tolist()) == [3, 3, 3, 3], labels[batch]
  try:
    sampling.EpochOrder(
      len(labels), labels=labels, global_batch_size=12, seed=0, samples_per_class=7
    )
  except ValueError as error:
    assert type(error).__name__ == 'ConfigError' and 'samples_per_class' in str(error), error
  else:
    raise AssertionError('7 samples of a class with 6 examples was accepted')


def check_one_line_errors() -> None:
  try:
    importlib.import_module('hscl_jax.training.loop')
  except ModuleNotFoundError as error:
    message = str(error)
  else:
    raise AssertionError('hscl_jax.training.loop imported without the [train] extra')
  assert '\n' not in message and hscl_jax.INSTALL_TRAINER in message, message
  program = subprocess.run(
    [sys.executable, '-m', 'hscl_jax.main', '--workdir=/tmp/unused'],
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert program.returncode == 1 and not program.stdout, program
  assert program.stderr.count('\n') == 1 and hscl_jax.INSTALL_TRAINER in program.stderr, program


if __name__ == '__main__':
  check_no_trainer_dependency()
  check_losses()
  check_sampler()
  check_one_line_errors()
  print(
    f'losses alone: jax {jax.__version__}, no trainer dependency, the class-aware sampler, '
    'one-line errors: passed'
  )
