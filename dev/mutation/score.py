"""A sampled mutation score from cosmic-ray's mutants: how many realistic bugs nobody chose
does a module's suite catch?

cosmic-ray (the `[mutation]` extra) lists every mutant of a module (an operator replaced,
a comparison flipped, a number changed, a condition negated, a loop skipped, a decorator
removed...). This script draws a seeded random sample of them per module, plants each, one
at a time, in a copy of the working tree (the real files are never touched; cosmic-ray
restores the file after each), runs that module's tests that execute the mutated statement
(`tests_for`: by the measured maps, else the module's test files, `TESTS_OF`) in a fresh
`python -m pytest -n 0 -x` process with PYTHONPATH on the copy,
so the mutated file and not the editable install is imported, and classifies the result:

  * ``assertion``: a test failed on an assertion about the behaviour (AssertionError,
    `Failed: DID NOT RAISE`, a regex mismatch), read from pytest's short summary;
  * ``crash``: killed, but by another exception (a fixture, an import, a TypeError...).
    With -x the first failing test decides, and which test fails first is an accident of
    the files' order: so a crash is run again with every test (no -x), and is an
    ``assertion`` kill if any test fails on an assertion, a crash only if none does;
  * ``timeout``: the tests ran past 3x their unmutated time plus 60 s (killed by cosmic-ray);
  * ``survived``: every test passed; ``equivalent`` if dev/mutation/equivalents.toml lists
    it, by hand, with the reason it cannot change behaviour (a listed mutant that is killed
    keeps its kill, and its line and the report say so: either the reason is wrong or a
    test fails without the mutant, as one did that depended on the tests' order);
  * ``not viable``: a crash that cannot run on the values it meets, so that no test can see
    it behave differently: its TypeError is raised by the mutated statement itself (`float
    << int`), or its run with every test failed every test that executes the mutated
    statement (`measure_reach`: which tests execute which line, measured under coverage
    once per set of test files), none on a refusal of the package's own (a `raise` in
    hscl_jax/: a mutant that refuses valid input is behaviour, seen by a test of the bound)
    and none from code run outside a test (a subprocess, collection), which cannot be
    attributed.

The score is the assertion kills over the sampled mutants less the equivalent and not
viable ones; crashes and timeouts are not counted as kills there (``detected`` counts
them). Mutants inside type annotations are never drawn (every module has `from __future__
import annotations`: they are strings nobody reads), nor those of a `*` that is no
operator (a keyword-only marker, `*args`, unpacking).

Sessions are cosmic-ray's sqlite files in .mutation_sessions/ (one per module, seed and
sample size): a run that stops continues where it stopped; a module or test file that
changed since (or DRAW_VERSION) starts its session again; after tests were only added,
`--restamp` keeps its results instead (it refuses where more changed).

    python dev/mutation_score.py hscl_jax/evaluation/knn.py --sample 25 --seed 0
    python dev/mutation_score.py --all --sample 200 --seed 0   # over hscl_jax/, by lines
    python dev/mutation_score.py --all --sample 200 --plan     # its mutants per module
    python dev/mutation_score.py --all --sample 200 --recheck  # after new tests
    python dev/mutation_score.py --all --sample 200 --restamp  # keep results: tests added
    python dev/mutation_score.py --all --sample 200 --report   # the stored table
    python dev/mutation_score.py --operators=semantic --all --sample 200 --seed 0

`--operators=semantic` samples the semantic operators' mutants instead (semantic.py: the
first for the last, randomness removed, a name for another of the same kind), in sessions
of their own.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import hashlib
import io
import json
import os
import pathlib
import random
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import tokenize
import tomllib

from mutation import coverage_map
from mutation import handwritten  # its tree copy and its assertion/crash classifier
from mutation import semantic

ROOT = pathlib.Path(__file__).resolve().parents[2]

EQUIVALENTS = pathlib.Path(__file__).with_name('equivalents.toml')
# Raise it when a change here changes which mutants are drawn or how they run: every
# session then starts again.
DRAW_VERSION = 4
SESSIONS = ROOT / '.mutation_sessions'

_DATA = ('tests/test_data_sources.py', 'tests/test_data_loaders.py')
_ENTRY = 'tests/test_entry_points.py'  # a program's argv check and its thinness
_LOSSES = ('tests/test_losses.py', 'tests/test_loss_properties.py', 'tests/test_losses_queue.py')
# Modules split from one keep the original's files (hscl_jax/train.py, models.py,
# linear_probe.py, experiments/image_grid.py): each part's own are not told apart yet.
_TRAIN = (
  'tests/test_train.py',
  'tests/test_train_wiring.py',
  'tests/test_queue_training.py',  # the queue's and key encoder's steps and log lines
)
_MODELS = ('tests/test_models.py', 'tests/test_configs.py')  # test_configs: its checks' bounds
_LINEAR_PROBE = ('tests/test_linear_eval.py', 'tests/test_randomness.py')
_IMAGE_GRID = (
  'tests/test_compare.py',
  'tests/test_compare_paired.py',
  'tests/test_compare_densities.py',
  'tests/test_compare_budgets.py',
  'tests/test_run_records.py',
)
# A unit package's __init__: a docstring that imports nothing (tests/test_layout.py checks).
_LAYOUT = 'tests/test_layout.py'
# Each measured module -> the test files written for it, by hand (whole files, never a -k
# chosen for a mutant). TESTS_OF adds the files the measured map (coverage_map.py) finds
# executing the module; tests/test_mutation_score.py checks that the two agree.
HAND_TESTS_OF = {
  'hscl_jax/__init__.py': ('tests/test_package.py',),
  'hscl_jax/config/__init__.py': (_LAYOUT,),
  'hscl_jax/config/methods.py': ('tests/test_methods.py', *_TRAIN, 'tests/test_inspect.py'),
  'hscl_jax/config/checks.py': ('tests/test_configs.py', 'tests/test_config_properties.py'),
  'hscl_jax/config/fields.py': (
    'tests/test_config_fields.py',
    'tests/test_configs.py',
    'tests/test_stored_config.py',  # which fields are free on resume
  ),
  'hscl_jax/config/command_line.py': ('tests/test_configs.py', 'tests/test_entry_points.py'),
  'hscl_jax/config/schema.py': ('tests/test_configs.py', 'tests/test_config_properties.py'),
  'hscl_jax/data/__init__.py': _DATA,
  'hscl_jax/data/arrays.py': (*_DATA, 'tests/test_randomness.py'),
  'hscl_jax/data/augment.py': ('tests/test_augment.py',),
  'hscl_jax/data/image_ops.py': ('tests/test_augment.py',),
  'hscl_jax/data/errors.py': ('tests/test_prepare.py', 'tests/test_data_sources.py'),
  'hscl_jax/data/image_folder.py': ('tests/test_data_sources.py', 'tests/test_tiny_imagenet.py'),
  'hscl_jax/data/loaders.py': (*_DATA, 'tests/test_class_aware.py', 'tests/test_randomness.py'),
  'hscl_jax/data/sampling.py': (*_DATA, 'tests/test_class_aware.py', 'tests/test_randomness.py'),
  'hscl_jax/data/sources.py': ('tests/test_data_sources.py', 'tests/test_data_tfds.py'),
  'hscl_jax/data/tfds_prepare.py': ('tests/test_prepare.py', 'tests/test_prepare_offline.py'),
  'hscl_jax/data/tfds_sources.py': ('tests/test_data_tfds.py',),
  'hscl_jax/embed.py': ('tests/test_embed.py', _ENTRY),
  'hscl_jax/errors.py': ('tests/test_errors.py', 'tests/test_main_errors.py'),
  'hscl_jax/evaluation/__init__.py': (_LAYOUT,),
  'hscl_jax/evaluation/embedding.py': ('tests/test_embed.py',),
  'hscl_jax/evaluation/features.py': ('tests/test_knn.py', 'tests/test_embed.py'),
  'hscl_jax/evaluation/figures.py': ('tests/test_inspect.py', 'tests/test_figures.py'),
  'hscl_jax/evaluation/hard_negatives.py': ('tests/test_inspect.py',),
  'hscl_jax/evaluation/inspection.py': ('tests/test_inspect.py',),
  'hscl_jax/evaluation/knn.py': ('tests/test_knn.py',),
  'hscl_jax/evaluation/linear_probe.py': _LINEAR_PROBE,
  'hscl_jax/evaluation/retrieval.py': ('tests/test_retrieval.py',),
  'hscl_jax/evaluation/trained_retrieval.py': ('tests/test_trained_retrieval.py',),
  'hscl_jax/evaluation/torch_export.py': (
    'tests/test_torch_export_errors.py',
    'tests/test_torch_export.py',
  ),
  'hscl_jax/experiments/__init__.py': ('tests/test_compare.py',),
  'hscl_jax/experiments/compare.py': (
    'tests/test_compare.py',
    'tests/test_compare_paired.py',
    _ENTRY,
  ),
  'hscl_jax/experiments/budget_grid.py': ('tests/test_compare_budgets.py',),
  'hscl_jax/experiments/compare_budgets.py': ('tests/test_compare_budgets.py', _ENTRY),
  'hscl_jax/experiments/compare_densities.py': ('tests/test_compare_densities.py', _ENTRY),
  'hscl_jax/experiments/compare_graphs.py': (_ENTRY,),
  'hscl_jax/experiments/density_grid.py': ('tests/test_compare_densities.py',),
  'hscl_jax/experiments/graph_grid.py': ('tests/test_graphs.py',),
  'hscl_jax/experiments/image_batches.py': _IMAGE_GRID,
  'hscl_jax/experiments/image_grid.py': _IMAGE_GRID,
  'hscl_jax/experiments/image_pairs.py': _IMAGE_GRID,
  'hscl_jax/experiments/image_plots.py': _IMAGE_GRID,
  'hscl_jax/experiments/image_report.py': _IMAGE_GRID,
  'hscl_jax/experiments/image_runs.py': _IMAGE_GRID,
  'hscl_jax/experiments/raw_pixels.py': _IMAGE_GRID,
  'hscl_jax/experiments/run_records.py': ('tests/test_run_records.py',),
  'hscl_jax/experiments/significance.py': (
    'tests/test_significance.py',
    'tests/test_compare_paired.py',
    'tests/test_compare_densities.py',
    'tests/test_compare_budgets.py',
  ),
  'hscl_jax/experiments/sweep.py': (
    'tests/test_compare_densities.py',
    'tests/test_compare_budgets.py',
  ),
  'hscl_jax/export.py': ('tests/test_torch_export_errors.py', 'tests/test_torch_export.py', _ENTRY),
  'hscl_jax/graphs/__init__.py': ('tests/test_graphs.py',),
  'hscl_jax/graphs/__main__.py': ('tests/test_graphs.py', _ENTRY),
  'hscl_jax/graphs/data.py': ('tests/test_graphs.py',),
  'hscl_jax/graphs/evaluate.py': ('tests/test_graphs.py',),
  'hscl_jax/graphs/model.py': ('tests/test_graphs.py',),
  'hscl_jax/graphs/prepare.py': ('tests/test_graphs.py',),
  'hscl_jax/graphs/train.py': ('tests/test_graphs.py', 'tests/test_randomness.py'),
  'hscl_jax/inspect.py': ('tests/test_inspect.py', _ENTRY),
  'hscl_jax/linear_eval.py': ('tests/test_linear_eval.py', 'tests/test_main_errors.py', _ENTRY),
  'hscl_jax/losses/__init__.py': _LOSSES,
  'hscl_jax/losses/diagnostics.py': ('tests/test_losses.py',),
  'hscl_jax/losses/graph.py': ('tests/test_graph_loss.py',),
  'hscl_jax/losses/image.py': _LOSSES,
  'hscl_jax/losses/kernel.py': _LOSSES,
  'hscl_jax/main.py': ('tests/test_main_errors.py', _ENTRY),
  'hscl_jax/models/__init__.py': _MODELS,
  'hscl_jax/models/backbones.py': _MODELS,
  'hscl_jax/models/factory.py': _MODELS,
  'hscl_jax/models/heads.py': _MODELS,
  'hscl_jax/models/layers.py': _MODELS,
  'hscl_jax/models/resnet.py': _MODELS,
  'hscl_jax/models/small_cnn.py': _MODELS,
  'hscl_jax/parallel.py': ('tests/test_train_wiring.py', 'tests/test_knn.py'),
  'hscl_jax/prepare.py': ('tests/test_prepare.py', 'tests/test_prepare_offline.py', _ENTRY),
  'hscl_jax/retrieval.py': ('tests/test_trained_retrieval.py', _ENTRY),
  'hscl_jax/rundir/__init__.py': (_LAYOUT,),
  'hscl_jax/rundir/checkpoints.py': ('tests/test_errors.py', 'tests/test_train.py'),
  'hscl_jax/rundir/atomic.py': ('tests/test_atomic.py',),
  'hscl_jax/rundir/layout.py': (
    'tests/test_workdir_lock.py',
    'tests/test_train.py',
    'tests/test_atomic.py',
  ),
  'hscl_jax/rundir/lock.py': ('tests/test_workdir_lock.py',),
  'hscl_jax/rundir/versions.py': ('tests/test_versions.py',),
  'hscl_jax/rundir/metrics.py': ('tests/test_metrics.py', 'tests/test_stored_config.py'),
  'hscl_jax/rundir/resume.py': (*_TRAIN, 'tests/test_versions.py'),
  'hscl_jax/rundir/timing.py': _TRAIN,
  'hscl_jax/rundir/progress.py': ('tests/test_progress.py',),
  'hscl_jax/rundir/stored_config.py': ('tests/test_stored_config.py',),
  'hscl_jax/rundir/trained_run.py': (*_LINEAR_PROBE, 'tests/test_best_checkpoint.py'),
  'hscl_jax/testing.py': ('tests/test_testing.py',),
  'hscl_jax/training/__init__.py': (_LAYOUT,),
  'hscl_jax/training/distributed.py': ('tests/test_multiprocess.py',),
  'hscl_jax/training/gradcache.py': ('tests/test_gradcache.py',),
  'hscl_jax/training/loop.py': (
    *_TRAIN,
    'tests/test_multiprocess.py',  # its multi-process paths, in the processes it starts
    'tests/test_prepare_offline.py',  # a run on prepared data (with TensorFlow only)
  ),
  'hscl_jax/training/optimizers.py': ('tests/test_optim.py',),
  'hscl_jax/training/plan.py': _TRAIN,
  'hscl_jax/training/preemption.py': _TRAIN,
  'hscl_jax/training/probe.py': ('tests/test_probe.py',),
  'hscl_jax/training/profiling.py': _TRAIN,
  'hscl_jax/training/queue.py': ('tests/test_queue_training.py',),
  'hscl_jax/training/state.py': _TRAIN,
  'hscl_jax/training/step.py': _TRAIN,
  'hscl_jax/training/summaries.py': _TRAIN,
  # The code outside the package that spends GPU time (issue 48 item 3).
  'benchmarks/accelerator.py': ('tests/test_benchmarks.py',),
  'benchmarks/torch_reference.py': ('tests/test_benchmarks.py',),
  'tools/first_light.py': ('tests/test_first_light.py', 'tests/test_benchmarks.py'),
  'tools/gpu_bundle.py': ('tests/test_gpu_bundle.py', 'tests/test_benchmarks.py'),
}
# The measured map: {module: {'sha256': ..., 'tests': {test file: the lines it executes}}}.
MEASURED = coverage_map.load()
# The map by test, where measured here (not committed): each test's lines and seconds.
MEASURED_TESTS = coverage_map.load_tests()
# Hand-listed test files the measured map cannot credit, and why: a program the file starts
# (a subprocess: coverage sees it run, but in no test's context) or what the module makes
# at import (outside any test). tests/test_entry_points.py runs every program. A module no
# test's context reaches at all needs no entry: its hand-listed files must name it (the
# test of the map checks), and its mutants run all of them.
_STARTS_PROGRAMS = 'tests/test_main_errors.py'  # the programs' one-line errors
UNCREDITED = {
  **{m: (_ENTRY,) for m, files in HAND_TESTS_OF.items() if _ENTRY in files},
  'hscl_jax/__init__.py': ('tests/test_package.py',),  # imports it in fresh interpreters
  'hscl_jax/data/errors.py': ('tests/test_prepare.py', 'tests/test_data_sources.py'),  # classes
  # Its lazy attributes run once per process: credited to whichever test asks first.
  'hscl_jax/data/__init__.py': _DATA,
  'hscl_jax/data/tfds_prepare.py': ('tests/test_prepare_offline.py',),  # without TensorFlow
  'hscl_jax/errors.py': (_STARTS_PROGRAMS,),
  'hscl_jax/linear_eval.py': (_STARTS_PROGRAMS, _ENTRY),
  'hscl_jax/main.py': (_STARTS_PROGRAMS, _ENTRY),
  'hscl_jax/prepare.py': ('tests/test_prepare.py', 'tests/test_prepare_offline.py', _ENTRY),
  'hscl_jax/retrieval.py': ('tests/test_trained_retrieval.py', _ENTRY),  # starts the program
  'hscl_jax/config/fields.py': ('tests/test_stored_config.py',),  # FREE_FIELDS, made at import
  # Docstrings, run at import.
  **{
    f'hscl_jax/{p}/__init__.py': (_LAYOUT,) for p in ('config', 'evaluation', 'rundir', 'training')
  },
  'hscl_jax/training/loop.py': (
    'tests/test_multiprocess.py',  # in the processes it starts
    'tests/test_prepare_offline.py',  # skipped without TensorFlow, as the map is measured
  ),
}


def merged(hand: dict[str, tuple], measured: dict[str, dict]) -> dict[str, tuple[str, ...]]:
  """Each module's hand-listed test files, then those the measured map adds (by name)."""
  modules = sorted(set(hand) | set(measured))
  found = {m: tuple(measured.get(m, {}).get('tests', ())) for m in modules}
  return {m: (*hand.get(m, ()), *sorted(set(found[m]) - set(hand.get(m, ())))) for m in modules}


TESTS_OF = merged(HAND_TESTS_OF, MEASURED)


def package_modules() -> list[str]:
  """Every measured module: hscl_jax/ and the GPU programs outside it, repository-relative."""
  return coverage_map.measured_modules(ROOT)


def code_lines(path: pathlib.Path) -> int:
  """Lines that are neither blank nor only a comment (what --all allocates by)."""
  return sum(1 for line in path.read_text().splitlines() if line.strip()[:1] not in ('', '#'))


def allocate(lines: dict[str, int], total: int) -> dict[str, int]:
  """`total` split over the modules in proportion to their lines (largest remainders)."""
  all_lines = sum(lines.values())
  exact = {module: total * n / all_lines for module, n in lines.items()}
  counts = {module: int(share) for module, share in exact.items()}
  by_remainder = sorted(exact, key=lambda m: (counts[m] - exact[m], m))
  for module in by_remainder[: total - sum(counts.values())]:
    counts[module] += 1
  return counts


def all_plan(
  total: int, seed: int, *, stored: bool, store: bool, operators: str = 'core'
) -> dict[str, int]:
  """`--all`'s modules and sample sizes: allocated by today's lines when the sample is
  drawn and kept beside its sessions (`store`), so that a recheck (`stored`) reruns the
  sample as drawn even after code moved between modules."""
  path = SESSIONS / f'all{_kind(operators)}.seed{seed}.n{total}.plan.json'
  if stored and path.exists():
    return json.loads(path.read_text())
  lines = {m: code_lines(ROOT / m) for m in package_modules()}
  plan = {m: n for m, n in allocate(lines, total).items() if n}
  if store and not stored:
    SESSIONS.mkdir(exist_ok=True)
    path.write_text(json.dumps(plan, indent=1))
  return plan


def draw(mutant_ids: list[str], size: int, seed: int, module: str) -> list[str]:
  """A seeded sample of `size` of the ids (all of them when there are fewer), the same for
  the same seed, module and ids whatever order they came in."""
  ordered = sorted(mutant_ids)
  if size >= len(ordered):
    return ordered
  return sorted(random.Random(f'{seed}:{module}').sample(ordered, size))


def annotation_lines(source: str) -> set[tuple[int, int]]:
  """(line, column) of every character inside a type annotation of `source`."""
  spans = set()
  for node in ast.walk(ast.parse(source)):
    annotations = []
    if isinstance(node, ast.arg | ast.AnnAssign):
      annotations.append(node.annotation)
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
      annotations.append(node.returns)
    for a in filter(None, annotations):
      for line in range(a.lineno, a.end_lineno + 1):
        first = a.col_offset if line == a.lineno else 0
        last = a.end_col_offset if line == a.end_lineno else 10_000
        spans.update((line, col) for col in range(first, last))
  return spans


def signature_stars(source: str) -> set[tuple[int, int]]:
  """(line, column) of every `*` or `**` that is no operator: the bare `*` of keyword-only
  parameters and the stars of `*args`, `**kwargs` and unpacking (cosmic-ray mutates them
  too: into `/`, positional-only and so equivalent, or into a syntax error)."""
  layout = (tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT)
  tokens = [
    t for t in tokenize.generate_tokens(io.StringIO(source).readline) if t.type not in layout
  ]
  stars = set()
  for before, token, after in zip(tokens, tokens[1:], tokens[2:]):
    if token.string not in ('*', '**'):
      continue
    if after.string in (',', ')') or before.string in ('(', ',', '[', '{', 'lambda'):
      stars.add(token.start)
  return stars


def never_drawn(source: str) -> set[tuple[int, int]]:
  """Positions whose mutants are never drawn: annotations and stars that are no operator."""
  return annotation_lines(source) | signature_stars(source)


@dataclasses.dataclass(frozen=True)
class Tally:
  """The outcomes of one module's (or all modules') sample."""

  sampled: int = 0
  assertion: int = 0
  crash: int = 0
  timeout: int = 0
  survived: int = 0
  equivalent: int = 0
  not_viable: int = 0

  @property
  def scored(self) -> int:
    """The sampled mutants that could behave differently: not equivalent, viable."""
    return self.sampled - self.equivalent - self.not_viable

  @property
  def score(self) -> float | None:
    """Assertion kills over the scored mutants."""
    return self.assertion / self.scored if self.scored else None

  @property
  def detected(self) -> float | None:
    """Kills of any kind (assertion, crash, timeout) over the scored mutants."""
    kills = self.assertion + self.crash + self.timeout
    return kills / self.scored if self.scored else None

  def __add__(self, other: Tally) -> Tally:
    return Tally(*(a + b for a, b in zip(dataclasses.astuple(self), dataclasses.astuple(other))))


def tally(outcomes: list[str]) -> Tally:
  """Counts of 'assertion', 'crash', 'timeout', 'survived', 'equivalent', 'not viable'."""
  counts = {name: outcomes.count(name) for name in ('assertion', 'crash', 'timeout', 'survived')}
  return Tally(
    sampled=len(outcomes),
    equivalent=outcomes.count('equivalent'),
    not_viable=outcomes.count('not viable'),
    **counts,
  )


def changed_lines(diff: str) -> tuple[str, str]:
  """The (original, mutated) line of a one-line diff, stripped; how equivalents are named."""
  lines = diff.splitlines()
  removed = [line[1:].strip() for line in lines if line[:1] == '-' and line[:3] != '---']
  added = [line[1:].strip() for line in lines if line[:1] == '+' and line[:3] != '+++']
  return '\n'.join(removed), '\n'.join(added)


def load_equivalents(path: pathlib.Path = EQUIVALENTS) -> dict[tuple[str, str, str], str]:
  """{(module, original line, mutated line): why the mutant cannot change behaviour}."""
  entries = tomllib.loads(path.read_text()).get('equivalent', [])
  return {(e['module'], e['original'], e['mutated']): e['reason'] for e in entries}


_FRAME = re.compile(r'^(\S+\.py):(\d+): ', re.MULTILINE)


def statement_lines(source: str, line: int) -> range:
  """The lines of the innermost statement holding `line` (of a compound statement, its
  header: `if a < b:` without its body)."""
  best = None
  for node in ast.walk(ast.parse(source)):
    end = getattr(node, 'end_lineno', None)
    if isinstance(node, ast.stmt) and node.lineno <= line <= end:
      body = getattr(node, 'body', None)
      if isinstance(body, list) and body and body[0].lineno <= line:
        continue  # the line is in the body: an inner statement holds it
      header_end = body[0].lineno - 1 if isinstance(body, list) and body else end
      if best is None or node.lineno >= best.start:
        best = range(node.lineno, max(header_end, node.lineno) + 1)
  return best if best is not None else range(line, line + 1)


def raised_by_mutated_statement(output: str, module: str, lines: range) -> bool:
  """Whether the run failed on a TypeError whose deepest frame in the package is the
  mutated statement: the mutant cannot run on the values it meets (`float << int`, `^` on
  float32), so any run of it fails and none can assert on its behaviour."""
  summary = handwritten.summary_lines(output)
  if not summary or ' - TypeError' not in summary[0]:
    return False
  package = [(path, int(n)) for path, n in _FRAME.findall(output) if 'hscl_jax/' in path]
  if not package:
    return False
  path, line = package[-1]
  return path.endswith(module) and line in lines


def reach_lines(source: str, line: int, operator: str) -> range:
  """The lines whose execution means a test ran the mutant at `line`: its statement's, or
  for a removed decorator the decorated function's first statement (a decorator runs once,
  at import, outside every test; what it changes runs with each call)."""
  if operator.endswith('RemoveDecorator'):
    for node in ast.walk(ast.parse(source)):
      decorated = getattr(node, 'decorator_list', ())
      if any(d.lineno <= line <= d.end_lineno for d in decorated):
        body = [b for b in node.body if not _is_docstring(b)] or node.body
        return statement_lines(source, body[0].lineno)
  return statement_lines(source, line)


def _is_docstring(node: ast.stmt) -> bool:
  return isinstance(node, ast.Expr) and isinstance(getattr(node, 'value', None), ast.Constant)


# A failed test's section in pytest's long report: `____ test_name[param] ____`.
_SECTION = re.compile(r'^_{3,} (.+?) _{3,}$', re.MULTILINE)


def refused_by_the_package(output: str) -> bool:
  """Whether some failure of the run ends, in hscl_jax/, on a `raise` statement: a refusal
  the package made on purpose (of an input the mutant no longer accepts)."""
  for section in _SECTION.split(output)[2::2]:
    frames = [(path, int(n)) for path, n in _FRAME.findall(section) if 'hscl_jax/' in path]
    if frames:
      path, line = frames[-1]
      lines = _package_lines('hscl_jax/' + path.split('hscl_jax/', 1)[1])
      if line <= len(lines) and lines[line - 1].strip().startswith('raise'):
        return True
  return False


@functools.cache
def _package_lines(name: str) -> tuple[str, ...]:
  """A package file's lines, read once (the tree under ROOT is not mutated: the copy is)."""
  return tuple((ROOT / name).read_text().splitlines())


def failed_tests(output: str) -> set[str]:
  """The test ids of the FAILED / ERROR lines of pytest's short summary."""
  return {line.split(' ', 1)[1].split(' - ', 1)[0] for line in handwritten.summary_lines(output)}


# The context coverage gives code run outside any test (collection, subprocesses).
OUTSIDE = ''


def fails_every_test_that_runs_it(output: str, reach: frozenset[str] | None) -> bool:
  """Whether a run with every test failed each test in `reach` (those that execute the
  mutated statement: see `measure_reach`), none by a refusal of the package's own, and the
  statement ran in no code outside a test (`OUTSIDE`, which cannot be attributed)."""
  if not reach or OUTSIDE in reach:
    return False
  return reach <= failed_tests(output) and not refused_by_the_package(output)


def reach_path(module: str) -> pathlib.Path:
  return SESSIONS / f'{module.replace("/", "__")}.reach.json'


def measure_reach(module: str) -> None:
  """Which of the module's tests execute each of its lines: its tests, unmutated (cwd: the
  copy), in one pytest process under coverage with a context per test; stored beside the
  sessions with the module's fingerprint (tests or code changed: measured again). The same
  run gives the reach of every module with the same test files (`sharing_tests`), stored too."""
  modules = sharing_tests(module)
  with tempfile.TemporaryDirectory(prefix='hscl_reach_') as scratch:
    tests = _tests_by_line(module, modules, pathlib.Path(scratch) / '.coverage')
  for each in modules:
    # The copy's files, which the tests ran: the tree may have changed since the copy was made.
    record = {'fingerprint': fingerprint(each, pathlib.Path.cwd()), 'tests': tests[each]}
    reach_path(each).write_text(json.dumps(record, sort_keys=True))


def sharing_tests(module: str) -> list[str]:
  """The module and every other whose test files are the same (graphs/*, losses/*, ...)."""
  return [m for m, files in TESTS_OF.items() if files == TESTS_OF[module]]


def _tests_by_line(
  module: str, modules: list[str], data_file: pathlib.Path
) -> dict[str, dict[int, list[str]]]:
  """{each of `modules`: {line: the test ids that execute it}} from one run of `module`'s
  tests under coverage."""
  import subprocess

  import coverage

  # --dist=no: with pytest.ini's `--dist loadgroup`, pytest-cov takes even `-n 0` for
  # xdist's controller and records no test's context.
  # Every measured folder: the GPU programs' reach too (a crash of every test that runs
  # their statement is not viable there either).
  cover = [f'--cov={folder}' for folder in ('hscl_jax', 'tools', 'benchmarks')]
  options = ['--dist=no', *cover, '--cov-context=test', '--cov-report=']
  command = shlex.split(test_command(module, first_failure=False)) + options
  # The command's plugin (`mutation.cosmic_names`) from the tree's dev/, as the mutants'.
  path = [p for p in (os.environ.get('PYTHONPATH'), str(pathlib.Path.cwd() / 'dev')) if p]
  env = dict(os.environ, COVERAGE_FILE=str(data_file), PYTHONPATH=os.pathsep.join(path))
  print(f'{", ".join(modules)}: which tests run each line (their tests under coverage)', flush=True)
  result = subprocess.run(command, capture_output=True, text=True, env=env)
  if result.returncode != 0:
    tail = (result.stdout + result.stderr).strip().splitlines()[-3:]
    sys.exit(f'{module}: its tests fail under coverage: ' + ' | '.join(tail))
  data = coverage.CoverageData(basename=str(data_file))
  data.read()
  return {each: _contexts_by_line(data, each) for each in modules}


def _contexts_by_line(data, module: str) -> dict[int, list[str]]:
  by_line = data.contexts_by_lineno(str(pathlib.Path(module).resolve()))
  return {line: sorted({c.split('|')[0] for c in contexts}) for line, contexts in by_line.items()}


def load_reach(module: str) -> dict[int, frozenset[str]] | None:
  """{line: the tests that execute it}, if measured for the module's current code and
  tests; else None."""
  path = reach_path(module)
  if not path.exists():
    return None
  record = json.loads(path.read_text())
  if record['fingerprint'] != fingerprint(module):
    return None
  return {int(line): frozenset(tests) for line, tests in record['tests'].items()}


def reach_of(reach: dict[int, frozenset[str]] | None, lines: range) -> frozenset[str] | None:
  """The tests that execute any of `lines` (None: not measured)."""
  if reach is None:
    return None
  return frozenset().union(*(reach.get(line, frozenset()) for line in lines))


def outcome_of(
  result,
  equivalents: dict,
  module: str,
  lines: range | None = None,
  reach: frozenset[str] | None = None,
):
  """(outcome, detail) of one cosmic-ray WorkResult; `lines`: the mutated statement's;
  `reach`: the tests that execute it (None: not measured)."""
  from cosmic_ray.work_item import TestOutcome

  if result.test_outcome == TestOutcome.SURVIVED:
    reason = listed_equivalent(result, equivalents, module)
    return ('equivalent', reason) if reason else ('survived', '')
  if result.output == 'timeout':  # cosmic-ray's marker for a test run it killed
    return 'timeout', ''
  if result.test_outcome == TestOutcome.INCOMPETENT:
    return 'crash', (result.output or '').strip().splitlines()[-1:][0][:120]
  outcome, detail = _killed_outcome(result, module, lines, reach)
  if listed_equivalent(result, equivalents, module):
    detail = f'{LISTED_YET_KILLED}: {detail}'
  return outcome, detail


LISTED_YET_KILLED = (
  'listed as equivalent, yet killed (a wrong reason, or a test failing without it)'
)


def listed_equivalent(result, equivalents: dict, module: str) -> str | None:
  """The reason equivalents.toml gives for this mutant's change, or None if it lists none."""
  return equivalents.get((module, *changed_lines(result.diff or '')))


def _killed_outcome(result, module: str, lines: range | None, reach: frozenset[str] | None):
  output = result.output or ''
  outcome, detail = handwritten.classify(1, output)  # an assertion among any failures
  if output.startswith(EVERY_TEST):  # the -x run found its statement viable already
    if outcome == 'crash' and fails_every_test_that_runs_it(output, reach):
      return 'not viable', f'fails all {len(reach)} tests that run it: {detail}'
    return outcome, detail
  if outcome == 'crash' and lines and raised_by_mutated_statement(output, module, lines):
    return 'not viable', detail
  return outcome, detail


def judge(result, equivalents: dict, module: str, source: str, mutation, reach=None):
  """`outcome_of` a mutant of `source`, given the module's measured reach (`load_reach`)."""
  line = mutation.start_pos[0]
  tests = reach_of(reach, reach_lines(source, line, mutation.operator_name))
  return outcome_of(result, equivalents, module, statement_lines(source, line), tests)


# The first line of a stored output from the run with every test (a crash's second run).
EVERY_TEST = '[every test]\n'


def fingerprint(module: str, tree: pathlib.Path = ROOT, operators: str = 'core') -> str:
  """What a session's results depend on: the module, its tests, the conftest and how this
  tool draws and runs mutants (DRAW_VERSION; for the semantic operators, their source);
  read in `tree` (the copy, for what ran there)."""
  digest = hashlib.sha256(f'draw {DRAW_VERSION}'.encode())
  if operators == semantic.PROVIDER:
    digest.update(pathlib.Path(semantic.__file__).read_bytes())
  for name in (module, 'tests/conftest.py', *TESTS_OF[module]):
    path = tree / name
    digest.update(name.encode() + (path.read_bytes() if path.exists() else b''))
  return digest.hexdigest()


# The operators a session's mutants come from: cosmic-ray's own ('core') or ours.
OPERATORS = ('core', semantic.PROVIDER)


def _kind(operators: str) -> str:
  """How a session's file names tell its operators: nothing for cosmic-ray's (the names
  the operator samples had before there were others), `.semantic` for ours."""
  return '' if operators == 'core' else f'.{operators}'


def session_path(module: str, size: int, seed: int, operators: str = 'core') -> pathlib.Path:
  return SESSIONS / f'{module.replace("/", "__")}{_kind(operators)}.seed{seed}.n{size}.sqlite'


def test_names(path: pathlib.Path) -> list[str]:
  """The tests a file defines, by name (`test_x`, `TestY::test_z`; a parametrised test's
  cases are its own): what a restamp checks is still there."""
  is_test = lambda node: (
    isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith('test')
  )
  names = []
  for node in ast.parse(path.read_text()).body:
    if is_test(node):
      names.append(node.name)
    elif isinstance(node, ast.ClassDef) and node.name.startswith('Test'):
      names += [f'{node.name}::{f.name}' for f in node.body if is_test(f)]
  return sorted(names)


def stamp_record(module: str, operators: str = 'core', tree: pathlib.Path | None = None) -> dict:
  """What a session is stamped with: its `fingerprint`, and the parts of it a restamp
  compares: the module's code, what every mutant shares (the conftest, the tool's draw and
  the semantic operators' source) and each test file's tests by name."""
  tree = ROOT if tree is None else tree
  shared = hashlib.sha256(f'draw {DRAW_VERSION}'.encode())
  if operators == semantic.PROVIDER:
    shared.update(pathlib.Path(semantic.__file__).read_bytes())
  shared.update(str(coverage_map.digest(tree / 'tests/conftest.py')).encode())  # None: none there
  return {
    'fingerprint': fingerprint(module, tree, operators),
    'module': coverage_map.digest(tree / module),
    'shared': shared.hexdigest(),
    'tests': {f: test_names(tree / f) for f in TESTS_OF[module] if (tree / f).is_file()},
  }


def stamped_fingerprint(stamp: pathlib.Path) -> str | None:
  """The fingerprint a session's stamp holds (a record, or the bare fingerprint that stamps
  held before they recorded their tests); None where there is no stamp."""
  if not stamp.exists():
    return None
  stored = json.loads(stamp.read_text())
  return stored['fingerprint'] if isinstance(stored, dict) else stored


def open_session(module: str, size: int, seed: int, operators: str = 'core') -> pathlib.Path:
  """The module's session: resumed when its code and tests are unchanged, else made anew
  (the mutants of the module by `operators`' provider alone, those in annotations and those
  not drawn skipped)."""
  from cosmic_ray.commands import init
  from cosmic_ray.work_db import use_db
  from cosmic_ray.work_item import WorkerOutcome
  from cosmic_ray.work_item import WorkResult

  path = session_path(module, size, seed, operators)
  stamp, now = path.with_suffix('.json'), fingerprint(module, operators=operators)
  if path.exists() and stamped_fingerprint(stamp) == now:
    return path
  if path.exists():
    print(f'{module}: changed since its session; starting it again', flush=True)
    path.unlink()
  SESSIONS.mkdir(exist_ok=True)
  cwd = os.getcwd()
  os.chdir(ROOT)  # cosmic-ray records the module's path as given: relative to the tree
  try:
    with use_db(str(path)) as db, semantic.only(operators):
      init([pathlib.Path(module)], db, {})
      never = never_drawn((ROOT / module).read_text())
      items = {item.job_id: item.mutations[0] for item in db.work_items}
      drawable = {
        f'{m.operator_name}#{m.occurrence:05d}': job
        for job, m in items.items()
        if tuple(m.start_pos) not in never
      }
      chosen = {drawable[key] for key in draw(list(drawable), size, seed, module)}
      skipped = [job for job in items if job not in chosen]
      db.set_multiple_results(skipped, WorkResult(worker_outcome=WorkerOutcome.SKIPPED))
  finally:
    os.chdir(cwd)
  stamp.write_text(json.dumps(stamp_record(module, operators)))
  return path


def restamp_refusal(stored: dict, now: dict) -> str | None:
  """Why a session stamped with `stored` cannot take the stamp `now` (None: it can)."""
  if stored['module'] != now['module']:
    return 'its code changed, so its mutants are not the stored ones'
  if stored['shared'] != now['shared']:
    return "tests/conftest.py or the tool's draw changed, which every mutant's run depends on"
  dropped = [f for f in stored['tests'] if f not in now['tests']]
  if dropped:
    return f'test files no longer among its tests: {", ".join(dropped)}'
  removed = [
    f'{f}::{t}' for f, names in stored['tests'].items() for t in names if t not in now['tests'][f]
  ]
  if removed:
    return f'tests removed: {", ".join(removed)}'
  return None


def restamp(
  module: str, size: int, seed: int, operators: str = 'core', tree: pathlib.Path | None = None
) -> tuple[bool, str]:
  """After tests were only added (or tightened): stamps the module's stored session with
  the tree's fingerprint, so that it resumes with its results instead of starting again (a
  stored kill stands: its test is still there). Refused, the stamp kept, where the tool can
  tell that more changed: the module's code, the conftest or the draw; a test file no
  longer among its tests; a test removed; or a stamp from before stamps recorded their
  tests that no longer matches (an unchanged one gets its record). That no kept test was
  loosened is for the person who restamps: the tool compares tests by name. The measured
  reach is not restamped: a new test may run lines the stored reach does not credit to
  it, so it is measured again where a crash needs it. (True, what was done) or (False, why
  not)."""
  path = session_path(module, size, seed, operators)
  stamp = path.with_suffix('.json')
  if not (path.exists() and stamp.exists()):
    return False, f'{module}: no stored session (n={size}, seed={seed}): run it first'
  stored, now = json.loads(stamp.read_text()), stamp_record(module, operators, tree)
  if not isinstance(stored, dict):
    if stored != now['fingerprint']:
      return False, (
        f'{module}: not restamped: its stamp predates recorded tests and the module or its '
        'tests changed since, so what changed cannot be told; run its session again'
      )
    stamp.write_text(json.dumps(now))
    return True, f'{module}: unchanged; its stamp now records its tests'
  why = restamp_refusal(stored, now)
  if why:
    return False, f'{module}: not restamped: {why}; run its session again'
  added = sum(
    len(set(names) - set(stored['tests'].get(f, ()))) for f, names in now['tests'].items()
  )
  changed = stored['fingerprint'] != now['fingerprint']
  stamp.write_text(json.dumps(now))
  return True, f'{module}: ' + (f'restamped ({added} tests added)' if changed else 'unchanged')


def test_command(module: str, first_failure: bool = True, files: tuple = ()) -> str:
  """One pytest process over test files or tests (`files`, else all the module's files) in
  their order, stopping at the first failure (-x) or not (-rfE: the summary classify
  reads); quoted, as cosmic-ray splits it (a test's parameters may hold spaces)."""
  tests = ' '.join(shlex.quote(name) for name in files or TESTS_OF[module])
  stop = ' -x' if first_failure else ''
  names = '-p mutation.cosmic_names'  # the replaced handlers' exception (PYTHONPATH: dev/)
  return f'{sys.executable} -m pytest -n 0{stop} -q -rfE -p no:cacheprovider {names} {tests}'


def tests_for(module: str, source: str, mutation) -> tuple[str, ...]:
  """The module's test files that execute the mutant's statement (by the measured map),
  with those that reach the module where the map cannot credit them (UNCREDITED: a
  program the file starts runs the statement too); all of them where the map cannot tell:
  the module not measured or changed since, or no test file executes it (reached only by
  a program a test starts, or by no test)."""
  lines = reach_lines(source, mutation.start_pos[0], mutation.operator_name)
  tests = coverage_map.tests_running(MEASURED_TESTS, module, source.encode(), lines)
  if tests:  # the map by test: those tests, then whole the module's files it cannot tell of
    changed = coverage_map.changed_files(MEASURED_TESTS, TESTS_OF[module])
    kept = tuple(t for t in tests if t.split('::', 1)[0] not in changed)
    return tuple(dict.fromkeys((*kept, *changed, *UNCREDITED.get(module, ()))))
  running = coverage_map.files_running(MEASURED.get(module), source.encode(), lines)
  if not running:
    return TESTS_OF[module]
  chosen = {*running, *UNCREDITED.get(module, ())}
  return tuple(f for f in TESTS_OF[module] if f in chosen)


# Each test file's seconds on the unmutated copy, measured once per copied tree: a module's
# mutants run many overlapping sets of files (those executing each statement), and a set's
# baseline run would repeat its files' for every set, and every module's process again.
# Kept beside the sessions for the tree they were measured on (the copy's digest).
_BASELINES: dict[str, float] = {}
BASELINES = SESSIONS / 'baselines.json'
# A run of single tests: each of their files' collection and imports (JAX's, the
# package's), which the tests' own times leave out; a test the map did not time.
STARTUP_SECONDS, UNTIMED_SECONDS = 20.0, 30.0


@functools.cache
def tree_digest(tree: str) -> str:
  """The copied tree's files (names and contents): what a test file's time is measured on."""
  digest = hashlib.sha256()
  for path in sorted(pathlib.Path(tree).rglob('*')):
    if path.is_file() and '__pycache__' not in path.parts:
      digest.update(str(path.relative_to(tree)).encode() + b'\0' + path.read_bytes())
  return digest.hexdigest()


def stored_baselines(tree: str) -> dict[str, float]:
  """The stored seconds of the test files, where measured on this tree; else none."""
  if BASELINES.exists():
    stored = json.loads(BASELINES.read_text())
    if stored.get('tree') == tree_digest(tree):
      return stored['seconds']
  return {}


def store_baselines(tree: str, seconds: dict[str, float]) -> None:
  """Adds `seconds` to the stored ones of this tree (replacing another tree's), atomically:
  two processes of one sample may write it."""
  merged = {**stored_baselines(tree), **seconds}
  SESSIONS.mkdir(exist_ok=True)
  scratch = BASELINES.with_suffix(f'.{os.getpid()}.tmp')
  scratch.write_text(json.dumps({'tree': tree_digest(tree), 'seconds': merged}, indent=1))
  os.replace(scratch, BASELINES)


def baseline_seconds(module: str, files: tuple = ()) -> float:
  """The tests (`files`, else all the module's) on the unmutated copy (cwd), each file alone
  and once per copied tree: they must pass; the sum of their times."""
  files = files or TESTS_OF[module]
  _BASELINES.update({**stored_baselines(os.getcwd()), **_BASELINES})
  tests = [name for name in files if '::' in name]  # timed by the map by test: not run
  files = [name for name in files if '::' not in name]
  for name in files:
    if name in _BASELINES:
      continue
    start = time.time()
    command = shlex.split(test_command(module, files=(name,)))
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
      tail = (result.stdout + result.stderr).strip().splitlines()[-3:]
      sys.exit(f'{module}: {name} fails before any mutant: ' + ' | '.join(tail))
    _BASELINES[name] = time.time() - start
    store_baselines(os.getcwd(), {name: _BASELINES[name]})
  recorded = MEASURED_TESTS.get('seconds', {})
  started = {test.split('::', 1)[0] for test in tests}  # each file's collection and imports
  untimed = sum(recorded.get(test, UNTIMED_SECONDS) for test in tests)
  return sum(_BASELINES[name] for name in files) + untimed + STARTUP_SECONDS * len(started)


def fastest_first(files: tuple[str, ...]) -> tuple[str, ...]:
  """The files in the order of their baseline times, shortest first: a mutant's run stops
  at its first failure (-x), which comes soonest when the quick files go first. Tests (of
  the map by test) come ordered already, then the whole files after them."""
  tests = tuple(name for name in files if '::' in name)
  rest = sorted((name for name in files if '::' not in name), key=lambda name: _BASELINES[name])
  return (*tests, *rest)


def run_pending(module: str, path: pathlib.Path, equivalents: dict, recheck: bool = False):
  """Plant and test every drawn mutant of the session that has no result yet, or with
  `recheck` every one that survived, crashed or timed out (cwd: the copy); a crash runs again with
  every test (`run_every_test`) and that run is stored."""
  from cosmic_ray.mutating import mutate_and_test
  from cosmic_ray.work_db import WorkDB
  from cosmic_ray.work_db import use_db

  with use_db(str(path), mode=WorkDB.Mode.open) as db:
    source = (ROOT / module).read_text()
    if recheck:
      again = rechecked(db, module, source, equivalents)
      items = [item for item in db.work_items if item.job_id in again]
    else:
      items = db.pending_work_items
    pending = sorted(items, key=lambda item: item.mutations[0].start_pos)
    if not pending:
      return
    timeouts, reach = {}, load_reach(module)  # a timeout per set of test files
    for item in pending:
      start = time.time()
      m = item.mutations[0]
      lines, files = statement_lines(source, m.start_pos[0]), tests_for(module, source, m)
      if files not in timeouts:
        timeouts[files] = 3 * baseline_seconds(module, files) + 60
      command = test_command(module, files=fastest_first(files))
      result = mutate_and_test(item.mutations, command, timeouts[files])
      if outcome_of(result, equivalents, module, lines)[0] == 'crash':
        result = run_every_test(item, module, timeouts[files], files)
      db.set_result(item.job_id, result)
      outcome, detail = judge(result, equivalents, module, source, m, reach)
      where = f'{module}:{m.start_pos[0]} {m.operator_name.removeprefix("core/")}'
      print(f'{where:70s} {outcome:10s} {time.time() - start:5.0f} s  {detail}', flush=True)


def rechecked(db, module: str, source: str, equivalents: dict) -> set[str]:
  """The session's mutants a recheck runs again: the survivors (not the equivalents), the
  crashes and the timeouts, which new tests may turn into assertion kills, the listed
  equivalents that were killed (after the test that failed without them is fixed), and
  any drawn mutant without a result (a stopped run's)."""
  from cosmic_ray.work_item import WorkerOutcome

  mutation = {item.job_id: item.mutations[0] for item in db.work_items}
  results, reach = dict(db.results), load_reach(module)
  return {job for job in mutation if job not in results} | {
    job
    for job, r in results.items()
    if r.worker_outcome != WorkerOutcome.SKIPPED  # the undrawn mutants
    and rechecks(*judge(r, equivalents, module, source, mutation[job], reach))
  }


def rechecks(outcome: str, detail: str) -> bool:
  """Whether a judged mutant is one `rechecked` runs again."""
  return outcome in ('survived', 'crash', 'timeout') or detail.startswith(LISTED_YET_KILLED)


def run_every_test(item, module: str, timeout: float, files: tuple = ()):
  """A crash's second run, without -x; its output marked as such (EVERY_TEST)."""
  import attrs  # cosmic-ray's WorkResult is an attrs class
  from cosmic_ray.mutating import mutate_and_test

  command = test_command(module, first_failure=False, files=files)
  result = mutate_and_test(item.mutations, command, timeout)
  return attrs.evolve(result, output=EVERY_TEST + (result.output or ''))


def needs_reach(module: str, path: pathlib.Path, equivalents: dict) -> bool:
  """Whether the session holds a crash of a run with every test and the module's reach is
  not measured for its current code and tests."""
  if load_reach(module) is not None:
    return False
  source = (ROOT / module).read_text()
  return any(
    r.output
    and r.output.startswith(EVERY_TEST)
    and judge(r, equivalents, module, source, m)[0] == 'crash'
    for m, r in results(module, path)[1]
  )


def results(module: str, path: pathlib.Path):
  """(the module's drawable mutants, the session's (mutation, result) pairs that ran)."""
  from cosmic_ray.work_db import WorkDB
  from cosmic_ray.work_db import use_db
  from cosmic_ray.work_item import WorkerOutcome

  with use_db(str(path), mode=WorkDB.Mode.open) as db:
    items = {item.job_id: item.mutations[0] for item in db.work_items}
    done = list(db.results)
  never = never_drawn((ROOT / module).read_text())
  drawable = sum(tuple(m.start_pos) not in never for m in items.values())
  ran = [(items[job], r) for job, r in done if r.worker_outcome != WorkerOutcome.SKIPPED]
  return drawable, ran


def report(plan: dict[str, int], seed: int, equivalents: dict, operators: str = 'core') -> Tally:
  """The per-module table, the total, and every survivor as a diff."""
  header = (
    *('module', 'mutants', 'sampled', 'assert', 'crash', 'timeout', 'survived', 'equiv'),
    *('unviable', 'score', 'detected'),
  )
  print('\n{:42s}{:>8s}{:>8s}{:>8s}{:>7s}{:>9s}{:>10s}{:>7s}{:>10s}{:>7s}{:>10s}'.format(*header))
  total, all_mutants, survivors, listed_killed = Tally(), 0, [], []
  for module, size in plan.items():
    mutants, done = results(module, session_path(module, size, seed, operators))
    source, reach = (ROOT / module).read_text(), load_reach(module)
    judged = [judge(r, equivalents, module, source, m, reach) for m, r in done]
    outcomes = [outcome for outcome, _ in judged]
    survivors += [r.diff for (_, r), o in zip(done, outcomes) if o == 'survived']
    listed_killed += [
      r.diff for (_, r), (_, detail) in zip(done, judged) if detail.startswith(LISTED_YET_KILLED)
    ]
    row = tally(outcomes)
    total, all_mutants = total + row, all_mutants + mutants
    print(f'{module:42s}{mutants:8d}' + format_row(row))
  print(f'{"all":42s}{all_mutants:8d}' + format_row(total))
  for diff in survivors:
    print('\nsurvived:\n' + diff.strip())
  for diff in listed_killed:
    print(f'\n{LISTED_YET_KILLED}:\n' + diff.strip())
  return total


def format_row(t: Tally) -> str:
  score, detected = ('-' if f is None else f'{100 * f:.0f} %' for f in (t.score, t.detected))
  return (
    f'{t.sampled:8d}{t.assertion:8d}{t.crash:7d}{t.timeout:9d}{t.survived:10d}'
    f'{t.equivalent:7d}{t.not_viable:10d}{score:>7s}{detected:>10s}'
  )


def make_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('modules', nargs='*', help='paths such as hscl_jax/evaluation/knn.py')
  parser.add_argument('--sample', type=int, default=25, help='mutants per module (--all: total)')
  parser.add_argument('--seed', type=int, default=0)
  parser.add_argument(
    '--all', action='store_true', help='--sample mutants over all of hscl_jax/, by lines'
  )
  parser.add_argument(
    '--operators',
    choices=OPERATORS,
    default='core',
    help="whose mutants: cosmic-ray's (core) or the semantic operators "
    '(dev/mutation/semantic.py); their sessions are kept apart',
  )
  parser.add_argument('--plan', action='store_true', help='print mutants per module and exit')
  parser.add_argument(
    '--report',
    action='store_true',
    help="print the stored samples' table; run no mutant (only the reach a crash needs)",
  )
  parser.add_argument(
    '--recheck',
    action='store_true',
    help="after tests were added: run the stored samples' survivors, crashes and timeouts "
    'again with the current tests, keep the other outcomes',
  )
  parser.add_argument(
    '--restamp',
    action='store_true',
    help="after tests were only added or tightened: keep the stored samples' results "
    '(refused where the code, the conftest or the draw changed, or a test was removed)',
  )
  return parser


def child_pids(parent: int) -> list[int]:
  """The processes whose parent is `parent` (Linux /proc; none found elsewhere)."""
  children = []
  for stat in pathlib.Path('/proc').glob('[0-9]*/stat'):
    try:
      ppid = int(stat.read_text().rsplit(')', 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
      continue  # gone meanwhile, or not Linux's format
    if ppid == parent:
      children.append(int(stat.parent.name))
  return children


def stop_on_signal(signum: int, frame) -> None:
  """SIGTERM or SIGINT: the running test command (cosmic-ray starts it in a session of its
  own, which a kill of this process's group misses) is killed with its group, then the
  exit unwinds, removing the tree's copy. The session keeps every finished mutant."""
  for pid in child_pids(os.getpid()):
    try:
      os.killpg(pid, signal.SIGKILL)
    except OSError:
      pass  # not a group leader, or already gone
  raise SystemExit(128 + signum)


def restamp_all(plan: dict[str, int], seed: int, operators: str) -> int:
  """`restamp` of each module's session, one line each; 1 where any was refused."""
  done = [restamp(module, size, seed, operators) for module, size in plan.items() if size]
  for _, line in done:
    print(line)
  return 0 if all(ok for ok, _ in done) else 1


def main() -> int:
  parser = make_parser()
  args = parser.parse_args()
  unknown = [m for m in args.modules if m not in TESTS_OF]
  if unknown or not (args.modules or args.all):
    parser.error(
      f'give modules of hscl_jax/ (as hscl_jax/evaluation/knn.py) or --all; unknown: {unknown}'
    )
  if args.recheck + args.report + args.restamp > 1:
    parser.error('give one of --recheck, --report and --restamp')
  if args.all:
    stored = args.recheck or args.report or args.restamp
    plan = all_plan(
      args.sample, args.seed, stored=stored, store=not args.plan, operators=args.operators
    )
  else:
    plan = dict.fromkeys(args.modules, args.sample)
  if args.plan:
    for module, size in plan.items():
      print(f'{module:42s}{size:5d}  {" ".join(TESTS_OF[module])}')
    return 0
  equivalents = load_equivalents()
  semantic.register()  # cosmic-ray looks a mutant's operator up by name to plant it
  if args.recheck or args.report or args.restamp:
    sessions = {m: session_path(m, size, args.seed, args.operators) for m, size in plan.items()}
    missing = [m for m, path in sessions.items() if not path.exists()]
    if missing:
      flag = next(f'--{f}' for f in ('recheck', 'report', 'restamp') if getattr(args, f))
      parser.error(f'{flag}: no stored sample of {", ".join(missing)}: run it first')
    if args.restamp:
      return restamp_all(plan, args.seed, args.operators)
  else:
    sessions = {m: open_session(m, size, args.seed, args.operators) for m, size in plan.items()}
  signal.signal(signal.SIGTERM, stop_on_signal)
  signal.signal(signal.SIGINT, stop_on_signal)
  with tempfile.TemporaryDirectory(prefix='hscl_mutation_score_') as copy:
    handwritten.copy_tree(copy, None)
    os.environ.update(PYTHONPATH=os.pathsep.join([copy, f'{copy}/dev']), COLUMNS='1000')
    os.chdir(copy)
    for module, path in sessions.items():
      if not args.report:
        run_pending(module, path, equivalents, args.recheck)
      if needs_reach(module, path, equivalents):
        measure_reach(module)
    os.chdir(ROOT)
  report(plan, args.seed, equivalents, args.operators)
  return 0


if __name__ == '__main__':
  sys.exit(main())
