"""Semantic mutation operators: the mistakes a person makes, not the ones a typo makes.

cosmic-ray's operators replace an operator, a number, a condition; the bugs that pass a
suite that kills those are of another kind (issue 48): the right input swapped for
another of the same kind, the first taken for the last, randomness that is not random.
These operators make them, as cosmic-ray operators (parso nodes in, parso nodes out), so
that a seeded sample nobody chose includes them (`python dev/mutation_score.py
--operators=semantic ...`, docs/testing.md):

  * ``FirstLast``: `x[0]` <-> `x[-1]` (a subscript that is only that index);
  * ``MinMax``: a call of `min` <-> `max`, `argmin` <-> `argmax`, `nanmin` <-> `nanmax`,
    `amin` <-> `amax` (a builtin, a module's function or a method);
  * ``SortedReversed``: `sorted(...)`'s `reverse=` flipped (`True` <-> `False`, any other
    value negated), or `reverse=True` added where it is absent;
  * ``RandomnessRemoved``: a permutation or a draw replaced by its input or by its first
    elements: `rng.permutation(x)` and `jax.random.permutation(key, x)` by `x` in its own
    order (`arange(x)` for a count), `rng.choice(a, size)` by the first `size` of `a`,
    `random.sample(a, k)` by `a[:k]`, and a `shuffle(x)` statement by `pass`;
  * ``SameKindName``: a name read in a function replaced by another name of the same kind
    that the function also uses (see `same_kind`); an attribute by another attribute of
    the same kind, a string that is an identifier (`'train'`, `'train_examples'`) by
    another such string of the same kind.

The tool registers the provider in cosmic-ray's table of providers in its own process
(`register`): cosmic-ray reads its providers from installed entry points, so a plugin
would have to be an installed distribution, and would then join every cosmic-ray session,
the operator sample's too.
"""

from __future__ import annotations

import re

# The tokens of split names: two names that differ only in one token, both of them here,
# are of the same kind (`train_x` / `test_x`, `train_source` / `eval_source`).
SPLIT_TOKENS = frozenset({'train', 'test', 'eval', 'val', 'valid', 'validation'})
# A count: a name whose first token is one of these (with more after it: `num_classes`,
# `n_views`) or whose last token is one of these (`train_examples`, `sample_count`).
COUNT_FIRST = frozenset({'num', 'n'})
COUNT_LAST = frozenset({'examples', 'count'})

_SWAPS = {
  'min': 'max',
  'max': 'min',
  'argmin': 'argmax',
  'argmax': 'argmin',
  'nanmin': 'nanmax',
  'nanmax': 'nanmin',
  'amin': 'amax',
  'amax': 'amin',
}
_IDENTIFIER = re.compile(r'[A-Za-z_]\w*')


def tokens(name: str) -> tuple[str, ...]:
  """A name's lower-case tokens, split at underscores: `trainExamples` is one token."""
  return tuple(t for t in name.lower().split('_') if t)


def is_count(name: str) -> bool:
  parts = tokens(name)
  return len(parts) > 1 and (parts[0] in COUNT_FIRST or parts[-1] in COUNT_LAST)


def same_kind(a: str, b: str) -> bool:
  """Whether `b` is a plausible slip for `a`: two split names (the same tokens but one,
  which is a split in both: `train_x` / `test_x`) or two counts (`num_classes` /
  `num_examples`, `train_examples` / `n_views`)."""
  if a == b:
    return False
  if is_count(a) and is_count(b):
    return True
  ta, tb = tokens(a), tokens(b)
  differ = [(x, y) for x, y in zip(ta, tb) if x != y]
  return len(ta) == len(tb) and len(differ) == 1 and set(differ[0]) <= SPLIT_TOKENS


def _expression(code: str, prefix: str, parent=None):
  """The parso node of the expression `code`, with `prefix` (the whitespace before it),
  put under `parent` (where it replaces a node)."""
  import parso  # cosmic-ray's parser: imported where a mutant is made, as cosmic-ray is

  node = parso.parse(code).children[0]  # one logical line, no newline: the expression
  node.get_first_leaf().prefix = prefix
  node.parent = parent
  return node


def _is_call(node) -> bool:
  return node is not None and node.type == 'trailer' and node.children[0].value == '('


def _next(node):
  siblings = node.parent.children if node.parent else [node]
  index = siblings.index(node)
  return siblings[index + 1] if index + 1 < len(siblings) else None


def _arguments(call) -> list:
  """The argument nodes of a call trailer `(...)`, in order (keyword ones as `argument`)."""
  inner = call.children[1:-1]
  if not inner:
    return []
  if inner[0].type == 'arglist':
    return [c for c in inner[0].children if c.type != 'operator' or c.value not in (',',)]
  return [inner[0]]


def _is_generator(argument) -> bool:
  return argument.type == 'argument' and any(
    c.type in ('sync_comp_for', 'comp_for') for c in argument.children
  )


def _keyword(argument) -> str | None:
  """`name` of a `name=value` argument, else None (`*args` and `**kwargs` are not)."""
  children = getattr(argument, 'children', ())
  if argument.type == 'argument' and len(children) == 3 and children[1].value == '=':
    return children[0].value
  return None


def _code(node) -> str:
  return node.get_code(include_prefix=False).strip()


class _Operator:
  """cosmic-ray's operator interface: `mutation_positions(node)` yields one (start, end)
  per mutant of the node; `mutate(node, index)` returns the index-th mutant's node."""

  @classmethod
  def arguments(cls):
    return ()

  @classmethod
  def examples(cls):
    return ()  # tests/test_mutation_semantic.py shows each operator's mutants


class FirstLast(_Operator):
  """An index `0` <-> `-1` in a subscript (`x[0]`, `x.shape[0]`, `x[:, -1]`): the first
  element taken for the last and back."""

  def mutation_positions(self, node):
    for element in _indices(node):
      yield element.start_pos, element.end_pos

  def mutate(self, node, index):
    chosen = _indices(node)[index]
    other = '-1' if _code(chosen) == '0' else '0'
    elements = node.children[1].children if _listed(node) else [node.children[1]]
    inner = ''.join(
      chosen.get_first_leaf().prefix + other if e is chosen else e.get_code() for e in elements
    )
    trailer = _expression(f'_[{inner}]', node.get_first_leaf().prefix).children[1]
    trailer.parent = node.parent
    return trailer


def _listed(trailer) -> bool:
  return trailer.children[1].type == 'subscriptlist'


def _indices(node) -> list:
  """The elements of a subscript trailer `[...]` that are the index `0` or `-1`."""
  if node.type != 'trailer' or node.children[0].value != '[' or len(node.children) != 3:
    return []
  elements = node.children[1].children if _listed(node) else [node.children[1]]
  return [e for e in elements if _code(e).replace(' ', '') in ('0', '-1')]


class MinMax(_Operator):
  """A call of `min` for `max`, `argmin` for `argmax` (and `nan`/`a` forms), and back."""

  def mutation_positions(self, node):
    if node.type == 'name' and node.value in _SWAPS and _called(node):
      yield node.start_pos, node.end_pos

  def mutate(self, node, index):
    return _leaf('Name', _SWAPS[node.value], node)


def _called(name) -> bool:
  """Whether the name is called: `max(...)`, or the attribute of `np.max(...)`, `x.max()`."""
  parent = name.parent
  if parent is None:
    return False
  if parent.type == 'atom_expr' and parent.children[0] is name:
    return _is_call(_next(name))
  if parent.type == 'trailer' and parent.children[0].value == '.':
    return _is_call(_next(parent))
  return False


class SortedReversed(_Operator):
  """`sorted(...)` in the other order: `reverse=` flipped, or `reverse=True` added."""

  def mutation_positions(self, node):
    if node.type == 'name' and node.value == 'sorted' and _called(node):
      if node.parent.type == 'atom_expr':  # the builtin, not a method named sorted
        yield node.start_pos, _next(node).end_pos

  def mutate(self, node, index):
    call = _next(node)
    reverse = [a for a in _arguments(call) if _keyword(a) == 'reverse']
    if reverse:
      value = reverse[0].children[2]
      flipped = {'True': 'False', 'False': 'True'}.get(_code(value), f'not ({_code(value)})')
      reverse[0].children[2] = _expression(flipped, value.get_first_leaf().prefix, reverse[0])
      return node
    args = _arguments(call)
    if len(args) == 1 and _is_generator(args[0]):  # sorted(x for x in y): parenthesised
      code = f'(({_code(args[0])})'
    else:
      code = call.get_code(include_prefix=False)[:-1].rstrip()
    comma = '' if code.endswith((',', '(')) else ','
    space = '' if code.endswith('(') else ' '
    new = _expression(f'_{code}{comma}{space}reverse=True)', call.get_first_leaf().prefix)
    new.children[1].parent = call.parent
    # In place: the walk over the parent's children reaches the new call next.
    call.parent.children[call.parent.children.index(call)] = new.children[1]
    return node


# Calls that draw an order or a subset: their last name.
_PERMUTATIONS = frozenset({'permutation', 'permuted'})
_DRAWS = frozenset({'choice', 'sample'})


class RandomnessRemoved(_Operator):
  """A permutation or draw replaced by its input in its own order, or by its first
  elements; a `shuffle(...)` statement removed (made `pass`)."""

  def mutation_positions(self, node):
    if node.type != 'atom_expr':
      return
    for position, child in enumerate(node.children):
      if _random_call(node, position) is not None:
        yield child.start_pos, child.end_pos

  def mutate(self, node, index):
    calls = [p for p in range(len(node.children)) if _random_call(node, p) is not None]
    position = calls[index]
    name = _random_call(node, position)
    prefix = node.get_first_leaf().prefix
    if name == 'shuffle':
      return _leaf('Keyword', 'pass', node)
    callee = ''.join(_code(c) for c in node.children[:position])
    args = _arguments(node.children[position])
    replacement = _unrandom(name, args, _numpy_alias(node, callee))
    rest = ''.join(c.get_code() for c in node.children[position + 1 :])
    return _expression(f'({replacement}){rest}', prefix, node.parent)


def _random_call(atom_expr, position: int) -> str | None:
  """The drawing function's name when children[position] of `atom_expr` is the call
  trailer of a permutation, a draw or a shuffle statement (`rng.shuffle(x)` alone)."""
  call = atom_expr.children[position]
  if position < 1 or not _is_call(call):
    return None
  before = atom_expr.children[position - 1]
  if before.type != 'trailer' or before.children[0].value != '.':
    return None  # a method or a module's function (`rng.choice`), not a name of our own
  name = before.children[1]
  if name.value == 'shuffle':
    statement = atom_expr.parent.type == 'simple_stmt' and position == len(atom_expr.children) - 1
    return 'shuffle' if statement and _arguments(call) else None
  if name.value in _PERMUTATIONS | _DRAWS and _positional(_arguments(call)):
    return name.value
  return None


def _positional(args) -> list:
  return [a for a in args if _keyword(a) is None and a.type != 'argument']


def _unrandom(name: str, args, numpy: str) -> str:
  """The code that stands for the draw without its randomness."""
  positional = _positional(args)
  jax_form = len(positional) >= 2 and name in _PERMUTATIONS  # permutation(key, x)
  source = positional[1] if jax_form else positional[0]
  # Its input in its own order: a count n stands for arange(n), as in numpy and JAX.
  if _is_plain_name(source):
    x = _code(source)
    ordered = f'{numpy}.arange({x}) if {numpy}.ndim({x}) == 0 else {numpy}.asarray({x})'
  else:  # evaluated once
    ordered = (
      f'(lambda x: {numpy}.arange(x) if {numpy}.ndim(x) == 0 else {numpy}.asarray(x))'
      f'({_code(source)})'
    )
  if name in _PERMUTATIONS:
    return ordered
  keywords = {_keyword(a): a.children[2] for a in args if _keyword(a)}
  size = positional[1] if len(positional) > 1 else None  # choice(a, size), sample(a, k)
  size = size or keywords.get('size') or keywords.get('k')
  if name == 'sample':
    whole = f'list({_code(source)})'
    return f'{whole}[: {_code(size)}]' if size is not None else whole
  return f'({ordered})[: {_code(size)}]' if size is not None else f'({ordered})[0]'


def _is_plain_name(node) -> bool:
  return re.fullmatch(r'[\w.]+', _code(node)) is not None


def _numpy_alias(node, callee: str) -> str:
  """The module's name for numpy (jax.numpy for `jax.random` calls), as it imports it;
  `__import__('numpy')` where it imports neither."""
  source = node.get_root_node().get_code()
  wanted = r'jax\.numpy' if callee.startswith(('jax.', 'jr.', 'jrandom.')) else r'numpy'
  match = re.search(rf'^\s*import {wanted} as (\w+)\s*$', source, re.MULTILINE)
  if match:
    return match.group(1)
  if re.search(rf'^\s*import {wanted}\s*$', source, re.MULTILINE):
    return wanted.replace('\\', '')
  return "__import__('jax').numpy" if 'jax' in wanted else "__import__('numpy')"


class SameKindName(_Operator):
  """A name read in a function replaced by another name of the same kind that the same
  function uses (`same_kind`): a split for a split, a count for a count. Attributes are
  replaced by attributes, identifier strings (`'train'`) by identifier strings."""

  def __init__(self):
    self._scopes: dict[int, tuple[object, dict]] = {}

  def mutation_positions(self, node):
    for _ in self._partners(node):
      yield node.start_pos, node.end_pos

  def mutate(self, node, index):
    other = self._partners(node)[index]
    if node.type == 'string':
      quote = node.value[-1]
      return _leaf('String', f'{quote}{other}{quote}', node)
    return _leaf('Name', other, node)

  def _partners(self, node) -> list[str]:
    role = _role(node)
    if role is None:
      return []
    value = _text(node)
    names = self._names(_scope(node)).get(role, ())
    return [other for other in names if same_kind(value, other)]

  def _names(self, scope) -> dict[str, list[str]]:
    """{role: the sorted names of that role the scope uses}, read once per scope."""
    cached = self._scopes.get(id(scope))
    if cached is None or cached[0] is not scope:
      found: dict[str, set[str]] = {}
      for leaf in _leaves(scope):
        role = _role(leaf, reads_only=False)
        if role is not None and _scope(leaf) is scope:
          found.setdefault(role, set()).add(_text(leaf))
      cached = (scope, {role: sorted(names) for role, names in found.items()})
      self._scopes[id(scope)] = cached
    return cached[1]


def _leaf(kind: str, value: str, node):
  """A parso leaf of `kind` ('Name', 'String', 'Keyword') with `value` in the place of
  `node`."""
  from parso.python import tree

  leaf = getattr(tree, kind)(value, node.start_pos, node.get_first_leaf().prefix)
  leaf.parent = node.parent
  return leaf


def _leaves(node):
  leaf = node.get_first_leaf()
  last = node.get_last_leaf()
  while leaf is not None:
    yield leaf
    if leaf is last:
      return
    leaf = leaf.get_next_leaf()


def _scope(node):
  """The innermost function (or the module) holding the node; lambdas and comprehensions
  belong to the function around them."""
  scope = node.parent
  while scope is not None and scope.type not in ('funcdef', 'file_input'):
    scope = scope.parent
  return scope if scope is not None else node


def _text(leaf) -> str:
  return leaf.value[1:-1] if leaf.type == 'string' else leaf.value


def _role(leaf, reads_only: bool = True) -> str | None:
  """'name', 'attribute' or 'string' for a leaf the operator may replace (with
  `reads_only`: not a definition, a keyword argument's name, a `def`'s or `import`'s); or
  for a leaf whose name counts among the scope's (without)."""
  if leaf.type == 'string':
    plain = re.fullmatch(r"('|\")([A-Za-z_]\w*)\1", leaf.value)  # no prefix, no f-string
    return 'string' if plain and leaf.parent.type != 'fstring' else None
  if leaf.type != 'name' or leaf.value in _KEYWORDS:
    return None
  parent = leaf.parent
  if parent.type == 'trailer' and parent.children[0].value == '.':
    role = 'attribute'
  elif parent.type == 'argument' and parent.children[0] is leaf and _keyword(parent):
    return None  # f(name=...): the callee's parameter, not a name of this scope
  else:
    role = 'name'
  if reads_only and (leaf.is_definition() or parent.type in _NOT_READ):
    return None
  return role


_KEYWORDS = frozenset({'self', 'cls'})
_NOT_READ = frozenset({'import_from', 'import_name', 'dotted_name', 'import_as_name'})
_NOT_READ |= {'global_stmt', 'nonlocal_stmt', 'funcdef', 'classdef', 'param', 'del_stmt'}


class SemanticProvider:
  """cosmic-ray's operator-provider protocol: iterate the names, index the classes."""

  OPERATORS = {
    cls.__name__: cls
    for cls in (FirstLast, MinMax, SortedReversed, RandomnessRemoved, SameKindName)
  }

  def __iter__(self):
    return iter(self.OPERATORS)

  def __getitem__(self, name):
    return self.OPERATORS[name]


PROVIDER = 'semantic'


def register() -> None:
  """Make `semantic/<Operator>` names known to cosmic-ray in this process (how it looks an
  operator up to plant a mutant); `only` chooses which providers a new session lists."""
  from cosmic_ray import plugins

  plugins.OPERATOR_PROVIDERS.setdefault(PROVIDER, SemanticProvider())


class only:
  """`with only('semantic'):` cosmic-ray's `init` lists that provider's mutants alone."""

  def __init__(self, provider: str):
    self.provider = provider

  def __enter__(self):
    from cosmic_ray import plugins

    register()
    self.saved = dict(plugins.OPERATOR_PROVIDERS)
    plugins.OPERATOR_PROVIDERS.clear()
    plugins.OPERATOR_PROVIDERS[self.provider] = self.saved[self.provider]

  def __exit__(self, *exc):
    from cosmic_ray import plugins

    plugins.OPERATOR_PROVIDERS.clear()
    plugins.OPERATOR_PROVIDERS.update(self.saved)
