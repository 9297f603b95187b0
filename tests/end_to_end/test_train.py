"""The training program: device-count invariance, preemption/resume, outputs, failures.

Every run uses the small CNN on 8x8 digits with a few steps. The tests share the session's
compilation cache (tests/conftest.py), so a configuration compiled once (e.g. the
uninterrupted run) is reused by the runs that must reproduce it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gzip
import json
import logging
import os
import pathlib
import re
import shutil
import signal
import stat
import sys
import time

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P
import numpy as np
import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # `from configs import ...`, as from the repo root

import tensorboard_events  # noqa: E402
from training_runs import assert_first_step_pinned  # noqa: E402
from training_runs import assert_trees_equal  # noqa: E402
from training_runs import leaves  # noqa: E402
from training_runs import random_batch  # noqa: E402
from training_runs import record_first_step  # noqa: E402
from training_runs import run_steps  # noqa: E402
from training_runs import sgd_config  # noqa: E402
from training_runs import signal_at  # noqa: E402
from training_runs import step_loss_reference  # noqa: E402
from training_runs import step_projections  # noqa: E402
from training_runs import tiny_config  # noqa: E402
from transfer_guard import no_implicit_transfers  # noqa: E402

from configs import digits  # noqa: E402
from hscl_jax import data  # noqa: E402
from hscl_jax import errors  # noqa: E402
from hscl_jax import losses  # noqa: E402
from hscl_jax import models  # noqa: E402,E501
from hscl_jax import optimizers  # noqa: E402,E501
from hscl_jax import parallel  # noqa: E402,E501
from hscl_jax import progress  # noqa: E402,E501
from hscl_jax.config import choices  # noqa: E402
from hscl_jax.config import methods  # noqa: E402
from hscl_jax.data import augment  # noqa: E402,E501
from hscl_jax.rundir import checkpoints  # noqa: E402,E501
from hscl_jax.rundir import layout  # noqa: E402
from hscl_jax.rundir import metrics  # noqa: E402,E501
from hscl_jax.rundir import stored_config  # noqa: E402
from hscl_jax.rundir import trained_run  # noqa: E402
from hscl_jax.rundir import versions  # noqa: E402
from hscl_jax.training import log_lines  # noqa: E402
from hscl_jax.training import loop  # noqa: E402
from hscl_jax.training import plan as plan_lib  # noqa: E402
from hscl_jax.training import state as state_lib  # noqa: E402
from hscl_jax.training import step as step_lib  # noqa: E402

EPOCH_KEYS = (
  'epoch',
  'step',
  'train_loss',
  'knn_top1',
  'assumption1_fraction',
  'images_per_second',
  'learning_rate',
  'epoch_time',
  'loss_ucl',
  'loss_hucl',
  'loss_scl',
  'loss_hscl',
)


def _checkpoint_steps(workdir):
  return sorted(int(p.name) for p in (workdir / 'checkpoints').iterdir() if p.name.isdigit())


# ----------------------------------------------------------------------------------------
# 4 devices == 1 device.


def _three_steps(config, num_devices, batch):
  """(the state before the first step, after the third, the three losses)."""
  states, losses, _ = run_steps(config, num_devices, [batch] * 3)
  return states[0], states[-1], losses


def test_four_devices_match_one_device():
  """Global negatives, synced BatchNorm and the global gradient: sharding changes nothing.

  Plain SGD with a large step: a gradient off by the device count (or BN statistics of
  the local shard only) would move the parameters visibly differently.
  """
  assert jax.device_count() == 4
  config = sgd_config()
  batch = random_batch()  # repeated labels: SCL positives

  _, four, four_losses = _three_steps(config, 4, batch)
  first, one, one_losses = _three_steps(config, 1, batch)

  np.testing.assert_allclose(four_losses, one_losses, rtol=1e-5)
  # Pinned: the first loss against the float64 reference (the two runs share the code).
  pinned = step_loss_reference(config, first, batch, num_devices=1)
  np.testing.assert_allclose(one_losses[0], pinned, rtol=2e-5)
  assert four_losses[0] != four_losses[2]  # the parameters did move
  for x, y in zip(leaves(four.params), leaves(one.params), strict=True):
    np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-5)
  for x, y in zip(leaves(four.batch_stats), leaves(one.batch_stats), strict=True):
    np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-5)
  for name in four.metric_sums:
    np.testing.assert_allclose(four.metric_sums[name], one.metric_sums[name], rtol=1e-5)


# ----------------------------------------------------------------------------------------
# End to end, preemption and resume.


@dataclasses.dataclass(frozen=True)
class Compilation:
  program: str  # e.g. 'jit(per_device_step)'
  epochs_finished: int  # before it, in this run
  in_checkpoint_write: bool


@contextlib.contextmanager
def compilations():
  """Yields a list that gets a `Compilation` for every program compiled (or loaded from
  the compilation cache) in the block."""
  compiled, finished, writing = [], [], []

  def listener(event, duration, **kwargs):
    del duration
    if event == '/jax/core/compile/backend_compile_duration':
      compiled.append(Compilation(kwargs['fun_name'], len(finished), bool(writing)))

  def counting_epochs(end_epoch):
    def wrapped(*args):
      ended = end_epoch(*args)
      finished.append(True)
      return ended

    return wrapped

  def flagging_writes(save):
    def wrapped(*args, **kwargs):
      writing.append(True)
      try:
        return save(*args, **kwargs)
      finally:
        writing.pop()

    return wrapped

  jax.monitoring.register_event_duration_secs_listener(listener)
  try:
    with pytest.MonkeyPatch.context() as patch:
      patch.setattr(loop, '_end_epoch', counting_epochs(loop._end_epoch))
      patch.setattr(
        checkpoints.Checkpointer, 'save', flagging_writes(checkpoints.Checkpointer.save)
      )
      yield compiled
  finally:
    jax.monitoring.unregister_event_duration_listener(listener)


class _Lines(logging.Handler):
  """The messages logged while it is attached to absl's logger, and when each was."""

  def __init__(self):
    super().__init__()
    self.lines, self.created = [], []

  def emit(self, record):
    self.lines.append(record.getMessage())
    self.created.append(record.created)


@pytest.fixture(scope='module')
def uninterrupted_run(tmp_path_factory):
  """(workdir, result, compilations, wall seconds, logged messages, their times) of the
  tiny run, under the transfer guard."""
  workdir = tmp_path_factory.mktemp('uninterrupted')
  jax.clear_caches()  # programs other tests compiled would otherwise not compile here
  logged, absl_logger = _Lines(), logging.getLogger('absl')
  absl_logger.addHandler(logged)
  level = absl_logger.level
  absl_logger.setLevel(logging.INFO)
  try:
    with pytest.MonkeyPatch.context() as patch:
      first_step = record_first_step(patch)
      with no_implicit_transfers(), compilations() as compiled:
        start = time.perf_counter()
        result = loop.train_and_evaluate(tiny_config(), str(workdir))
        seconds = time.perf_counter() - start
  finally:
    absl_logger.removeHandler(logged)
    absl_logger.setLevel(level)
  # The resume tests compare other runs with this one: pinned by its first step.
  assert_first_step_pinned(tiny_config(), first_step)
  return workdir, result, compiled, seconds, logged.lines, logged.created


@pytest.fixture(scope='module')
def uninterrupted(uninterrupted_run):
  return uninterrupted_run[:2]


def test_end_to_end_writes_checkpoints_metrics_and_config(uninterrupted_run):
  workdir, result, _, seconds, _, _ = uninterrupted_run
  assert not result.preempted
  assert int(result.state.step) == 6
  assert _checkpoint_steps(workdir) == [3, 6]

  records = metrics.read_metrics(str(workdir))
  assert [r['epoch'] for r in records] == [1, 2]
  assert [r['step'] for r in records] == [3, 6]
  for record in records:
    assert set(EPOCH_KEYS) <= set(record)
    assert all(np.isfinite(record[k]) for k in EPOCH_KEYS)
    assert 0.0 <= record['assumption1_fraction'] <= 1.0
    assert 'beta' in record and 'tau' not in record  # H-SCL(beta): tau is not used
  assert records[-1]['knn_top1'] > 0.5  # chance is 0.1
  assert records[-1]['train_loss'] < records[0]['train_loss']
  # The logged rate is the one the epoch's last update used (step s - 1 of the schedule):
  # digits' cosine from 3e-3 to 0 over 6 steps, no warm-up (tiny_config), written out.
  config = tiny_config()
  assert (config.optimizer.schedule, config.optimizer.warmup_epochs) == ('cosine', 0.0)
  want = [config.optimizer.learning_rate * 0.5 * (1 + np.cos(np.pi * (s - 1) / 6)) for s in (3, 6)]
  np.testing.assert_allclose([r['learning_rate'] for r in records], want, rtol=1e-6)
  # Throughput from its sources: epoch 2's 3 steps of 32 samples (2 views each) over its
  # time; epoch 1's first step compiled, so its rate is that of its other 2 steps.
  second = records[1]
  samples = config.batch_size * 3 / second['epoch_time']
  np.testing.assert_allclose(second['samples_per_second'], samples, rtol=1e-12)
  np.testing.assert_allclose(second['images_per_second'], 2 * samples, rtol=1e-12)
  first = records[0]
  assert first['samples_per_second'] > config.batch_size * 3 / first['epoch_time']
  np.testing.assert_allclose(first['images_per_second'], 2 * first['samples_per_second'])
  # Times are durations within the run's: the two epochs, and the kNN of the last.
  assert 0 < records[-1]['knn_time']
  assert records[-1]['knn_time'] + sum(r['epoch_time'] for r in records) < seconds
  assert result.last_record == records[-1]

  saved = json.loads((workdir / 'config.json').read_text())
  assert saved == {
    **json.loads(json.dumps(tiny_config().to_dict())),
    'format_version': versions.FORMAT_VERSION,
  }
  assert (workdir / layout.STEPS_FILE).exists()
  # Every file has the mode any new file gets (a co-worker in the group reads them).
  umask = os.umask(0o022)
  os.umask(umask)
  modes = {str(p.relative_to(workdir)): p.stat().st_mode for p in workdir.rglob('*')}
  odd = {p: oct(m) for p, m in modes.items() if stat.S_ISREG(m) and m & 0o777 != 0o666 & ~umask}
  assert not odd and len(modes) > 10, odd
  # The epoch records' event files (the per-step scalars' run is the folder beside them).
  events = [p for p in (workdir / 'tensorboard').iterdir() if p.is_file()]
  assert events and events[0].name.startswith('events.out.tfevents')


def test_the_epoch_lines_show_the_compilation_apart_and_the_run_ends_with_what_next(
  uninterrupted_run,
):
  """Epoch 1's line shows its compilation, whose time is the epoch's time less its other
  2 steps at the recorded rate; epoch 2's line has none. The last line is the closing one:
  the epochs, the final monitor (kNN, retrieval, probe), the best epoch by the kNN, the
  workdir and the next commands with it filled in."""
  workdir, _, _, seconds, lines, _ = uninterrupted_run
  records = metrics.read_metrics(str(workdir))
  epoch_lines = [line for line in lines if EPOCH_LINE.match(line)]
  assert len(epoch_lines) == 2, lines
  first, second = records
  compiling = re.search(r'\((\d+\.\d) s compiling\)', epoch_lines[0])
  other_steps = first['epoch_time'] - tiny_config().batch_size * 2 / first['samples_per_second']
  assert abs(float(compiling.group(1)) - other_steps) <= 0.051, (epoch_lines[0], other_steps)
  assert epoch_lines[1] == log_lines.epoch_line(second, num_epochs=2)  # no compilation
  assert f'  {first["images_per_second"]:.0f} views/s  ' in epoch_lines[0]
  head, *commands = lines[-1].split('\n')
  # The best epoch by the kNN (of equal ones the newer), whose checkpoint the run kept.
  best = max(records, key=lambda r: (r['knn_top1'], r['step']))
  closing = re.fullmatch(
    rf'Finished 2 epochs in (\S+), final kNN top-1 {second["knn_top1"]:.4f}, P@1 '
    rf'{second["precision_at_1"]:.4f}, MAP@R {second["map_at_r"]:.4f}, probe top-1 '
    rf'{second["probe_top1"]:.4f}; best kNN top-1 {best["knn_top1"]:.4f} at epoch '
    rf'{best["epoch"]} \(--checkpoint=best\); workdir {re.escape(str(workdir))}\. Next:',
    head,
  )
  # The run's wall time, measured inside the fixture's (which also counts the return).
  assert closing.group(1) in {progress.format_duration(seconds - d) for d in (0, 1, 2)}, head
  programs = [c.split()[2] for c in commands]
  assert programs == ['hscl_jax.linear_eval', 'hscl_jax.embed', 'hscl_jax.inspect']
  assert all(f'--workdir={workdir} ' in c + ' ' for c in commands), commands


EPOCH_LINE = re.compile(r'epoch \d+/\d+  loss ')
PROGRESS = re.compile(
  r'epoch (\d+)/2  step (\d+)/6 \((\d+)%\)  loss (\S+)  (\d+) views/s  ETA (.+)'
)


def test_progress_lines_come_every_log_every_steps_and_count_both_views(uninterrupted_run):
  """tiny_config logs every 2nd of 6 steps and each epoch's last (3): steps 2, 3, 4, 6.
  A line's rate is of both views since the compiling step: at step 6, 2 x 32 views for
  each of steps 2..6 over the time the records measured them in (epoch 1's steps 2-3 at
  its rate, epoch 2's 3 steps); a rate of samples would be half. The last ETA is nought."""
  workdir, _, _, _, lines, _ = uninterrupted_run
  matched = [match for line in lines if (match := PROGRESS.fullmatch(line))]
  assert [(int(m[1]), int(m[2]), int(m[3])) for m in matched] == [
    (1, 2, 33),
    (1, 3, 50),
    (2, 4, 67),
    (2, 6, 100),
  ], lines
  first, second = metrics.read_metrics(str(workdir))
  batch = tiny_config().batch_size
  seconds = 2 * batch / first['samples_per_second'] + second['epoch_time']
  np.testing.assert_allclose(int(matched[-1][5]), 2 * batch * 5 / seconds, rtol=0.3)
  assert matched[-1][6] == progress.format_duration(0)


STEP_ROW_KEYS = {'step', 'time', 'epoch', 'train_loss', 'grad_norm', 'learning_rate', 'beta'}


def _step_events(workdir):
  return tensorboard_events.scalars(workdir / layout.EVENTS_DIR / layout.STEP_EVENTS_DIR)


def test_steps_file_has_a_row_per_logging_step(uninterrupted_run):
  """steps.jsonl has a row at each progress line's step (2, 3, 4, 6): the step's loss as
  the line shows it, the learning rate its update used (the cosine written out), beta
  (H-SCL(beta) reads no tau); TensorBoard's steps run holds the same scalars."""
  workdir, _, _, _, lines, created = uninterrupted_run
  rows = metrics.read_steps(str(workdir))
  assert [r['step'] for r in rows] == [2, 3, 4, 6]
  assert [r['epoch'] for r in rows] == [1, 1, 2, 2]
  assert all(set(r) == STEP_ROW_KEYS for r in rows), rows
  config = tiny_config()
  want = [
    config.optimizer.learning_rate * 0.5 * (1 + np.cos(np.pi * (s - 1) / 6)) for s in (2, 3, 4, 6)
  ]
  np.testing.assert_allclose([r['learning_rate'] for r in rows], want, rtol=1e-6)
  assert all(r['beta'] == np.float32(config.beta) for r in rows)
  assert all(r['grad_norm'] > 0 for r in rows)
  shown = [float(m[4]) for line in lines if (m := PROGRESS.fullmatch(line))]
  assert shown == [float(f'{r["train_loss"]:.4f}') for r in rows]
  # Each row's wall-clock time (ms) is its step's: after the previous progress line was
  # logged, before its own (its row is written first); each record's before its epoch line.
  logged = [created[i] for i, line in enumerate(lines) if PROGRESS.fullmatch(line)]
  for row, after, before in zip(rows, [0.0, *logged], logged):
    assert after - 1e-3 <= row['time'] <= before + 1e-3, (row, after, before)
  records = metrics.read_metrics(str(workdir))
  epoch_lines = [created[i] for i, line in enumerate(lines) if EPOCH_LINE.match(line)]
  for record, before, epoch_line in zip(records, [logged[1], logged[3]], epoch_lines, strict=True):
    assert before - 1e-3 <= record['time'] <= epoch_line + 1e-3, (record, epoch_line)
  events = _step_events(workdir)
  assert set(events) == STEP_ROW_KEYS - {'step', 'time', 'epoch'}
  for name, steps in events.items():
    assert steps == {r['step']: float(np.float32(r[name])) for r in rows}, name


def test_per_step_rows_average_to_the_epoch_records_and_a_profile_is_traced(tmp_path):
  """Logging every step: each epoch's rows of loss and gradient norm average to its record
  (which sums them on the device). --config.profile_steps=2 leaves a trace of steps 2-3
  in DIR/profile: a non-empty .xplane.pb and a Perfetto trace that parses and holds the
  step's program."""
  config = tiny_config()
  config.log_every_steps, config.knn.every_epochs, config.profile_steps = 1, 0, 2
  loop.train_and_evaluate(config, str(tmp_path))
  rows, records = metrics.read_steps(str(tmp_path)), metrics.read_metrics(str(tmp_path))
  assert [r['step'] for r in rows] == [1, 2, 3, 4, 5, 6]
  for record in records:
    epoch_rows = [r for r in rows if r['epoch'] == record['epoch']]
    for name in ('train_loss', 'grad_norm'):
      np.testing.assert_allclose(np.mean([r[name] for r in epoch_rows]), record[name], rtol=1e-6)
  xplanes = list((tmp_path / layout.PROFILE_DIR).rglob('*.xplane.pb'))
  assert len(xplanes) == 1 and xplanes[0].stat().st_size > 0, xplanes
  (perfetto,) = (tmp_path / layout.PROFILE_DIR).rglob('perfetto_trace.json.gz')
  trace = json.loads(gzip.decompress(perfetto.read_bytes()))
  names = {event.get('name', '') for event in trace['traceEvents']}
  assert any('per_device_step' in name for name in names), sorted(names)[:50]


def test_the_start_line_counts_the_parameters_and_the_state_bytes(uninterrupted_run):
  """The start line's counts per part equal the model's initial parameters counted from
  their shapes (no arrays made), and its bytes those of the checkpoint's tree on the host."""
  workdir, result, _, _, lines, _ = uninterrupted_run
  (line,) = [line for line in lines if line.startswith('Parameters:')]
  match = re.fullmatch(
    r'Parameters: backbone ([\d,]+), head ([\d,]+), probe ([\d,]+) \(([\d,]+) in all\); '
    r'train state ([\d,]+) bytes \(\d+\.\d MiB\) per device\.',
    line,
  )
  assert match, line
  backbone, head, probe, total, size = (int(g.replace(',', '')) for g in match.groups())
  config = tiny_config()
  model = models.create_model(config.model)
  image_size = augment.AugmentParams.from_config(config.augment).image_size
  shapes = jax.eval_shape(
    lambda: models.initialize(model, jax.random.key(0), (image_size, image_size, 3))
  )['params']
  count = lambda tree: sum(int(np.prod(x.shape)) for x in jax.tree.leaves(tree))
  assert (backbone, head) == (count(shapes['encoder']), count(shapes['head']))
  # The online probe (on for labelled data): its own parameters, beside the model's.
  assert probe == count(jax.device_get(result.state.probe['params']))
  assert total == backbone + head + probe
  host = jax.device_get(state_lib.state_to_checkpoint(result.state))
  assert size == sum(np.asarray(x).nbytes for x in jax.tree.leaves(host))


def test_the_knn_time_is_the_span_between_the_last_step_and_the_epochs_line(uninterrupted_run):
  """Epoch 2 ends with its progress line, then the kNN, then its epoch line: the recorded
  kNN time fills most of that span (the record's other work is a device read) and no more."""
  workdir, _, _, _, lines, created = uninterrupted_run
  last_step = max(i for i, line in enumerate(lines) if PROGRESS.fullmatch(line))
  epoch_line = next(i for i, line in enumerate(lines) if line.startswith('epoch 2/2  loss'))
  span = created[epoch_line] - created[last_step]
  knn_time = metrics.read_metrics(str(workdir))[-1]['knn_time']
  assert 0.5 * span < knn_time <= span, (knn_time, span)


def test_run_compiles_each_program_once_in_its_first_epoch(uninterrupted_run):
  """The train step compiles once; the initialisation, the learning-rate schedule, the
  feature extraction, the kNN and the retrieval metrics once each; nothing compiles after
  the first epoch, and no one-op program ever (eager jnp arithmetic on the host would
  compile `add`, `cos`...), except Orbax's: on several devices each replica writes a slice
  of every replicated array (replica-parallel saving), one `slice` program per array shape."""
  _, _, compiled, _, _, _ = uninterrupted_run
  order = data.EpochOrder(1438, global_batch_size=tiny_config().batch_size, seed=0)
  schedule = plan_lib.make_plan(tiny_config(), order).learning_rate.__name__
  ours = ['init', 'per_device_step', schedule, 'per_device', '_predict', '_per_query']
  assert [c.program for c in compiled if not c.in_checkpoint_write] == [
    f'jit({name})' for name in ours
  ], compiled
  assert {c.program for c in compiled if c.in_checkpoint_write} == {'jit(slice)'}, compiled
  assert all(c.epochs_finished == 0 for c in compiled), compiled


# The durations and the wall-clock time of a row: what a resumed run measures anew.
TIMING_KEYS = ('epoch_time', 'images_per_second', 'samples_per_second', 'knn_time', 'time')


def _deterministic(records):
  return [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in records]


def _deterministic_events(workdir):
  return {
    tag: steps
    for tag, steps in tensorboard_events.scalars(workdir / 'tensorboard').items()
    if tag not in TIMING_KEYS
  }


SIGNAL_NAMES = {signal.SIGTERM: 'SIGTERM', signal.SIGINT: 'Ctrl-C (SIGINT)'}


def _tiny_position(step):
  """Where `step` of tiny_config()'s 2 epochs of 3 steps stands, as the stop lines say it."""
  epoch = (step - 1) // 3 + 1
  return f'step {step} (epoch {epoch} of 2, {step - 3 * (epoch - 1)} of its 3 steps taken)'


@pytest.mark.parametrize('first', [signal.SIGINT, signal.SIGTERM], ids=['sigint', 'sigterm'])
@pytest.mark.parametrize(
  'interruptions',
  [
    # last step of epoch 1, its kNN, its record, then mid-epoch 2 (not a logging step)
    [('step', 3), ('knn',), ('record',), ('step', 5)],
    # epoch 1's checkpoint write, the last step of the run, the last kNN
    [('checkpoint',), ('step', 6), ('knn',)],
  ],
  ids=['epoch-end-phases', 'checkpoint-and-last-epoch'],
)
@pytest.mark.covering  # each sequence once, each signal first once; -m slow: the other two
def test_a_signal_in_any_phase_resumes_to_the_uninterrupted_records(
  uninterrupted, tmp_path, monkeypatch, caplog, interruptions, first
):
  """Whatever phase a SIGTERM or a Ctrl-C lands in (the two alternate, `first` first), the
  run saves and stops (main exits 143 or 130), saying where it stopped, and the resumed
  run's metrics.jsonl and TensorBoard scalars equal an uninterrupted run's, row for row;
  every run under the transfer guard (`no_implicit_transfers`)."""
  reference_dir, reference = uninterrupted
  workdir = tmp_path / 'run'
  sigint_handler = signal.getsignal(signal.SIGINT)
  signals = [first, ({signal.SIGTERM, signal.SIGINT} - {first}).pop()] * len(interruptions)
  for interruption, signum in zip(interruptions, signals):
    caplog.clear()
    with monkeypatch.context() as patch, no_implicit_transfers():
      fired = signal_at(patch, *interruption, signum=signum)
      stopped = loop.train_and_evaluate(tiny_config(), str(workdir))
    assert fired and stopped.stop_signal == signum, interruption
    if interruption[0] == 'step':  # it stops at the step the signal came in, not later
      step = interruption[1]
      assert int(stopped.state.step) == step, interruption
      assert max(_checkpoint_steps(workdir)) == step, interruption
      assert (
        f'{SIGNAL_NAMES[signum]}: saved the checkpoint at {_tiny_position(step)}; rerun the '
        'same command to resume.'
      ) in caplog.messages
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # handlers restored
    assert signal.getsignal(signal.SIGINT) is sigint_handler
  caplog.clear()
  caplog.set_level(logging.INFO, logger='absl')
  last = max(_checkpoint_steps(workdir))
  with no_implicit_transfers():
    resumed = loop.train_and_evaluate(tiny_config(), str(workdir))
  assert not resumed.preempted
  assert f'Resumed from the checkpoint at {_tiny_position(last)}.' in caplog.messages
  assert_trees_equal(resumed.state.params, reference.state.params)
  assert_trees_equal(resumed.state.opt_state, reference.state.opt_state)
  assert_trees_equal(resumed.state.probe, reference.state.probe)  # the online probe's too
  assert reference.state.probe is not None
  records = metrics.read_metrics(str(workdir))
  assert _deterministic(records) == _deterministic(metrics.read_metrics(str(reference_dir)))
  assert all(r['images_per_second'] > 0 for r in records)
  assert _deterministic_events(workdir) == _deterministic_events(reference_dir)
  # The per-step scalars too, the file and TensorBoard's steps run.
  assert _deterministic(metrics.read_steps(str(workdir))) == _deterministic(
    metrics.read_steps(str(reference_dir))
  )
  assert _step_events(workdir) == _step_events(reference_dir)


STARTS_OVER = (
  'no checkpoint had been written, so the workdir is left as it was and rerunning the same '
  'command starts over'
)


@pytest.mark.parametrize(
  'phase, signum',
  [
    ('compile', signal.SIGINT),
    ('compile', signal.SIGTERM),
    ('compile-callback', signal.SIGINT),
    ('loop-start', signal.SIGINT),
  ],
  ids=['sigint', 'sigterm', 'sigint-in-a-callback', 'sigint-as-the-loop-starts'],
)
def test_a_signal_before_the_first_step_stops_at_once_leaving_the_workdir_as_it_was(
  tmp_path, monkeypatch, phase, signum
):
  """Until the first step is taken (as it compiles, or as the loop starts) the run has
  nothing to save: a signal stops it at once (errors.Interrupted: main's one line and exit
  status 128 + the signal, 130 for Ctrl-C), the workdir as the run found it, and the line
  says the rerun starts over. Where the signal lands in a callback whose error the
  interpreter only reports (a garbage collection's, as while XLA compiles), the report is
  silenced and the run stops after the step instead of saving it."""
  workdir = tmp_path / 'shared'
  workdir.mkdir()
  (workdir / 'notes.txt').write_text('a file of the user')
  reports = []
  with monkeypatch.context() as patch:
    patch.setattr(sys, 'unraisablehook', reports.append)
    fired = signal_at(patch, phase, signum=signum)
    with pytest.raises(errors.Interrupted) as stop:
      loop.train_and_evaluate(tiny_config(), str(workdir))
  assert fired and stop.value.exit_status == 128 + signum
  assert str(stop.value) == (
    f'{SIGNAL_NAMES[signum]} before the first step was taken: stopped at once without saving; '
    f'{STARTS_OVER}.'
  )
  assert [p.name for p in workdir.iterdir()] == ['notes.txt']
  assert reports == []
  assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


@pytest.mark.parametrize(
  'first_at, outcome',
  [
    (2, STARTS_OVER),
    (
      4,
      'rerunning the same command resumes from the checkpoint at step 3 (epoch 1 of 2, 3 of '
      'its 3 steps taken)',
    ),
  ],
  ids=['before-the-first-checkpoint', 'after-it'],
)
def test_a_second_ctrl_c_stops_at_once_without_saving(tmp_path, monkeypatch, first_at, outcome):
  """Ctrl-C after step `first_at`, then again as the stop's checkpoint starts: the run
  stops at once, saves nothing more, and says what a rerun does (main: one line, 130)."""
  workdir = tmp_path / 'run'
  with monkeypatch.context() as patch:
    first = signal_at(patch, 'step', first_at, signum=signal.SIGINT)
    second = signal_at(patch, 'saving', first_at, signum=signal.SIGINT)
    with pytest.raises(errors.Interrupted) as stop:
      loop.train_and_evaluate(tiny_config(), str(workdir))
  assert first and second and stop.value.exit_status == 130
  assert str(stop.value) == (
    f'Ctrl-C (SIGINT) while the run was stopping: stopped at once without saving; {outcome}.'
  )
  if first_at < 3:
    assert not workdir.exists()
  else:
    assert _checkpoint_steps(workdir) == [3]


@pytest.mark.parametrize(
  'row', [row for row in methods.ROWS if row.family == 'sigmoid'], ids=lambda row: row.slug
)
def test_a_sigmoid_run_resumes_after_a_sigterm_to_the_uninterrupted_run(row, tmp_path, monkeypatch):
  """Each sigmoid row through the methods table alone: stopped by a SIGTERM mid-epoch 2,
  then resumed, its log t and b (with their optimizer state), parameters, records and
  per-step rows equal an uninterrupted run's; t and b are logged per epoch and per logging
  step."""
  config = tiny_config()
  config.knn.every_epochs = 0
  config.update_from_flattened_dict(dict(row.overrides))
  reference = loop.train_and_evaluate(config, str(tmp_path / 'reference'))
  with monkeypatch.context() as patch:
    fired = signal_at(patch, 'step', 4)
    stopped = loop.train_and_evaluate(config, str(tmp_path / 'run'))
  assert fired and stopped.preempted and int(stopped.state.step) == 4
  resumed = loop.train_and_evaluate(config, str(tmp_path / 'run'))
  assert not resumed.preempted
  for tree in ('loss_state', 'params', 'opt_state'):
    assert_trees_equal(getattr(resumed.state, tree), getattr(reference.state, tree))
  records = metrics.read_metrics(str(tmp_path / 'run'))
  assert _deterministic(records) == _deterministic(
    metrics.read_metrics(str(tmp_path / 'reference'))
  )
  steps = metrics.read_steps(str(tmp_path / 'run'))
  assert _deterministic(steps) == _deterministic(metrics.read_steps(str(tmp_path / 'reference')))
  learned = jax.device_get(reference.state.loss_state['params'])
  final = {'t': float(np.exp(learned['log_t'])), 'b': float(learned['b'])}
  assert {name: records[-1][name] for name in final} == pytest.approx(final, rel=1e-6)
  assert {name: steps[-1][name] for name in final} == pytest.approx(final, rel=1e-6)
  assert records[0]['t'] != records[1]['t'] and records[0]['b'] != records[1]['b']  # trained


def test_a_crash_after_a_checkpoint_resumes_to_the_uninterrupted_step_rows(
  uninterrupted, tmp_path, monkeypatch
):
  """A crash (no SIGTERM: no checkpoint at it) before step 5 leaves step 4's row on file
  after the checkpoint at step 3; the resumed run drops it, hides its TensorBoard event
  and writes both again: the rows and the steps run equal an uninterrupted run's."""
  reference_dir, _ = uninterrupted
  workdir = tmp_path / 'run'
  make_train_step = step_lib.make_train_step

  class Crash(Exception):
    pass

  def make_train_step_crashing_before_step_5(*args, **kwargs):
    step = make_train_step(*args, **kwargs)

    def crashing(state, batch, hyper):
      if int(state.step) == 4:
        raise Crash()
      return step(state, batch, hyper)

    return crashing

  with monkeypatch.context() as patch:
    patch.setattr(step_lib, 'make_train_step', make_train_step_crashing_before_step_5)
    with pytest.raises(Crash):
      loop.train_and_evaluate(tiny_config(), str(workdir))
  assert _checkpoint_steps(workdir) == [3]
  assert [r['step'] for r in metrics.read_steps(str(workdir))] == [2, 3, 4]
  loop.train_and_evaluate(tiny_config(), str(workdir))
  assert _deterministic(metrics.read_steps(str(workdir))) == _deterministic(
    metrics.read_steps(str(reference_dir))
  )
  assert _step_events(workdir) == _step_events(reference_dir)


def _tear_last_row(path):
  text = path.read_text()
  path.write_text(text[: len(text) - len(text.splitlines()[-1]) // 2 - 1])


def _delete_first_row(path):
  path.write_text(''.join(path.read_text().splitlines(keepends=True)[1:]))


@pytest.mark.parametrize(
  'damage',
  [_tear_last_row, _delete_first_row, lambda path: path.unlink()],
  ids=['torn-last-row', 'row-missing-before-another', 'file-deleted'],
)
def test_damaged_metrics_are_rebuilt_from_the_checkpoint(uninterrupted, tmp_path, damage, caplog):
  """A finished run whose metrics.jsonl was damaged from outside: rerunning the command
  rebuilds every row whose epoch has a checkpoint, and the TensorBoard scalars, saying so."""
  reference_dir, _ = uninterrupted
  workdir = tmp_path / 'run'
  shutil.copytree(reference_dir, workdir)
  damage(workdir / layout.METRICS_FILE)
  with caplog.at_level('WARNING'):
    again = loop.train_and_evaluate(tiny_config(), str(workdir))
  assert not again.preempted
  assert metrics.read_metrics(str(workdir)) == metrics.read_metrics(str(reference_dir))
  assert _deterministic_events(workdir) == _deterministic_events(reference_dir)
  assert sum('Rebuilt' in r.getMessage() for r in caplog.records) == 1


def test_finished_run_is_not_retrained(uninterrupted, caplog):
  workdir, reference = uninterrupted
  caplog.set_level(logging.INFO, logger='absl')
  again = loop.train_and_evaluate(tiny_config(), str(workdir))
  assert int(again.state.step) == 6 and again.last_record is None and again.already_complete
  last = metrics.read_metrics(str(workdir))[-1]
  figures = (
    f'final kNN top-1 {last["knn_top1"]:.4f}, P@1 {last["precision_at_1"]:.4f}, MAP@R '
    f'{last["map_at_r"]:.4f}, probe top-1 {last["probe_top1"]:.4f}'
  )
  assert (
    f'Already complete: 2 of 2 epochs ({figures}). To train longer, rerun with '
    '--config.num_epochs=4 (or any larger number) --allow_config_change=num_epochs.'
  ) in caplog.messages
  assert caplog.messages[-1].startswith(f'Nothing trained (already complete); workdir {workdir}.')
  assert 'Resumed from the checkpoint' not in caplog.text
  assert_trees_equal(again.state.params, reference.state.params)
  assert len(metrics.read_metrics(str(workdir))) == 2


def test_changed_config_is_refused_unless_allowed(uninterrupted, tmp_path):
  reference_dir, _ = uninterrupted
  workdir = tmp_path / 'run'
  shutil.copytree(reference_dir, workdir)
  stored = (workdir / 'config.json').read_text()
  changed = tiny_config()
  changed.batch_size, changed.method = 64, 'ucl'
  with pytest.raises(
    stored_config.ConfigChangedError,
    match='batch_size: 32 -> 64; method: "hscl" -> "ucl".*--allow_config_change',
  ):
    loop.train_and_evaluate(changed, str(workdir))
  assert (workdir / 'config.json').read_text() == stored
  assert len(metrics.read_metrics(str(workdir))) == 2
  longer = tiny_config()
  longer.num_epochs = 3
  with pytest.raises(stored_config.ConfigChangedError, match='num_epochs: 2 -> 3'):
    loop.train_and_evaluate(longer, str(workdir))
  # A named change is allowed (the run is finished: nothing to train); the log period is free.
  deliberate = tiny_config()
  deliberate.knn.k, deliberate.log_every_steps = 50, 1
  result = loop.train_and_evaluate(deliberate, str(workdir), allowed_config_changes=('knn.k',))
  assert int(result.state.step) == 6
  assert json.loads((workdir / 'config.json').read_text())['knn']['k'] == 50


@pytest.mark.parametrize('index,processes', [(0, 1), (0, 2), (1, 2)])
def test_a_checkpoint_moved_aside_is_waited_for_by_every_process(
  tmp_path, monkeypatch, index, processes
):
  """Process 0 alone moves the damaged checkpoint; with several processes each waits for
  that move (a barrier after it) before reloading the listing; with one there is none."""
  checkpointer = checkpoints.Checkpointer(str(tmp_path), keep=2)
  damaged = checkpoints.directory(str(tmp_path)) / '6'
  damaged.mkdir(parents=True)
  barriers = []  # (name, whether the damaged directory was still in place)
  monkeypatch.setattr(checkpoints.jax, 'process_index', lambda: index)
  monkeypatch.setattr(checkpoints.jax, 'process_count', lambda: processes)
  monkeypatch.setattr(
    checkpoints.multihost_utils,
    'sync_global_devices',
    lambda name: barriers.append((name, damaged.exists())),
  )
  checkpointer._move_aside(6, ValueError('truncated'), fallback=3)
  moved = tmp_path / layout.UNUSABLE_DIR / '6'
  assert (moved.is_dir(), damaged.exists()) == ((True, False) if index == 0 else (False, True))
  assert barriers == ([] if processes == 1 else [('moved aside checkpoint 6', index != 0)])


# Orbax leaves the coroutines of the failed read unawaited; that noise is not ours.
@pytest.mark.filterwarnings('ignore::pytest.PytestUnraisableExceptionWarning')
def test_corrupt_latest_checkpoint_falls_back_to_the_newest_good_one(
  uninterrupted, tmp_path, caplog
):
  reference_dir, reference = uninterrupted
  workdir = tmp_path / 'run'
  shutil.copytree(reference_dir, workdir)
  for path in (workdir / 'checkpoints' / '6' / 'state').rglob('*'):
    if path.is_file() and path.stat().st_size > 1000:
      path.write_bytes(path.read_bytes()[:100])  # truncated

  # linear_eval skips it with a warning, and lists the usable steps if asked for it.
  config = tiny_config()
  model = models.create_model(config.model)
  with caplog.at_level('WARNING'):
    step, _ = trained_run.restore_usable_encoder(str(workdir), None, model, (8, 8, 3))
  assert step == 3 and 'step(s) [6] cannot be restored' in caplog.text
  with pytest.raises(
    trained_run.LinearEvalError,
    match=r'checkpoint step 6 cannot be used: .*Usable steps: \[3\]; '
    r'pass --checkpoint_step=3',
  ):
    trained_run.restore_usable_encoder(str(workdir), 6, model, (8, 8, 3))

  caplog.clear()
  with caplog.at_level('WARNING'):
    result = loop.train_and_evaluate(tiny_config(), str(workdir))
  assert 'checkpoint at step 6 cannot be restored' in caplog.text
  assert 'resumes from step 3' in caplog.text
  assert (workdir / 'checkpoints_unusable' / '6').is_dir()  # kept aside, not deleted
  assert _checkpoint_steps(workdir) == [3, 6]
  assert_trees_equal(result.state.params, reference.state.params)
  assert _deterministic(metrics.read_metrics(str(workdir))) == _deterministic(
    metrics.read_metrics(str(reference_dir))
  )


def test_one_class_folder_refuses_supervised_methods(tmp_path):
  from PIL import Image

  for i in range(8):
    path = tmp_path / 'images' / 'only_class' / f'{i}.png'
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new('RGB', (8, 8), (i, 0, 0)).save(path)
  config = tiny_config()
  config.dataset, config.folder = 'image_folder', str(tmp_path / 'images')
  config.batch_size = 4  # fits the 6 training images: only the missing negatives are wrong
  with pytest.raises(
    errors.ConfigError,
    match=r"config.method: 'hscl' takes its negatives from other classes, but "
    r'the image_folder training split has 1 class.*--config.method=ucl',
  ):
    loop.train_and_evaluate(config, str(tmp_path / 'run'))
  assert not (tmp_path / 'run' / 'checkpoints').exists()


def test_a_refused_start_leaves_no_workdir_and_keeps_what_was_there(tmp_path):
  """The data's check of samples_per_class comes after the lock made the workdir: a new
  workdir (and the parents made for it) is removed, an existing one keeps its own files."""
  config = tiny_config()
  config.samples_per_class = 2  # 16 classes per batch of 32; digits has 10
  with pytest.raises(errors.ConfigError, match='samples_per_class'):
    loop.train_and_evaluate(config, str(tmp_path / 'new' / 'parent' / 'run'))
  assert list(tmp_path.iterdir()) == []
  existing = tmp_path / 'existing'
  (existing / 'notes').mkdir(parents=True)
  (existing / 'notes' / 'plan.txt').write_text('mine')
  with pytest.raises(errors.ConfigError, match='samples_per_class'):
    loop.train_and_evaluate(config, str(existing))
  assert sorted(p.name for p in existing.rglob('*')) == ['notes', 'plan.txt']


def test_a_run_that_fails_before_its_first_checkpoint_removes_its_workdir(tmp_path, monkeypatch):
  """A crash in the first epoch (here: the first step raises) after config.json, metrics
  and TensorBoard files were written: the workdir it made is gone."""

  class Crash(Exception):
    pass

  def crashing_step(*args, **kwargs):
    def step(state, batch, hyper):
      assert (tmp_path / 'run' / 'config.json').exists()  # written, then removed
      raise Crash()

    return step

  monkeypatch.setattr(step_lib, 'make_train_step', crashing_step)
  with pytest.raises(Crash):
    loop.train_and_evaluate(tiny_config(), str(tmp_path / 'run'))
  assert list(tmp_path.iterdir()) == []


def test_a_stopped_first_epoch_removes_only_what_the_run_wrote(tmp_path, monkeypatch):
  """In the first epoch a user writes a file into the workdir and another run makes its
  directory there (a --workdir on a shared parent); then the run crashes before its first
  checkpoint. The run's own entries go (config.json, metrics, TensorBoard: the workdir's
  layout); the user's file and the other run's directory stay, and so does the workdir."""
  workdir = tmp_path / 'shared'
  make_train_step = step_lib.make_train_step

  class Crash(Exception):
    pass

  def step_then_others_write_then_crash(*args, **kwargs):
    step = make_train_step(*args, **kwargs)

    def stepped(state, batch, hyper):
      if int(state.step) == 1:
        assert (workdir / layout.CONFIG_FILE).exists() and (workdir / layout.EVENTS_DIR).exists()
        raise Crash()
      (workdir / 'notes.txt').write_text('mine')
      (workdir / 'other_run' / 'checkpoints' / '5').mkdir(parents=True)
      (workdir / 'other_run' / 'config.json').write_text('{}')
      return step(state, batch, hyper)

    return stepped

  monkeypatch.setattr(step_lib, 'make_train_step', step_then_others_write_then_crash)
  with pytest.raises(Crash):
    loop.train_and_evaluate(tiny_config(), str(workdir))
  assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob('*')) == [
    'shared',
    'shared/notes.txt',
    'shared/other_run',
    'shared/other_run/checkpoints',
    'shared/other_run/checkpoints/5',
    'shared/other_run/config.json',
  ]


@pytest.mark.parametrize(
  'nan_after, epoch, where',
  [
    (
      3,
      2,
      'rerunning the same command resumes from the checkpoint at step 3 (epoch 1 of 2, 3 of '
      'its 3 steps taken)',
    ),
    (1, 1, STARTS_OVER),
  ],
  ids=['after-a-checkpoint', 'before-the-first'],
)
def test_non_finite_loss_stops_and_keeps_the_last_good_checkpoint(
  tmp_path, monkeypatch, nan_after, epoch, where
):
  """NaN weights from step `nan_after` + 1 on, found at the next logging step: the run stops
  unsaved and says what a rerun does (before the first checkpoint: start over, the workdir
  left as it was)."""
  make_train_step = step_lib.make_train_step

  def make_train_step_diverging(*args, **kwargs):
    step = make_train_step(*args, **kwargs)

    def diverging_step(state, batch, hyper):
      if int(state.step) == nan_after:  # simulate a divergence
        state = state.replace(params=jax.tree.map(lambda p: p * np.nan, state.params))
      return step(state, batch, hyper)

    return diverging_step

  monkeypatch.setattr(step_lib, 'make_train_step', make_train_step_diverging)
  workdir = tmp_path / 'run'
  with pytest.raises(errors.NonFiniteLossError) as error:
    loop.train_and_evaluate(tiny_config(), str(workdir))
  assert re.search(
    rf'Non-finite training loss or gradient .* in epoch {epoch}, by step {nan_after + 1}\. The '
    rf'state was not saved; {re.escape(where)}\. Try ',
    str(error.value),
  ), str(error.value)
  if nan_after < 3:
    assert not workdir.exists()
  else:
    assert _checkpoint_steps(workdir) == [3]
    assert [r['epoch'] for r in metrics.read_metrics(str(workdir))] == [1]


# ----------------------------------------------------------------------------------------
# TFDS datasets through tfds.testing.mock_data (random images; no download, no TensorFlow).


def _write_tfds_metadata(data_dir, name):
  """dataset_info.json of `name` (no records): what mock_data's USE_FILES policy reads."""
  import tensorflow_datasets as tfds
  from tensorflow_datasets.core import splits as splits_lib

  builder = tfds.builder(name, data_dir=str(data_dir), file_format='array_record')
  builder.data_path.mkdir(parents=True, exist_ok=True)
  builder.info.set_splits(
    splits_lib.SplitDict(
      [
        splits_lib.SplitInfo(name=split, shard_lengths=[24], num_bytes=0)
        for split in ('train', 'test')
      ]
    )
  )
  builder.info.write_to_directory(builder.data_path)


@pytest.mark.parametrize('name', ['cifar10', 'stl10'])
def test_mock_tfds_dataset_one_short_epoch(name, tmp_path):
  import tensorflow_datasets as tfds

  from configs import cifar10
  from configs import stl10

  config = {'cifar10': cifar10, 'stl10': stl10}[name].get_config()
  config.model.name = 'small_cnn'  # a tiny backbone: this tests the pipeline, not ResNet-50
  config.model.head_hidden, config.model.head_out = 32, 16
  config.augment.image_size = 32  # stl10: random resized crops of the 96-px images to 32 px
  config.batch_size, config.num_epochs, config.steps_per_epoch_limit = 8, 1, 2
  config.knn.batch_size = 16
  _write_tfds_metadata(tmp_path / 'tfds', name)
  with tfds.testing.mock_data(
    num_examples=24, policy=tfds.testing.MockPolicy.USE_FILES, data_dir=str(tmp_path / 'tfds')
  ):
    result = loop.train_and_evaluate(config, str(tmp_path / 'run'))
  assert int(result.state.step) == 2
  assert _checkpoint_steps(tmp_path / 'run') == [2]
  (record,) = metrics.read_metrics(str(tmp_path / 'run'))
  assert set(EPOCH_KEYS) <= set(record)
  assert 0.0 <= record['knn_top1'] <= 1.0 and np.isfinite(record['train_loss'])


# ----------------------------------------------------------------------------------------
# Options: optimizers, methods, bf16; the command line.


@pytest.mark.parametrize(
  'method, hardening, diagnostics, logged',
  [
    ('ucl', 'exp', False, ()),
    ('scl', 'threshold', False, ()),
    ('hucl', 'threshold', False, ('beta',)),
    ('hscl', 'exp', False, ('beta',)),
    ('hscl', 'threshold', False, ('tau',)),
    ('ucl', 'threshold', True, ('tau',)),
    ('hucl', 'threshold', True, ('beta', 'tau')),
  ],
)
def test_only_the_hyperparameters_in_use_are_logged(method, hardening, diagnostics, logged):
  config = tiny_config()
  config.method, config.hardening, config.diagnostics = method, hardening, diagnostics
  assert plan_lib.used_hyperparameters(config) == logged


@pytest.mark.parametrize('name', choices.OPTIMIZERS)
@pytest.mark.parametrize('exclude_rank1', [False, True])
def test_optimizers_take_a_step(name, exclude_rank1):
  config = digits.get_config()
  config.optimizer.name = name
  config.optimizer.exclude_rank1_from_decay = exclude_rank1
  optimizer = optimizers.create_optimizer(config.optimizer, 0.1)
  params = {'kernel': np.ones((3, 2), np.float32), 'bias': np.ones((2,), np.float32)}
  grads = jax.tree.map(np.ones_like, params)
  updates, _ = optimizer.update(grads, optimizer.init(params), params)
  for update in jax.tree.leaves(updates):
    assert np.all(np.asarray(update) < 0)


@pytest.mark.slow  # one compilation per variant (~20 s each on 2 cores)
@pytest.mark.parametrize(
  'overrides',
  [
    {'method': 'ucl'},
    {'method': 'hucl', 'tau_plus': 0.1, 'beta_anneal_steps': 1},
    {'method': 'scl', 'positive_mode': 'label'},
    {'method': 'hscl', 'hardening': 'threshold', 'stop_gradient_weights': True},
    {'model.dtype': 'bfloat16', 'optimizer.name': 'lars', 'optimizer.schedule': 'cosine'},
  ],
)
def test_method_and_option_variants_train(overrides, tmp_path):
  config = tiny_config()
  config.num_epochs, config.knn.every_epochs = 1, 0
  for path, value in overrides.items():
    node, *rest = path.split('.')
    if rest:
      config[node][rest[0]] = value
    else:
      config[node] = value
  result = loop.train_and_evaluate(config, str(tmp_path))
  (record,) = metrics.read_metrics(str(tmp_path))
  assert int(result.state.step) == 3 and np.isfinite(record['train_loss'])


def _main(workdir, *flags, timeout=300):
  import subprocess

  return subprocess.Popen(
    [
      sys.executable,
      '-m',
      'hscl_jax.main',
      f'--config={REPO}/configs/digits.py',
      f'--workdir={workdir}',
      *flags,
    ],
    cwd=REPO,
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
    text=True,
    env={**os.environ, 'JAX_PLATFORMS': 'cpu', 'JAX_TRANSFER_GUARD': 'disallow'},
  )


def test_main_rejects_an_invalid_config_before_compiling(tmp_path):
  process = _main(tmp_path / 'run', '--config.temperature=-0.5')
  output, _ = process.communicate(timeout=120)
  assert process.returncode == 1, output
  assert 'config.temperature: must be positive' in output
  assert not (tmp_path / 'run').exists()


MAIN_FLAGS = (
  '--config.num_epochs=3',
  '--config.steps_per_epoch_limit=2',
  '--config.batch_size=32',
  '--config.checkpoint_every_epochs=1',
)


@pytest.mark.slow  # a separate JAX process that compiles the step (~40 s)
@pytest.mark.parametrize('signum', [signal.SIGTERM, signal.SIGINT], ids=['sigterm', 'sigint'])
def test_main_saves_on_a_signal_and_resumes(tmp_path, signum):
  """After the first checkpoint: one line, exit status 128 + the signal (143, or 130 for
  Ctrl-C), and the same command finishes the run."""
  workdir = tmp_path / 'run'
  process = _main(workdir, *MAIN_FLAGS)
  try:
    while not (workdir / 'checkpoints' / '2').exists():  # the first checkpoint
      assert process.poll() is None, process.communicate()[0]
      time.sleep(0.2)
    process.send_signal(signum)
    output, _ = process.communicate(timeout=120)
  finally:
    process.kill()
  assert process.returncode == 128 + signum, output
  assert f'{SIGNAL_NAMES[signum]}: saved the checkpoint at step ' in output
  assert 'Traceback' not in output, output[-3000:]
  resumed = _main(workdir, *MAIN_FLAGS)
  output, _ = resumed.communicate(timeout=300)
  assert resumed.returncode == 0, output
  assert [r['epoch'] for r in metrics.read_metrics(str(workdir))] == [1, 2, 3]


def test_main_ctrl_c_as_the_first_step_compiles_is_one_line(tmp_path):
  """A separate JAX process (~10 s), Ctrl-C'd as it starts compiling the first step (or
  loading it from the session's cache): one line, not a traceback, exit status 130 (not
  a crash of the interpreter's shutdown beside XLA's compiling threads), no workdir left."""
  workdir = tmp_path / 'run'
  process = _main(workdir, *MAIN_FLAGS)
  try:
    for line in process.stdout:
      if 'steps/epoch' in line:  # the start line: the first step is being compiled
        process.send_signal(signal.SIGINT)
        break
    output, _ = process.communicate(timeout=120)
  finally:
    process.kill()
  assert process.returncode == 130, output
  assert 'Traceback' not in output, output[-3000:]
  (error,) = [line for line in output.splitlines() if line.startswith('E')]
  assert error.endswith(
    f'] Ctrl-C (SIGINT) before the first step was taken: stopped at once without saving; '
    f'{STARTS_OVER}.'
  )
  assert not workdir.exists()


# ----------------------------------------------------------------------------------------
# Gradient caching (config.chunk_size).


SPMD_CUSTOM_CALLS = {'Sharding', 'SPMDFullToShardShape', 'SPMDShardToFullShape'}


@functools.cache
def _group_norm_steps(num_devices):
  """_three_steps of the GroupNorm model on random_batch() without chunks: the unrolled
  and the scanned chunk loops are compared with one run (host copies, read only)."""
  return _three_steps(sgd_config(norm='group'), num_devices, random_batch())


@pytest.mark.parametrize(
  'num_devices,unroll',
  # 1 device: the 4-device cases' chunk loop with 4 times the rows (slow: ~30 s).
  [pytest.param(1, False, marks=pytest.mark.slow), (4, False), (4, True)],
)
def test_chunked_step_equals_unchunked_without_batch_statistics(num_devices, unroll):
  """GroupNorm mixes no samples: 4 chunks per device give the same parameters, optimizer
  state and metrics as one pass (plain SGD with a large step: a scale error would show),
  whether the loops over chunks are scans or unrolled."""
  config = sgd_config(norm='group')
  batch = random_batch()
  first, plain, plain_losses = _group_norm_steps(num_devices)
  config.chunk_size = 16 // num_devices // 4
  config.chunk_unroll = unroll
  _, chunked, chunked_losses = _three_steps(config, num_devices, batch)
  np.testing.assert_allclose(chunked_losses, plain_losses, rtol=1e-6)
  pinned = step_loss_reference(config, first, batch, num_devices)  # both runs share the code
  np.testing.assert_allclose(plain_losses[0], pinned, rtol=2e-5)
  assert plain_losses[0] != plain_losses[2]
  for tree in ('params', 'opt_state', 'metric_sums'):
    for x, y in zip(leaves(getattr(chunked, tree)), leaves(getattr(plain, tree)), strict=True):
      np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)
  assert not jax.tree.leaves(chunked.batch_stats)


def test_a_sigmoid_step_trains_log_t_and_b_by_the_global_gradient():
  """Sig-H-SCL(β)'s step: its loss is losses.sigmoid_contrastive of the step's projections
  at the state's t = e^{log_t} and b, and its SGD step moves log t and b by that loss's
  gradient; 4 devices give 1 device's losses, parameters and t and b, and so do chunks
  (GroupNorm: chunks normalise as the whole batch)."""
  config = sgd_config(norm='group')
  config.method, config.optimizer.weight_decay = 'sigmoid_hscl', 0.0
  # A smaller step than the softmax tests': b's gradient is about -|P(i)| per anchor, and
  # SGD at 0.5 sends the logits (and the loss) to 1e14 by the second step.
  config.optimizer.learning_rate = 0.02
  batch = random_batch()
  states, one_losses, _ = run_steps(config, 1, [batch] * 3)
  _, four, four_losses = _three_steps(config, 4, batch)
  config.chunk_size = 2
  _, chunked, chunked_losses = _three_steps(config, 4, batch)
  first, one = states[0], states[-1]

  variables = {'params': first.params, 'batch_stats': first.batch_stats}
  z = jnp.asarray(step_projections(config, variables, first, batch, 1), jnp.float32)
  hardening = losses.exponential(config.beta)

  def reference(learned):
    t = jnp.exp(learned['log_t'])
    return losses.sigmoid_contrastive(z, batch['label'], t=t, b=learned['b'], hardening=hardening)

  value, grads = jax.value_and_grad(reference)(first.loss_state['params'])
  np.testing.assert_allclose(one_losses[0], value, rtol=2e-5)
  lr = config.optimizer.learning_rate  # cosine's first step: the peak
  for name, grad in grads.items():
    assert abs(grad) > 1e-3, name  # the loss reaches it
    moved = states[1].loss_state['params'][name] - first.loss_state['params'][name]
    np.testing.assert_allclose(moved, -lr * grad, rtol=1e-4)
  assert one_losses[0] != one_losses[2]
  for other, other_losses in ((four, four_losses), (chunked, chunked_losses)):
    np.testing.assert_allclose(other_losses, one_losses, rtol=1e-5)
    for tree in ('params', 'loss_state'):
      for x, y in zip(leaves(getattr(other, tree)), leaves(getattr(one, tree)), strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-5)


def _reference_step_normalising_each_chunk(config, mesh, chunk_size):
  """The unchunked step's gradient (autodiff through every chunk at once), with the model
  applied to each chunk separately: BatchNorm statistics per chunk (over all devices),
  running statistics updated chunk after chunk."""
  model = models.create_model(config.model, bn_axis_name=parallel.AXIS)
  augment_params = augment.AugmentParams.from_config(config.augment)
  loss_fn, _ = step_lib.make_loss_fn(config)

  def per_device(state, batch, hyper):
    images, labels = batch['image'], batch['label']
    local = labels.shape[0]
    index = jax.lax.axis_index(parallel.AXIS) * local + np.arange(local)

    def loss_of(params):
      outputs, stats = [], state.batch_stats
      for start in range(0, local, chunk_size):
        part = slice(start, start + chunk_size)
        views = step_lib.augment_batch(
          state.rng, state.step, images[part], index[part], augment_params
        )
        (_, projections), updates = model.apply(
          {'params': params, 'batch_stats': stats},
          views.reshape((-1, 8, 8, 3)),
          train=True,
          mutable=['batch_stats'],
        )
        stats = updates['batch_stats']
        outputs.append(projections.reshape(chunk_size, 2, -1))
      z = losses.l2_normalize(jnp.concatenate(outputs))
      return loss_fn(z, labels, hyper), stats

    (loss, stats), grads = jax.value_and_grad(loss_of, has_aux=True)(state.params)
    lr = config.optimizer.learning_rate
    return jax.tree.map(lambda p, g: p - lr * g, state.params, grads), stats, loss

  return jax.jit(
    jax.shard_map(per_device, mesh=mesh, in_specs=(P(), P(parallel.AXIS), P()), out_specs=P())
  )


def test_chunked_step_with_batchnorm_normalises_each_chunk(num_devices=4):
  config = sgd_config()  # synced BatchNorm: each chunk's statistics over the 4 devices
  config.optimizer.weight_decay = 0.0
  config.chunk_size = 16 // num_devices // 2
  mesh = parallel.make_mesh(jax.devices()[:num_devices])
  model = models.create_model(config.model, bn_axis_name=parallel.AXIS)
  optimizer = optimizers.create_optimizer(
    config.optimizer,
    optimizers.create_learning_rate_schedule(config.optimizer, steps_per_epoch=1, total_steps=1),
  )
  augment_params = augment.AugmentParams.from_config(config.augment)
  state = state_lib.create_train_state(config, model, optimizer, augment_params.image_size, mesh)
  batch = parallel.global_batch(random_batch(1), mesh, ('image', 'label'))
  hyper = plan_lib.loss_hyperparameters(config, 1)
  params, stats, loss = jax.device_get(
    _reference_step_normalising_each_chunk(config, mesh, config.chunk_size)(state, batch, hyper)
  )
  step = step_lib.make_train_step(config, model, optimizer, augment_params, mesh)
  new_state, new_loss = jax.device_get(step(state, batch, hyper))
  np.testing.assert_allclose(new_loss['train_loss'], loss, rtol=1e-6)
  for x, y in zip(leaves(new_state.params), leaves(params), strict=True):
    np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)
  for x, y in zip(leaves(new_state.batch_stats), leaves(stats), strict=True):
    np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)


def test_chunked_run_resumes_exactly(tmp_path, monkeypatch):
  """SIGTERM after step 2 of 3, then the same command: the chunked run of 3 steps."""
  config = tiny_config()
  config.num_epochs, config.knn.every_epochs, config.chunk_size = 1, 0, 4
  with monkeypatch.context() as patch:
    first_step = record_first_step(patch)
    reference = loop.train_and_evaluate(config, str(tmp_path / 'uninterrupted'))
  assert_first_step_pinned(config, first_step)  # the reference is pinned too
  make_train_step = step_lib.make_train_step

  def make_train_step_sending_sigterm(*args, **kwargs):
    step = make_train_step(*args, **kwargs)

    def step_then_sigterm(state, batch, hyper):
      new_state, loss = step(state, batch, hyper)
      if int(new_state.step) == 2:
        os.kill(os.getpid(), signal.SIGTERM)
      return new_state, loss

    return step_then_sigterm

  with monkeypatch.context() as patch:
    patch.setattr(step_lib, 'make_train_step', make_train_step_sending_sigterm)
    stopped = loop.train_and_evaluate(config, str(tmp_path / 'run'))
  assert stopped.preempted and int(stopped.state.step) == 2
  resumed = loop.train_and_evaluate(config, str(tmp_path / 'run'))
  assert int(resumed.state.step) == 3
  for tree in ('params', 'batch_stats', 'opt_state'):
    assert_trees_equal(getattr(resumed.state, tree), getattr(reference.state, tree))


@pytest.mark.parametrize('chunk_size', [0, 2])
def test_train_step_exports_for_gpu_and_tpu(chunk_size):
  """jax.export lowers the real step (4-device mesh) for CUDA and TPU from this CPU host:
  nothing CPU-only (host callbacks, CPU custom calls) hides in it."""
  config = tiny_config()
  config.chunk_size = chunk_size
  mesh = parallel.make_mesh()
  model = models.create_model(config.model, bn_axis_name=parallel.AXIS)
  optimizer = optimizers.create_optimizer(
    config.optimizer,
    optimizers.create_learning_rate_schedule(config.optimizer, steps_per_epoch=1, total_steps=1),
  )
  augment_params = augment.AugmentParams.from_config(config.augment)
  state = jax.eval_shape(
    lambda: state_lib.create_train_state(config, model, optimizer, augment_params.image_size, mesh)
  )
  batch = {
    'image': jax.ShapeDtypeStruct((32, 2, 8, 8, 3), np.uint8),
    'label': jax.ShapeDtypeStruct((32,), np.int32),
  }
  hyper = jax.tree.map(
    lambda x: jax.ShapeDtypeStruct(np.shape(x), np.asarray(x).dtype),
    plan_lib.loss_hyperparameters(config, 1),
  )
  step = step_lib.make_train_step(config, model, optimizer, augment_params, mesh)
  exported = jax.export.export(step, platforms=('cuda', 'tpu'))(state, batch, hyper)
  assert exported.platforms == ('cuda', 'tpu') and exported.nr_devices == 4
  module = exported.mlir_module()
  assert 'callback' not in module
  # Only the SPMD partitioner's markers (jax.export also rejects unstable custom calls).
  assert set(re.findall(r'custom_call @(\w+)', module)) <= SPMD_CUSTOM_CALLS
