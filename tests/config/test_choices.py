"""config/choices: the values a field chooses among, declared once in config and read by the
modules that act on them, so a value the config accepts is one its owner builds."""

from __future__ import annotations

import numpy as np
import pytest

from hscl_jax import data
from hscl_jax import errors
from hscl_jax import optimizers
from hscl_jax.config import choices
from hscl_jax.config import fields
from hscl_jax.data import loaders
from hscl_jax.evaluation import retrieval_metrics
from hscl_jax.rundir import checkpoints


def test_each_owner_reads_the_list_the_config_checks_against():
  assert data.DATASETS is choices.DATASETS
  assert loaders.POSITIVE_MODES is choices.POSITIVE_MODES
  assert retrieval_metrics.metric_names is choices.retrieval_metric_names


def test_every_choice_the_config_accepts_is_built_by_its_owner():
  """Each optimizer and schedule the config accepts builds; each dataset has its splits."""
  config = fields.default_config()
  for name in choices.OPTIMIZERS:
    fields.FIELDS['optimizer.name'].check('optimizer.name', name)
    config.optimizer.name = name
    assert optimizers.create_optimizer(config.optimizer, 1e-3).init({}) is not None
  for schedule in choices.LR_SCHEDULES:
    fields.FIELDS['optimizer.schedule'].check('optimizer.schedule', schedule)
    config.optimizer.schedule = schedule
    rate = optimizers.create_learning_rate_schedule(
      config.optimizer, steps_per_epoch=2, total_steps=4
    )
    assert float(rate(0)) == pytest.approx(1e-3)
  assert sorted(data.sources.SPLITS) == sorted(choices.DATASETS)
  with pytest.raises(errors.ConfigError, match=r"^config\.optimizer\.name: unknown value 'sgdw'"):
    fields.FIELDS['optimizer.name'].check('optimizer.name', 'sgdw')


@pytest.mark.parametrize(
  'text, rule',
  [
    ('', None),
    (None, None),
    ('knn_top1', ('knn_top1', 'max')),
    ('train_loss', ('train_loss', 'min')),
    ('loss_hscl:max', ('loss_hscl', 'max')),
    ('map_at_r:min', ('map_at_r', 'min')),
  ],
)
def test_keep_best_reads_as_the_checkpoints_rank_it(text, rule):
  assert choices.keep_best_rule(text) == rule
  kept = checkpoints.KeepBest.parse(text)
  assert (None if kept is None else (kept.metric, kept.mode)) == rule


@pytest.mark.parametrize('text', ['knn_top1:up', ':max', ':'])
def test_a_bad_keep_best_is_one_line_naming_the_fix(text):
  with pytest.raises(errors.ConfigError) as info:
    choices.keep_best_rule(text)
  message = str(info.value)
  assert message.startswith('config.keep_best: ') and '\n' not in message
  assert "Fix: name a figure of metrics.jsonl, e.g. 'knn_top1'" in message


def test_retrieval_metric_names_parse_and_refuse_in_one_place():
  assert choices.retrieval_metric_names(' map_at_r , recall_at_16,map_at_r,') == (
    'map_at_r',
    'recall_at_16',
  )
  assert choices.recall_ks(('recall_at_16', 'precision_at_1', 'recall_at_2')) == (2, 16)
  for bad in ('recall_at_0', 'recall_at_02', 'top1'):
    with pytest.raises(ValueError, match=f'Unknown retrieval metric {bad!r}'):
      choices.retrieval_metric_names(bad)


@pytest.mark.parametrize(
  'value, ok',
  [
    (0, True),
    (4, True),
    (np.int64(4), True),
    (-1, False),
    (np.int64(-1), False),
    (2.0, False),
    (True, False),
  ],
)
def test_samples_per_class_is_a_whole_number_at_least_0(value, ok):
  if ok:
    choices.check_samples_per_class(value)
  else:
    with pytest.raises(errors.ConfigError, match=r'^config\.samples_per_class: must be a whole'):
      choices.check_samples_per_class(value)
