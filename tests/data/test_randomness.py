"""Randomness that is random: every randomised component's statistical promise, checked
over many seeds and epochs (NumPy only, small sizes, no training).

Each test compares counts with the binomial law a correct implementation gives them,
exactly (two-sided: twice the smaller tail), with a Bonferroni share of ALPHA per count
and per hypothesis example, so a correct implementation fails a test with probability
below ALPHA; the seeds are fixed (hypothesis derandomised), so a run is deterministic.
The mutants each test is for: an order that is not shuffled (the largest classes always
first, the same examples always sitting out, the remainder always to the lowest class
ids, each class's first members), or shuffled once and reused (every epoch, or every
seed, the same).
"""

from __future__ import annotations

import math

from hypothesis import HealthCheck
from hypothesis import Phase
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
import jax
import ml_collections
import numpy as np
from scipy import stats

from hscl_jax import data
from hscl_jax.data import arrays
from hscl_jax.data import loaders
from hscl_jax.evaluation import linear_evaluation

ALPHA = 1e-6  # the chance that a correct implementation fails one of these tests
EXAMPLES = 6  # hypothesis examples per test: each gets ALPHA / EXAMPLES

property_test = settings(
  max_examples=EXAMPLES,
  deadline=None,
  derandomize=True,
  database=None,
  suppress_health_check=[HealthCheck.too_slow],  # a loaded CI machine
  # No shrinking: a smaller example says nothing more about a statistical failure, and
  # each try reruns its hundreds of epochs.
  phases=[Phase.explicit, Phase.generate],
)


def binomial_p(counts, trials, p):
  """Two-sided p-values of counts ~ Binomial(trials, p) (twice the smaller tail, at most 1)."""
  counts, trials, p = np.broadcast_arrays(*map(np.asarray, (counts, trials, p)))
  low, high = stats.binom.cdf(counts, trials, p), stats.binom.sf(counts - 1, trials, p)
  return np.minimum(1.0, 2 * np.minimum(low, high))


class Checks:
  """The binomial checks of one test example, sharing `alpha` between them (Bonferroni)."""

  def __init__(self, alpha: float = ALPHA / EXAMPLES):
    self.alpha, self.pending = alpha, []

  def binomial(self, what, counts, trials, p):
    self.pending.append((what, *np.broadcast_arrays(*map(np.asarray, (counts, trials, p)))))

  def assert_all(self):
    total = sum(counts.size for _, counts, _, _ in self.pending)
    for what, counts, trials, p in self.pending:
      pvalues = binomial_p(counts, trials, p)
      worst = int(np.argmin(pvalues))
      assert pvalues.min() > self.alpha / total, (
        f'{what}: count {counts.flat[worst]} of {trials.flat[worst]} at p = '
        f'{p.flat[worst]:.4g} (expected {trials.flat[worst] * p.flat[worst]:.1f}), two-sided '
        f'p-value {pvalues.min():.2g} <= {self.alpha / total:.2g}'
      )


def first_example_matches(orders_a, orders_b):
  """How often two lists of orders start with the same example (a fresh draw each: about
  1 / N of the time; a draw reused: every time)."""
  return sum(int(a[0] == b[0]) for a, b in zip(orders_a, orders_b))


# Uniform batches: a permutation of (seed, epoch), its remainder dropped.

EPOCHS = 200


@property_test
@given(num_examples=st.integers(12, 40), batch=st.integers(2, 12), seed=st.integers(0, 2**20))
def test_uniform_epochs_shuffle_every_example_alike_each_epoch_and_seed(num_examples, batch, seed):
  order = data.EpochOrder(num_examples, global_batch_size=batch, seed=seed)
  kept = order.steps_per_epoch * batch
  epochs = [order(e) for e in range(EPOCHS)]
  other_seed = data.EpochOrder(num_examples, global_batch_size=batch, seed=seed + 1)
  checks = Checks()
  visited = np.zeros(num_examples, np.int64)
  first_batch, first = np.zeros_like(visited), np.zeros_like(visited)
  for visited_now in epochs:
    visited[visited_now] += 1
    first_batch[visited_now[:batch]] += 1
    first[visited_now[0]] += 1
  sits_out = (num_examples - kept) / num_examples
  checks.binomial('sat out', EPOCHS - visited, EPOCHS, sits_out)
  checks.binomial('in the first batch', first_batch, EPOCHS, batch / num_examples)
  checks.binomial('first of its epoch', first, EPOCHS, 1 / num_examples)
  # Each uniform: the first examples of independent draws agree 1 / N of the time.
  pairs = EPOCHS // 2
  checks.binomial(
    'epochs 2k and 2k+1 start alike',
    first_example_matches(epochs[0::2], epochs[1::2]),
    pairs,
    1 / num_examples,
  )
  checks.binomial(
    'seeds s and s+1 start alike',
    first_example_matches(epochs[:pairs], [other_seed(e) for e in range(pairs)]),
    pairs,
    1 / num_examples,
  )
  checks.assert_all()


# Class-aware batches: built from a packing that uses every group, so each class's share
# of each batch position, and each example's chance to sit out, are known exactly.


def class_aware_case(case_seed: int):
  """(labels, m, batch, classes' groups g, steps T): T batches of G distinct classes,
  class c in g_c of them (every group used: sum g = G T, g_c <= T), n_c = m g_c + r_c
  examples with r_c < m sitting each epoch out. The examples' labels are shuffled."""
  rng = np.random.default_rng(case_seed)
  while True:
    m, per_batch, steps = int(rng.integers(1, 4)), int(rng.integers(2, 4)), int(rng.integers(4, 9))
    num_classes = per_batch + int(rng.integers(1, 4))
    batches = [rng.choice(num_classes, per_batch, replace=False) for _ in range(steps)]
    groups = np.bincount(np.concatenate(batches), minlength=num_classes)
    sizes = m * groups + rng.integers(0, m, num_classes)
    # Every class; none in every batch; two epochs' orders all but never equal by chance.
    if groups.min() >= 1 and groups.max() < steps and same_order_bound(sizes, steps, per_batch):
      break
  labels = rng.permutation(np.repeat(np.arange(num_classes), sizes)).astype(np.int32)
  return labels, m, per_batch * m, groups, steps


def same_order_bound(sizes, steps, per_batch) -> bool:
  """Whether two independent epochs' orders are equal with a chance under 1e-12: their
  batch order, every batch's class order and every class's member order must agree."""
  log_p = -math.lgamma(steps + 1) - steps * math.lgamma(per_batch + 1)
  log_p -= sum(math.lgamma(n + 1) for n in sizes)
  return log_p < math.log(1e-12)


@property_test
@given(case_seed=st.integers(0, 2**20), seed=st.integers(0, 2**20))
def test_class_aware_epochs_shuffle_batches_classes_and_who_sits_out(case_seed, seed):
  labels, m, batch, groups, steps = class_aware_case(case_seed)
  per_batch = batch // m

  def order_of(s):
    return data.EpochOrder(
      len(labels), labels=labels, global_batch_size=batch, seed=s, samples_per_class=m
    )

  order = order_of(seed)
  assert order.steps_per_epoch == steps
  checks = Checks()
  sizes = np.bincount(labels)
  visited = np.zeros(len(labels), np.int64)
  at_first, at_last = np.zeros_like(groups), np.zeros_like(groups)  # class c in batch 0 / T-1
  first_slot = np.zeros_like(groups)  # class c in the first m samples of a batch
  epochs = []
  for epoch in range(EPOCHS):
    visited_now = order(epoch)
    epochs.append(visited_now)
    visited[visited_now] += 1
    slots = labels[visited_now].reshape(steps, per_batch, m)[:, :, 0]
    at_first[slots[0]] += 1
    at_last[slots[-1]] += 1
    np.add.at(first_slot, slots[:, 0], 1)
  # Each example of class c sits out r_c / n_c of the epochs (its class's shuffle is new
  # each epoch: an unshuffled class always leaves out the same r_c).
  sits_out = (sizes - m * groups) / sizes
  checks.binomial('sat out', EPOCHS - visited, EPOCHS, sits_out[labels])
  # The packed batches are shuffled: class c holds batch 0 (and T-1) g_c / T of the time,
  # where unshuffled the classes with the most groups always come first.
  checks.binomial('class in the first batch', at_first, EPOCHS, groups / steps)
  checks.binomial('class in the last batch', at_last, EPOCHS, groups / steps)
  # The classes within a batch are shuffled: each of a batch's G classes comes first 1 / G.
  checks.binomial('class first in its batch', first_slot, EPOCHS * groups, 1 / per_batch)
  checks.assert_all()
  # Another epoch, or another seed, draws anew: equal orders have a chance under 1e-12
  # each (`class_aware_case`), 4e-10 in all.
  other = order_of(seed + 1)
  same_epochs = [e for e in range(1, EPOCHS) if np.array_equal(epochs[e - 1], epochs[e])]
  assert not same_epochs, f'epochs {same_epochs[:5]} repeat the order of the epoch before'
  same_seeds = [e for e in range(EPOCHS) if np.array_equal(epochs[e], other(e))]
  assert not same_seeds, f'seeds {seed} and {seed + 1} give epochs {same_seeds[:5]} alike'


def test_class_aware_packing_draws_which_classes_meet():
  """Ties between classes with as many groups left are broken at random, so which
  classes share a batch is drawn: 4 classes of one group, 2 a batch, make 3 pairings
  alike, and classes 0 and 1 meet in a third of the epochs (not always, as the lowest ids
  first would have it)."""
  labels = np.repeat(np.arange(4), 2).astype(np.int32)
  order = data.EpochOrder(8, labels=labels, global_batch_size=4, seed=3, samples_per_class=2)
  met = 0
  for epoch in range(EPOCHS):
    batches = labels[order(epoch)].reshape(2, 4)
    met += int(any({0, 1} <= set(b.tolist()) for b in batches))
  checks = Checks(ALPHA)
  checks.binomial('classes 0 and 1 in one batch', met, EPOCHS, 1 / 3)
  checks.assert_all()


# The class-balanced subset (config.train_examples) and the seeded train/test split.

SEEDS = 300


def classes_case(case_seed: int, max_classes: int = 6):
  """Shuffled labels of 2..max_classes classes of 3..14 examples."""
  rng = np.random.default_rng(case_seed)
  sizes = rng.integers(3, 15, int(rng.integers(2, max_classes + 1)))
  return rng.permutation(np.repeat(np.arange(len(sizes)), sizes)), rng


@property_test
@given(case_seed=st.integers(0, 2**20))
def test_balanced_subset_draws_each_classes_members_and_the_remainders_classes(case_seed):
  labels, rng = classes_case(case_seed)
  sizes = np.bincount(labels)
  num_classes = len(sizes)
  share = int(rng.integers(1, sizes.min()))  # every class can give share + 1
  extra = int(rng.integers(1, num_classes))  # a remainder: `extra` classes give one more
  num_examples = share * num_classes + extra
  chosen = np.zeros(len(labels), np.int64)
  given_extra = np.zeros(num_classes, np.int64)
  for seed in range(SEEDS):
    subset = data.balanced_subset(labels, num_examples, seed)
    counts = np.bincount(labels[subset], minlength=num_classes)
    assert set(counts.tolist()) <= {share, share + 1} and counts.sum() == num_examples
    chosen[subset] += 1
    given_extra += counts == share + 1
  checks = Checks()
  # The remainder's classes are drawn: each gets the extra one extra / C of the seeds.
  checks.binomial('class given the remainder', given_extra, SEEDS, extra / num_classes)
  # Each class's members are drawn: each member is chosen (share + extra / C) / n_c of them.
  chance = (share + extra / num_classes) / sizes
  checks.binomial('example chosen', chosen, SEEDS, chance[labels])
  checks.assert_all()


@property_test
@given(case_seed=st.integers(0, 2**20))
def test_stratified_split_draws_each_classes_test_examples(case_seed):
  labels, _ = classes_case(case_seed)
  sizes = np.bincount(labels)
  in_test = np.zeros(len(labels), np.int64)
  for seed in range(SEEDS):
    in_test[arrays.stratified_split(labels, seed)['test']] += 1
  num_test = np.round(arrays.TEST_FRACTION * sizes)
  checks = Checks()
  checks.binomial('example in the test split', in_test, SEEDS, (num_test / sizes)[labels])
  checks.assert_all()


@property_test
@given(case_seed=st.integers(0, 2**20), seed=st.integers(0, 2**20))
def test_same_class_partners_are_drawn_anew_each_epoch(case_seed, seed):
  """positive_mode='label': the partner of an example is any other member of its class
  alike (never itself), drawn anew each epoch and for each seed."""
  labels, _ = classes_case(case_seed, max_classes=3)
  partners = loaders.SameClassPartners(labels, seed)
  other_seed = loaders.SameClassPartners(labels, seed + 1)
  sizes = np.bincount(labels)
  checks = Checks()
  for index in range(len(labels)):
    picked = np.array([partners(index, epoch) for epoch in range(EPOCHS)])
    assert (labels[picked] == labels[index]).all() and (picked != index).all()
    counts = np.bincount(picked, minlength=len(labels))
    members = np.flatnonzero((labels == labels[index]) & (np.arange(len(labels)) != index))
    n = sizes[labels[index]]
    checks.binomial('partner', counts[members], EPOCHS, 1 / (n - 1))
    other = [other_seed(index, epoch) for epoch in range(EPOCHS // 2)]
    checks.binomial(
      'seeds s and s+1 pick alike',
      sum(int(a == b) for a, b in zip(picked, other)),
      EPOCHS // 2,
      1 / (n - 1),
    )
  checks.assert_all()


# The linear probe's minibatches: a permutation each epoch, its remainder dropped.


def probe_batches(num_examples: int, batch: int, seed: int, epochs: int) -> list[np.ndarray]:
  """The training examples of each epoch, in the order `linear_evaluation._train_loop` feeds
  them, recorded from its batch function (a 2-feature, 2-class classifier)."""
  cfg = ml_collections.ConfigDict(
    {'batch_size': batch, 'num_epochs': epochs, 'learning_rate': 1e-3, 'weight_decay': 0.0}
  )
  setup = linear_evaluation.LinearSetup(num_classes=2, feature_dim=2, cfg=cfg)
  features = jax.device_put(np.zeros((batch, 2), np.float32))
  labels = jax.device_put(np.zeros(batch, np.int32))
  fed = {}

  def batch_fn(indices, epoch, i):
    fed.setdefault(epoch, []).append(np.asarray(indices))
    return features, labels

  linear_evaluation._train_loop(setup, num_examples, batch_fn, seed)
  return [np.concatenate(fed[e]) for e in sorted(fed)]


def test_linear_probe_minibatches_are_shuffled_every_epoch_and_seed():
  num_examples, batch, epochs = 14, 4, EPOCHS  # 3 batches; 2 examples sit each epoch out
  runs = {seed: probe_batches(num_examples, batch, seed, epochs) for seed in (0, 1)}
  checks = Checks(ALPHA)
  for seed, fed in runs.items():
    assert len(fed) == epochs and all(len(e) == 12 and len(set(e)) == 12 for e in fed)
    visited = np.bincount(np.concatenate(fed), minlength=num_examples)
    first_batch = np.bincount(np.concatenate([e[:batch] for e in fed]), minlength=num_examples)
    checks.binomial(f'seed {seed}: sat out', epochs - visited, epochs, 2 / num_examples)
    checks.binomial(f'seed {seed}: in the first batch', first_batch, epochs, batch / num_examples)
    checks.binomial(
      f'seed {seed}: epochs 2k and 2k+1 start alike',
      first_example_matches(fed[0::2], fed[1::2]),
      epochs // 2,
      1 / num_examples,
    )
  checks.binomial(
    'seeds 0 and 1 start alike', first_example_matches(runs[0], runs[1]), epochs, 1 / num_examples
  )
  checks.assert_all()


# The graph trainer's batches (one stream for every epoch and vmapped encoder) and the
# inspection's seeded batches of the test split.


@property_test
@given(
  sizes=st.lists(st.integers(6, 20), min_size=2, max_size=3),
  batch=st.integers(2, 6),
  seed=st.integers(0, 2**20),
)
def test_graph_epochs_shuffle_each_index_set_anew_every_epoch(sizes, batch, seed):
  """Index sets of `sizes` graphs (the second the first's graphs when as large, as the
  encoders of a cross-validation share graphs): each graph leads its set's epoch and sits
  in its first batch alike, every epoch and every set drawing its own order."""
  from hscl_jax.graphs import train as graph_train

  sets = [np.arange(n) for n in sizes]
  plan = graph_train.epoch_plan(sets, batch, EPOCHS, seed)
  assert len(plan) == EPOCHS and all(len(groups) == len(sets) for groups in plan)
  checks = Checks()
  for k, members in enumerate(sets):
    orders = [np.concatenate(groups[k]) for groups in plan]
    assert all(np.array_equal(np.sort(o), members) for o in orders)  # each graph once
    n = len(members)
    first = np.bincount([o[0] for o in orders], minlength=n)
    first_batch = np.bincount(np.concatenate([o[:batch] for o in orders]), minlength=n)
    checks.binomial(f'set {k}: graph first of its epoch', first, EPOCHS, 1 / n)
    checks.binomial(f'set {k}: graph in the first batch', first_batch, EPOCHS, min(batch, n) / n)
    checks.binomial(
      f'set {k}: epochs 2k and 2k+1 start alike',
      first_example_matches(orders[0::2], orders[1::2]),
      EPOCHS // 2,
      1 / n,
    )
  if sizes[0] == sizes[1]:  # the same graphs: the two sets' orders drawn apart
    checks.binomial(
      'sets 0 and 1 start alike',
      first_example_matches(*([np.concatenate(g[k]) for g in plan] for k in (0, 1))),
      EPOCHS,
      1 / sizes[0],
    )
  checks.assert_all()


def test_inspection_batches_are_a_seeded_shuffle_of_the_test_split():
  """`inspect`'s batches of the test split: each example leads them and fills the first
  batch alike over seeds (a seed's batches are not the split in its stored order)."""
  from hscl_jax.evaluation import inspection

  num_examples, batch = 23, 5
  first = np.zeros(num_examples, np.int64)
  first_batch = np.zeros_like(first)
  for seed in range(SEEDS):
    batches = inspection.seeded_batches(num_examples, batch, seed)
    visited = np.concatenate(batches)
    assert np.array_equal(np.sort(visited), np.arange(num_examples))  # 23 = 4 x 5 + 3
    first[visited[0]] += 1
    first_batch[batches[0]] += 1
  checks = Checks(ALPHA)
  checks.binomial('example first', first, SEEDS, 1 / num_examples)
  checks.binomial('example in the first batch', first_batch, SEEDS, batch / num_examples)
  checks.assert_all()
