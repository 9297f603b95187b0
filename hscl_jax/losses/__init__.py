"""Contrastive losses UCL, H-UCL, SCL, H-SCL and the sigmoid family as pure, jittable JAX
functions.

    from hscl_jax import losses
    losses.hscl(z, labels, hardening=losses.exponential(1.0))

The modules, by family (this package re-exports their public names):
  * `image`: the four losses on batches of views (eq. (3)), their hardenings
    (`exponential`, `threshold`) and schedules (`tau_schedule`, eq. (4); `beta_schedule`).
  * `sigmoid`: the sigmoid (SigLIP) family, two towers (`siglip`) and one tower of views
    (`sigmoid_contrastive`), with labels and the same hardenings.
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
from hscl_jax.losses.sigmoid import SIGLIP_B
from hscl_jax.losses.sigmoid import SIGLIP_T
from hscl_jax.losses.sigmoid import siglip
from hscl_jax.losses.sigmoid import sigmoid_contrastive

__all__ = [
  'Array',
  'DEFAULT_BLOCK_SIZE',
  'DEFAULT_PRECISION',
  'DENSE_MAX_ENTRIES',
  'Hardening',
  'Mask',
  'Precision',
  'SIGLIP_B',
  'SIGLIP_T',
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
  'siglip',
  'sigmoid_contrastive',
  'tau_schedule',
  'threshold',
  'ucl',
]

del annotations  # the __future__ import's name: dir(losses) lists the public API only
