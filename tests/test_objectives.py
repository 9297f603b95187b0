"""hscl_jax/objectives: each row of the methods table trains the loss kernel its names say,
with the hardening and τ schedule of the config, and a row without a loss is refused."""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hscl_jax import errors
from hscl_jax import losses
from hscl_jax import objectives
from hscl_jax.config import fields
from hscl_jax.config import methods

Z = losses.l2_normalize(jax.random.normal(jax.random.key(0), (8, 2, 16)))
LABELS = jnp.array([0, 1, 0, 2, 1, 1, 0, 2])
HYPER = {'beta': np.float32(2.0), 'tau': np.float32(0.9)}
KERNEL = {'temperature': 0.5, 'M': None, 'axis_name': None}

# Each softmax row's slug: the kernel call its row stands for (β = 2, τ = 0.9, τ⁺ = 0.1).
EXPECTED = {
  'ucl': lambda: losses.ucl(Z, **KERNEL),
  'hucl': lambda: losses.hucl(Z, beta=2.0, tau_plus=0.1, **KERNEL),
  'scl': lambda: losses.scl(Z, LABELS, **KERNEL),
  'hscl_beta': lambda: losses.hscl(Z, LABELS, hardening=losses.exponential(2.0), **KERNEL),
  'hscl_tau': lambda: losses.hscl(Z, LABELS, hardening=losses.threshold(0.9), **KERNEL),
}


def test_every_row_of_the_table_has_its_loss_and_no_other():
  assert list(objectives.LOSSES) == [row.slug for row in methods.ROWS]


@pytest.mark.parametrize('slug', sorted(EXPECTED))
def test_a_softmax_rows_loss_is_the_kernel_its_names_say(slug):
  (row,) = [r for r in methods.ROWS if r.slug == slug]
  options = objectives.LossOptions(KERNEL, tau_plus=0.1)
  got = objectives.loss_of(row)(Z, LABELS, HYPER, options)
  np.testing.assert_allclose(got, EXPECTED[slug](), rtol=1e-6)


def test_a_row_without_a_loss_is_refused_in_one_line_naming_its_slug_and_the_fix():
  new = dataclasses.replace(methods.by_label('SCL'), label='2·SCL', slug='scaled_scl')
  with pytest.raises(errors.ConfigError) as error:
    objectives.loss_of(new)
  message = str(error.value)
  assert '\n' not in message and message.startswith("config.method: the methods table's row")
  assert (
    "'scaled_scl'" in message
    and "Fix: enter its loss function in hscl_jax/objectives.py's LOSSES" in message
  )


def test_the_configs_hardening_reads_its_own_parameter():
  config = fields.default_config()
  g = jnp.array([-1.0, -0.2, 0.0, 0.5])
  config.hardening = 'exp'
  np.testing.assert_allclose(objectives.config_hardening(config, HYPER)(g), 2.0 * g)
  config.hardening = 'threshold'  # log η = 0 where e^g >= τ, -inf (no weight) below
  kept = np.asarray(objectives.config_hardening(config, HYPER)(g)) == 0.0
  np.testing.assert_array_equal(kept, np.exp(np.float64(g)) >= 0.9)


def test_tau_at_follows_eq_4_over_the_configs_epochs():
  """τ = e^{l/γ}, l linear from tau_start (epoch 1) to tau_end (the last epoch)."""
  config = fields.default_config()
  config.tau_start, config.tau_end, config.num_epochs, config.temperature = -0.5, 0.1, 5, 0.25
  for epoch in range(1, 6):
    level = -0.5 + (epoch - 1) / 4 * 0.6
    assert objectives.tau_at(config, epoch) == pytest.approx(math.exp(level / 0.25), rel=1e-6)


def test_the_sigmoid_rows_start_at_siglips_t_and_b():
  """config/methods states SigLIP's start without importing the losses: they agree."""
  assert methods.SIGMOID_START == {'log_t': math.log(losses.SIGLIP_T), 'b': losses.SIGLIP_B}
  assert fields.FIELDS['sigmoid_log_t'].default == math.log(losses.SIGLIP_T)
  assert fields.FIELDS['sigmoid_b'].default == losses.SIGLIP_B
