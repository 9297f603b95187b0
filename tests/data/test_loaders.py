"""Training/eval loaders: sharding, determinism, exact resume, label-mode pairs, padding."""

from __future__ import annotations

import numpy as np
import pytest

from hscl_jax import data

NUM_EXAMPLES, NUM_CLASSES, SIDE = 50, 5, 4


def indexed_source(num_examples=NUM_EXAMPLES, num_classes=NUM_CLASSES):
  """Images whose pixels hold their own index, so a batch's content can be checked."""
  images = np.broadcast_to(
    np.arange(num_examples, dtype=np.uint8)[:, None, None, None], (num_examples, SIDE, SIDE, 3)
  ).copy()
  labels = np.arange(num_examples) % num_classes
  return data.ArraySource(images, labels, num_classes)


def take(loader, steps):
  return [next(loader) for _ in range(steps)]


def loader(source=None, **kwargs):
  kwargs = {
    'global_batch_size': 8,
    'seed': 3,
    'shard_index': 0,
    'shard_count': 1,
    'num_threads': 2,
    **kwargs,
  }
  return data.TrainLoader(source or indexed_source(), **kwargs)


def test_steps_per_epoch():
  assert data.steps_per_epoch(50, 8) == 6
  assert data.steps_per_epoch(48, 8) == 6
  with pytest.raises(ValueError, match='larger than the 7 training examples'):
    data.steps_per_epoch(7, 8)


def test_train_batch_layout_and_content():
  batch = next(loader())
  assert batch['image'].shape == (8, 2, SIDE, SIDE, 3) and batch['image'].dtype == np.uint8
  assert batch['label'].shape == (8,) and batch['label'].dtype == np.int32
  # Augmentation mode: both views are the same image, and it is the indexed example.
  np.testing.assert_array_equal(batch['image'][:, 0], batch['image'][:, 1])
  np.testing.assert_array_equal(batch['image'][:, 0, 0, 0, 0], batch['index'])
  np.testing.assert_array_equal(batch['label'], batch['index'] % NUM_CLASSES)


def test_two_shards_cover_each_epoch_exactly_once_and_match_one_process():
  steps = data.steps_per_epoch(NUM_EXAMPLES, 8)
  shards = [take(loader(shard_index=i, shard_count=2), 2 * steps) for i in range(2)]
  single = take(loader(), 2 * steps)
  epochs = []
  for epoch in range(2):
    seen = []
    for step in range(epoch * steps, (epoch + 1) * steps):
      local = [shards[i][step]['index'] for i in range(2)]
      assert all(len(part) == 4 for part in local)
      # The global batch does not depend on the number of processes.
      np.testing.assert_array_equal(np.concatenate(local), single[step]['index'])
      seen.extend(np.concatenate(local).tolist())
    assert len(seen) == len(set(seen)) == steps * 8  # Disjoint; remainder of 2 dropped.
    epochs.append(seen)
  assert epochs[0] != epochs[1]  # Reshuffled per epoch.


def test_deterministic_given_seed():
  first = [b['index'] for b in take(loader(seed=5), 4)]
  again = [b['index'] for b in take(loader(seed=5), 4)]
  other = [b['index'] for b in take(loader(seed=6), 4)]
  np.testing.assert_array_equal(first, again)
  assert not np.array_equal(first, other)


@pytest.mark.parametrize('positive_mode', ['augmentation', 'label'])
def test_resume_gives_exactly_the_same_batches(positive_mode):
  uninterrupted = loader(positive_mode=positive_mode)
  take(uninterrupted, 4)
  state = uninterrupted.get_state()
  expected = take(uninterrupted, 5)  # Crosses the epoch boundary (6 steps per epoch).
  resumed = loader(positive_mode=positive_mode)
  resumed.set_state(dict(state))
  for want, got in zip(expected, take(resumed, 5)):
    for key in want:
      np.testing.assert_array_equal(want[key], got[key])
  assert resumed.get_state() == uninterrupted.get_state() == {'step': 9}


def test_label_mode_pairs_share_a_label_and_are_deterministic():
  batches = take(loader(positive_mode='label'), 6)
  for batch in batches:
    anchors = batch['image'][:, 0, 0, 0, 0].astype(int)
    partners = batch['image'][:, 1, 0, 0, 0].astype(int)
    np.testing.assert_array_equal(partners % NUM_CLASSES, batch['label'])
    assert np.all(partners != anchors)  # Every class has 10 members.
  again = take(loader(positive_mode='label'), 6)
  for want, got in zip(batches, again):
    np.testing.assert_array_equal(want['image'], got['image'])


def test_label_mode_singleton_class_pairs_with_itself():
  source = data.ArraySource(
    np.arange(8, dtype=np.uint8).reshape(8, 1, 1, 1).repeat(3, -1),
    np.array([0, 0, 0, 0, 1, 1, 1, 2]),
    3,
  )
  batch = next(loader(source, positive_mode='label', global_batch_size=8))
  singleton = batch['label'] == 2
  np.testing.assert_array_equal(batch['image'][singleton, 0], batch['image'][singleton, 1])


@pytest.mark.parametrize('labels', [np.full(10, -1), np.array([0, 1, 2, -1, 3, 4, 5, 6, 7, 8])])
def test_label_mode_rejects_unlabelled_data(labels):
  """All unlabelled (STL-10's extra split) or one unlabelled example among labelled ones:
  it would have no same-class partner."""
  source = data.ArraySource(np.zeros((10, 2, 2, 3), np.uint8), labels, 10)
  with pytest.raises(ValueError, match='unlabelled'):
    loader(source, positive_mode='label')


def test_label_mode_names_the_label_out_of_range():
  """Labels 0-2 and one 7 with 3 classes: the refusal names the 7, the largest label. (The
  source has 8 classes, so it holds the 7; the loader is asked for 3.)"""
  labels = np.array([0, 1, 2, 7, 1, 0, 2, 1])
  source = data.ArraySource(np.zeros((8, 2, 2, 3), np.uint8), labels, 8)
  with pytest.raises(ValueError, match='^label 7 is out of range for 3 classes$'):
    loader(source, positive_mode='label', num_classes=3)


def test_invalid_arguments():
  with pytest.raises(ValueError, match='not divisible'):
    loader(global_batch_size=9, shard_count=2)
  with pytest.raises(ValueError, match='positive_mode'):
    loader(positive_mode='views')
  with pytest.raises(ValueError, match='shard_index'):
    loader(shard_index=2, shard_count=2)


def test_eval_loader_covers_every_example_once_with_padding():
  source = indexed_source(num_examples=23)
  shards = [
    data.EvalLoader(source, global_batch_size=8, shard_index=i, shard_count=2, num_threads=2)
    for i in range(2)
  ]
  assert [len(shard) for shard in shards] == [3, 3]
  batches = [list(shard) for shard in shards]
  assert [len(b) for b in batches] == [3, 3]  # Same count on every process.
  valid = []
  for batch in batches[0] + batches[1]:
    assert batch['image'].shape == (4, SIDE, SIDE, 3) and batch['mask'].dtype == bool
    mask = batch['mask']
    np.testing.assert_array_equal(batch['image'][mask, 0, 0, 0], batch['index'][mask])
    np.testing.assert_array_equal(batch['label'][mask], batch['index'][mask] % NUM_CLASSES)
    assert np.all(batch['image'][~mask] == 0) and np.all(batch['index'][~mask] == -1)
    valid.extend(batch['index'][mask].tolist())
  assert sorted(valid) == list(range(23))
  # Re-iterable: a second pass gives the same batches.
  np.testing.assert_array_equal(list(shards[0])[2]['index'], batches[0][2]['index'])
