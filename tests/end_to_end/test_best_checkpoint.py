"""The best checkpoint: kept besides the newest by `keep_best`, through a resume, a save
mid-epoch and keep=1, and picked by `--checkpoint=best|latest|STEP` in every program that
reads a trained run (rundir/checkpoints, rundir/trained_run and the five programs).

The retention is checked against a reference written here: the newest `keep` steps and the
best by the figure (ties to the newer), over the steps saved so far.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

from hscl_jax import errors
from hscl_jax import models
from hscl_jax.config import choices
from hscl_jax.rundir import checkpoints
from hscl_jax.rundir import metrics
from hscl_jax.rundir import resume
from hscl_jax.rundir import trained_run

REPO = pathlib.Path(__file__).resolve().parents[2]
FIXTURE = REPO / 'tests' / 'fixtures' / 'digits_workdir'
KNN = checkpoints.KeepBest('knn_top1', 'max')


def _expected_kept(figures: dict[int, float | None], keep: int, mode: str) -> list[int]:
  """The reference: the newest `keep` steps and the best step by its figure (a larger one
  for 'max', a smaller for 'min'; of equal figures the newer)."""
  steps = sorted(figures)
  ranked = [s for s in steps if figures[s] is not None and math.isfinite(figures[s])]
  kept = set(steps[-keep:])
  if ranked:
    sign = 1 if mode == 'max' else -1
    kept.add(max(ranked, key=lambda s: (sign * figures[s], s)))
  return sorted(kept)


def _save_all(workdir, figures: dict[int, float | None], *, keep: int, keep_best):
  checkpointer = checkpoints.Checkpointer(str(workdir), keep=keep, keep_best=keep_best)
  for step, figure in figures.items():
    assert checkpointer.save(
      step, {'w': jnp.full((3,), step, jnp.float32)}, {'at': step}, {}, metric_value=figure
    )
  checkpointer.close()


def test_an_old_best_is_kept_besides_the_newest_and_survives_a_resume(tmp_path):
  first = {1: 0.5, 2: 0.9, 3: None, 4: 0.6, 5: 0.7, 6: 0.8}  # step 2 is best and oldest
  _save_all(tmp_path, first, keep=2, keep_best=KNN)
  assert checkpoints.finished_steps(str(tmp_path)) == _expected_kept(first, 2, 'max') == [2, 5, 6]
  assert checkpoints.best_checkpoint(str(tmp_path)) == checkpoints.Best(2, 'knn_top1', 'max', 0.9)

  # A new Checkpointer on the same directory, as a resumed run builds: step 2 stays.
  second = {7: 0.4, 8: 0.3}
  _save_all(tmp_path, second, keep=2, keep_best=KNN)
  assert checkpoints.finished_steps(str(tmp_path)) == [2, 7, 8]
  assert checkpoints.best_checkpoint(str(tmp_path)).step == 2

  # A better figure takes over; the old best goes, and a best among the newest is one copy.
  third = {9: 0.95}
  _save_all(tmp_path, third, keep=2, keep_best=KNN)
  everything = {**first, **second, **third}
  assert checkpoints.finished_steps(str(tmp_path)) == _expected_kept(everything, 2, 'max')
  assert checkpoints.finished_steps(str(tmp_path)) == [8, 9]
  assert checkpoints.best_checkpoint(str(tmp_path)) == checkpoints.Best(9, 'knn_top1', 'max', 0.95)


def test_keep_1_and_min_mode_keep_at_most_two_and_ties_go_to_the_newer(tmp_path):
  loss = checkpoints.KeepBest.parse('train_loss')
  assert loss == checkpoints.KeepBest('train_loss', 'min')
  figures = {1: 3.0, 2: 1.0, 3: 2.0, 4: 2.5}
  _save_all(tmp_path, figures, keep=1, keep_best=loss)
  assert checkpoints.finished_steps(str(tmp_path)) == _expected_kept(figures, 1, 'min') == [2, 4]
  assert checkpoints.best_checkpoint(str(tmp_path)) == checkpoints.Best(2, 'train_loss', 'min', 1.0)
  _save_all(tmp_path, {5: 1.0}, keep=1, keep_best=loss)  # equal to step 2's: the newer is best
  assert checkpoints.finished_steps(str(tmp_path)) == [5]
  assert checkpoints.best_checkpoint(str(tmp_path)).step == 5


def test_the_same_figures_by_max_and_by_min_keep_opposite_ends(tmp_path):
  figures = {1: 0.2, 2: 0.9, 3: 0.1, 4: 0.5, 5: 0.4}
  for mode in checkpoints.MODES:
    workdir = tmp_path / mode
    _save_all(workdir, figures, keep=1, keep_best=checkpoints.KeepBest('knn_top1', mode))
    assert checkpoints.finished_steps(str(workdir)) == _expected_kept(figures, 1, mode)
  assert checkpoints.finished_steps(str(tmp_path / 'max')) == [2, 5]
  assert checkpoints.finished_steps(str(tmp_path / 'min')) == [3, 5]


def test_a_checkpoint_is_ranked_by_its_own_steps_record_only(tmp_path):
  """A save mid-epoch (a SIGTERM) passes the last epoch's record: it ranks nothing, nor
  does a record without the figure (an epoch without the kNN), nor a NaN."""
  records = {
    5: {'step': 5, 'knn_top1': 0.9, 'train_loss': 2.0},
    7: {'step': 5, 'knn_top1': 0.9},  # saved mid-epoch, after step 5's record
    10: {'step': 10, 'train_loss': 1.5},  # no kNN this epoch
    15: {'step': 15, 'knn_top1': math.nan},
    20: {'step': 20, 'knn_top1': 0.6},
  }
  _save_all(tmp_path, records, keep=1, keep_best=KNN)
  assert checkpoints.finished_steps(str(tmp_path)) == [5, 20]
  entries = {step: KNN.entry(step, record) for step, record in records.items()}
  assert [entries[s]['value'] for s in records] == [0.9, None, None, None, 0.6]
  assert KNN.entry(3, jnp.float32(0.5)) == {'metric': 'knn_top1', 'mode': 'max', 'value': 0.5}
  assert checkpoints.best_checkpoint(str(tmp_path)).step == 5


def test_a_run_resumed_with_another_figure_ranks_by_the_new_one(tmp_path):
  _save_all(tmp_path, {1: 0.9, 2: 0.5}, keep=1, keep_best=KNN)
  probe = checkpoints.KeepBest('probe_top1', 'max')
  _save_all(tmp_path, {3: 0.3, 4: 0.2}, keep=1, keep_best=probe)
  assert checkpoints.finished_steps(str(tmp_path)) == [3, 4]
  assert checkpoints.best_checkpoint(str(tmp_path)) == checkpoints.Best(3, 'probe_top1', 'max', 0.3)


def test_without_keep_best_only_the_newest_are_kept_and_none_is_best(tmp_path):
  _save_all(tmp_path, {1: 0.9, 2: 0.1, 3: 0.2}, keep=2, keep_best=None)
  assert checkpoints.finished_steps(str(tmp_path)) == [2, 3]
  assert checkpoints.best_checkpoint(str(tmp_path)) is None
  assert checkpoints.best_checkpoint(str(tmp_path / 'nothing')) is None


def test_keep_best_is_parsed_from_the_configs_text():
  assert checkpoints.KeepBest.parse(None) is None
  assert checkpoints.KeepBest.parse('') is None
  assert checkpoints.KeepBest.parse('knn_top1') == KNN
  assert checkpoints.KeepBest.parse('knn_top1:min') == checkpoints.KeepBest('knn_top1', 'min')
  assert checkpoints.KeepBest.parse('loss_hscl:max') == checkpoints.KeepBest('loss_hscl', 'max')
  for bad in ('knn_top1:up', ':max'):
    with pytest.raises(errors.ConfigError, match=r'^config\.keep_best: .* Fix: .*\.$'):
      checkpoints.KeepBest.parse(bad)


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


class _Loader:
  """The input pipeline's position, as a RunRecord saves and restores it."""

  def __init__(self):
    self.state = {'served': 0}

  def get_state(self):
    return dict(self.state)

  def set_state(self, state):
    self.state = dict(state)


def test_a_run_record_ranks_each_checkpoint_by_the_record_of_its_step(tmp_path):
  """Training's bookkeeping (rundir/resume) with keep_best, across a resume: a save
  mid-epoch follows the last epoch's record and is ranked by none."""
  tree, loader = {'w': jnp.zeros((3,), jnp.float32)}, _Loader()
  book = resume.RunRecord(str(tmp_path), keep=1, keep_best='knn_top1')
  assert book.restore(tree, loader).step == 0
  for step, knn in ((5, 0.9), (10, 0.5)):
    book.write_record(step, {'epoch': step // 5, 'knn_top1': knn})
    book.save(step, tree, loader, resume.EpochPosition())
  book.save(12, tree, loader, resume.EpochPosition())  # a SIGTERM mid-epoch 3
  book.close()
  assert checkpoints.finished_steps(str(tmp_path)) == [5, 12]
  book = resume.RunRecord(str(tmp_path), keep=1, keep_best='knn_top1')
  assert book.restore(tree, loader).step == 12
  book.write_record(15, {'epoch': 3, 'knn_top1': 0.7})
  book.save(15, tree, loader, resume.EpochPosition())
  book.close()
  assert checkpoints.finished_steps(str(tmp_path)) == [5, 15]
  assert checkpoints.best_checkpoint(str(tmp_path)) == checkpoints.Best(5, 'knn_top1', 'max', 0.9)


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
