"""data/sources: the datasets by name (unknown names and splits refused), the digits
source and its seeded split, the run's sources (config.train_examples' subset of the training
split, the decoded cache's budget), and the package's lazy names."""

from __future__ import annotations

import inspect

from acceptance import accepted
import ml_collections
import numpy as np
import pytest

from data.test_arrays import _pixels
from hscl_jax import data
from hscl_jax import errors
from hscl_jax.data import sources as data_sources


def test_unknown_dataset_lists_valid_names():
  with pytest.raises(data.UnknownDatasetError) as error:
    data.get_source('imagenet', 'train')
  for name in data.DATASETS:
    assert name in str(error.value)


def test_unknown_split():
  with pytest.raises(ValueError, match="valid: \\['train', 'test'\\]"):
    data.get_source('digits', 'unlabelled')


def test_digits_source():
  train, test = data.get_source('digits', 'train'), data.get_source('digits', 'test')
  assert (len(train), len(test)) == (1438, 359)
  example = train[0]
  assert example['image'].shape == (8, 8, 3) and example['image'].dtype == np.uint8
  assert np.all(example['image'] == example['image'][..., :1])  # Grey replicated to RGB.
  assert max(train[i]['image'].max() for i in range(50)) == 255  # 16 -> 255.
  assert set(np.unique(test.labels())) == set(range(10))
  np.testing.assert_array_equal(test.labels(), data.get_source('digits', 'test').labels())
  info = data.dataset_info('digits')
  assert info.num_classes == 10 and info.image_shape == (8, 8, 3)
  assert info.split_sizes == {'train': 1438, 'test': 359}


def test_the_default_seed_is_0_and_the_seed_picks_the_split():
  """get_source's documented default seed (0) is accepted and gives seed 0's split."""
  assert inspect.signature(data.get_source).parameters['seed'].default == 0
  with accepted('get_source without a seed'):
    default = data.get_source('digits', 'train')
  seeded = lambda seed: data.get_source('digits', 'train', seed=seed)
  np.testing.assert_array_equal(default.labels(), seeded(0).labels())
  assert not np.array_equal(default.labels(), seeded(1).labels())


def _digits_config(**overrides):
  config = ml_collections.ConfigDict(
    {
      'dataset': 'digits',
      'data_dir': None,
      'folder': None,
      'split_seed': 0,
      'train_split': 'train',
      'test_split': 'test',
      'augment': {'image_size': 8},
      'train_examples': None,
      'decode_cache_gib': 2.0,
    }
  )
  config.update(overrides)
  return config


def test_run_sources_subset_the_training_split_only():
  train, test = data.run_sources(_digits_config(train_examples=100))
  full_train, full_test = data.run_sources(_digits_config())
  assert len(train) == 100 and len(test) == len(full_test) == 359
  np.testing.assert_array_equal(np.bincount(train.labels()), [10] * 10)
  expected = data.balanced_subset(full_train.labels(), 100, seed=0)
  np.testing.assert_array_equal(_pixels(train), _pixels(full_train)[expected])
  again, _ = data.run_sources(_digits_config(train_examples=100))
  np.testing.assert_array_equal(_pixels(again), _pixels(train))
  other_split_seed, _ = data.run_sources(_digits_config(train_examples=100, split_seed=1))
  assert not np.array_equal(_pixels(other_split_seed), _pixels(train))


@pytest.mark.parametrize('gib,budget', [(0.5, 2**29), (None, 2 * 2**30)])
def test_run_sources_cache_budget_is_the_configs_or_the_default(monkeypatch, gib, budget):
  # None: a config.json written before decode_cache_gib existed gets the 2 GiB default.
  budgets = []
  subset_and_cache, get_source = data_sources._subset_and_cache, data_sources.get_source
  monkeypatch.setattr(
    data_sources, '_subset_and_cache', lambda *a: budgets.append(a[3]) or subset_and_cache(*a)
  )
  monkeypatch.setattr(
    data_sources,
    'get_source',
    lambda *a, **k: budgets.append(k['cache_bytes']) or get_source(*a, **k),
  )
  config = _digits_config(decode_cache_gib=gib)
  if gib is None:
    del config['decode_cache_gib']
  data.run_sources(config)
  assert len(budgets) >= 2 and set(budgets) == {budget}  # the train split's and the test's


@pytest.mark.parametrize('num_examples', [10, 1438])
def test_run_sources_accept_train_examples_at_their_bounds(num_examples):
  """One example per class (10), and the whole training split (1438: equal to its size,
  the same as 0 or None)."""
  with accepted(f'train_examples={num_examples}'):
    train, _ = data.run_sources(_digits_config(train_examples=num_examples))
  full_train, _ = data.run_sources(_digits_config())
  expected = [1] * 10 if num_examples == 10 else np.bincount(full_train.labels())
  np.testing.assert_array_equal(np.bincount(train.labels()), expected)
  if num_examples == 1438:
    np.testing.assert_array_equal(_pixels(train), _pixels(full_train))


@pytest.mark.parametrize('num_examples', [9, 1439])
def test_run_sources_refuse_impossible_train_examples(num_examples):
  with pytest.raises(
    errors.ConfigError,
    match=rf'^config\.train_examples: {num_examples} is not between the 10 classes and the '
    r'1438 examples of the digits train split\. Fix: use a value in \[10, 1438\]',
  ):
    data.run_sources(_digits_config(train_examples=num_examples))


def test_the_package_lists_its_lazy_names_before_they_are_loaded():
  """`dir(hscl_jax.data)` (what completion and `help` read): every name of `__all__`, loaded
  or not, beside the module's own globals."""
  names = set(dir(data))
  assert set(data.__all__) <= names and {'__all__', '__getattr__', '__doc__'} <= names
  assert dir(data) == sorted(names)
