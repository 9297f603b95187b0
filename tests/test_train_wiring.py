"""The training program's wiring, each piece against a direct computation.

The loss the step minimises is the loss of the config's method with every option it sets
(not a default); the epoch of a step, the hyper-parameters of an epoch at a temperature
other than the default, the checkpoint steps in order; and the model the program itself
builds (not one a test builds) syncs BatchNorm over the devices.
"""

from __future__ import annotations

import math
import pathlib
import sys
import types

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P
import numpy as np
import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # `from configs import ...`, as from the repo root

from acceptance import accepted  # noqa: E402

from configs import digits  # noqa: E402
from hscl_jax import data  # noqa: E402
from hscl_jax import errors  # noqa: E402
from hscl_jax import losses  # noqa: E402
from hscl_jax import models  # noqa: E402
from hscl_jax import optimizers  # noqa: E402
from hscl_jax import parallel  # noqa: E402
from hscl_jax import progress  # noqa: E402
from hscl_jax.rundir import checkpoints  # noqa: E402
from hscl_jax.rundir import metrics  # noqa: E402
from hscl_jax.rundir import resume  # noqa: E402
from hscl_jax.rundir import timing  # noqa: E402
from hscl_jax.training import loop  # noqa: E402
from hscl_jax.training import plan as plan_lib  # noqa: E402
from hscl_jax.training import step as step_lib  # noqa: E402
from hscl_jax.training import summaries  # noqa: E402


def _features(seed=0, batch=8, views=2, dim=6):
  z = np.random.default_rng(seed).normal(size=(batch, views, dim))
  return jnp.asarray(z / np.linalg.norm(z, axis=-1, keepdims=True), jnp.float32)


def _program_loss(config, z, labels, hyper):
  """The training step's loss function, on one device (its axis is the mesh's)."""
  loss_fn, _ = step_lib.make_loss_fn(config)
  mesh = parallel.make_mesh(jax.devices()[:1])
  shard = jax.shard_map(
    lambda z, y: loss_fn(z, y, hyper), mesh=mesh, in_specs=(P(parallel.AXIS),) * 2, out_specs=P()
  )
  return jax.jit(jax.value_and_grad(shard))(z, labels)


@pytest.mark.parametrize(
  'method,hardening',
  [('ucl', 'exp'), ('hucl', 'exp'), ('scl', 'exp'), ('hscl', 'exp'), ('hscl', 'threshold')],
)
def test_wiring_loss_is_the_configured_loss_with_every_option(method, hardening):
  """Non-default γ, M, τ⁺, stop_gradient_weights and β/τ reach the loss."""
  config = digits.get_config()
  config.method, config.hardening = method, hardening
  config.temperature, config.M, config.tau_plus = 0.3, 9, 0.1
  config.stop_gradient_weights = True
  hyper = {'beta': np.float32(1.5), 'tau': np.float32(np.exp(-0.4))}
  z, labels = _features(), jnp.array([0, 1, 2, 0, 1, 2, 0, 1])
  common = dict(temperature=0.3, M=9)
  direct = {
    'ucl': lambda f: losses.ucl(f, **common),
    'hucl': lambda f: losses.hucl(f, beta=1.5, tau_plus=0.1, stop_gradient_weights=True, **common),
    'scl': lambda f: losses.scl(f, labels, **common),
    'hscl': lambda f: losses.hscl(
      f,
      labels,
      hardening=losses.exponential(1.5) if hardening == 'exp' else losses.threshold(np.exp(-0.4)),
      stop_gradient_weights=True,
      **common,
    ),
  }[method]
  value, grad = _program_loss(config, z, labels, hyper)
  expected_value, expected_grad = jax.jit(jax.value_and_grad(direct))(z)
  np.testing.assert_allclose(value, expected_value, rtol=1e-6)
  np.testing.assert_allclose(grad, expected_grad, rtol=1e-5, atol=1e-7)


def test_wiring_epoch_of_step_is_one_based():
  plan = plan_lib.Plan(
    steps_per_epoch=3, num_epochs=4, learning_rate=optimizers.optax.constant_schedule(1.0)
  )
  assert [plan.epoch_of_step(s) for s in range(7)] == [1, 1, 1, 2, 2, 2, 3]
  assert plan.total_steps == 12


def test_wiring_hyperparameters_use_the_run_temperature():
  """eq. (4) at γ = 0.2: τ = exp((start + (e - 1)/(E - 1)·(end - start)) / γ)."""
  config = digits.get_config()
  config.num_epochs, config.tau_start, config.tau_end, config.temperature = 5, -0.3, 0.1, 0.2
  for epoch in (1, 3, 5):
    level = -0.3 + (epoch - 1) / 4 * 0.4
    tau = plan_lib.loss_hyperparameters(config, epoch)['tau']
    assert float(tau) == pytest.approx(math.exp(level / 0.2), rel=1e-5)


def test_wiring_finished_steps_in_increasing_order(tmp_path):
  directory = checkpoints.directory(str(tmp_path))
  for name in ('10', '3', '7', '12.orbax-checkpoint-tmp', 'other'):
    (pathlib.Path(str(directory)) / name).mkdir(parents=True)
  assert checkpoints.finished_steps(str(tmp_path)) == [3, 7, 10]


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


def test_the_epoch_log_line_shows_the_records_main_values_in_under_100_columns():
  """summaries.epoch_summary, the one line logged per epoch, from a record whose every value
  differs (and rounds visibly at the line's precision): the loss, the kNN's and probe's
  top-1 only when the record has them, views/s and the time; the other figures stay in
  the record. Its widest form (a 4-digit epoch, a large loss, rate and time, compiling)
  still fits in 100 columns (whole seconds from 100 s on)."""
  record = {
    'epoch': 3,
    'train_loss': 4.56789,
    'knn_top1': 0.71234,
    'precision_at_1': 0.8123,
    'map_at_r': 0.5123,
    'probe_top1': 0.875,
    'assumption1_fraction': 0.0456,
    'learning_rate': 0.00123456,
    'images_per_second': 1234.4,  # views: two per sample
    'samples_per_second': 617.2,
    'epoch_time': 12.34,
  }
  assert summaries.epoch_summary(record, num_epochs=30) == (
    'epoch 3/30  loss 4.5679  kNN 0.7123  probe 0.8750  1234 views/s  12.3 s'
  )
  assert summaries.epoch_summary(record, num_epochs=30, compile_seconds=8.56).endswith(
    '  12.3 s (8.6 s compiling)'
  )
  del record['knn_top1'], record['probe_top1']
  assert summaries.epoch_summary(record, num_epochs=30) == (
    'epoch 3/30  loss 4.5679  1234 views/s  12.3 s'
  )
  widest = {
    **record,
    'epoch': 1000,
    'train_loss': 12.345678,
    'knn_top1': 0.5,
    'probe_top1': 0.5,
    'images_per_second': 1_234_567.0,
    'epoch_time': 9999.4,
  }
  line = summaries.epoch_summary(widest, num_epochs=1000, compile_seconds=999.4)
  assert line.endswith('  9999 s (999 s compiling)') and len(line) <= 100, line


def test_the_epoch_throughput_leaves_out_the_compiling_steps():
  """An epoch timed over 10 steps in 12 s, of which 2 steps (one per process) compiled in
  4 s: its throughput counts the other 8 steps over the other 8 s. An epoch whose every
  step compiled keeps them all (there is nothing else to time); a resumed epoch's position
  round-trips through the checkpoint's metadata."""
  times = timing.EpochTimes(seconds=12.0, steps_timed=10, compile_seconds=4.0, compile_steps=2)
  assert times.without_compilation() == (8, 8.0)
  one_step = timing.EpochTimes(seconds=3.0, steps_timed=1, compile_seconds=3.0, compile_steps=1)
  assert one_step.without_compilation() == (1, 3.0)
  position = resume.EpochPosition(times=times)
  restored, records = resume.EpochPosition.from_metadata(position.to_metadata([{'epoch': 1}]))
  assert restored == position and records == [{'epoch': 1}]


def test_one_timer_gives_the_epoch_s_times_the_rate_and_the_eta(monkeypatch):
  """A span from step 4 whose first step (the process's) compiles in 10 s, two more steps
  in 5 s, then an evaluation of 1 s every 2 epochs: the epoch keeps 15 s over 3 steps (10 s
  and 1 step of them compiling), the rate is 2.5 s a step after the compilation, and the
  progress line's ETA at step 7 of 10 is 3 steps at that rate plus one epoch's share of
  the evaluation (3 x 2.5 + 0.5)."""
  readings = iter([0.0, 10.0, 12.0, 15.0, 20.0, 21.0])
  clock = types.SimpleNamespace(perf_counter=lambda: next(readings))
  monkeypatch.setattr(progress, 'time', clock)  # the stopwatch of the steps
  monkeypatch.setattr(timing, 'time', clock)  # the evaluation's
  timer = timing.Timer(start_step=4)
  timer.start(4)
  timer.first_step_done(5)
  assert timer.compiled and timer.seconds_per_step(6) == 2.0  # read mid-span, at 12 s
  timer.stop(7)
  assert timer.epoch == timing.EpochTimes(
    seconds=15.0, steps_timed=3, compile_seconds=10.0, compile_steps=1
  )
  assert timer.epoch.without_compilation() == (2, 5.0)
  assert timer.evaluate(lambda: 'top-1', every_epochs=2) == ('top-1', 1.0)
  line = metrics.Progress(
    total_steps=10, start_step=4, steps_per_epoch=5, images_per_step=2, timer=timer
  )
  assert line.eval_seconds_per_epoch == 0.5
  assert timer.seconds_per_step(7) == 2.5 and line.eta_seconds(7) == 8.0
  timer.next_epoch()
  assert timer.epoch == timing.EpochTimes()


def test_the_eta_counts_down_without_a_jump_when_the_first_evaluation_compiles(monkeypatch):
  """30 epochs of 5 steps on a stepped clock: each step 1 s (the first compiles 10 s more),
  each epoch's kNN 2 s, the first kNN 6 s more compiling (jax.monitoring's event, as JAX
  reports it). The ETA at each epoch's last step (the loop's progress line, before its kNN)
  is the steps left at 1 s plus the epochs left at 2 s, from epoch 2 on: a countdown of 7 s
  an epoch. Taking the first kNN's 8 s as every kNN's would show 364 s at epoch 2 after 145
  s at epoch 1, then 189 s at epoch 3."""
  clock = types.SimpleNamespace(now=0.0)
  clock.perf_counter = lambda: clock.now
  monkeypatch.setattr(progress, 'time', clock)
  monkeypatch.setattr(timing, 'time', clock)
  timer = timing.Timer(start_step=0)
  line = metrics.Progress(
    total_steps=150, start_step=0, steps_per_epoch=5, images_per_step=2, timer=timer
  )

  def knn(epoch):
    clock.now += 2.0
    if epoch == 1:
      clock.now += 6.0
      jax.monitoring.record_event_duration_secs('/jax/core/compile/backend_compile_duration', 6.0)
    return epoch

  etas = []
  for epoch in range(1, 31):
    timer.start(5 * (epoch - 1))
    for step in range(5 * (epoch - 1) + 1, 5 * epoch + 1):
      clock.now += 11.0 if step == 1 else 1.0
      if not timer.compiled:
        timer.first_step_done(step)
    timer.stop(5 * epoch)
    etas.append(line.eta_seconds(5 * epoch))
    assert timer.evaluate(lambda: knn(epoch), every_epochs=1) == (epoch, 8.0 if epoch == 1 else 2.0)
    timer.next_epoch()
  assert etas[0] == 145.0  # no kNN timed yet
  assert etas[1:] == pytest.approx([7.0 * (30 - epoch) for epoch in range(2, 31)])


def test_a_batch_fits_up_to_the_training_examples_and_not_one_more():
  """One more is refused naming the largest batch that passes on the 4 devices (a multiple
  of 4, and with chunk_size 4 of 16), or, with fewer examples than any, asking for more."""
  config = digits.get_config()
  config.batch_size = 64
  with accepted('a batch of all 64 training examples'):
    plan_lib.check_batch_fits(config, 64)
  refusal = r'^config\.batch_size: 64 exceeds the 63 training examples\. Fix: use at most 63: '
  with pytest.raises(errors.ConfigError, match=refusal + r'--config\.batch_size=60 passes here\.$'):
    plan_lib.check_batch_fits(config, 63)
  config.chunk_size = 4
  with pytest.raises(errors.ConfigError, match=r'--config\.batch_size=48 passes here\.$'):
    plan_lib.check_batch_fits(config, 63)
  with pytest.raises(errors.ConfigError, match=r'Fix: train on more examples than the .*, 16\.$'):
    plan_lib.check_batch_fits(config, 15)


def test_a_refused_samples_per_class_suggests_a_batch_every_device_divides():
  """The run's loader asks a suggested batch_size to be a multiple of the devices (4
  here) and processes (1): with no m passing at 7, the largest such batch that has one."""
  assert (jax.device_count(), jax.process_count()) == (4, 1)
  labels = np.repeat(np.arange(6), [1, 1, 1, 1, 1, 3]).astype(np.int32)  # 6 classes
  source = data.ArraySource(np.zeros((8, 4, 4, 3), np.uint8), labels, 6)
  config = digits.get_config()
  config.batch_size, config.samples_per_class = 7, 7
  # Batch 6 would take one of each class; 4 is the largest multiple of 4 devices below 7.
  with pytest.raises(errors.ConfigError, match=r'use --config\.batch_size=4 with samples_per'):
    plan_lib.make_train_loader(config, source)


def test_a_refused_samples_per_class_suggests_what_the_config_check_passes():
  """The loader asks what the config check asks (config/schema): a suggested batch_size a
  multiple of the devices times chunk_size, and for a supervised method two classes per
  batch, which an unsupervised one does without."""
  assert (jax.device_count(), jax.process_count()) == (4, 1)
  labels = np.repeat(np.arange(12), [1] * 11 + [20]).astype(np.int32)  # m = 1 only
  singles = data.ArraySource(np.zeros((31, 4, 4, 3), np.uint8), labels, 12)
  config = digits.get_config()
  config.batch_size, config.samples_per_class = 17, 17  # no m passes at 17: 12 classes
  for chunk_size, batch in ((0, 12), (2, 8)):
    config.chunk_size = chunk_size
    with pytest.raises(errors.ConfigError, match=rf'use --config\.batch_size={batch} with '):
      plan_lib.make_train_loader(config, singles)
  pairs = data.ArraySource(np.zeros((16, 4, 4, 3), np.uint8), np.repeat(np.arange(2), 8), 2)
  config.batch_size, config.samples_per_class, config.chunk_size = 8, 8, 0
  assert config.method == 'hscl'
  with pytest.raises(errors.ConfigError, match=r'fewer than the 2 .* use samples_per_class=4 '):
    plan_lib.make_train_loader(config, pairs)
  config.method = 'ucl'
  assert plan_lib.make_train_loader(config, pairs).steps_per_epoch == 2
