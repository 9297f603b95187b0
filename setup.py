"""hscl_jax: hard-negative supervised contrastive learning in JAX/Flax."""
import setuptools

# Versions tested together on CPU (Python 3.11, 2026-11). Accelerator users replace
# `jax` by `jax[cuda13]` or `jax[tpu]` of the same version.
INSTALL_REQUIRES = [
    "jax==0.10.2",
    "jaxlib==0.10.2",
    "flax==0.12.8",
    "optax==0.2.8",
    "orbax-checkpoint==0.12.8",
    "chex==0.1.92",
    "ml-collections==1.1.0",
    "absl-py==2.5.1",
    "numpy==2.4.6",
    "grain==0.2.18",
    "tensorflow-datasets==4.9.10",
    "array-record==0.8.6",
    "etils==1.15.0",
    "importlib-resources==7.1.0",  # tfds imports it but does not declare it
    "pillow==13.0.0",  # tfds image decoding and image_folder
    "scikit-learn==1.9.1",  # the embedded digits dataset
    "tensorboardX==2.6.5",  # TensorBoard event files without TensorFlow
    "matplotlib==3.11.2",  # the reproduction report's plots
]

setuptools.setup(
    name="hscl_jax",
    version="0.1.0",
    description="Hard-negative supervised contrastive learning (H-SCL) in JAX/Flax",
    packages=setuptools.find_packages(include=["hscl_jax", "hscl_jax.*"]),
    python_requires=">=3.11",
    install_requires=INSTALL_REQUIRES,
    extras_require={
        "test": ["pytest==9.0.3"],
        # Only needed to *prepare* TFDS datasets (download + convert to array_record).
        "prepare": ["tensorflow-cpu==2.21.0"],
    },
)
