"""The best checkpoint picked by `--checkpoint=best|latest|STEP` in every program that reads
a trained run (rundir/trained_run and the five programs), and kept by a training run by
default. Its retention: tests/rundir/test_checkpoints.py; a save mid-epoch ranked across a
resume: tests/rundir/test_run_log.py.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys

import jax
import pytest
from rundir.test_checkpoints import KNN
from rundir.test_checkpoints import _expected_kept

from hscl_jax import errors
from hscl_jax import models
from hscl_jax.config import choices
from hscl_jax.rundir import checkpoints
from hscl_jax.rundir import metrics
from hscl_jax.rundir import trained_run

REPO = pathlib.Path(__file__).resolve().parents[2]
FIXTURE = REPO / 'tests' / 'fixtures' / 'digits_workdir'


@pytest.fixture
def ranked_workdir(tmp_path) -> pathlib.Path:
  """The stored digits workdir (a copy) with its step 12 saved again, ranked, as steps 13
  (knn_top1 0.9) and 14 (0.5): 13 is the best, 14 the latest."""
  workdir = tmp_path / 'run'
  shutil.copytree(FIXTURE, workdir)
  checkpointer = checkpoints.Checkpointer(str(workdir), keep=1, keep_best=KNN)
  state, iterator_state = checkpointer.restore(12, None)
  metadata = checkpointer.metadata(12)
  for step, figure in ((13, 0.9), (14, 0.5)):
    checkpointer.save(step, state, iterator_state, metadata, metric_value=figure)
  checkpointer.close()
  assert checkpoints.finished_steps(str(workdir)) == [13, 14]
  return workdir


def test_resolve_step_takes_best_latest_or_a_step(ranked_workdir, tmp_path):
  workdir = str(ranked_workdir)
  assert trained_run.resolve_step(workdir, 'best') == 13
  for latest in ('latest', None, 'LATEST'):
    assert trained_run.resolve_step(workdir, latest) == 14
  assert trained_run.resolve_step(workdir, 13) == trained_run.resolve_step(workdir, '13') == 13
  with pytest.raises(trained_run.LinearEvalError, match=r'no checkpoint for step 12 .*\[13, 14\]'):
    trained_run.resolve_step(workdir, 12)
  with pytest.raises(trained_run.LinearEvalError, match=r'--checkpoint=first is not a .* Fix: '):
    trained_run.resolve_step(workdir, 'first')
  with pytest.raises(trained_run.LinearEvalError, match=r'--checkpoint=-3 is not a .* Fix: '):
    trained_run.resolve_step(workdir, '-3')
  unranked = tmp_path / 'unranked'
  shutil.copytree(FIXTURE, unranked)
  message = r'no best checkpoint .* Fix: pass --checkpoint=latest or a step, or train with '
  with pytest.raises(trained_run.LinearEvalError, match=message):
    trained_run.resolve_step(str(unranked), 'best')
  assert trained_run.resolve_step(str(unranked), 'latest') == 12


def test_the_two_flags_give_one_choice(ranked_workdir):
  """--checkpoint_step=N is --checkpoint=N; both at once are refused before the workdir is read."""
  assert trained_run.checkpoint_choice(None, None) == 'latest'
  assert trained_run.checkpoint_choice('Best', None) == 'best'
  assert trained_run.checkpoint_choice('14', None) == trained_run.checkpoint_choice(None, 14) == 14
  with pytest.raises(trained_run.LinearEvalError, match=r'^--checkpoint=best and --checkpoint_st'):
    trained_run.checkpoint_choice('best', 13)
  with pytest.raises(trained_run.LinearEvalError, match=r'^--checkpoint=13th is not a .* Fix: '):
    trained_run.checkpoint_choice('13th', None)
  workdir = str(ranked_workdir)
  assert [trained_run.resolve_step(workdir, c) for c in ('best', 'latest', 13)] == [13, 14, 13]


def _program(module: str, *args: str) -> subprocess.CompletedProcess:
  env = {**os.environ, 'JAX_PLATFORMS': 'cpu'}
  return subprocess.run(
    [sys.executable, '-m', f'hscl_jax.{module}', *args],
    cwd=REPO,
    env=env,
    capture_output=True,
    text=True,
    timeout=300,
  )


PROGRAMS = {
  'linear_eval': [],
  'embed': ['--split=test', '--out={tmp}/e.npz'],
  'inspect': ['--out={tmp}/figures'],
  'export': ['--format=torch', '--out={tmp}/b.safetensors'],
  'retrieval': [],
}


@pytest.mark.parametrize('module', sorted(PROGRAMS))
def test_each_program_reads_the_checkpoint_flag(module, tmp_path):
  """--checkpoint=best on a run that kept none is one line naming the fix (the export
  refuses the stored run's small CNN first), and both flags at once are refused."""
  workdir = tmp_path / 'run'
  shutil.copytree(FIXTURE, workdir)
  args = [a.format(tmp=tmp_path) for a in PROGRAMS[module]]
  out = _program(module, f'--workdir={workdir}', '--checkpoint=best', *args)
  assert out.returncode == 1, out.stderr[-2000:]
  assert 'Traceback' not in out.stderr
  expected = 'only ResNets export' if module == 'export' else 'no best checkpoint'
  (line,) = [line for line in out.stderr.splitlines() if expected in line]
  if module != 'export':
    assert line.endswith(
      'Fix: pass --checkpoint=latest or a step, or train with python -m hscl_jax.main ... '
      '--config.keep_best=knn_top1 added.'
    )
  both = _program(module, f'--workdir={workdir}', '--checkpoint=12', '--checkpoint_step=12', *args)
  assert both.returncode == 1 and 'both given. Fix: pass one' in both.stderr


def test_embed_of_the_best_checkpoint(ranked_workdir, tmp_path):
  out = _program(
    'embed',
    f'--workdir={ranked_workdir}',
    '--split=test',
    f'--out={tmp_path}/e.npz',
    '--checkpoint=best',
  )
  assert out.returncode == 0, out.stderr[-2000:]
  assert 'checkpoint step 13)' in out.stdout
  assert 'The best checkpoint is step 13: knn_top1 = 0.9.' in out.stderr


def test_export_of_the_best_and_the_latest_checkpoint(tmp_path):
  """A ResNet run (random variables, as tests/evaluation/test_torch_export.py writes one) whose
  best checkpoint, step 7, is older than its latest, step 8."""
  sys.path.insert(0, str(REPO))  # `from configs import default`, as from the repo root
  from configs import default

  config = default.get_config()
  config.model.name, config.model.stem, config.augment.image_size = 'resnet18', 'cifar', 8
  model = models.create_model(config.model)
  variables = models.initialize(model, jax.random.key(0), (8, 8, 3))
  variables = {'params': variables['params'], 'batch_stats': variables['batch_stats']}
  workdir = tmp_path / 'run'
  metrics.write_config(str(workdir), config)
  checkpointer = checkpoints.Checkpointer(str(workdir), keep=1, keep_best=KNN)
  for step, figure in ((7, 0.9), (8, 0.5)):
    checkpointer.save(step, variables, {}, metric_value={'step': step, 'knn_top1': figure})
  checkpointer.close()
  for flag, step in (
    ('--checkpoint=best', 7),
    ('--checkpoint=latest', 8),
    ('--checkpoint_step=7', 7),
  ):
    out = _program(
      'export', f'--workdir={workdir}', '--format=torch', f'--out={tmp_path}/b.safetensors', flag
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads((tmp_path / 'b.json').read_text())['checkpoint_step'] == step


def test_a_training_run_keeps_its_best_epoch_by_default_and_its_closing_line_names_it(tmp_path):
  """keep_best at its default ('auto', the kNN top-1 with the monitor on) through the loop,
  a checkpoint due only at the last of 4 epochs: the checkpoints kept are the newest and
  the epoch whose record has the highest kNN figure (of equal ones the newer), as the
  reference reads them from metrics.jsonl, an epoch before the last and saved because it
  was the best so far; the closing line names it and its figure. A bad direction is
  refused before training."""
  sys.path.insert(0, str(REPO))
  from configs import digits
  from hscl_jax.config import schema
  from hscl_jax.training import loop

  config = digits.get_config()
  config.batch_size, config.num_epochs, config.steps_per_epoch_limit = 32, 4, 2
  config.knn.batch_size, config.keep_checkpoints = 256, 1
  config.checkpoint_every_epochs = 4
  config.optimizer.learning_rate = 3e-2  # large: the kNN figure moves between epochs
  assert config.keep_best == choices.KEEP_BEST_AUTO
  result = loop.train_and_evaluate(config, str(tmp_path))
  records = [json.loads(line) for line in (tmp_path / 'metrics.jsonl').read_text().splitlines()]
  figures = {r['step']: r['knn_top1'] for r in records}
  assert checkpoints.finished_steps(str(tmp_path)) == _expected_kept(figures, 1, 'max')
  best = checkpoints.best_checkpoint(str(tmp_path))
  best_step = max(figures, key=lambda step: (figures[step], step))
  assert best_step < max(figures)  # an old best, which keep_checkpoints=1 alone would delete
  assert (best.step, best.metric, best.value) == (best_step, 'knn_top1', figures[best_step])
  head = loop.closing_summary(config, str(tmp_path), result, 1.0).split('\n')[0]
  epoch = {r['step']: r['epoch'] for r in records}[best_step]
  assert f'; best kNN top-1 {figures[best_step]:.4f} at epoch {epoch} (--checkpoint=best);' in head
  config.keep_best = 'knn_top1:up'
  with pytest.raises(errors.ConfigError, match=r'^config\.keep_best: .* Fix: '):
    schema.validate_config(config, num_devices=1)
