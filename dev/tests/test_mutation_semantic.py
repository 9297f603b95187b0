"""dev/mutation/semantic.py: each semantic operator makes exactly the mutants it is for on a
small source (and none on its look-alikes), each mutant compiles, the randomness removed
computes its input in its own order, the same-kind rule, and the tool keeps the semantic
sessions apart from the operator sample's."""

from __future__ import annotations

import difflib
import pathlib
import random
import sys

import numpy as np
import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / 'dev'))
from mutation import score
from mutation import semantic

pytest.importorskip('cosmic_ray')  # the [mutation] extra: cosmic-ray and its parser, parso


def mutants(operator: type, source: str) -> list[str]:
  """Every mutant `operator` makes of `source`, in cosmic-ray's order of occurrence."""
  from cosmic_ray.ast import ast_nodes
  from cosmic_ray.ast import get_ast
  from cosmic_ray.mutating import mutate_code

  count = sum(1 for node in ast_nodes(get_ast(source)) for _ in operator().mutation_positions(node))
  made = [mutate_code(source, operator(), i) for i in range(count)]
  for mutant in made:
    compile(mutant, 'mutant.py', 'exec')  # no syntax error
  return made


def changes(operator: type, source: str) -> list[tuple[str, str]]:
  """(original line, mutated line) of each mutant, stripped."""
  pairs = []
  for mutant in mutants(operator, source):
    diff = difflib.unified_diff(source.splitlines(), mutant.splitlines(), lineterm='', n=0)
    lines = [line for line in diff if line[:3] not in ('---', '+++', '@@ ')]
    assert len(lines) == 2, lines  # one line changed
    pairs.append((lines[0][1:].strip(), lines[1][1:].strip()))
  return pairs


def test_first_last_swaps_an_index_0_and_minus_1_and_nothing_else():
  source = (
    'def f(a, *, b, **c):\n'
    '  x = [0] + a[0] + a.shape[-1] + a[:, 0] + a[1] + a[0:1] + a[-2] + g(*a)[b]\n'
  )
  line = source.splitlines()[1].strip()
  assert [after for _, after in changes(semantic.FirstLast, source)] == [
    line.replace('a[0]', 'a[-1]'),
    line.replace('a.shape[-1]', 'a.shape[0]'),
    line.replace('a[:, 0]', 'a[:, -1]'),
  ]  # not the list [0], a[1], the slice a[0:1], a[-2], nor the stars


def test_min_max_swaps_the_called_function_or_method():
  source = (
    'def f(a, b):\n'
    '  x = np.min(a) + max(a, b) + a.argmax(1) + jnp.nanmin(a)\n'
    '  y = g(np.max, min=1) + a.minimum(b) + self.max\n'
    'def max(a):\n'
    '  return a\n'
  )
  line = source.splitlines()[1].strip()
  assert changes(semantic.MinMax, source) == [
    (line, line.replace('np.min', 'np.max')),
    (line, line.replace('max(a, b)', 'min(a, b)')),
    (line, line.replace('argmax', 'argmin')),
    (line, line.replace('nanmin', 'nanmax')),
  ]  # not an uncalled np.max, a keyword min=, minimum, an attribute, a def


def test_sorted_reversed_flips_or_adds_reverse():
  source = (
    'def f(a, flag):\n'
    '  x = sorted(a) + sorted(a, key=len, reverse=True) + sorted(a, reverse=flag)\n'
    '  y = sorted(v for v in a)\n'
    '  z = np.sort(a) + a.sort() + a.sorted()\n'
  )
  lines = [line.strip() for line in source.splitlines()]
  assert [after for _, after in changes(semantic.SortedReversed, source)] == [
    lines[1].replace('sorted(a)', 'sorted(a, reverse=True)'),
    lines[1].replace('reverse=True', 'reverse=False'),
    lines[1].replace('reverse=flag', 'reverse=not (flag)'),
    'y = sorted((v for v in a), reverse=True)',  # a bare generator must be parenthesised
  ]


_RANDOM = """import numpy as np

def f(rng, a, n, k):
  rng.shuffle(list(a))
  order = rng.permutation(n)
  pick = rng.choice(a, k, replace=False)
  taken = rng.permutation(np.asarray(a))[:k]
  sampled = random.sample(a, k)
  draw = rng.shuffle
  mine = choice(a)
  return order, pick, taken
"""


def test_randomness_removed_replaces_each_draw_by_its_input_in_order():
  made = changes(semantic.RandomnessRemoved, _RANDOM)
  assert made == [
    ('rng.shuffle(list(a))', 'pass'),
    ('order = rng.permutation(n)', 'order = (np.arange(n) if np.ndim(n) == 0 else np.asarray(n))'),
    (
      'pick = rng.choice(a, k, replace=False)',
      'pick = ((np.arange(a) if np.ndim(a) == 0 else np.asarray(a))[: k])',
    ),
    (
      'taken = rng.permutation(np.asarray(a))[:k]',
      'taken = ((lambda x: np.arange(x) if np.ndim(x) == 0 else np.asarray(x))(np.asarray(a)))[:k]',
    ),
    ('sampled = random.sample(a, k)', 'sampled = (list(a)[: k])'),
  ]  # not an uncalled rng.shuffle, nor a function of the module's own named choice


def test_the_randomness_removed_computes_the_input_in_its_own_order():
  """Run: the original draws; each mutant gives a count's arange and an array's first
  elements, whatever the generator."""
  a, rng = [5, 3, 8, 1, 9, 7], np.random.default_rng(0)
  scope = {'random': random, 'choice': len}
  exec(_RANDOM, scope)
  order, pick, taken = scope['f'](rng, list(a), 6, 2)
  assert sorted(order) == list(range(6)) and set(pick) <= set(a) and len(taken) == 2
  outputs = []
  for mutant in mutants(semantic.RandomnessRemoved, _RANDOM)[1:4]:
    scope = {'random': random, 'choice': len}
    exec(mutant, scope)
    outputs.append(scope['f'](np.random.default_rng(1), list(a), 6, 2))
  assert list(outputs[0][0]) == list(range(6))  # permutation(n) -> arange(n)
  assert list(outputs[1][1]) == a[:2]  # choice(a, k) -> a[:k]
  assert list(outputs[2][2]) == a[:2]  # permutation(a)[:k] -> a[:k]


def test_jax_permutation_keeps_its_key_out_and_uses_jax_numpy():
  source = 'import jax.numpy as jnp\n\ndef f(key, x):\n  return jax.random.permutation(key, x)\n'
  assert changes(semantic.RandomnessRemoved, source) == [
    (
      'return jax.random.permutation(key, x)',
      'return (jnp.arange(x) if jnp.ndim(x) == 0 else jnp.asarray(x))',
    )
  ]


@pytest.mark.parametrize(
  'a,b,same',
  [
    ('train_x', 'test_x', True),  # one token apart, both splits
    ('train_source', 'eval_source', True),
    ('train', 'val', True),
    ('train_x', 'test_y', False),  # two tokens apart
    ('train_x', 'bank_x', False),  # bank is no split
    ('num_classes', 'num_examples', True),  # two counts
    ('train_examples', 'n_views', True),
    ('sample_count', 'num_steps', True),
    ('num', 'n', False),  # a lone prefix is no count
    ('num_classes', 'batch_size', False),
    ('train_x', 'train_x', False),
  ],
)
def test_same_kind_is_one_split_token_apart_or_two_counts(a, b, same):
  assert semantic.same_kind(a, b) == semantic.same_kind(b, a) == same


def test_same_kind_name_replaces_reads_by_names_of_the_same_kind_in_the_function():
  source = (
    'def f(train_source, eval_source, num_classes, num_examples, batch_size):\n'
    "  x = load(train_source, split='train', n=batch_size)\n"
    "  y = load(eval_source, split='test')\n"
    '  return x.num_examples + num_classes\n'
    'def g(train_x):\n'
    '  return train_x + test_x + num_classes\n'
  )
  assert [after for _, after in changes(semantic.SameKindName, source)] == [
    "x = load(eval_source, split='train', n=batch_size)",
    "x = load(train_source, split='test', n=batch_size)",
    "y = load(train_source, split='test')",
    "y = load(eval_source, split='train')",
    'return x.num_examples + num_examples',  # the attribute has no partner attribute
    'return test_x + test_x + num_classes',  # g's names only: num_classes is f's
    'return train_x + train_x + num_classes',
  ]  # never a parameter, a keyword's name (split=, n=) or batch_size (no count)


def test_semantic_and_operator_sessions_are_kept_apart(tmp_path, monkeypatch):
  """Each lists its own provider's mutants alone, in a file of its own; opening one leaves
  the other as it was."""
  from cosmic_ray.work_db import WorkDB
  from cosmic_ray.work_db import use_db

  module = 'hscl_jax/fixture.py'
  (tmp_path / 'hscl_jax').mkdir()
  (tmp_path / module).write_text('def f(a, train_x, test_x):\n  return a[0] + min(a) + train_x\n')
  monkeypatch.setattr(score, 'ROOT', tmp_path)
  monkeypatch.setattr(score, 'SESSIONS', tmp_path / 'sessions')
  monkeypatch.setitem(score.TESTS_OF, module, ('tests/test_fixture.py',))
  core = score.open_session(module, 100, 0)
  stamp = core.with_suffix('.json').read_text()
  ours = score.open_session(module, 100, 0, 'semantic')
  assert core != ours and core.name == 'hscl_jax__fixture.py.seed0.n100.sqlite'
  assert ours.name == 'hscl_jax__fixture.py.semantic.seed0.n100.sqlite'
  assert (
    score.open_session(module, 100, 0) == core and core.with_suffix('.json').read_text() == stamp
  )

  def operators(path):
    with use_db(str(path), mode=WorkDB.Mode.open) as db:
      return sorted(item.mutations[0].operator_name for item in db.work_items)

  assert operators(ours) == ['semantic/FirstLast', 'semantic/MinMax', 'semantic/SameKindName']
  assert operators(core) and all(name.startswith('core/') for name in operators(core))
