"""Class-aware batches (config.samples_per_class): the sampler's invariants, the loader
through both source paths, the one-line refusals, and a digits run pinned to eq. (3)."""

from __future__ import annotations

import functools
import logging
import re

from acceptance import accepted
import numpy as np
import pytest

from data.test_loaders import loader
from data.test_loaders import take
from hscl_jax import data
from hscl_jax import errors
from hscl_jax.config import schema
from hscl_jax.data import sampling
from hscl_jax.experiments import reports as image_batches


def unbalanced_labels(seed=0, num_classes=9):
  """Classes of different sizes (some not multiples of m), shuffled: a sampler that
  ignored the labels, or counted groups wrongly, shows."""
  rng = np.random.default_rng(seed)
  sizes = rng.integers(5, 23, num_classes)
  return rng.permutation(np.repeat(np.arange(num_classes), sizes)).astype(np.int32)


def order_of(labels, batch, m, seed=0, processes=1, min_classes=1):
  return data.EpochOrder(
    len(labels),
    labels=labels,
    global_batch_size=batch,
    seed=seed,
    samples_per_class=m,
    num_processes=processes,
    min_classes_per_batch=min_classes,
  )


def reference_max_batches(groups, per_batch):
  """The most batches of `per_batch` distinct classes, by brute force over T."""
  return max(t for t in range(sum(groups) + 1) if sum(min(g, t) for g in groups) >= per_batch * t)


@pytest.mark.parametrize('m,batch', [(1, 6), (2, 8), (3, 12), (4, 16), (4, 36)])
@pytest.mark.parametrize('seed', [0, 5])
def test_every_batch_holds_m_samples_of_batch_over_m_distinct_classes(m, batch, seed):
  labels = unbalanced_labels(seed)
  order = order_of(labels, batch, m, seed=seed)
  groups = np.bincount(labels) // m
  assert order.steps_per_epoch == reference_max_batches(groups.tolist(), batch // m) > 0
  for epoch in range(3):
    visited = order(epoch)
    assert visited.shape == (order.steps_per_epoch * batch,)
    assert len(np.unique(visited)) == len(visited)  # no example twice in an epoch
    batches = labels[visited].reshape(order.steps_per_epoch, batch // m, m)
    assert (batches == batches[:, :, :1]).all()  # each group of m is one class
    for classes in batches[:, :, 0]:
      assert len(np.unique(classes)) == batch // m  # distinct classes in a batch
    # An anchor meets exactly m - 1 others of its class.
    flat = labels[visited].reshape(order.steps_per_epoch, batch)
    assert ((flat[:, :, None] == flat[:, None, :]).sum(-1) - 1 == m - 1).all()


def test_a_balanced_subset_is_visited_whole_in_a_fresh_order_each_epoch():
  labels = np.repeat(np.arange(6), 8)  # 6 classes x 8 = 2 groups of 4 each: 12 groups
  order = order_of(labels, 12, 4, seed=2)  # 3 classes a batch: 4 batches
  assert order.steps_per_epoch == 4
  epochs = [order(e) for e in range(3)]
  for visited in epochs:
    np.testing.assert_array_equal(np.sort(visited), np.arange(48))
  assert not np.array_equal(epochs[0], epochs[1])
  assert not np.array_equal(epochs[1], epochs[2])


def test_the_order_is_a_function_of_seed_and_epoch():
  labels = unbalanced_labels()
  first = order_of(labels, 8, 2, seed=4)
  again = order_of(labels, 8, 2, seed=4)
  np.testing.assert_array_equal(first(1), again(1))
  np.testing.assert_array_equal(first(0), first(0))
  assert not np.array_equal(first(0), order_of(labels, 8, 2, seed=5)(0))


def test_uniform_batches_are_unchanged():
  """m = 0: the batches the loader gave before class-aware batches existed (pinned:
  seed 3, 50 examples, batch 8; the first two batches of epochs 0 and 1)."""
  batches = [b['index'].tolist() for b in take(loader(), 8)]
  assert batches[:2] == [[2, 11, 17, 28, 32, 23, 30, 41], [25, 39, 4, 3, 40, 46, 35, 18]]
  assert batches[6:] == [[49, 24, 32, 25, 27, 44, 28, 41], [10, 39, 12, 13, 45, 11, 43, 8]]
  assert loader().steps_per_epoch == 6


def class_aware_source():
  """72 indexed examples, labels unbalanced (classes 0-5 of 8-16 examples)."""
  labels = np.repeat(np.arange(6), [8, 10, 12, 13, 14, 15])
  images = np.broadcast_to(
    np.arange(len(labels), dtype=np.uint8)[:, None, None, None], (len(labels), 4, 4, 3)
  ).copy()
  return data.ArraySource(images, labels.astype(np.int32), 6)


def test_the_loader_reads_the_order_and_processes_read_slices_of_it():
  source = class_aware_source()
  single = take(loader(source, samples_per_class=2, global_batch_size=8), 20)
  order = order_of(source.labels(), 8, 2, seed=3)
  steps = order.steps_per_epoch
  expected = np.concatenate([order(0), order(1), order(2)]).reshape(-1, 8)[:20]
  np.testing.assert_array_equal([b['index'] for b in single], expected)
  np.testing.assert_array_equal(  # the images are the examples' own
    [b['image'][:, 0, 0, 0, 0] for b in single], expected
  )
  shards = [
    take(loader(source, samples_per_class=2, shard_index=i, shard_count=2), 20) for i in range(2)
  ]
  for k in range(20):
    joined = np.concatenate([shards[0][k]['index'], shards[1][k]['index']])
    np.testing.assert_array_equal(joined, single[k]['index'])
  assert steps == 8  # groups of 2: 4+5+6+6+7+7 = 35, four classes a batch: 8 batches


@pytest.mark.parametrize('positive_mode', ['augmentation', 'label'])
def test_resume_mid_epoch_gives_the_uninterrupted_batches(positive_mode):
  source = class_aware_source()
  kwargs = dict(samples_per_class=2, positive_mode=positive_mode)
  uninterrupted = take(loader(source, **kwargs), 13)
  first = loader(source, **kwargs)
  take(first, 5)  # mid-epoch 0 (8 steps an epoch)
  resumed = loader(source, **kwargs)
  resumed.set_state(first.get_state())
  for want, got in zip(uninterrupted[5:], take(resumed, 8), strict=True):
    for key in want:
      np.testing.assert_array_equal(want[key], got[key])
  if positive_mode == 'label':  # the second view is another example of the same class
    second = uninterrupted[0]['image'][:, 1, 0, 0, 0]
    np.testing.assert_array_equal(source.labels()[second], uninterrupted[0]['label'])


def test_the_decoded_cache_and_the_lazy_path_give_the_same_batches(tmp_path):
  from end_to_end.test_image_folder_run import short_config
  from end_to_end.test_image_folder_run import write_folder

  write_folder(tmp_path, {'train': 10, 'test': 2})
  config = short_config(str(tmp_path))
  config.train_examples = 32  # 8 of each of the 4 classes
  batches = {}
  for cache_gib in (0.0, 1.0):
    config.decode_cache_gib = cache_gib
    source = data.run_sources(config)[0]
    assert isinstance(source, data.ArraySource) == (cache_gib > 0)
    batches[cache_gib] = take(loader(source, samples_per_class=4), 4)
  for lazy, cached in zip(batches[0.0], batches[1.0], strict=True):
    for key in lazy:
      np.testing.assert_array_equal(lazy[key], cached[key])
    assert sorted(np.bincount(lazy['label'], minlength=4)) == [0, 0, 4, 4]


def test_bounds_are_accepted_and_one_past_refused():
  labels = np.repeat(np.arange(4), [6, 7, 9, 12])  # smallest class: 6 examples
  # m equal to the smallest class: accepted; one more: refused naming class 0.
  with accepted('m equal to the smallest class'):
    assert order_of(labels, 12, 6).steps_per_epoch == 2  # groups 1, 1, 1, 2 in pairs
  with pytest.raises(errors.ConfigError) as refused:
    order_of(labels, 14, 7)
  # No m passes at 14 (a divisor >= 14 / 4 classes is 7 or 14, above 6); 12 has 3, 4, 6.
  assert str(refused.value) == (
    'config.samples_per_class: 7 exceeds the 6 training examples of class 0 (the smallest '
    'class in the training subset). Fix: no samples_per_class passes at batch_size 14 on this '
    'training subset (4 classes, the smallest with 6 examples): use --config.batch_size=12 '
    'with samples_per_class = one of 3, 4, 6, or more train_examples (0: the whole split), '
    'or samples_per_class=0 (uniform batches).'
  )
  # batch / m equal to the number of classes: accepted; one more class: refused.
  with accepted('batch / m equal to the number of classes'):
    assert order_of(labels, 8, 2).steps_per_epoch == 3  # groups 3, 3, 4, 6 in fours
  with pytest.raises(errors.ConfigError) as refused:
    order_of(labels, 10, 2)
  assert str(refused.value) == (
    'config.samples_per_class: batch_size 10 / 2 = 5 classes per batch, but the training '
    'subset has 4 classes. Fix: use samples_per_class=5 (what passes every check on this '
    'training subset at batch_size 10), or 0 (uniform batches).'
  )


def test_a_batch_no_m_can_fill_names_the_largest_batch():
  labels = np.repeat(np.arange(4), 2)  # 4 classes of 2: no m gives 6 classes a batch of 12
  with pytest.raises(errors.ConfigError) as refused:
    order_of(labels, 12, 2)
  assert str(refused.value) == (
    'config.samples_per_class: batch_size 12 / 2 = 6 classes per batch, but the training '
    'subset has 4 classes. Fix: no samples_per_class passes at batch_size 12 on this training '
    'subset (4 classes, the smallest with 2 examples): use --config.batch_size=8 with '
    'samples_per_class=2, or more train_examples (0: the whole split), or samples_per_class=0 '
    '(uniform batches).'
  )
  # One class of one example over 2 processes: no batch of a multiple of 2 has an m.
  with pytest.raises(errors.ConfigError) as refused:
    order_of(np.zeros(1, np.int64), 2, 2, processes=2)
  assert str(refused.value).endswith(
    'Fix: use samples_per_class=0 (uniform batches): no value passes on this training subset '
    '(1 classes, the smallest with 1 examples).'
  )


def test_only_two_epochs_orders_are_kept():
  """The loader asks for the current epoch (and, at its end, the next): memory stays two
  epochs' orders over a run of any length, and an order asked again is the same."""
  order = order_of(unbalanced_labels(), 8, 2)
  first = [order(epoch).copy() for epoch in range(5)]
  assert sorted(order._cache) == [3, 4]
  np.testing.assert_array_equal(order(1), first[1])  # recomputed: the same


def test_m_must_divide_a_process_slice():
  labels = np.repeat(np.arange(4), 12)
  assert order_of(labels, 12, 6, processes=2).steps_per_epoch == 4  # 6 of 6: accepted
  with pytest.raises(errors.ConfigError) as refused:
    order_of(labels, 12, 4, processes=2)
  assert str(refused.value) == (
    "config.samples_per_class: 4 does not divide the 6 samples of a process's batch "
    '(batch_size 12 over 2 processes). Fix: use samples_per_class = one of 3, 6 (what passes '
    'every check on this training subset at batch_size 12), or 0 (uniform batches).'
  )
  for bad in (-1, 2.5, True):
    with pytest.raises(errors.ConfigError, match=r'config\.samples_per_class: must be a whole'):
      order_of(labels, 12, bad)


def test_unlabelled_data_is_refused():
  labels = np.array([0, 1, -1, 1] * 4)
  with pytest.raises(errors.ConfigError, match='unlabelled examples'):
    order_of(labels, 4, 2)
  # Labelled data need not hold class 0 (a subset, a folder of some classes): accepted.
  assert order_of(np.repeat([2, 5], 4), 4, 2).steps_per_epoch == 2
  with pytest.raises(ValueError, match=r'labels must have shape \(9,\), got \(8,\)'):
    data.EpochOrder(
      9, labels=np.repeat([2, 5], 4), global_batch_size=4, seed=0, samples_per_class=2
    )


def test_the_config_check_refuses_what_no_data_allows_and_leaves_the_rest_to_the_data():
  """A value that is not a whole number >= 0 is refused before any data is read; one the
  processes rule out is refused with the data, so that the refusal lists what passes."""
  from configs import digits

  config = digits.get_config()
  config.batch_size, config.samples_per_class = 32, 12  # 12 does not divide 16 of 2 processes
  schema.validate_config(config, num_devices=4, num_processes=2)
  config.samples_per_class = -1  # (2.5 or '4' the config's types refuse on assignment)
  with pytest.raises(errors.ConfigError, match=r'samples_per_class: must be a whole number'):
    schema.validate_config(config, num_devices=4, num_processes=2)


@pytest.mark.parametrize('min_classes', [1, 2])
@pytest.mark.parametrize('seed', range(6))
def test_every_value_a_refusal_lists_passes_and_every_other_is_refused(seed, min_classes):
  """On random unbalanced labels, each refusal's listed values (or suggested batch_size
  with its values) build orders whose batches hold m of each of batch / m classes, at
  least min_classes of them (a supervised method's negatives are another class's), and
  every other m from 1 to the batch is refused. A suggested batch holds two samples."""
  rng = np.random.default_rng(seed)
  num_classes = int(rng.integers(2, 9))
  labels = np.repeat(np.arange(num_classes), rng.integers(1, 20, size=num_classes))
  batch, processes = int(rng.choice([8, 12, 16, 24])), int(rng.choice([1, 2]))
  order = functools.partial(order_of, min_classes=min_classes)
  outcomes = {}
  for m in range(1, batch + 1):
    try:
      order(labels, batch, m, processes=processes)
    except errors.ConfigError as refused:
      outcomes[m] = str(refused)
    else:
      outcomes[m] = None
  passing = [m for m, message in outcomes.items() if message is None]
  for message in filter(None, outcomes.values()):
    suggested = re.search(
      r'--config\.batch_size=(\d+) with samples_per_class(?:=| = one of )'
      r'(\d+(?:, \d+)*)',
      message,
    )
    listed = re.search(r'Fix: use samples_per_class(?:=| = one of )(\d+(?:, \d+)*) \(', message)
    if listed:
      assert [int(v) for v in listed.group(1).split(', ')] == passing, message
    elif suggested:
      assert not passing, message
      other = int(suggested.group(1))
      assert other >= 2, message
      for m in (int(v) for v in suggested.group(2).split(', ')):
        _assert_m_per_class(order(labels, other, m, processes=processes), labels, m)
        assert other // m >= min_classes, message
    else:
      assert not passing and 'samples_per_class=0 (uniform batches): no value' in message
  for m in passing:
    _assert_m_per_class(order(labels, batch, m, processes=processes), labels, m)
  assert all(batch // m >= min_classes for m in passing)
  assert min_classes == 1 or outcomes[batch] is not None  # one class: no negatives


def _assert_m_per_class(order, labels, m):
  batches = order(0).reshape(order.steps_per_epoch, -1)
  assert order.steps_per_epoch >= 1
  for rows in batches:
    counts = np.unique(labels[rows], return_counts=True)[1]
    assert (counts == m).all() and len(counts) * m == len(rows)


def test_the_report_counts_m_minus_1_same_class_samples_per_anchor():
  labels = unbalanced_labels()
  for m, batch in ((2, 8), (4, 16)):
    mean, with_one = image_batches.same_class_per_anchor(labels, batch, 1, 2, m)
    assert (mean, with_one) == (m - 1, 1.0)
  uniform, _ = image_batches.same_class_per_anchor(labels, 16, 1, 2)
  assert 0 < uniform < 3  # ~ (16 - 1) / 9 on uniform batches


def test_max_batches_matches_brute_force():
  rng = np.random.default_rng(0)
  for _ in range(200):
    groups = rng.integers(0, 7, rng.integers(1, 9))
    per_batch = int(rng.integers(1, len(groups) + 1))
    expected = reference_max_batches(groups.tolist(), per_batch)
    assert sampling.max_batches(groups, per_batch) == expected


def class_aware_line(m, batch, labels):
  """The start-up line, from the brute-force packing and the uniform epoch's steps."""
  groups = (np.bincount(labels) // m).tolist()
  steps = reference_max_batches(groups, batch // m)
  share = 100 * steps * batch / len(labels)
  return steps, (
    f'Class-aware batches: {m} samples of each of {batch // m} classes per batch; an epoch '
    f'of {steps} steps visits {share:.1f}% of the {len(labels)} training examples (uniform '
    f'batches: {len(labels) // batch} steps).'
  )


def test_a_long_tailed_class_aware_epoch_is_warned_of_with_the_epochs_that_make_up_for_it():
  """40 examples of one class, 4 of four others: batches of 4 classes x 2 run out after 2
  steps (16 of 56 examples) where uniform batches take 7; 10 epochs -> 35 keep the steps."""
  from training_runs import tiny_config

  from hscl_jax.training import log_lines

  config = tiny_config()
  config.batch_size, config.samples_per_class, config.num_epochs = 8, 2, 10
  labels = np.repeat(np.arange(5), [40, 4, 4, 4, 4])
  order = sampling.EpochOrder(56, labels=labels, global_batch_size=8, seed=0, samples_per_class=2)
  info, warning = log_lines.class_aware_epoch_lines(config, order)
  steps, line = class_aware_line(2, 8, labels)
  assert (steps, info) == (2, line)
  assert warning.startswith('Class-aware epochs visit only 28.6% of the training examples (2 ')
  assert 'schedule in steps, is 3.5x shorter. Fix: --config.num_epochs=35 ' in warning
  balanced = np.repeat(np.arange(4), 6)
  order = sampling.EpochOrder(24, labels=balanced, global_batch_size=8, seed=0, samples_per_class=2)
  info, warning = log_lines.class_aware_epoch_lines(config, order)
  assert (info, warning) == (class_aware_line(2, 8, balanced)[1], None)
  assert '100.0% of the 24' in info


def test_a_digits_run_with_4_per_class_meets_3_and_its_first_loss_is_eq_3(tmp_path, caplog):
  """Class-aware batches through the whole step on 4 devices, with gradient caching
  (chunks of 4 per device) and a negative queue: the batch the run drew holds 8 classes x
  4, and its first loss is eq. (3)'s float64 reference on that batch."""
  from training_runs import record_first_step
  from training_runs import step_loss_reference
  from training_runs import tiny_config

  from hscl_jax.rundir import metrics
  from hscl_jax.training import loop

  config = tiny_config()
  config.samples_per_class = 4
  config.num_epochs, config.steps_per_epoch_limit = 1, 2
  config.chunk_size = 4
  config.queue_size = 2 * config.batch_size * 2
  caplog.set_level(logging.INFO, logger='absl')
  with pytest.MonkeyPatch.context() as patch:
    seen = record_first_step(patch)
    loop.train_and_evaluate(config, str(tmp_path))
  train_labels = data.run_sources(config)[0].labels()
  assert class_aware_line(4, 32, train_labels)[1] in caplog.messages
  labels = np.asarray(seen['batch']['label'])
  same = (labels[:, None] == labels[None, :]).sum(-1) - 1
  assert (same == 3).all() and len(np.unique(labels)) == 8
  np.testing.assert_allclose(
    seen['loss'], step_loss_reference(config, seen['state'], seen['batch']), rtol=2e-5
  )
  assert image_batches.same_class_per_anchor(train_labels, 32, config.seed, 1, 4) == (3.0, 1.0)
  history = metrics.read_metrics(str(tmp_path))
  assert history[-1]['step'] == 2 and np.isfinite(history[-1]['train_loss'])
