"""TFDS datasets through the real reading path (array_record, no TensorFlow).

Two kinds of fakes, both without network or TensorFlow:
  * real prepared files: array_record shards of PNG-encoded examples plus
    dataset_info.json, written here exactly as `hscl_jax.prepare` would leave them;
  * `tfds.testing.mock_data` (MockPolicy.USE_FILES, pointed at the metadata),
    which mocks the array_record reader inside `tfds.data_source`.
"""

from __future__ import annotations

import io
import sys
import time

from acceptance import accepted
from array_record.python import array_record_module
import numpy as np
from PIL import Image
import pytest
import tensorflow_datasets as tfds
from tensorflow_datasets.core import naming
from tensorflow_datasets.core import splits as splits_lib

from hscl_jax import data
from hscl_jax.data import tfds_sources

SPLIT_SIZES = {
  'cifar10': {'train': 24, 'test': 10},
  'cifar100': {'train': 12, 'test': 4},
  'stl10': {'train': 8, 'test': 4, 'unlabelled': 6},
}


def fake_image(shape, value):
  return np.full(shape, value % 256, np.uint8)


def png_bytes(image):
  buffer = io.BytesIO()
  Image.fromarray(image).save(buffer, format='PNG')
  return buffer.getvalue()


def fake_example(features, split, index):
  example = {
    'image': png_bytes(fake_image(features['image'].shape, index)),
    'label': index % features['label'].num_classes,
  }
  if 'id' in features:
    example['id'] = f'{split}_{index}'
  return example


def write_prepared(data_dir, name, file_format='array_record', with_records=True):
  """Writes a tiny prepared TFDS dataset; example i has pixels i and label i % classes."""
  builder = tfds.builder(name, data_dir=str(data_dir), file_format=file_format)
  features = builder.info.features
  builder.data_path.mkdir(parents=True, exist_ok=True)
  split_infos = []
  for split, size in SPLIT_SIZES[name].items():
    template = naming.ShardedFileTemplate(
      data_dir=builder.data_path, dataset_name=name, split=split, filetype_suffix=file_format
    )
    if with_records:
      writer = array_record_module.ArrayRecordWriter(
        str(template.sharded_filepath(shard_index=0, num_shards=1)), 'group_size:1'
      )
      for index in range(size):
        writer.write(features.serialize_example(fake_example(features, split, index)))
      writer.close()
    split_infos.append(
      splits_lib.SplitInfo(
        name=split, shard_lengths=[size], num_bytes=0, filename_template=template
      )
    )
  builder.info.set_splits(splits_lib.SplitDict(split_infos))
  builder.info.write_to_directory(builder.data_path)


@pytest.fixture(scope='module')
def prepared_dir(tmp_path_factory):
  data_dir = tmp_path_factory.mktemp('tfds')
  for name in ('cifar10', 'stl10'):
    write_prepared(data_dir, name)
  return str(data_dir)


@pytest.fixture(scope='module')
def metadata_dir(tmp_path_factory):
  """dataset_info.json only (no records): what mock_data's USE_FILES policy reads."""
  data_dir = tmp_path_factory.mktemp('tfds_metadata')
  for name in SPLIT_SIZES:
    write_prepared(data_dir, name, with_records=False)
  return str(data_dir)


def test_reads_prepared_array_record_without_tensorflow(prepared_dir):
  source = data.get_source('cifar10', 'train', data_dir=prepared_dir)
  assert len(source) == 24 and source.num_classes == 10
  for index in (0, 7, 23):
    example = source[index]
    np.testing.assert_array_equal(example['image'], fake_image((32, 32, 3), index))
    assert example['label'] == index % 10
  np.testing.assert_array_equal(source.labels(), np.arange(24) % 10)
  assert 'tensorflow' not in sys.modules
  info = data.dataset_info('cifar10', data_dir=prepared_dir)
  assert info.split_sizes == {'train': 24, 'test': 10} and info.image_shape == (32, 32, 3)


def test_lazy_tfds_sources_and_their_subsets_read_their_labels(prepared_dir):
  """cache_bytes=0 keeps the records on disk: the TFDS source's labels() decodes them,
  a subset's labels() are its examples' labels in its order, unlabelled ones are -1."""
  lazy = data.get_source('cifar10', 'train', data_dir=prepared_dir, cache_bytes=0)
  assert isinstance(lazy, tfds_sources.TfdsSource)
  np.testing.assert_array_equal(lazy.labels(), np.arange(24) % 10)
  subset = data.get_source(
    'cifar10', 'train', data_dir=prepared_dir, num_examples=10, seed=3, cache_bytes=0
  )
  assert isinstance(subset, data.SubsetSource) and len(subset) == 10
  np.testing.assert_array_equal(subset.labels(), [subset[i]['label'] for i in range(10)])
  assert sorted(subset.labels()) == list(range(10))  # one of each class: balanced
  unlabelled = data.get_source('stl10', 'unlabelled', data_dir=prepared_dir, cache_bytes=0)
  assert isinstance(unlabelled, tfds_sources.TfdsSource)
  np.testing.assert_array_equal(unlabelled.labels(), np.full(len(unlabelled), -1))


def test_tfds_loaders_end_to_end(prepared_dir):
  train = data.get_source('cifar10', 'train', data_dir=prepared_dir)
  batch = next(
    data.TrainLoader(
      train,
      global_batch_size=8,
      seed=0,
      shard_index=1,
      shard_count=2,
      positive_mode='label',
      num_threads=2,
    )
  )
  assert batch['image'].shape == (4, 2, 32, 32, 3)
  np.testing.assert_array_equal(batch['image'][:, 1, 0, 0, 0] % 10, batch['label'])
  test = data.get_source('cifar10', 'test', data_dir=prepared_dir)
  batches = list(data.EvalLoader(test, global_batch_size=4, shard_index=0, shard_count=1))
  assert sum(int(b['mask'].sum()) for b in batches) == 10 and len(batches) == 3


def test_stl10_unlabelled_split(prepared_dir):
  unlabelled = data.get_source('stl10', 'unlabelled', data_dir=prepared_dir)
  assert len(unlabelled) == 6 and unlabelled[0]['image'].shape == (96, 96, 3)
  assert unlabelled[3]['label'] == -1 and np.all(unlabelled.labels() == -1)
  # Usable by the unsupervised methods, refused where labels are needed.
  batch = next(
    data.TrainLoader(unlabelled, global_batch_size=4, seed=0, shard_index=0, shard_count=1)
  )
  assert np.all(batch['label'] == -1)
  with pytest.raises(ValueError, match='unlabelled'):
    data.TrainLoader(
      unlabelled, global_batch_size=4, seed=0, shard_index=0, shard_count=1, positive_mode='label'
    )
  info = data.dataset_info('stl10', data_dir=prepared_dir)
  assert info.unlabelled_splits == ('unlabelled',) and info.split_sizes['unlabelled'] == 6


@pytest.mark.parametrize('name', ['cifar10', 'cifar100', 'stl10'])
def test_mock_data_through_tfds_data_source(name, metadata_dir):
  side = 96 if name == 'stl10' else 32
  with tfds.testing.mock_data(
    num_examples=12, policy=tfds.testing.MockPolicy.USE_FILES, data_dir=metadata_dir
  ):
    source = data.get_source(name, 'train', data_dir='/not/used/under/mock')
    assert len(source) == 12
    example = source[5]
    assert example['image'].shape == (side, side, 3) and example['image'].dtype == np.uint8
    assert 0 <= example['label'] < source.num_classes
    loader = data.TrainLoader(
      source,
      global_batch_size=4,
      seed=1,
      shard_index=0,
      shard_count=1,
      positive_mode='label',
      num_threads=2,
    )
    batch = next(loader)
    assert batch['image'].shape == (4, 2, side, side, 3)
    np.testing.assert_array_equal(source.labels()[batch['index']], batch['label'])


def test_not_prepared_fails_fast_with_the_prepare_command(tmp_path):
  start = time.monotonic()
  for call in (
    lambda: data.get_source('cifar100', 'train', data_dir=str(tmp_path)),
    lambda: data.dataset_info('cifar100', data_dir=str(tmp_path)),
  ):
    with pytest.raises(data.DatasetNotPreparedError) as error:
      call()
    message = str(error.value)
    assert f'python -m hscl_jax.prepare --dataset=cifar100 --data_dir={tmp_path}' in message
    assert '--manual_dir' in message and 'cifar-100-binary.tar.gz' in message
  assert time.monotonic() - start < 10
  assert not any(tmp_path.iterdir())  # Nothing was downloaded or created.


def test_every_split_of_each_dataset_is_accepted_up_to_preparation(tmp_path):
  """Each dataset's own splits (written out here) get as far as its prepared files: not
  prepared here, so the prepare command; a refusal of the split name fails an assertion."""
  splits = {
    'cifar10': ('train', 'test'),
    'cifar100': ('train', 'test'),
    'stl10': ('train', 'test', 'unlabelled'),
  }
  for name, names in splits.items():
    for split in names:
      with accepted(f'{name} split {split!r}'), pytest.raises(data.DatasetNotPreparedError):
        data.get_source(name, split, data_dir=str(tmp_path))


def test_tfrecord_preparation_is_rejected(tmp_path):
  write_prepared(tmp_path, 'cifar10', file_format='tfrecord', with_records=False)
  with pytest.raises(data.DatasetNotPreparedError, match='prepared as tfrecord'):
    data.get_source('cifar10', 'test', data_dir=str(tmp_path))
