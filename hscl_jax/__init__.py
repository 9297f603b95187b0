"""hscl_jax: UCL, H-UCL, SCL and H-SCL contrastive learning in JAX/Flax."""

from __future__ import annotations

__version__ = '0.1.0'
