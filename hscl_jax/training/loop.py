"""Data-parallel contrastive training (UCL/SimCLR, H-UCL, SCL, H-SCL) with a kNN monitor.

`train_and_evaluate` builds a run from its config (the plan, state and step of
training/plan, training/state and training/step), trains its epochs and, at a SIGTERM
(training/preemption), saves a checkpoint and stops.

Each epoch: the paper's diagnostics (Assumption 1 fraction; the four losses) averaged
over the training batches, a weighted kNN monitor (train split as memory bank, test split
as queries, normalised backbone features, BatchNorm in eval mode), throughput, epoch time
and learning rate, written to DIR/metrics.jsonl and TensorBoard; then an Orbax checkpoint.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

from absl import logging
import jax
import ml_collections
import numpy as np

from hscl_jax import data
from hscl_jax import errors
from hscl_jax import models
from hscl_jax import parallel
from hscl_jax.config import schema
from hscl_jax.data import augment
from hscl_jax.evaluation import features as eval_features
from hscl_jax.rundir import checkpoints
from hscl_jax.rundir import lock as workdir_lock
from hscl_jax.rundir import metrics
from hscl_jax.rundir import stored_config
from hscl_jax.training import optimizers
from hscl_jax.training import plan as plan_lib
from hscl_jax.training import preemption as preemption_lib
from hscl_jax.training import state as state_lib
from hscl_jax.training import step as step_lib
from hscl_jax.training import summaries

NonFiniteLossError = errors.NonFiniteLossError


@dataclasses.dataclass
class TrainResult:
  state: state_lib.TrainState
  preempted: bool  # stopped by SIGTERM after saving a checkpoint
  last_record: dict[str, Any] | None  # the last epoch's metrics record (None: none trained)
  records: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # all epochs' so far
  already_complete: bool = False  # the workdir's run had trained every epoch: nothing ran


def train_and_evaluate(
  config: ml_collections.ConfigDict,
  workdir: str,
  *,
  mesh: jax.sharding.Mesh | None = None,
  allowed_config_changes: tuple[str, ...] = (),
) -> TrainResult:
  """Trains per `config`, resuming from the latest checkpoint in `workdir` if there is one.

  The workdir is locked for the run (a second run on it stops, naming the holder); resuming
  with a config that differs from DIR/config.json is refused unless the differing fields
  are in `allowed_config_changes` (see hscl_jax.rundir.stored_config).
  """
  start = time.perf_counter()
  mesh = parallel.make_mesh() if mesh is None else mesh
  schema.validate_config(config, num_devices=mesh.size, num_processes=jax.process_count())
  lock = workdir_lock.acquire_for_run(workdir)
  stopped = True
  try:
    if checkpoints.finished_steps(workdir):
      stored_config.check_unchanged(workdir, config, allowed=allowed_config_changes)
    run = _build_run(config, workdir, mesh)
    try:
      with preemption_lib.PreemptionWatcher() as run.preemption:
        result = run.train()
    finally:
      run.close()
    stopped = False
  finally:
    if lock is not None:
      # A run stopped (refused data, a crash, Ctrl-C) before its first checkpoint leaves
      # the workdir as it found it; a preempted one has saved a checkpoint.
      lock.release(undo=stopped and not checkpoints.finished_steps(workdir))
  if not result.preempted and jax.process_index() == 0:
    logging.info('%s', closing_summary(config, workdir, result, time.perf_counter() - start))
  return result


def closing_summary(
  config: ml_collections.ConfigDict, workdir: str, result: TrainResult, seconds: float
) -> str:
  """What the run did and the commands that use it, the workdir filled in."""
  workdir = os.path.abspath(workdir)
  if result.already_complete:
    head = 'Nothing trained (already complete)'
  else:
    head = (
      f'Finished {config.num_epochs} epochs in {metrics.format_duration(seconds)}, '
      f'{summaries.final_knn(result.records)}'
    )
  commands = [
    f'python -m hscl_jax.linear_eval --workdir={workdir}',
    f'python -m hscl_jax.embed --workdir={workdir} --split=test --out={workdir}/embeddings.npz',
    f'python -m hscl_jax.inspect --workdir={workdir} --out={workdir}/inspect',
  ]
  if config.model.name.startswith('resnet'):  # export refuses other backbones (and says why)
    commands.append(
      f'python -m hscl_jax.export --workdir={workdir} --format=torch '
      f'--out={workdir}/backbone.safetensors'
    )
  return f'{head}; workdir {workdir}. Next:\n' + '\n'.join(f'  {c}' for c in commands)


def _build_run(config: ml_collections.ConfigDict, workdir: str, mesh: jax.sharding.Mesh):
  """The run's data, model, step, state (restored if a checkpoint exists) and writers."""
  is_writer = jax.process_index() == 0
  train_source, test_source = data.run_sources(config)
  schema.validate_dataset(config, num_classes=train_source.num_classes)
  train_iter = plan_lib.make_train_loader(config, train_source)
  plan = plan_lib.make_plan(config, train_iter.order)
  augment_params = augment.AugmentParams.from_config(config.augment)
  model = models.create_model(config.model, bn_axis_name=parallel.AXIS)
  optimizer = optimizers.create_optimizer(config.optimizer, plan.learning_rate)
  state = state_lib.create_train_state(config, model, optimizer, augment_params.image_size, mesh)
  checkpointer = checkpoints.Checkpointer(workdir, keep=config.keep_checkpoints)
  state, start_step, position, records = _restore(checkpointer, state, train_iter)
  metrics.write_config(workdir, config, enabled=is_writer)
  summaries.log_queue_memory(config, state)
  logging.info(
    '%s on %s: %d devices, global batch %d, %d steps/epoch, %d epochs.',
    config.method,
    config.dataset,
    mesh.size,
    config.batch_size,
    plan.steps_per_epoch,
    plan.num_epochs,
  )
  if config.samples_per_class:
    info, warning = summaries.class_aware_epoch_lines(config, train_iter.order)
    logging.info('%s', info)
    if warning:
      logging.warning('%s', warning)
  return _Run(
    config=config,
    plan=plan,
    mesh=mesh,
    train_step=step_lib.make_train_step(config, model, optimizer, augment_params, mesh),
    feature_fn=eval_features.make_feature_fn(model, augment_params, mesh),
    train_iter=train_iter,
    train_source=train_source,
    test_source=test_source,
    checkpointer=checkpointer,
    # An epoch end the resumed run redoes gets its record (again).
    writer=metrics.MetricWriter(
      workdir,
      enabled=is_writer,
      keep_through_step=start_step - 1 if position.steps_done else start_step,
      records=records,
    ),
    progress=metrics.Progress(
      total_steps=plan.total_steps,
      start_step=start_step,
      steps_per_epoch=plan.steps_per_epoch,
      images_per_step=2 * config.batch_size,
      enabled=is_writer,
    ),
    state=state,
    position=position,
  )


def _restore(checkpointer, state: state_lib.TrainState, train_iter):
  """(state, step, position, records) of the newest usable checkpoint, or initial ones."""
  restored = checkpointer.restore_latest(state_lib.state_to_checkpoint(state))
  if restored is None:
    return state, 0, state_lib.EpochPosition(), None
  step, tree, iterator_state = restored
  train_iter.set_state(iterator_state)
  position, records = state_lib.EpochPosition.from_metadata(checkpointer.metadata(step))
  return state_lib.state_from_checkpoint(tree), step, position, records


@dataclasses.dataclass
class _Run:
  """The pieces of one training run, its state and the epoch loop over them."""

  config: ml_collections.ConfigDict
  plan: plan_lib.Plan
  mesh: jax.sharding.Mesh
  train_step: Any
  feature_fn: Any
  train_iter: Any
  train_source: Any
  test_source: Any
  checkpointer: checkpoints.Checkpointer
  writer: metrics.MetricWriter
  progress: metrics.Progress
  state: state_lib.TrainState
  position: state_lib.EpochPosition  # of the epoch in progress
  preemption: preemption_lib.PreemptionWatcher | None = None
  last_record: dict[str, Any] | None = None
  compiled: bool = False  # whether the train step has run (and compiled) in this process

  @property
  def step(self) -> int:
    return int(parallel.replicated_value(self.state.step))

  def train(self) -> TrainResult:
    """For each epoch: train it, finish it. A SIGTERM, in whatever phase it lands, saves
    the state and where the epoch stood, then stops."""
    if self.step >= self.plan.total_steps and not self.position.steps_done:
      logging.info('%s', self.already_complete_line())
      return self.result(already_complete=True)
    if self.step:
      logging.info('Resumed from the checkpoint at step %d.', self.step)
    try:
      while self.step < self.plan.total_steps or self.position.steps_done:
        epoch = self.plan.epoch_of_step(self.step - 1 if self.position.steps_done else self.step)
        hyper = plan_lib.loss_hyperparameters(self.config, epoch)
        if not self.position.steps_done:
          self.train_epoch(epoch, hyper)
        self.finish_epoch(epoch, hyper)
        if self.step < self.plan.total_steps:
          self.preemption.check()
    except preemption_lib.Preempted:
      self.stop_for_preemption()
      return self.result(preempted=True)
    return self.result()

  def result(self, *, preempted: bool = False, already_complete: bool = False) -> TrainResult:
    return TrainResult(
      state=self.state,
      preempted=preempted,
      last_record=self.last_record,
      records=list(self.writer.records),
      already_complete=already_complete,
    )

  def already_complete_line(self) -> str:
    epochs, knn = self.plan.num_epochs, summaries.final_knn(self.writer.records)
    return (
      f'Already complete: {epochs} of {epochs} epochs ({knn}). '
      f'To train longer, rerun with --config.num_epochs={2 * epochs} (or any larger number) '
      '--allow_config_change=num_epochs.'
    )

  def train_epoch(self, epoch: int, hyper) -> None:
    """Steps to the end of `epoch`; a SIGTERM raises Preempted between two steps."""
    end_step = epoch * self.plan.steps_per_epoch
    step = self.step
    hyper = parallel.replicated(hyper, self.mesh)
    start, start_time = step, time.perf_counter()
    self.progress.resume_timer()
    try:
      while step < end_step:
        step_start = time.perf_counter()
        batch = parallel.global_batch(next(self.train_iter), self.mesh, ('image', 'label'))
        self.state, loss = self.train_step(self.state, batch, hyper)
        step += 1
        self.position.steps_done = step == end_step
        log_step = step % self.config.log_every_steps == 0 or step == end_step
        if not self.compiled:
          self.after_first_step(step, loss, step_start)
        self.after_step(step, epoch, loss, log_step)
        self.preemption.check(sync_point=log_step)
    finally:
      self.progress.pause_timer()
      self.position.seconds += time.perf_counter() - start_time
      self.position.steps_timed += step - start

  def after_first_step(self, step: int, loss, step_start: float) -> None:
    """The first step of this process compiles: timed apart, left out of the rates."""
    jax.block_until_ready(loss)
    self.compiled = True
    self.position.compile_seconds += time.perf_counter() - step_start
    self.position.compile_steps += 1
    self.progress.restart(step)

  def after_step(self, step: int, epoch: int, loss, log_step: bool) -> None:
    if log_step:
      loss_value = float(parallel.replicated_value(loss))  # waits for the step: real timings
      self.check_finite(epoch)
      self.progress.log(step, loss_value)

  def finish_epoch(self, epoch: int, hyper) -> None:
    """The epoch's record (means, timings, kNN), written; the metric sums reset; a
    checkpoint when one is due. A SIGTERM during the kNN raises before anything is written."""
    record = self.epoch_record(epoch, hyper)
    if metrics.is_due(epoch, self.config.knn.every_epochs, self.plan.num_epochs):
      record.update(self.knn())
    # Fresh zeros each epoch: the step donates (deletes) the state's buffers.
    zeros = jax.tree.map(lambda x: np.zeros(x.shape, x.dtype), self.state.metric_sums)
    self.state = self.state.replace(metric_sums=parallel.replicated(zeros, self.mesh))
    self.writer.write(epoch * self.plan.steps_per_epoch, record)
    logging.info(
      '%s', summaries.epoch_summary(record, compile_seconds=self.position.compile_seconds)
    )
    self.last_record, self.position = record, state_lib.EpochPosition()
    if metrics.is_due(epoch, self.config.checkpoint_every_epochs, self.plan.num_epochs):
      self.save()

  def epoch_record(self, epoch: int, hyper) -> dict[str, Any]:
    """Means of the per-step metrics over the epoch, learning rate, throughput, hyper."""
    step = epoch * self.plan.steps_per_epoch
    record = {
      name: float(parallel.replicated_value(value)) / self.plan.steps_per_epoch
      for name, value in self.state.metric_sums.items()
    }
    samples, seconds = self.position.steps_timed_without_compilation()
    samples *= self.config.batch_size
    seconds = max(seconds, 1e-9)
    record.update(
      epoch=epoch,
      step=step,
      learning_rate=self.plan.learning_rate_at(step - 1),
      epoch_time=self.position.seconds,
      images_per_second=2 * samples / seconds,
      samples_per_second=samples / seconds,
      **{name: float(hyper[name]) for name in plan_lib.used_hyperparameters(self.config)},
    )
    return record

  def knn(self) -> dict[str, float]:
    start = time.perf_counter()
    variables = {'params': self.state.params, 'batch_stats': self.state.batch_stats}
    top1 = eval_features.knn_accuracy(
      self.config.knn,
      self.feature_fn,
      variables,
      self.train_source,
      self.test_source,
      num_classes=self.train_source.num_classes,
      mesh=self.mesh,
      check=self.preemption.check,
    )
    seconds = time.perf_counter() - start
    self.progress.eval_seconds_per_epoch = seconds / self.config.knn.every_epochs
    return {'knn_top1': top1, 'knn_time': seconds}

  def save(self) -> None:
    """A checkpoint of the state, the input position and where the epoch stands."""
    self.checkpointer.save(
      self.step,
      state_lib.state_to_checkpoint(self.state),
      self.train_iter.get_state(),
      self.position.to_metadata(self.writer.records),
    )

  def check_finite(self, epoch: int) -> None:
    """Raises if a step of the epoch so far had a non-finite loss or gradient."""
    sums = {
      name: float(parallel.replicated_value(self.state.metric_sums[name]))
      for name in ('train_loss', 'grad_norm')
    }
    if all(np.isfinite(v) for v in sums.values()):
      return
    self.checkpointer.wait_until_finished()
    last = self.checkpointer.latest_step()
    where = (
      f'the last good checkpoint is step {last}; rerunning the same command resumes from it'
      if last is not None
      else 'no checkpoint was written yet'
    )
    raise NonFiniteLossError(
      f'Non-finite training loss or gradient (epoch sums: {sums}) in epoch {epoch}, by step '
      f'{self.step}. The state was not saved; {where}. Try a lower optimizer.learning_rate, a '
      'larger temperature, or model.dtype=float32.'
    )

  def stop_for_preemption(self) -> None:
    step = self.step
    self.check_finite(self.plan.epoch_of_step(max(step - 1, 0)))
    self.save()  # a no-op if this step is already saved
    self.checkpointer.wait_until_finished()
    logging.warning(
      'SIGTERM: saved the checkpoint at step %d; rerun the same command to resume.', step
    )

  def close(self) -> None:
    self.checkpointer.close()
    self.writer.close()
