"""hscl_jax: hard-negative supervised contrastive learning in JAX/Flax."""

from __future__ import annotations

import setuptools

# Floors, no caps (the JAX libraries' convention): each floor is the oldest version with
# which the fast tests pass when every direct dependency sits at its floor (CI installs
# that set with `uv pip install --resolution=lowest-direct`); an upper cap only with the
# known break written next to it. constraints.txt holds the exact set tested with the full
# suite. Accelerator users install `jax[cuda13]` or `jax[tpu]` in the same range.
INSTALL_REQUIRES = [
  'jax>=0.10.0',
  'flax>=0.11.0',
  'optax>=0.2.8',  # optax 0.2.7 fails to import with jax 0.10.x
  'orbax-checkpoint>=0.11.17',  # 0.11.16 and older fail to import with jax 0.10 (DeviceLocalLayout)
  'ml-collections>=1.0.0',  # 0.1.1's config flags pass sys_argv, which absl rejects
  'absl-py>=0.12.0',  # 0.11 has no parameterized.product (the tests use it)
  'numpy>=2.0.0',
  'grain>=0.2.8',
  'tensorflow-datasets>=4.9.0',  # reads prepared TFDS datasets (no TensorFlow needed)
  'array-record>=0.5.0',  # 0.4.x ships Python 3.10 binaries only
  'etils>=1.4.0',  # grain needs epy.lazy_imports (1.3.0 has none)
  'importlib-resources>=1.3.0',  # tfds imports it but does not declare it
  'pillow>=9.1.0',  # tfds image decoding and image_folder
  'scikit-learn>=1.4.2',  # the embedded digits dataset
  'tensorboardX>=2.6',  # TensorBoard event files without TensorFlow
]

setuptools.setup(
  name='hscl_jax',
  version='0.1.0',
  description='Hard-negative supervised contrastive learning (H-SCL) in JAX/Flax',
  packages=setuptools.find_packages(include=['hscl_jax', 'hscl_jax.*']),
  python_requires='>=3.11',
  install_requires=INSTALL_REQUIRES,
  extras_require={
    # ruff is pinned: its lint rules and formatting change between releases, and CI runs
    # `ruff check .` and `ruff format --check .`.
    'test': ['pytest>=7.0.0', 'chex>=0.1.86', 'ruff==0.17.6', 'matplotlib>=3.8.4'],
    # The comparison report's plots (python -m hscl_jax.experiments.compare).
    'report': ['matplotlib>=3.8.4'],
    # Only needed to *prepare* TFDS datasets (download + convert to array_record). Its floor
    # is the version tested (constraints.txt); the lowest-direct check does not install it.
    'prepare': ['tensorflow-cpu>=2.21.0'],
  },
)
