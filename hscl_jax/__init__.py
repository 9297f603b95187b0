"""hscl_jax: UCL, H-UCL, SCL and H-SCL contrastive learning in JAX/Flax."""

__version__ = "0.1.0"
