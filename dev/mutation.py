"""Mutation testing of one module with cosmic-ray (docs/testing.md): does the suite catch bugs?

    python dev/mutation.py hscl_jax/optimizers.py
    python dev/mutation.py hscl_jax/training/loop.py --sample 25 --seed 0
    python dev/mutation.py hscl_jax/rundir/layout.py --tests tests/rundir/test_atomic.py

The module's tests are its mirrored path (hscl_jax/training/step.py ->
tests/training/test_step.py) or, where that file does not exist, the test files that import
the module. cosmic-ray's configuration is dev/cosmic-ray.toml with the module, the tests'
command and a timeout (3 x the tests' time unmutated + 60 s) filled in; the session runs in
a copy of the tree, so the working tree is never mutated. Prints the survivors' diffs and
the score: the mutants killed over the mutants run.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import pathlib
import random
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
TEMPLATE = REPO / 'dev' / 'cosmic-ray.toml'


def mirrored_test(module: pathlib.Path) -> pathlib.Path:
  """tests/<the module's folders below the top one>/test_<module>.py."""
  return pathlib.Path('tests', *module.parts[1:-1], f'test_{module.stem}.py')


def dotted_name(module: pathlib.Path, root: pathlib.Path) -> str:
  """hscl_jax/training/step.py -> hscl_jax.training.step; a script outside a package
  (tools/first_light.py), imported by path, -> first_light."""
  if not (root / module.parts[0] / '__init__.py').is_file():
    return module.stem
  parts = module.with_suffix('').parts
  return '.'.join(parts[:-1] if parts[-1] == '__init__' else parts)


def imported_names(path: pathlib.Path) -> set[str]:
  """Every module a file imports, and `module.name` for each `from module import name`."""
  names = set()
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Import):
      names.update(alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
      names.add(node.module)
      names.update(f'{node.module}.{alias.name}' for alias in node.names)
  return names


def tests_of(module: pathlib.Path, root: pathlib.Path = REPO) -> list[str]:
  """The mirrored test file if it exists, else the test files that import the module."""
  if (root / mirrored_test(module)).is_file():
    return [str(mirrored_test(module))]
  name = dotted_name(module, root)
  tests = sorted((root / 'tests').rglob('test_*.py'))
  found = [str(path.relative_to(root)) for path in tests if name in imported_names(path)]
  if not found:
    sys.exit(
      f'{module}: no tests found: neither {mirrored_test(module)} nor a test file importing '
      f'{name} exists; write {mirrored_test(module)} or pass --tests'
    )
  return found


def copy_tree(destination: pathlib.Path) -> None:
  """The tracked and untracked, not ignored, files of the working tree."""
  listed = subprocess.run(
    ['git', 'ls-files', '-z', '--cached', '--others', '--exclude-standard'],
    cwd=REPO,
    capture_output=True,
    check=True,
  )
  for name in filter(None, listed.stdout.decode().split('\0')):
    if (REPO / name).is_file():
      (destination / name).parent.mkdir(parents=True, exist_ok=True)
      shutil.copy2(REPO / name, destination / name)


def baseline_seconds(command: str, tree: pathlib.Path, env: dict) -> float:
  """The tests' time on the unmutated copy; they must pass there."""
  start = time.monotonic()
  run = subprocess.run(shlex.split(command), cwd=tree, env=env, capture_output=True, text=True)
  if run.returncode:
    sys.exit(f'the tests fail unmutated ({command}):\n{run.stdout[-3000:]}')
  return time.monotonic() - start


def sample_jobs(session: pathlib.Path, sample: int, seed: int) -> int:
  """Every pending job but a seeded sample of `sample` marked skipped; the number left out."""
  from cosmic_ray.work_db import WorkDB
  from cosmic_ray.work_db import use_db
  from cosmic_ray.work_item import WorkerOutcome
  from cosmic_ray.work_item import WorkResult

  with use_db(str(session), WorkDB.Mode.open) as db:
    # In the order of the mutations, not of the job ids (random per session).
    pending = [item.job_id for item in sorted(db.pending_work_items, key=mutation_key)]
    kept = set(random.Random(seed).sample(pending, min(sample, len(pending))))
    skipped = WorkResult(output='not sampled', worker_outcome=WorkerOutcome.SKIPPED)
    db.set_multiple_results([job for job in pending if job not in kept], skipped)
    return len(pending) - len(kept)


def mutation_key(item) -> list[tuple[str, str, int]]:
  return [(str(m.module_path), m.operator_name, m.occurrence) for m in item.mutations]


def outcomes(session: pathlib.Path) -> dict[str, int]:
  """Counts of the mutants run: killed (by a timeout among them), survived, incompetent."""
  from cosmic_ray.work_db import WorkDB
  from cosmic_ray.work_db import use_db
  from cosmic_ray.work_item import WorkerOutcome

  counts = dict.fromkeys(['killed', 'timeout', 'survived', 'incompetent', 'skipped'], 0)
  with use_db(str(session), WorkDB.Mode.open) as db:
    for _, result in db.results:
      if result.worker_outcome == WorkerOutcome.SKIPPED:
        counts['skipped'] += 1
      else:
        counts[result.test_outcome.value] += 1
        counts['timeout'] += result.output == 'timeout'
  return counts


def score_line(module: str, counts: dict[str, int], minutes: float) -> str:
  run = counts['killed'] + counts['survived']
  score = f'{100 * counts["killed"] / run:.1f} %' if run else 'none run'
  return (
    f'{module}: score {score} ({counts["killed"]} of {run} mutants killed, '
    f'{counts["timeout"]} by a timeout; {counts["incompetent"]} incompetent, '
    f'{counts["skipped"]} skipped) in {minutes:.1f} min'
  )


def run_session(module: str, tests: list[str], tree: pathlib.Path, args) -> dict[str, int]:
  """cosmic-ray's init, its operator filter, the sample, exec and the survivors' report."""
  env = {**os.environ, 'PYTHONPATH': str(tree), 'JAX_PLATFORMS': 'cpu'}
  command = f'{sys.executable} -m pytest -x -q -n 0 -p no:cacheprovider {" ".join(tests)}'
  timeout = 3 * baseline_seconds(command, tree, env) + 60
  config, session = tree / 'cosmic-ray.toml', tree / 'session.sqlite'
  text = TEMPLATE.read_text().replace('"MODULE"', json.dumps(module))
  text = text.replace('"TEST_COMMAND"', json.dumps(command))
  config.write_text(text.replace('timeout = 0.0', f'timeout = {timeout:.0f}.0'))

  def tool(name, *arguments, **kwargs):
    program = pathlib.Path(sys.executable).with_name(name)
    return subprocess.run([program, *arguments], cwd=tree, env=env, check=True, **kwargs)

  tool('cosmic-ray', 'init', config, session)
  tool('cr-filter-operators', session, config)
  if args.sample:
    sample_jobs(session, args.sample, args.seed)
  tool('cosmic-ray', 'exec', config, session)
  report = tool('cr-report', '--surviving-only', '--show-diff', session, capture_output=True)
  print(report.stdout.decode())
  return outcomes(session)


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('module', type=pathlib.Path, help='e.g. hscl_jax/optimizers.py')
  parser.add_argument('--tests', nargs='+', help="test files (default: the module's, found)")
  parser.add_argument('--sample', type=int, default=0, help='run N mutants drawn at random')
  parser.add_argument('--seed', type=int, default=0, help="the sample's seed")
  args = parser.parse_args(argv)
  if not (REPO / args.module).is_file():
    sys.exit(f'{args.module}: no such module; give its path from the repository root')
  tests = args.tests or tests_of(args.module)
  start = time.monotonic()
  with tempfile.TemporaryDirectory(prefix='hscl_mutation_') as tree:
    copy_tree(pathlib.Path(tree))
    counts = run_session(str(args.module), tests, pathlib.Path(tree), args)
  print(score_line(str(args.module), counts, (time.monotonic() - start) / 60))
  print(f'tests: {" ".join(tests)}')


if __name__ == '__main__':
  main()
