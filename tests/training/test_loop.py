"""training/loop's closing line: every next command it prints runs, as printed, where the
README's set-up command installed the package (`pip install -e '.[train]'`) and nothing
else."""

from __future__ import annotations

import importlib.metadata
import os
import pathlib
import shlex
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P
import numpy as np
import pytest
import requirements

from hscl_jax import models
from hscl_jax import optimizers
from hscl_jax import parallel
from hscl_jax.config import choices
from hscl_jax.evaluation import figures
from hscl_jax.evaluation import inspection
from hscl_jax.evaluation import linear_evaluation
from hscl_jax.rundir import checkpoints
from hscl_jax.training import loop

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # `from configs import ...`, as from the repo root

from configs import digits  # noqa: E402

# `python -m MODULE ARGS` (argv[1:]) under requirements.hiding.
_RUN_MODULE = """
module, sys.argv = sys.argv[1], sys.argv[1:]
runpy.run_module(module, run_name='__main__', alter_sys=True)
"""


def modules_outside(install: frozenset[str]) -> set[str]:
  """The top-level modules here that no distribution of `install` provides (ours aside)."""
  owners = importlib.metadata.packages_distributions()
  return {
    module
    for module, dists in owners.items()
    if module != 'hscl_jax' and not {requirements.distribution(d) for d in dists} & install
  }


def run_as_installed(command: str, hidden: set[str], env: dict[str, str]):
  python, dash_m, module, *args = shlex.split(command)
  assert (python, dash_m) == ('python', '-m'), command
  return subprocess.run(
    [sys.executable, '-c', requirements.hiding(hidden, _RUN_MODULE), module, *args],
    cwd=REPO,
    env=env,
    capture_output=True,
    text=True,
    timeout=900,
  )


def test_every_next_command_of_the_closing_line_runs_after_the_readme_install(digits_run, tmp_path):
  """The digits run's closing line names linear_eval, embed and inspect; each, run as
  printed with only the [train] extra's distributions importable, finishes and writes
  what it says; inspect, the first to draw (into a fresh cache folder), says that it
  builds matplotlib's font cache, naming the file matplotlib then writes."""
  workdir, config, result = digits_run
  run = tmp_path / 'run'  # a copy: the commands write into it, the session's run stays
  shutil.copytree(workdir, run)
  closing = loop.closing_summary(config, str(run), result, seconds=1.0)
  commands = [line.strip() for line in closing.split('\n')[1:]]
  assert [c.split()[2] for c in commands] == [
    'hscl_jax.linear_eval',
    'hscl_jax.embed',
    'hscl_jax.inspect',
  ]
  hidden = modules_outside(requirements.installed_by('train'))
  assert {'pytest', 'chex', 'hypothesis'} <= hidden  # the [test] extra's own are hidden
  fonts = tmp_path / 'matplotlib'
  env = {**os.environ, 'MPLCONFIGDIR': str(fonts)}
  for command in commands:
    out = run_as_installed(command, hidden, env)
    assert out.returncode == 0, (command, out.stderr[-3000:])
  assert (run / linear_evaluation.RESULT_FILE).is_file()
  assert (run / 'embeddings.npz').is_file()
  assert sorted(p.name for p in (run / 'inspect').iterdir()) == sorted(inspection.FILES)
  cache = figures.font_cache_file(str(fonts))
  assert os.path.isfile(cache)  # the file named is the one matplotlib built
  assert f"Building matplotlib's font cache ({cache})" in out.stderr


def test_keep_best_auto_is_the_knn_top1_where_the_monitor_runs_and_none_without():
  """The default, resolved by training: the kNN top-1 with the kNN monitor on; none
  without it (no record would have the figure); any other value as given. Read alone
  (unresolved), 'auto' keeps none."""
  sys.path.insert(0, str(REPO))
  from configs import digits
  from hscl_jax.config import fields
  from hscl_jax.training import loop

  config = digits.get_config()
  assert config.keep_best == fields.FIELDS['keep_best'].default == choices.KEEP_BEST_AUTO
  assert loop.keep_best(config) == 'knn_top1'
  config.knn.every_epochs = 0
  assert loop.keep_best(config) == ''
  config.keep_best = 'probe_loss'
  assert loop.keep_best(config) == 'probe_loss'
  assert checkpoints.KeepBest.parse(choices.KEEP_BEST_AUTO) is None


class _Built(Exception):
  pass


def _program_model(config, workdir, monkeypatch):
  """The model train_and_evaluate builds (the run stops right after building it)."""
  built = []
  create = models.create_model

  def record(*args, **kwargs):
    built.append(create(*args, **kwargs))
    return built[-1]

  def stop(*args, **kwargs):
    raise _Built

  monkeypatch.setattr(models, 'create_model', record)
  monkeypatch.setattr(optimizers, 'create_optimizer', stop)
  with pytest.raises(_Built):
    loop.train_and_evaluate(config, str(workdir))
  return built[-1]  # the last one built (schema validation builds one first)


def test_wiring_program_model_batchnorm_statistics_are_global(tmp_path, monkeypatch):
  """On 4 devices with different shards, every device's BatchNorm statistics after a
  training-mode pass equal the statistics of the whole batch on one device."""
  config = digits.get_config()
  config.batch_size, config.knn.batch_size = 32, 256
  model = _program_model(config, tmp_path, monkeypatch)
  image_size = config.augment.image_size
  variables = models.initialize(model, jax.random.key(0), (image_size, image_size, 3))
  images = jax.random.normal(jax.random.key(1), (16, image_size, image_size, 3))
  images = images * jnp.arange(1, 17, dtype=jnp.float32)[:, None, None, None]  # shards differ

  def stats(devices):
    mesh = parallel.make_mesh(jax.devices()[:devices])

    def per_device(x):
      _, updates = model.apply(variables, x, train=True, mutable=['batch_stats'])
      return jax.tree.map(lambda s: s[None], updates['batch_stats'])

    fn = jax.shard_map(per_device, mesh=mesh, in_specs=P(parallel.AXIS), out_specs=P(parallel.AXIS))
    return jax.device_get(jax.jit(fn)(images))

  one, four = stats(1), stats(4)
  for x, y in zip(jax.tree.leaves(four), jax.tree.leaves(one), strict=True):
    assert x.shape[0] == 4
    np.testing.assert_allclose(x, np.broadcast_to(y, x.shape), rtol=1e-4, atol=1e-5)
