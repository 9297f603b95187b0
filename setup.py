"""hscl_jax: hard-negative supervised contrastive learning in JAX/Flax."""

from __future__ import annotations

import setuptools

# Floors, no upper caps (the JAX libraries' convention). Each floor is the oldest version
# that passes with every direct dependency at its floor (what `uv pip install
# --resolution=lowest-direct` installs; .ci/run runs the fast loss, config and data tests
# on that set). Where a lower version broke, how is written next to the floor; an upper cap
# only with its known break. constraints.txt holds the exact set the full suite ran with
# (Python 3.11); constraints-py312.txt the newest set .ci/run tests on Python 3.12 (jax 0.12).
# Accelerator users install `jax[cuda13]` or `jax[tpu]` in the same range.
# The loss kernels alone (`pip install hscl_jax`; `from hscl_jax import losses`): JAX and
# NumPy, as optax.
INSTALL_REQUIRES = [
  # The code needs jax.lax.pcast (0.8.2) and the tests jax.extend.core.jaxprs_in_params
  # (0.10.0); with 0.10.0 and 0.10.1, end_to_end/test_train's 4 devices = 1 device check failed
  # (losses 8e-5 apart, rtol 1e-5), as 0.10.2 did on AVX2-only CPUs: a ReLU kink, which the
  # test now avoids with SiLU (docs/testing.md). 0.10.0 has not been retried since.
  'jax>=0.10.2',
  'numpy>=2.0.0',  # jax 0.10 needs numpy 2
]
# The trainer, the evaluations, the export and the experiments (`pip install
# 'hscl_jax[train]'`): their top-level modules are hscl_jax.TRAINER_MODULES, which makes a
# missing one a one-line error naming this extra.
TRAIN_REQUIRES = [
  'flax>=0.10.0',  # 0.9.0: Module.init fails with jax 0.10 (no DynamicJaxprTrace.level)
  'optax>=0.2.8',  # 0.2.7 fails to import with jax 0.10 (no jax_pmap_shmap_merge option)
  'orbax-checkpoint>=0.11.17',  # 0.11.16 fails to import with jax 0.10 (DeviceLocalLayout)
  'ml-collections>=1.0.0',  # 0.1.1's config flags pass sys_argv, which absl rejects
  'absl-py>=0.12.0',  # 0.11 has no parameterized.product (the tests use it)
  'grain>=0.2.8',  # 0.2.7 has no grain.ReadOptions
  'tensorflow-datasets>=4.9.0',  # 4.8 needs TensorFlow for tfds.data_source
  'array-record>=0.5.0',  # 0.4.x ships Python 3.10 binaries only
  'etils>=1.14.0',  # 1.13 has no epath.Path.absolute() (checkpointing)
  'importlib-resources>=1.1.0',  # tfds imports it undeclared; 1.0 has no files()
  'pillow>=9.1.0',  # 9.0 has no Image.Resampling
  'scikit-learn>=1.4.2',  # 1.4.1 and older require numpy<2
  # inspect's t-SNE on one OpenMP thread (evaluation/figures); scikit-learn requires it too.
  # The version tested (its floor not searched).
  'threadpoolctl>=3.8.0',
  # TensorBoard event files without TensorFlow; 2.6.1 and older fail with numpy 2.4.6
  # (TypeError: only 0-dimensional arrays can be converted to Python scalars).
  'tensorboardX>=2.6.2.2',
  'safetensors>=0.8.0',  # the PyTorch export's file (its NumPy API); the version tested
  # inspect's figures: training's closing line prints an inspect command, which has to run
  # after this extra alone (tests/training/test_loop.py). 3.8.3 requires numpy<2.
  'matplotlib>=3.8.4',
]
# The comparison reports' tests of significance (hscl_jax/experiments/paired.py).
# jax and jaxlib 0.10 require scipy>=1.14 themselves, so every install has it; declared
# where the reports import it, at jax's floor.
SCIPY = 'scipy>=1.14.0'

# The programs, as console scripts beside `python -m` (each program's `run()`).
CONSOLE_SCRIPTS = {
  'hscl-train': 'hscl_jax.main',
  'hscl-linear-eval': 'hscl_jax.linear_eval',
  'hscl-retrieval': 'hscl_jax.retrieval',
  'hscl-embed': 'hscl_jax.embed',
  'hscl-inspect': 'hscl_jax.inspect',
  'hscl-export': 'hscl_jax.export',
  'hscl-prepare': 'hscl_jax.prepare',
  'hscl-graphs': 'hscl_jax.graphs.__main__',
  'hscl-compare': 'hscl_jax.experiments.compare',
  'hscl-compare-graphs': 'hscl_jax.experiments.compare_graphs',
}

setuptools.setup(
  name='hscl_jax',
  version='0.1.0',
  description='Hard-negative supervised contrastive learning (H-SCL) in JAX/Flax',
  packages=setuptools.find_packages(include=['hscl_jax', 'hscl_jax.*']),
  python_requires='>=3.11',
  install_requires=INSTALL_REQUIRES,
  entry_points={
    'console_scripts': [f'{name}={module}:run' for name, module in CONSOLE_SCRIPTS.items()]
  },
  extras_require={
    # ruff is pinned: its lint rules and formatting change between releases, and CI runs
    # `ruff check .` and `ruff format --check .`. chex 0.1.83 fails to import with jax 0.10
    # (jax.core.Shape). hypothesis: the version tested
    # (its floor not searched; the lowest-direct check does not run the property tests).
    'train': TRAIN_REQUIRES,
    'test': [
      *TRAIN_REQUIRES,
      'pytest>=6.2.5',
      'pytest-xdist>=3.0.2',  # pytest.ini's -n auto: the tests on every core
      'chex>=0.1.84',
      'ruff==0.17.6',
      # The declared-dependency check (pyproject.toml's [tool.fawltydeps]; .ci/run), pinned
      # as ruff is: what it reports changes between releases.
      'fawltydeps==0.20.0',
      # The import rules (pyproject.toml's [tool.importlinter]; .ci/run's `lint-imports`;
      # docs/layout.md), pinned as ruff is: what its contracts report changes between releases.
      'import-linter==2.17',
      'matplotlib>=3.8.4',
      'hypothesis>=6.155.2',
      SCIPY,
      # jax.export's serialisation (the losses' export round trip test); the version tested.
      'flatbuffers>=25.12.19',
      # Imported by tests themselves (already installed beside others: pip's tooling
      # brings it); the version tested.
      'packaging>=26.2',
    ],
    # Line and branch coverage (pyproject.toml; docs/testing.md): coverage's `patch =
    # subprocess` follows the programs the tests start (pytest-cov 7 leaves that to it).
    # The versions tested; pytest-cov 7.1 needs coverage 7.10.6 and pytest 7, so this is
    # not in [test], whose floors (pytest 6.2.5) .ci/run checks.
    'coverage': ['pytest-cov>=7.1.0', 'coverage>=7.10.6'],
    # The comparison reports (python -m hscl_jax.experiments.compare): their plots draw with
    # [train]'s matplotlib, their tests with scipy, which JAX brings; this extra adds nothing
    # to [train] but the name the reports' docs use.
    'report': [*TRAIN_REQUIRES, SCIPY],
    # Only needed to *prepare* TFDS datasets (download + convert to array_record). Its floor
    # is the version tested (constraints.txt); the lowest-direct check does not install it.
    'prepare': [*TRAIN_REQUIRES, 'tensorflow-cpu>=2.21.0'],
    # The PyTorch reference of the CPU benchmarks (bench_train_step --torch, bench_conv);
    # never imported by the package. The version measured (its floor not searched).
    'bench': [*TRAIN_REQUIRES, 'torch>=2.13.0'],
    # Loading a backbone written by `python -m hscl_jax.export --format=torch` (and its
    # test); torch and torchvision are never imported by the package. The versions
    # tested, a matching pair: PyPI's torchvision 0.29 does not import beside torch 2.13.
    'torch': ['torch>=2.14.1', 'torchvision>=0.29.1', 'safetensors>=0.8.0'],
    # The losses compared with the libraries people port from (tests/test_peer_losses.py;
    # docs/method.md's porting table): pytorch-metric-learning's NTXentLoss and SupConLoss,
    # lightly's NTXentLoss. Never imported by the package; the versions tested.
    'peers': ['torch>=2.14.1', 'pytorch-metric-learning>=2.9.0', 'lightly>=1.6.0'],
    # dev/mutation.py (dev/README.md): cosmic-ray's mutants of a module against its tests
    # (docs/testing.md). The version tested (its floor not searched).
    'mutation': ['cosmic-ray>=8.7.0'],
  },
)
