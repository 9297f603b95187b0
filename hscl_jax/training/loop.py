"""Data-parallel contrastive training (UCL/SimCLR, H-UCL, SCL, H-SCL) with a kNN monitor.

`train_and_evaluate` locks the workdir and runs `_run`, the run's life in one place: the
run built from its config (the plan, state and step of training/plan, training/state and
training/step), restored from its workdir (rundir/run_log), then one loop over its steps
with each epoch's end in it; at a SIGTERM or Ctrl-C (training/preemption) it saves a
checkpoint and stops, or stops at once where it has nothing to save yet (before its first
step is taken) and at a second Ctrl-C.

Each epoch: the paper's diagnostics (Assumption 1 fraction; the four losses) averaged
over the training batches, a weighted kNN monitor (train split as memory bank, test split
as queries, normalised backbone features, BatchNorm in eval mode), throughput, epoch time
and learning rate (timed by rundir/timing), written to DIR/metrics.jsonl and TensorBoard;
then an Orbax checkpoint. Every log_every_steps: the progress line and the step's own
scalars (loss, gradient norm, learning rate, beta/tau) in DIR/steps.jsonl and TensorBoard.
"""

from __future__ import annotations

from collections.abc import Callable
import dataclasses
import functools
import os
import time
from typing import Any

from absl import logging
import jax
import ml_collections
import numpy as np

from hscl_jax import data
from hscl_jax import errors
from hscl_jax import optimizers
from hscl_jax import parallel
from hscl_jax import progress
from hscl_jax.config import choices
from hscl_jax.evaluation import features as eval_features
from hscl_jax.rundir import checkpoints
from hscl_jax.rundir import lock as workdir_lock
from hscl_jax.rundir import metrics
from hscl_jax.rundir import run_log as run_log_lib
from hscl_jax.rundir import stored_config
from hscl_jax.rundir import timing
from hscl_jax.training import log_lines
from hscl_jax.training import online_probe
from hscl_jax.training import plan as plan_lib
from hscl_jax.training import preemption as preemption_lib
from hscl_jax.training import profiling
from hscl_jax.training import state as state_lib
from hscl_jax.training import step as step_lib

# The kNN monitor's figure: what config.keep_best's default keeps the best checkpoint by.
MONITOR_FIGURE = 'knn_top1'


@dataclasses.dataclass
class TrainResult:
  state: state_lib.TrainState
  stop_signal: int | None  # the SIGTERM or SIGINT it stopped at after saving (None: it did not)
  last_record: dict[str, Any] | None  # the last epoch's metrics record (None: none trained)
  records: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # all epochs' so far
  already_complete: bool = False  # the workdir's run had trained every epoch: nothing ran

  @property
  def preempted(self) -> bool:
    return self.stop_signal is not None


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
  are in `allowed_config_changes` (see hscl_jax.rundir.stored_config). A signal that stops
  it at once (before its first step, or a second Ctrl-C) raises `errors.Interrupted`, whose
  line says what rerunning the command does.
  """
  start = time.perf_counter()
  mesh = parallel.make_mesh() if mesh is None else mesh
  built = plan_lib.validate_run(config, num_devices=mesh.size, num_processes=jax.process_count())
  with preemption_lib.PreemptionWatcher() as preemption:
    try:
      result = _locked_run(config, workdir, mesh, built, allowed_config_changes, preemption)
    except preemption_lib.StoppedAtOnce as stop:
      raise errors.Interrupted(_stopped_at_once_line(stop, workdir), stop.signum) from None
  if not result.preempted:
    # On every process: reading the best checkpoint back (Orbax's manager) is collective.
    summary = closing_summary(config, workdir, result, time.perf_counter() - start)
    if jax.process_index() == 0:
      logging.info('%s', summary)
  return result


def _locked_run(
  config, workdir: str, mesh, built: plan_lib.Built, allowed_config_changes, preemption
) -> TrainResult:
  """`_run` with the workdir locked; a run stopped before its first checkpoint (refused
  data, a crash, a signal that stops it at once, a full disk) leaves the workdir as it
  found it."""
  lock = workdir_lock.acquire_for_run(workdir)
  stopped = True
  try:
    if checkpoints.finished_steps(workdir):
      config = stored_config.as_resumed(workdir, config)
      stored_config.check_unchanged(workdir, config, allowed=allowed_config_changes)
    result = _run(config, workdir, mesh, built, preemption)
    stopped = False
  finally:
    if lock is not None:  # a preempted run has saved a checkpoint
      with preemption.deferring():  # a signal lets the release finish
        lock.release(undo=stopped and not checkpoints.finished_steps(workdir))
  return result


def _run(config, workdir: str, mesh, built: plan_lib.Built, preemption) -> TrainResult:
  """The run's life: built, restored, then its steps with each epoch's end among them. A
  SIGTERM or Ctrl-C, in whatever phase after the first step it lands, saves the state and
  where the epoch stood, then stops; a non-finite loss stops the run without saving."""
  run, state = _build(config, mesh, built)
  plan = run.plan
  run_log = run_log_lib.RunLog(
    workdir, keep=config.keep_checkpoints, keep_best=keep_best(config), enabled=_is_writer()
  )
  trace = profiling.StepTrace(workdir, config.profile_steps)
  try:
    state, start, pending, timer = _restore(run, run_log, state)
    metrics.write_config(workdir, config, enabled=_is_writer())
    _log_start(run, state)
    if start >= plan.total_steps and not pending:
      logging.info('%s', _already_complete_line(plan, run_log.records))
      return _result(state, run_log, None, already_complete=True)
    if start:
      logging.info('Resumed from the checkpoint at %s.', _position(plan, start))
    progress = _progress(run, start, timer)
    step, last_record = start, None
    with preemption.deferring():
      try:
        if pending:  # the epoch's steps were all taken before the signal, not its record
          state, last_record = _end_epoch(run, run_log, timer, preemption, state, step)
          pending = False
          _check_between_epochs(preemption, step, plan)
        for step in range(start + 1, plan.total_steps + 1):  # the step it reaches
          epoch = plan.epoch_of_step(step - 1)
          if step == start + 1 or (step - 1) % plan.steps_per_epoch == 0:  # epoch (re)starts
            host_hyper = plan_lib.loss_hyperparameters(config, epoch)
            hyper = parallel.replicated(host_hyper, run.mesh)
            timer.start(step - 1)
          batch = parallel.global_batch(next(run.train_iter), run.mesh, ('image', 'label'))
          state, scalars = _train_step(run, timer, preemption, state, batch, hyper, step)
          pending = step == epoch * plan.steps_per_epoch  # its last step: its end is due
          log_step = step % config.log_every_steps == 0 or pending
          trace.step_done(scalars)
          if log_step:
            row = _step_row(run, step, epoch, scalars, host_hyper)  # waits: real timings
            run_log.write_step(step, row)
            _check_finite(state, step, epoch, run_log, plan)
            progress.log(step, row['train_loss'])
          preemption.check(sync_point=log_step)
          if pending:
            timer.stop(step)
            state, last_record = _end_epoch(run, run_log, timer, preemption, state, step)
            pending = False
            _check_between_epochs(preemption, step, plan)
      except preemption_lib.Preempted as stop:
        _stop_for_preemption(run, run_log, timer, state, step, pending, stop.signum)
        return _result(state, run_log, last_record, stop_signal=stop.signum)
    return _result(state, run_log, last_record)
  except preemption_lib.StoppedAtOnce as stop:
    stop.describe_step = functools.partial(_position, plan)
    raise
  finally:
    with preemption.deferring():  # a signal lets the last checkpoint's write finish
      trace.close()
      run_log.close()


def keep_best(config: ml_collections.ConfigDict) -> str:
  """config.keep_best, its default resolved: 'auto' keeps the best by the kNN monitor's
  top-1 where the monitor runs (knn.every_epochs > 0) and none without it, where no record
  would have the figure."""
  if config.keep_best != choices.KEEP_BEST_AUTO:
    return config.keep_best
  return MONITOR_FIGURE if config.knn.every_epochs else ''


def closing_summary(
  config: ml_collections.ConfigDict, workdir: str, result: TrainResult, seconds: float
) -> str:
  """What the run did and the commands that use it, the workdir filled in."""
  workdir = os.path.abspath(workdir)
  if result.already_complete:
    head = 'Nothing trained (already complete)'
  else:
    head = (
      f'Finished {config.num_epochs} epochs in {progress.format_duration(seconds)}, '
      f'{log_lines.final_monitor(result.records)}{_best_of_run(config, workdir, result.records)}'
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


def _best_of_run(config: ml_collections.ConfigDict, workdir: str, records) -> str:
  """'; best kNN top-1 0.9861 at epoch 18' by the figure the run keeps its best checkpoint
  by (the kNN top-1 where it keeps none), with the kept checkpoint: that epoch's, or, as
  checkpoints are saved every checkpoint_every_epochs, another's; '' where no record has
  the figure."""
  kept = checkpoints.KeepBest.parse(keep_best(config))
  figure = kept or checkpoints.KeepBest(MONITOR_FIGURE)
  # Before anything that differs between processes (only process 0 keeps the records):
  # reading the checkpoints back is collective.
  stored = checkpoints.best_checkpoint(workdir) if kept else None
  best = log_lines.best_epoch(records, figure.metric, figure.mode)
  if best is None:
    return ''
  text = f'; {log_lines.best_part(best, figure.metric)}'
  if stored is None or stored.metric != figure.metric:
    return text
  if stored.step == best['step']:
    return f'{text} (--checkpoint=best)'
  epoch = next((r['epoch'] for r in records if r['step'] == stored.step), '?')
  return f"{text} (--checkpoint=best: epoch {epoch}'s, {stored.value:.4f})"


@dataclasses.dataclass(frozen=True)
class _Pieces:
  """What a run is built of: fixed for its life (the state is the loop's)."""

  config: ml_collections.ConfigDict
  plan: plan_lib.Plan
  mesh: jax.sharding.Mesh
  train_step: Any
  feature_fn: Any
  train_iter: Any
  train_source: Any
  test_source: Any


def _is_writer() -> bool:
  return jax.process_index() == 0


def _build(config: ml_collections.ConfigDict, mesh: jax.sharding.Mesh, built: plan_lib.Built):
  """(the run's data, plan, step and feature function; its initial state), with the model and
  augmentation its validation built (stored_config.as_resumed fills no section they read)."""
  train_source, test_source = data.run_sources(config)
  plan_lib.validate_dataset(config, num_classes=train_source.num_classes)
  train_iter = plan_lib.make_train_loader(config, train_source)
  plan = plan_lib.make_plan(config, train_iter.order)
  model, augment_params = built.model, built.augment_params
  optimizer = optimizers.create_optimizer(config.optimizer, plan.learning_rate)
  state = state_lib.create_train_state(
    config,
    model,
    optimizer,
    augment_params.image_size,
    mesh,
    probe_classes=train_source.num_classes if online_probe.enabled(config) else None,
  )
  run = _Pieces(
    config=config,
    plan=plan,
    mesh=mesh,
    train_step=step_lib.make_train_step(config, model, optimizer, augment_params, mesh),
    feature_fn=eval_features.make_feature_fn(model, augment_params, mesh),
    train_iter=train_iter,
    train_source=train_source,
    test_source=test_source,
  )
  return run, state


def _restore(run: _Pieces, run_log: run_log_lib.RunLog, state: state_lib.TrainState):
  """(state, step, whether the epoch's end is pending, the timer with the epoch's times) of
  the newest usable checkpoint, or the initial ones."""
  restored = run_log.restore(state_lib.state_to_checkpoint(state), run.train_iter)
  if restored.tree is not None:
    state = state_lib.state_from_checkpoint(restored.tree)
  timer = timing.Timer(restored.step, restored.position.times)
  return state, restored.step, restored.position.steps_done, timer


def _log_start(run: _Pieces, state: state_lib.TrainState) -> None:
  config, plan = run.config, run.plan
  logging.info('%s', log_lines.size_line(state))
  log_lines.log_queue_memory(config, state)
  logging.info(
    '%s on %s: %d devices, global batch %d, %d steps/epoch, %d epochs.',
    config.method,
    config.dataset,
    run.mesh.size,
    config.batch_size,
    plan.steps_per_epoch,
    plan.num_epochs,
  )
  if config.samples_per_class:
    info, warning = log_lines.class_aware_epoch_lines(config, run.train_iter.order)
    logging.info('%s', info)
    if warning:
      logging.warning('%s', warning)
  elif dropped := plan_lib.dropped_examples_warning(config, run.train_iter.order):
    logging.warning('%s', dropped)


def _step_row(run: _Pieces, step: int, epoch: int, scalars, host_hyper) -> dict[str, Any]:
  """A logging step's row of DIR/steps.jsonl: its epoch, loss and gradient norm (the
  step's own), the learning rate it used and the loss hyperparameters the method reads."""
  row = {'epoch': epoch}
  row.update({name: float(parallel.replicated_value(value)) for name, value in scalars.items()})
  row['learning_rate'] = run.plan.learning_rate_at(step - 1)
  row.update({name: float(host_hyper[name]) for name in plan_lib.used_hyperparameters(run.config)})
  return row


def _progress(run: _Pieces, start: int, timer: timing.Timer) -> metrics.Progress:
  return metrics.Progress(
    total_steps=run.plan.total_steps,
    start_step=start,
    steps_per_epoch=run.plan.steps_per_epoch,
    images_per_step=2 * run.config.batch_size,
    enabled=_is_writer(),
    timer=timer,
  )


def _already_complete_line(plan: plan_lib.Plan, records: list[dict[str, Any]]) -> str:
  epochs, figures = plan.num_epochs, log_lines.final_monitor(records)
  return (
    f'Already complete: {epochs} of {epochs} epochs ({figures}). '
    f'To train longer, rerun with --config.num_epochs={2 * epochs} (or any larger number) '
    '--allow_config_change=num_epochs.'
  )


def _result(
  state, run_log: run_log_lib.RunLog, last_record, *, stop_signal=None, already_complete=False
) -> TrainResult:
  return TrainResult(
    state=state,
    stop_signal=stop_signal,
    last_record=last_record,
    records=list(run_log.records),
    already_complete=already_complete,
  )


def _check_between_epochs(preemption, step: int, plan: plan_lib.Plan) -> None:
  """A SIGTERM that came during an epoch's end stops the run before the next epoch (after
  the last one the run is finished)."""
  if step < plan.total_steps:
    preemption.check()


def _end_epoch(run: _Pieces, run_log, timer: timing.Timer, preemption, state, step: int):
  """(state with fresh metric sums, the epoch's record): the record (means, timings, kNN
  when due) written and logged, then a checkpoint when one is due. A SIGTERM during the
  kNN raises before anything is written."""
  config, plan = run.config, run.plan
  epoch = plan.epoch_of_step(step - 1)
  record = _epoch_record(run, state, timer.epoch, epoch)
  if progress.is_due(epoch, config.knn.every_epochs, plan.num_epochs):
    record.update(_knn(run, state, timer, preemption))
  # Fresh zeros each epoch: the step donates (deletes) the state's buffers.
  zeros = jax.tree.map(lambda x: np.zeros(x.shape, x.dtype), state.metric_sums)
  state = state.replace(metric_sums=parallel.replicated(zeros, run.mesh))
  record = run_log.write_record(step, record)
  logging.info(
    '%s',
    log_lines.epoch_line(
      record, num_epochs=plan.num_epochs, compile_seconds=timer.epoch.compile_seconds
    ),
  )
  timer.next_epoch()
  # An epoch at least as good as every earlier one by keep_best's figure is saved too, so
  # the best epoch is kept whatever checkpoint_every_epochs says.
  if run_log.new_best or progress.is_due(epoch, config.checkpoint_every_epochs, plan.num_epochs):
    _save(run, run_log, state, step, run_log_lib.EpochPosition())
  return state, record


def _epoch_record(run: _Pieces, state, times: timing.EpochTimes, epoch: int) -> dict[str, Any]:
  """Means of the per-step metrics over the epoch, learning rate, throughput, hyper, and a
  sigmoid row's t and b at the epoch's end."""
  config, plan = run.config, run.plan
  step = epoch * plan.steps_per_epoch
  record = {
    name: float(parallel.replicated_value(value)) / plan.steps_per_epoch
    for name, value in state.metric_sums.items()
  }
  samples, seconds = times.without_compilation()
  samples *= config.batch_size
  seconds = max(seconds, 1e-9)
  hyper = plan_lib.loss_hyperparameters(config, epoch)
  record.update(
    epoch=epoch,
    step=step,
    learning_rate=plan.learning_rate_at(step - 1),
    epoch_time=times.seconds,
    images_per_second=2 * samples / seconds,
    samples_per_second=samples / seconds,
    **{name: float(hyper[name]) for name in plan_lib.used_hyperparameters(config)},
  )
  learned = step_lib.learned_values(state.loss_state)  # t and b at the epoch's end
  record.update({name: float(parallel.replicated_value(v)) for name, v in learned.items()})
  return record


def _knn(run: _Pieces, state, timer: timing.Timer, preemption) -> dict[str, float]:
  """The monitor's figures of one extraction of both splits: the kNN top-1, the retrieval
  metrics of config.knn.retrieval (both in knn_time), and the online probe's top-1."""
  config = run.config
  variables = {'params': state.params, 'batch_stats': state.batch_stats}

  def evaluate():
    features = eval_features.monitor_features(
      config.knn,
      run.feature_fn,
      variables,
      run.train_source,
      run.test_source,
      mesh=run.mesh,
      check=preemption.check,
    )
    top1 = eval_features.monitor_knn(config.knn, features, num_classes=run.train_source.num_classes)
    return {MONITOR_FIGURE: top1, **eval_features.monitor_retrieval(config.knn, features)}, features

  (figures, features), seconds = timer.evaluate(evaluate, every_epochs=config.knn.every_epochs)
  figures['knn_time'] = seconds
  if state.probe is not None:
    params = jax.tree.map(parallel.replicated_value, state.probe['params'])
    figures['probe_top1'] = online_probe.top1(params, *features.queries)
  return figures


def _save(run: _Pieces, run_log, state, step: int, position: run_log_lib.EpochPosition) -> None:
  """A checkpoint of the state, the input position and where the epoch stands."""
  run_log.save(step, state_lib.state_to_checkpoint(state), run.train_iter, position)


def _check_finite(
  state, step: int, epoch: int, run_log: run_log_lib.RunLog, plan: plan_lib.Plan
) -> None:
  """Raises if a step of the epoch so far had a non-finite loss or gradient."""
  sums = {
    name: float(parallel.replicated_value(state.metric_sums[name]))
    for name in ('train_loss', 'grad_norm')
  }
  if all(np.isfinite(v) for v in sums.values()):
    return
  where = _rerun_outcome(run_log.last_saved_step(), functools.partial(_position, plan))
  raise errors.NonFiniteLossError(
    f'Non-finite training loss or gradient (epoch sums: {sums}) in epoch {epoch}, by step '
    f'{step}. The state was not saved; {where}. Try a lower optimizer.learning_rate, a '
    'larger temperature, or model.dtype=float32.'
  )


def _stop_for_preemption(
  run: _Pieces, run_log, timer: timing.Timer, state, step: int, pending: bool, signum: int
) -> None:
  """Saves the state at `step` with where its epoch stood, then says so in one line."""
  timer.stop(step)
  _check_finite(state, step, run.plan.epoch_of_step(max(step - 1, 0)), run_log, run.plan)
  _save(
    run, run_log, state, step, run_log_lib.EpochPosition(pending, timer.epoch)
  )  # no-op if saved
  run_log.wait_until_finished()
  logging.warning(
    '%s: saved the checkpoint at %s; rerun the same command to resume.',
    errors.signal_name(signum),
    _position(run.plan, step),
  )


def _train_step(run: _Pieces, timer: timing.Timer, preemption, state, batch, hyper, step: int):
  """One step; this process's first compiles, timed apart. A signal while it compiles
  stops the run at once: there is nothing new to save before it is taken."""
  with preemption.deferring(timer.compiled):
    state, scalars = run.train_step(state, batch, hyper)
    if not timer.compiled:
      jax.block_until_ready(scalars)
      timer.first_step_done(step)
  return state, scalars


def _position(plan: plan_lib.Plan, step: int) -> str:
  """'step 20 (epoch 7 of 12, 2 of its 3 steps taken)'."""
  epoch = plan.epoch_of_step(max(step - 1, 0))
  taken = step - (epoch - 1) * plan.steps_per_epoch
  return (
    f'step {step} (epoch {epoch} of {plan.num_epochs}, {taken} of its {plan.steps_per_epoch} '
    'steps taken)'
  )


def _rerun_outcome(last_saved: int | None, describe_step: Callable[[int], str]) -> str:
  """What rerunning the same command does after a stop that saved nothing more: resume
  from the newest checkpoint, or start over where none had been written."""
  if last_saved is None:
    return (
      'no checkpoint had been written, so the workdir is left as it was and rerunning the '
      'same command starts over'
    )
  return f'rerunning the same command resumes from the checkpoint at {describe_step(last_saved)}'


def _stopped_at_once_line(stop: preemption_lib.StoppedAtOnce, workdir: str) -> str:
  """The one line of a run a signal stopped at once, once the workdir is as it leaves it."""
  when = 'while the run was stopping' if stop.again else 'before the first step was taken'
  steps = checkpoints.finished_steps(workdir)
  return (
    f'{errors.signal_name(stop.signum)} {when}: stopped at once without saving; '
    f'{_rerun_outcome(steps[-1] if steps else None, stop.describe_step)}.'
  )
