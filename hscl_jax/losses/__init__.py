"""Contrastive losses UCL, H-UCL, SCL and H-SCL as pure, jittable JAX functions.

    from hscl_jax import losses
    losses.hscl(z, labels, hardening=losses.exponential(1.0))

The modules, by family (this package re-exports their public names):
  * `image`: the four losses on batches of views (eq. (3)), their hardenings
    (`exponential`, `threshold`) and schedules (`tau_schedule`, eq. (4); `beta_schedule`).
  * `diagnostics`: Prop. 2's α's, Assumption 1 and the four losses of one batch (Figs. 4, 5).
  * `graph`: InfoGraph's local–global objective with the four settings (Table II).
  * `kernel`: rows, masks, log-sum-exp, the dense and blockwise sums and their custom JVP,
    shared by all of the above; `l2_normalize`.
This package imports JAX and NumPy only.
"""

from __future__ import annotations

from hscl_jax.losses.diagnostics import assumption1
from hscl_jax.losses.diagnostics import batch_diagnostics
from hscl_jax.losses.diagnostics import log_alphas
from hscl_jax.losses.graph import local_global_infonce
from hscl_jax.losses.graph import local_global_jsd
from hscl_jax.losses.image import beta_schedule
from hscl_jax.losses.image import exponential
from hscl_jax.losses.image import hscl
from hscl_jax.losses.image import hucl
from hscl_jax.losses.image import scl
from hscl_jax.losses.image import tau_schedule
from hscl_jax.losses.image import threshold
from hscl_jax.losses.image import ucl
from hscl_jax.losses.kernel import DEFAULT_BLOCK_SIZE
from hscl_jax.losses.kernel import DEFAULT_PRECISION
from hscl_jax.losses.kernel import DENSE_MAX_ENTRIES
from hscl_jax.losses.kernel import Array
from hscl_jax.losses.kernel import Hardening
from hscl_jax.losses.kernel import Mask
from hscl_jax.losses.kernel import Precision
from hscl_jax.losses.kernel import l2_normalize

__all__ = [
  'Array',
  'DEFAULT_BLOCK_SIZE',
  'DEFAULT_PRECISION',
  'DENSE_MAX_ENTRIES',
  'Hardening',
  'Mask',
  'Precision',
  'assumption1',
  'batch_diagnostics',
  'beta_schedule',
  'exponential',
  'hscl',
  'hucl',
  'l2_normalize',
  'local_global_infonce',
  'local_global_jsd',
  'log_alphas',
  'scl',
  'tau_schedule',
  'threshold',
  'ucl',
]

del annotations  # the __future__ import's name: dir(losses) lists the public API only
