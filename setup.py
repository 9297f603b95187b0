"""hscl_jax: hard-negative supervised contrastive learning in JAX/Flax."""

from __future__ import annotations

import setuptools

# Compatible ranges: the floor is the version tested (constraints.txt holds the exact
# tested set), the cap the next release allowed to break APIs. Accelerator users
# install `jax[cuda13]` or `jax[tpu]` in the same range.
INSTALL_REQUIRES = [
  'jax>=0.10.1,<0.11',  # also tested: jax 0.10.1 with flax 0.12.7
  'flax>=0.12.7,<0.13',
  'optax>=0.2.8,<0.3',  # optax 0.2.7 fails to import with jax 0.10.x
  'orbax-checkpoint>=0.12.8,<0.13',
  'ml-collections>=1.1.0,<2',
  'absl-py>=2.5.1,<3',
  'numpy>=2.4.6,<3',
  'grain>=0.2.18,<0.3',
  'tensorflow-datasets>=4.9.10,<5',  # reads prepared TFDS datasets (no TensorFlow needed)
  'array-record>=0.8.6,<0.9',
  'etils>=1.15.0,<2',
  'importlib-resources>=7.1.0',  # tfds imports it but does not declare it
  'pillow>=13.0.0,<14',  # tfds image decoding and image_folder
  'scikit-learn>=1.9.1,<2',  # the embedded digits dataset
  'tensorboardX>=2.6.5,<3',  # TensorBoard event files without TensorFlow
]

setuptools.setup(
  name='hscl_jax',
  version='0.1.0',
  description='Hard-negative supervised contrastive learning (H-SCL) in JAX/Flax',
  packages=setuptools.find_packages(include=['hscl_jax', 'hscl_jax.*']),
  python_requires='>=3.11',
  install_requires=INSTALL_REQUIRES,
  extras_require={
    'test': [
      'pytest>=9.0.3,<10',
      'chex>=0.1.92,<0.2',
      'ruff==0.17.6',
      'matplotlib>=3.11.2,<4',
      'hypothesis>=6.155.2,<7',
    ],
    # The comparison report's plots (python -m hscl_jax.experiments.compare).
    'report': ['matplotlib>=3.11.2,<4'],
    # Only needed to *prepare* TFDS datasets (download + convert to array_record).
    'prepare': ['tensorflow-cpu>=2.21.0,<2.22'],
  },
)
