"""Every `python -m hscl_jax...` command written in a doc or a docstring parses, and so does
every `hscl-NAME` console script's (setup.py's CONSOLE_SCRIPTS: the same program).

Commands are read from README.md, docs/**/*.md, benchmarks/README.md (code blocks and code
spans) and from the docstrings of hscl_jax/, configs/ and launch/ Python files, with
backslash continuations joined. For each: the module is one of the programs; every flag
is one that program defines (or absl's own); a `--config=FILE[:ARG]` loads, with every
`--config.FIELD=VALUE` override applied by ml_collections' own flag parser (so a value the
field's type cannot take, e.g. `--config.train_examples=None` for an int, fails here as it
would for a user), and the result passes the schema's validation. Placeholders (`DIR`,
`<name>`, `...`, `[optional]` brackets) are read as such: an elided command (`...`) is
checked for its flags only, a placeholder config path is not loaded.

A documented comparison that writes a committed report (`--report_dir=docs/results/...`)
rewrites it word for word from the run records committed with it: the digits reports
always, the Tiny-ImageNet ones where HSCL_TINY_IMAGENET_DIR names the data.
"""

from __future__ import annotations

import ast
import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys

from absl import flags
from ml_collections import config_flags
import pytest
import requirements

from hscl_jax.config import schema
from hscl_jax.graphs import train as graph_train

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # configs/<name>.py imports `configs.default`
ABSL_FLAGS = {'help', 'helpfull', 'helpshort', 'flagfile', 'logtostderr', 'v', 'verbosity'}
# Console script -> the module `python -m` runs.
SCRIPTS = {
  entry.split('=', 1)[0]: entry.split('=', 1)[1].split(':')[0].removesuffix('.__main__')
  for entry in requirements.setup_arguments()['entry_points']['console_scripts']
}
_SCRIPT_NAMES = '|'.join(sorted(map(re.escape, SCRIPTS), key=len, reverse=True))
_COMMAND = re.compile(
  rf'(?:python -m (hscl_jax(?:\.\w+)+)|(?<![\w./-])({_SCRIPT_NAMES})(?![\w-]))'
  r'((?:[^\n`\\]|\\\n)*)'
)
# ml_collections loads config files with importlib's deprecated load_module().
_LOAD_MODULE_WARNING = 'ignore:the load_module:DeprecationWarning'
_SHELL_END = {'&', '&&', '|', ';', '#', '>', '2>&1'}


def _docstrings(path: pathlib.Path) -> list[str]:
  tree = ast.parse(path.read_text(encoding='utf-8'))
  nodes = [tree] + [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
  return [doc for node in nodes if (doc := ast.get_docstring(node, clean=False))]


def _texts():
  for path in [
    REPO / 'README.md',
    REPO / 'benchmarks' / 'README.md',
    REPO / 'dev' / 'README.md',
    REPO / 'tests' / 'fixtures' / 'README.md',
    *(REPO / 'docs').rglob('*.md'),
  ]:
    yield path, path.read_text(encoding='utf-8')
  for folder in ('hscl_jax', 'configs', 'launch'):
    for path in sorted((REPO / folder).rglob('*.py')):
      for doc in _docstrings(path):
        yield path, doc


def documented_commands() -> list[tuple[str, str, list[str]]]:
  """(where, module, arguments) of every documented command."""
  commands = []
  for path, text in _texts():
    for match in _COMMAND.finditer(text):
      words = []
      for word in shlex.split(match.group(3).replace('\\\n', ' '), comments=False, posix=True):
        if word in _SHELL_END or word.startswith('#'):
          break
        words.append(word)
      module = match.group(1) or SCRIPTS[match.group(2)]
      commands.append((str(path.relative_to(REPO)), module, words))
  return commands


def program_file(module: str) -> pathlib.Path | None:
  """The file `python -m module` runs, if it is a program (it starts through
  command_line.run)."""
  base = REPO / module.replace('.', '/')
  for path in (base.with_suffix('.py'), base / '__main__.py'):
    if path.is_file() and 'command_line.run(main)' in path.read_text():
      return path
  return None


def _defined_flags(program: str) -> set[str]:
  tree = ast.parse(program_file(program).read_text())
  names = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Call) and getattr(node.func, 'attr', '').startswith('DEFINE'):
      if node.args and isinstance(node.args[0], ast.Constant):
        names.add(node.args[0].value)
  return names


def _flag_names(words):
  """(name, value or None) of each --flag; brackets of optional parts and '...' dropped."""
  for word in words:
    word = word.strip('[]')
    if word.startswith('--'):
      name, _, value = word[2:].partition('=')
      yield name, value if _ else None


def _is_placeholder(text: str) -> bool:
  return '<' in text or '{' in text or text.isupper() or text in ('...', 'FILE')


def test_commands_are_found_in_docs_and_docstrings():
  where = {w for w, _, _ in documented_commands()}
  assert {'README.md', 'docs/training.md', 'configs/tiny_imagenet.py'} <= where
  assert len(documented_commands()) > 40


@pytest.mark.filterwarnings(_LOAD_MODULE_WARNING)
@pytest.mark.parametrize(
  'where,program,words',
  documented_commands(),
  ids=[f'{w}:{" ".join([p, *a])[:60]}' for w, p, a in documented_commands()],
)
def test_documented_command_parses(where, program, words, monkeypatch):
  monkeypatch.chdir(REPO)  # the documented config paths are relative to the repository
  assert program_file(program), f'{where}: python -m {program} is not a program'
  known = _defined_flags(program) | ABSL_FLAGS
  config_file, overrides = None, []
  for name, value in _flag_names(words):
    if name.startswith('config.'):
      assert 'config' in known, f'{where}: {program} takes no --config'
      overrides.append(f'--{name}={value}')
      continue
    bare = name[2:] if name.startswith('no') and name[2:] in known else name
    assert bare in known, f'{where}: {program} has no flag --{name}'
    if name == 'config':
      config_file = value
  if config_file is None or _is_placeholder(config_file.split(':')[0]) or '...' in words:
    return
  for choice in _alternatives(overrides):
    argv = ['prog', f'--config={config_file}', *choice]
    flag_values = flags.FlagValues()
    config_flags.DEFINE_config_file('config', None, flag_values=flag_values, sys_argv=argv)
    flag_values(argv)  # raises on an override the field's type cannot take
    if program == 'hscl_jax.graphs':
      graph_train.validate_config(flag_values.config)
    else:
      schema.validate_config(flag_values.config, num_devices=1)


def _alternatives(overrides: list[str]) -> list[list[str]]:
  """`--config.method=ucl|hucl` written as a choice: one list of overrides per choice."""
  split = [o.split('=', 1) for o in overrides]
  count = max([len(value.split('|')) for _, value in split] + [1])
  return [
    [f'{name}={value.split("|")[min(i, len(value.split("|")) - 1)]}' for name, value in split]
    for i in range(count)
  ]


@pytest.mark.filterwarnings(_LOAD_MODULE_WARNING)
def test_a_bad_override_in_a_doc_would_fail(monkeypatch):
  monkeypatch.chdir(REPO)
  """The check above is not vacuous: the override this test suite was written for."""
  argv = ['prog', '--config=configs/cifar10_folder.py', '--config.train_examples=None']
  flag_values = flags.FlagValues()
  config_flags.DEFINE_config_file('config', None, flag_values=flag_values, sys_argv=argv)
  with pytest.raises(flags.IllegalFlagValueError):
    flag_values(argv)


_OVERRIDE = re.compile(r'--config\.([\w.]+)=([^\s`\'",)\]]+)')


def documented_overrides() -> list[tuple[str, str]]:
  """(where, '--config.FIELD=VALUE') of every override a doc or docstring shows, inside a
  command or in prose ('pass --config.train_examples=0 for the whole split')."""
  found = set()
  for path, text in _texts():
    for match in _OVERRIDE.finditer(text):
      found.add((str(path.relative_to(REPO)), match.group(0).rstrip('.;:')))
  return sorted(found)


def _parses(config_file: str, override: str) -> bool:
  argv = ['prog', f'--config={config_file}', override]
  flag_values = flags.FlagValues()
  config_flags.DEFINE_config_file('config', None, flag_values=flag_values, sys_argv=argv)
  try:
    flag_values(argv)
  except (flags.UnrecognizedFlagError, AttributeError, KeyError):
    return False  # a field of the other program's config
  return True


@pytest.mark.filterwarnings(_LOAD_MODULE_WARNING)
@pytest.mark.parametrize('where,override', documented_overrides())
def test_documented_override_parses(where, override, monkeypatch):
  """Each override's value parses as its field's type in the image or the graph config."""
  monkeypatch.chdir(REPO)
  name, value = override.split('=', 1)
  values = [v for v in value.split('|') if not _is_placeholder(v)]
  for choice in values:
    assert any(
      _parses(config, f'{name}={choice}') for config in ('configs/default.py', 'configs/graphs.py')
    ), f'{where}: {override} names no field of configs/default.py or configs/graphs.py'


def documented_reports(config_file: str, where: str) -> list[list[str]]:
  """The arguments of each comparison of `config_file` documented in the files under `where`
  (a path in the repository) that writes a committed report (`--report_dir=docs/results/...`),
  the first command found for each report."""
  commands = {}
  for found_in, module, words in documented_commands():
    if (
      module == 'hscl_jax.experiments.compare'
      and f'--config={config_file}' in words
      and any(w.startswith('--report_dir=docs/results/') for w in words)
      and found_in.startswith(where)
    ):
      commands.setdefault(_report_dir(words), words)
  return list(commands.values())


def _report_dir(words: list[str]) -> str:
  return next(w.split('=', 1)[1] for w in words if w.startswith('--report_dir='))


def _regenerated_report(words: list[str], tmp_path: pathlib.Path) -> str:
  """report.md as the documented command writes it on a copy of docs/results/, with an
  empty workdir and `--report_only` (nothing trains; a sweep ignores both)."""
  shutil.copytree(REPO / 'docs' / 'results', tmp_path / 'docs' / 'results')
  shutil.copytree(REPO / 'configs', tmp_path / 'configs')
  words = [w for w in words if not w.startswith(('--workdir=', '--report_only'))]
  words += [f'--workdir={tmp_path / "empty"}', '--report_only']
  env = {**os.environ, 'PYTHONPATH': str(REPO)}
  subprocess.run(
    [sys.executable, '-m', 'hscl_jax.experiments.compare', *words],
    cwd=tmp_path,
    env=env,
    check=True,
    capture_output=True,
    timeout=600,
  )
  return (tmp_path / _report_dir(words) / 'report.md').read_text()


def documented_digits_reports() -> list[list[str]]:
  """The comparisons of configs/digits.py the readings in docs/results/ document."""
  return documented_reports('configs/digits.py', 'docs/results/')


def test_the_committed_digits_reports_have_documented_commands():
  assert {_report_dir(words) for words in documented_digits_reports()} == {
    'docs/results/digits',
    'docs/results/digits_sigmoid',
    'docs/results/digits_grid',
  }


@pytest.mark.parametrize('words', documented_digits_reports(), ids=_report_dir)
def test_a_committed_digits_report_regenerates_from_its_run_records(words, tmp_path):
  """The documented command writes the committed report.md word for word from the records
  committed beside it (digits is embedded: no data to fetch)."""
  report = pathlib.Path(_report_dir(words), 'report.md')
  assert _regenerated_report(words, tmp_path) == (REPO / report).read_text()


# The unzipped tiny-imagenet-200 folder (the official zip's; ../shared/data/tiny_imagenet/
# holds it): the committed Tiny-ImageNet reports read its listing for their subset.
TINY_IMAGENET = os.environ.get('HSCL_TINY_IMAGENET_DIR', '')
_TINY_IMAGENET_FOLDER = 'DIR/tiny-imagenet-200'


def documented_tiny_imagenet_reports() -> list[list[str]]:
  """configs/tiny_imagenet.py's documented comparisons that write a committed report."""
  return [
    words
    for words in documented_reports('configs/tiny_imagenet.py:cpu', 'configs/tiny_imagenet.py')
    if any(_TINY_IMAGENET_FOLDER in w for w in words)
  ]


def test_the_committed_tiny_imagenet_reports_have_documented_commands():
  dirs = {_report_dir(words) for words in documented_tiny_imagenet_reports()}
  assert {
    'docs/results/tiny_imagenet',
    'docs/results/tiny_imagenet_density/m4_e9',
    'docs/results/tiny_imagenet_sigmoid',
  } <= dirs


@pytest.mark.skipif(
  not (TINY_IMAGENET and os.path.isdir(os.path.join(TINY_IMAGENET, 'train'))),
  reason='set HSCL_TINY_IMAGENET_DIR to an unzipped tiny-imagenet-200 to regenerate the '
  'committed Tiny-ImageNet reports from their run records',
)
@pytest.mark.parametrize('words', documented_tiny_imagenet_reports(), ids=_report_dir)
def test_a_committed_tiny_imagenet_report_regenerates_from_its_run_records(words, tmp_path):
  """The documented command writes the committed report.md word for word from its records
  (the data's listing read for the subset)."""
  words = [w.replace(_TINY_IMAGENET_FOLDER, TINY_IMAGENET) for w in words]
  report = pathlib.Path(_report_dir(words), 'report.md')
  assert _regenerated_report(words, tmp_path) == (REPO / report).read_text()
