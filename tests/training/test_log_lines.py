"""training/log_lines: the lines a run logs, from given numbers and small states; the
figures each line shows rather than its wording."""

from __future__ import annotations

import math
import re

import ml_collections
import numpy as np

from hscl_jax import data
from hscl_jax.training import log_lines
from hscl_jax.training import state as state_lib


def _params():
  """A model's parameters (24 + 4 in the backbone, 6 in the head) and a probe's (10)."""
  model = {
    'head': {'kernel': np.zeros((2, 3), np.float32)},
    'encoder': {'conv': {'kernel': np.zeros((2, 3, 4), np.float32)}, 'scale': np.ones(4)},
  }
  return model, {'kernel': np.zeros((4, 2), np.float32), 'bias': np.zeros(2, np.float32)}


def _state(params, probe_params=None):
  return state_lib.TrainState(
    step=np.zeros((), np.int32),
    params=params,
    batch_stats={'mean': np.zeros(4, np.float32)},
    opt_state=(np.zeros(7, np.float32),),
    rng=np.zeros(2, np.uint32),
    metric_sums={'train_loss': np.zeros((), np.float32)},
    probe=None if probe_params is None else {'params': probe_params, 'opt_state': ()},
  )


def test_parameters_are_counted_per_part_backbone_head_then_the_rest():
  model, probe = _params()
  counts = log_lines.parameter_counts({**model, 'probe': probe, 'adapter': {'w': np.zeros(5)}})
  assert list(counts.items()) == [('backbone', 28), ('head', 6), ('adapter', 5), ('probe', 10)]


def test_the_size_line_counts_the_probe_and_every_byte_of_the_state():
  model, probe = _params()
  state = _state(model, probe)
  # float32 28 + 6 + 10 parameters, ones(4) float64, batch stats 4, opt state 7, metric 1,
  # step int32 1, rng uint32 2.
  assert log_lines.state_bytes(state) == 4 * (24 + 6 + 10) + 8 * 4 + 4 * (4 + 7 + 1 + 1 + 2)
  line = log_lines.size_line(state)
  parts = dict(re.findall(r'(\w+) ([\d,]+)(?=[,(; ])', line.split(' (')[0] + ' '))
  assert {k: int(v.replace(',', '')) for k, v in parts.items()} == {
    'backbone': 28,
    'head': 6,
    'probe': 10,
  }
  assert '(44 in all)' in line
  assert f'{log_lines.state_bytes(state):,} bytes' in line
  without_probe = log_lines.size_line(_state(model))
  assert 'probe' not in without_probe and '(34 in all)' in without_probe


RECORD = {
  'epoch': 3,
  'step': 18,
  'train_loss': 4.123456,
  'learning_rate': 0.00123,
  'samples_per_second': 512.4,
  'images_per_second': 1024.8,
  'epoch_time': 12.34,
  'knn_top1': 0.87654,
  'precision_at_1': 0.81234,
  'map_at_r': 0.45678,
  'probe_top1': 0.9,
  'assumption1_fraction': 0.96789,
}


def test_an_epochs_line_shows_the_headline_figures_of_its_record_in_100_columns():
  """The loss, the kNN's and the probe's top-1, views/s and the time, in that order; the
  other figures (P@1, MAP@R, Assumption 1, the learning rate) stay in the records."""
  line = log_lines.epoch_line(RECORD, num_epochs=30)
  shown = ['epoch 3/30', 'loss 4.1235', 'kNN 0.8765', 'probe 0.9000', '1025 views/s', '12.3 s']
  positions = [line.index(part) for part in shown]
  assert positions == sorted(positions), line
  for hidden in ('P@1', 'MAP@R', 'Assumption', '0.00123', 'samples/s', 'compil'):
    assert hidden not in line, (hidden, line)
  assert len(line) <= 100
  compiled = log_lines.epoch_line(RECORD, num_epochs=30, compile_seconds=4.0)
  assert compiled.endswith('12.3 s (4.0 s compiling)'), compiled


def test_the_monitor_figures_are_knn_then_retrieval_in_the_records_order_then_the_probe():
  record = {'probe_top1': 0.5, 'recall_at_4': 0.75, 'precision_at_1': 0.25, 'knn_top1': 0.125}
  assert log_lines.monitor_parts(record) == [
    'kNN top-1 0.1250',
    'R@4 0.7500',
    'P@1 0.2500',
    'probe top-1 0.5000',
  ]
  assert log_lines.monitor_parts({'train_loss': 1.0, 'epoch': 1}) == []


def test_the_final_monitor_is_the_last_epoch_with_a_knn():
  records = [
    {'epoch': 1, 'knn_top1': 0.5},
    {'epoch': 2, 'knn_top1': 0.75, 'map_at_r': 0.25},
    {'epoch': 3, 'train_loss': 1.0},  # no kNN this epoch
  ]
  assert log_lines.final_monitor(records) == 'final kNN top-1 0.7500, MAP@R 0.2500'
  assert 'no kNN' in log_lines.final_monitor(records[2:])


def _class_aware(labels, batch_size, m, num_epochs=5):
  config = ml_collections.ConfigDict(
    {'samples_per_class': m, 'batch_size': batch_size, 'num_epochs': num_epochs}
  )
  order = data.EpochOrder(
    len(labels), labels=labels, global_batch_size=batch_size, seed=0, samples_per_class=m
  )
  return order, log_lines.class_aware_epoch_lines(config, order)


def test_a_balanced_class_aware_epoch_is_described_without_a_warning():
  order, (info, warning) = _class_aware(np.repeat(np.arange(4), 6), batch_size=8, m=2)
  assert order.steps_per_epoch == 3 and warning is None
  assert '100.0%' in info and 'of 4 classes' in info and '(uniform batches: 3 steps)' in info


def test_a_short_class_aware_epoch_is_warned_with_the_epochs_that_train_as_long():
  """Class 0 holds 40 of 52 examples: 4 classes per batch run out after 2 steps, where
  uniform batches take 6; the fix's num_epochs is the fewest that train 5 epochs' steps."""
  labels = np.array([0] * 40 + [1, 2, 3] * 4)
  order, (info, warning) = _class_aware(labels, batch_size=8, m=2, num_epochs=5)
  steps, uniform = order.steps_per_epoch, 52 // 8
  assert (steps, uniform) == (2, 6)
  assert f'{steps * 8 / 52:.1%}' in info and warning is not None
  epochs = int(re.search(r'--config\.num_epochs=(\d+)', warning).group(1))
  assert epochs * steps >= 5 * uniform > (epochs - 1) * steps
  assert '3.0x shorter' in warning
  assert math.isclose(
    steps * 8 / 52, float(re.search(r'only ([\d.]+)%', warning).group(1)) / 100, abs_tol=1e-3
  )


def test_the_epoch_log_line_shows_the_records_main_values_in_under_100_columns():
  """log_lines.epoch_line, the one line logged per epoch, from a record whose every value
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
  assert log_lines.epoch_line(record, num_epochs=30) == (
    'epoch 3/30  loss 4.5679  kNN 0.7123  probe 0.8750  1234 views/s  12.3 s'
  )
  assert log_lines.epoch_line(record, num_epochs=30, compile_seconds=8.56).endswith(
    '  12.3 s (8.6 s compiling)'
  )
  del record['knn_top1'], record['probe_top1']
  assert log_lines.epoch_line(record, num_epochs=30) == (
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
  line = log_lines.epoch_line(widest, num_epochs=1000, compile_seconds=999.4)
  assert line.endswith('  9999 s (999 s compiling)') and len(line) <= 100, line
