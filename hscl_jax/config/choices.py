"""The values a config field chooses among, declared here and read by the modules that act on
them: the datasets (`data`), the second view's kind (`data/loaders`), the optimizers and
schedules (`optimizers`), the retrieval metrics (`evaluation/retrieval_metrics`), the ways
`keep_best` ranks (`rundir/checkpoints`). So config/fields checks a value against the very
list its owner builds from, and config imports none of them.

Every refusal is one line through `errors.fail`, `config.<field>: <problem>. Fix: <fix>.`
"""

from __future__ import annotations

import numbers

from hscl_jax import errors

DATASETS = ('digits', 'cifar10', 'cifar100', 'stl10', 'image_folder')
POSITIVE_MODES = ('augmentation', 'label')
OPTIMIZERS = ('adam', 'adamw', 'sgd', 'lars')
LR_SCHEDULES = ('constant', 'cosine')
RANKED_RETRIEVAL_METRICS = ('precision_at_1', 'r_precision', 'map_at_r')  # and recall_at_K
KEEP_BEST_MODES = ('max', 'min')


def recall_ks(metrics) -> tuple[int, ...]:
  """The K of the metrics' `recall_at_K`; any other name than the ranked figures refused."""
  ks = []
  for name in metrics:
    head, _, k = name.rpartition('_')
    if head == 'recall_at' and k.isdigit() and k == str(int(k)) and int(k) >= 1:
      ks.append(int(k))
    elif name not in RANKED_RETRIEVAL_METRICS:
      raise ValueError(
        f'Unknown retrieval metric {name!r}: use {", ".join(RANKED_RETRIEVAL_METRICS)} or '
        'recall_at_K with an integer K >= 1.'
      )
  return tuple(sorted(set(ks)))


def retrieval_metric_names(text: str) -> tuple[str, ...]:
  """The metrics of a comma-separated list, e.g. config.knn.retrieval's
  'precision_at_1,map_at_r' (spaces and empty entries ignored: '' names none); an unknown
  name raises ValueError naming it and the known ones."""
  names = tuple(dict.fromkeys(n.strip() for n in str(text).split(',') if n.strip()))
  recall_ks(names)
  return names


# config.keep_best's default: the figure of the run's monitor, which training resolves
# (training/loop.keep_best); read alone it keeps none.
KEEP_BEST_AUTO = 'auto'


def keep_best_rule(text: str | None) -> tuple[str, str] | None:
  """config.keep_best as (figure, mode): '', None or KEEP_BEST_AUTO unresolved keeps no
  best; 'NAME' ranks by that figure, smallest first for a loss (a name with 'loss' in it)
  and largest first for any other; 'NAME:min' or 'NAME:max' say which way."""
  if not text or text == KEEP_BEST_AUTO:  # AUTO: training resolves it (training/loop)
    return None
  metric, _, mode = str(text).partition(':')
  return check_keep_best(metric, mode or ('min' if 'loss' in metric else 'max'))


def check_keep_best(metric: str, mode: str) -> tuple[str, str]:
  if not metric or mode not in KEEP_BEST_MODES:
    errors.fail(
      'keep_best',
      f'{metric}:{mode} is not a figure to rank by',
      "name a figure of metrics.jsonl, e.g. 'knn_top1', with ':min' or ':max' if wanted",
    )
  return metric, mode


def check_samples_per_class(samples_per_class) -> None:
  """The check that needs no data: m is a whole number >= 0. The others need the labels
  (`data.sampling.EpochOrder`), so that a refusal can list the values that pass them all."""
  m = samples_per_class
  if not isinstance(m, numbers.Integral) or isinstance(m, bool) or m < 0:
    errors.fail(
      'samples_per_class',
      f'must be a whole number >= 0, got {m!r}',
      'use 0 (uniform batches, the paper) or e.g. 4 (4 samples of each of batch_size / 4 classes)',
    )
