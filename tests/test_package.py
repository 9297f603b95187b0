"""Packaging: the loss kernels are importable without the training stack."""

from __future__ import annotations

import json
import os
import subprocess
import sys

# Top-level modules that only training, data, evaluation or plotting need.
HEAVY = (
  'flax',
  'optax',
  'orbax',
  'grain',
  'tensorflow',
  'tensorflow_datasets',
  'tensorboardX',
  'matplotlib',
  'sklearn',
  'PIL',
  'ml_collections',
  'absl',
  'array_record',
)

_PROBE = """
import json, sys
import jax, jax.numpy
with_jax = set(sys.modules)
from hscl_jax import losses
print(json.dumps({'jax': sorted(with_jax), 'losses': sorted(set(sys.modules) - with_jax)}))
"""


def test_losses_import_no_package_beyond_jax():
  out = subprocess.run(
    [sys.executable, '-c', _PROBE],
    capture_output=True,
    text=True,
    env={**os.environ, 'JAX_PLATFORMS': 'cpu'},
    timeout=120,
    check=True,
  )
  modules = json.loads(out.stdout.splitlines()[-1])
  assert 'jax' in modules['jax']
  jax_packages = {m.split('.')[0] for m in modules['jax']}
  # Only our package and lazily loaded parts of packages `import jax` already loaded.
  assert {m.split('.')[0] for m in modules['losses']} - jax_packages == {'hscl_jax'}
  ours = [m for m in modules['losses'] if m.startswith('hscl_jax')]
  assert ours[:2] == ['hscl_jax', 'hscl_jax.losses']
  assert all(m.startswith('hscl_jax.losses.') for m in ours[2:])
  assert not [m for m in modules['jax'] + modules['losses'] if m.split('.')[0] in HEAVY]
