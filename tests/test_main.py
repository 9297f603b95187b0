"""The programs as a user meets them: user errors are one line with the fix, no traceback.

Each case runs `python -m hscl_jax.main` (or linear_eval) in a fresh process; all but the
disk-full case stop before anything compiles.
"""

from __future__ import annotations

from concurrent import futures
import contextlib
import os
import pathlib
import re
import shutil
import socket
import subprocess
import sys

import pytest
from rundir.test_lock import _holder
from test_entry_points import CONSOLE_SCRIPTS
from test_entry_points import ENTRY_POINTS
from test_entry_points import program_flags

from hscl_jax.config import fields

REPO = pathlib.Path(__file__).resolve().parents[1]
DIGITS = str(REPO / 'configs' / 'digits.py')
ENV = {**os.environ, 'JAX_PLATFORMS': 'cpu', 'PYTHONPATH': str(REPO)}


def run(*args, cwd=REPO, env=ENV, timeout=240):
  result = subprocess.run(
    [sys.executable, '-m', *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
  )
  return result.returncode, result.stdout + result.stderr


def error_lines(output):
  return [line for line in output.splitlines() if line.startswith(('E', 'F')) and '] ' in line]


def assert_one_line(output, *parts):
  assert 'Traceback' not in output, output[-3000:]
  (line,) = error_lines(output)
  for part in parts:
    assert part in line, line


@pytest.mark.parametrize('program', ['hscl_jax.main', 'hscl_jax.linear_eval'])
def test_missing_config_file_names_the_path(tmp_path, program):
  code, output = run(program, '--config=configs/nope.py', f'--workdir={tmp_path / "w"}')
  assert code != 0
  assert 'configs/nope.py' in output and 'Fix:' in output and 'Traceback' not in output
  assert not (tmp_path / 'w').exists()


@pytest.mark.parametrize(
  'program,extra,expected',
  [
    # Stops at validation, after the config file (which imports configs/default.py) loaded.
    ('hscl_jax.main', ['--config.temperature=-0.5'], 'config.temperature: must be positive'),
    # The config file loads; the empty workdir is refused.
    ('hscl_jax.linear_eval', [], 'no checkpoint in {workdir}/checkpoints: train first'),
  ],
)
def test_config_path_works_from_any_directory(tmp_path, program, extra, expected):
  # Only the package is importable (as after `pip install`), not the repository's configs/.
  (tmp_path / 'site').mkdir()
  (tmp_path / 'site' / 'hscl_jax').symlink_to(REPO / 'hscl_jax')
  workdir = tmp_path / 'w'
  code, output = run(
    program,
    f'--config={DIGITS}',
    f'--workdir={workdir}',
    *extra,
    cwd=tmp_path,
    env={**ENV, 'PYTHONPATH': str(tmp_path / 'site')},
  )
  assert code == 1
  assert_one_line(output, expected.format(workdir=workdir))


def test_workdir_that_is_a_file(tmp_path):
  (tmp_path / 'file').write_text('')
  code, output = run('hscl_jax.main', f'--config={DIGITS}', f'--workdir={tmp_path / "file"}')
  assert code == 1
  assert_one_line(output, f'workdir {tmp_path / "file"} is a file', 'Fix:')


@contextlib.contextmanager
def _tmpfs(path, options):
  path.mkdir()
  if (
    subprocess.run(
      ['mount', '-t', 'tmpfs', '-o', options, 'tmpfs', str(path)], capture_output=True
    ).returncode
    != 0
  ):
    pytest.skip('cannot mount a tmpfs here (needs root): read-only/disk-full case not run')
  try:
    yield path
  finally:
    subprocess.run(['umount', str(path)], check=True)


def test_read_only_workdir(tmp_path):
  with _tmpfs(tmp_path / 'ro', 'ro,size=1m') as read_only:
    code, output = run('hscl_jax.main', f'--config={DIGITS}', f'--workdir={read_only / "w"}')
  assert code == 1
  assert_one_line(output, f'{read_only / "w"}', 'Read-only file system', 'Fix:')


@pytest.mark.slow  # compiles a step; tests/test_errors.py covers the path
def test_disk_full_says_which_checkpoint_is_intact(tmp_path):
  """6 MB: the first digits checkpoint (4.2 MB) fits, the second does not."""
  with _tmpfs(tmp_path / 'small', 'size=6m') as small_disk:
    workdir = small_disk / 'w'
    code, output = run(
      'hscl_jax.main',
      f'--config={DIGITS}',
      f'--workdir={workdir}',
      '--config.num_epochs=3',
      '--config.steps_per_epoch_limit=1',
      '--config.batch_size=32',
      '--config.checkpoint_every_epochs=1',
      '--config.knn.every_epochs=0',
      '--config.keep_checkpoints=3',
    )
  assert code == 1, output[-3000:]
  assert_one_line(output, f'no space at {workdir}, last good checkpoint 1 is intact', 'Fix:')


def test_linear_eval_refuses_zero_epochs(tmp_path):
  code, output = run('hscl_jax.linear_eval', f'--workdir={tmp_path}', '--num_epochs=0')
  assert code == 1
  assert_one_line(output, '--num_epochs', 'Fix:')


def test_second_run_on_a_live_workdir_names_the_holder(tmp_path):
  holder = _holder(tmp_path)  # a live process holding the workdir's lock
  try:
    code, output = run('hscl_jax.main', f'--config={DIGITS}', f'--workdir={tmp_path}')
  finally:
    holder.communicate('\n', timeout=30)
  assert code == 1
  assert_one_line(
    output, f'in use by another run (host {socket.gethostname()}, pid {holder.pid})', 'Fix:'
  )


@pytest.mark.parametrize(
  'program,config,override,line',
  [
    (
      'hscl_jax.main',
      DIGITS,
      '--config.learning_rate=0.3',
      "--config.learning_rate: config has no field 'learning_rate'. Fix: did you mean "
      '--config.linear_eval.learning_rate or --config.optimizer.learning_rate or '
      '--config.probe.learning_rate?',
    ),
    (
      'hscl_jax.main',
      DIGITS,
      '--config.optimiser.learning_rate=0.3',
      "--config.optimiser.learning_rate: config has no section 'optimiser'. Fix: did you mean "
      '--config.optimizer.learning_rate?',
    ),
    (
      'hscl_jax.graphs',
      str(REPO / 'configs' / 'graphs.py'),
      '--config.betta=2',
      "--config.betta: config has no field 'betta'. Fix: did you mean --config.beta?",
    ),
  ],
)
def test_an_unknown_override_is_one_line_not_a_traceback(tmp_path, program, config, override, line):
  _assert_only_stderr_line(program, config, override, tmp_path / 'w', line)


def _assert_only_stderr_line(program, config, override, workdir, line):
  """The program stops at flag parsing: exit 1, `line` alone on stderr, no workdir."""
  result = subprocess.run(
    [sys.executable, '-m', program, f'--config={config}', override, f'--workdir={workdir}'],
    cwd=REPO,
    env=ENV,
    capture_output=True,
    text=True,
    timeout=240,
  )
  assert (result.returncode, result.stderr.strip(), result.stdout) == (1, line, '')
  assert not workdir.exists()


@pytest.mark.parametrize(
  'override,line',
  [
    (
      '--config.samples_per_class=2.5',
      '--config.samples_per_class=2.5: config.samples_per_class takes a whole number, not '
      "'2.5'. Fix: e.g. --config.samples_per_class=0",
    ),
    (
      '--config.temperature=abc',
      "--config.temperature=abc: config.temperature takes a number, not 'abc'. Fix: e.g. "
      '--config.temperature=0.5',
    ),
  ],
)
def test_a_value_of_the_wrong_type_is_one_line_with_the_fields_type(tmp_path, override, line):
  _assert_only_stderr_line('hscl_jax.main', DIGITS, override, tmp_path / 'w', line)


def test_a_refused_samples_per_class_lists_what_passes_and_leaves_no_workdir(tmp_path):
  """Refused once the data is read (after the workdir was locked): digits' 10 classes at
  batch 256 take m >= 26 dividing 256 and at most its smallest class; the workdir the lock
  made, and its parent, are gone."""
  workdir = tmp_path / 'parent' / 'w'
  code, output = run(
    'hscl_jax.main', f'--config={DIGITS}', f'--workdir={workdir}', '--config.samples_per_class=7'
  )
  assert code == 1
  assert_one_line(
    output,
    "config.samples_per_class: 7 does not divide the 256 samples of a process's batch",
    'Fix: use samples_per_class = one of 32, 64, 128 (what passes every check on this '
    'training subset at batch_size 256), or 0 (uniform batches).',
  )
  assert list(tmp_path.iterdir()) == []


# Every refusal suggests only flags its program has: each program run into its refusals, and
# each `--flag` a refusal's fix names checked against the flags of the program it is for.
ABSL_FLAGS = {'help', 'helpfull', 'helpshort', 'helpxml', 'flagfile'}
MODULE_OF_COMMAND = {name: module for module, name in ENTRY_POINTS.items()} | {
  entry.split('=', 1)[0]: entry.split('=', 1)[1].split(':')[0] for entry in CONSOLE_SCRIPTS
}
_FLAG = re.compile(r'(?<![\w-])--(?:\[no\])?([A-Za-z_][\w.]*)')
_PUNCTUATION = '()[],.;:`\'"'
TRAIN = ['--config=configs/digits.py', '--workdir={tmp}/w']
REFUSALS = [  # (program, its arguments): {missing}, {run} (a trained run), {tmp} filled in
  ('hscl_jax.embed', ['--workdir={missing}', '--split=test', '--out={tmp}/e.npz']),
  ('hscl_jax.inspect', ['--workdir={missing}', '--out={tmp}/figures']),
  ('hscl_jax.retrieval', ['--workdir={missing}']),
  ('hscl_jax.linear_eval', ['--workdir={missing}']),
  ('hscl_jax.export', ['--workdir={missing}', '--format=torch', '--out={tmp}/b.safetensors']),
  ('hscl_jax.embed', ['--workdir={run}', '--checkpoint=best', '--split=test', '--out={tmp}/e.npz']),
  ('hscl_jax.retrieval', ['--workdir={run}', '--checkpoint=first']),
  ('hscl_jax.inspect', ['--workdir={run}', '--out=F', '--checkpoint=3', '--checkpoint_step=3']),
  ('hscl_jax.embed', ['--workdir={run}', '--out={tmp}/e.npz']),
  ('hscl_jax.inspect', ['--workdir={run}', '--out={tmp}/f', '--config=configs/digits.py']),
  ('hscl_jax.linear_eval', ['--workdir={run}', '--num_epochs=0']),
  ('hscl_jax.main', [*TRAIN, '--config.batch_size=0']),
  ('hscl_jax.main', [*TRAIN, '--config.learning_rate=1']),
  ('hscl_jax.main', [*TRAIN, '--config.beta=-1']),
  ('hscl_jax.main', [*TRAIN, '--config.dataset=image_folder']),
  ('hscl_jax.graphs', ['--config=configs/graphs.py', '--workdir={tmp}/g']),
]  # fmt: skip


def named_flags(line: str, program: str) -> list[tuple[str, str]]:
  """(program, flag) of each `--flag` the fix of a refusal names (the whole line where it
  has no `Fix:`): a flag in a command it gives (`python -m MODULE --flag ...`, `hscl-NAME
  --flag ...`, up to the first word that is not a flag or `...`) is that command's, any
  other the running program's."""
  words = line.split('Fix:', 1)[-1].split()
  named, command = [], None
  for i, word in enumerate(words):
    name = word.strip(_PUNCTUATION)
    if name in MODULE_OF_COMMAND and (words[i - 1 : i] == ['-m'] or name.startswith('hscl-')):
      command = MODULE_OF_COMMAND[name]
      continue
    if command is not None and not word.startswith(('--', '...')):
      command = None
    named += [(command or program, flag.rstrip('.')) for flag in _FLAG.findall(word)]
  return named


def is_a_flag_of(module: str, flag: str) -> bool:
  """Whether `python -m` of `module` accepts `--flag`: its own, absl's, a boolean's --noX,
  and for a program with --config a field (or section) of its config."""
  defined = program_flags(module) | ABSL_FLAGS
  if flag.startswith(('config.', 'noconfig.')):
    field = flag.split('.', 1)[1]
    image_config = module not in ('hscl_jax.graphs.__main__', 'hscl_jax.experiments.compare_graphs')
    known = field in fields.FIELDS or field in fields.CONFIG_FIELDS
    return 'config' in defined and (known or not image_config)
  return flag in defined or (flag.startswith('no') and flag[2:] in defined)


def _refusal(program: str, args: list[str]) -> tuple[str, list[str], str]:
  result = subprocess.run(
    [sys.executable, '-m', program, *args], cwd=REPO, env=ENV, capture_output=True, text=True,
    timeout=300,
  )  # fmt: skip
  output = result.stdout + result.stderr
  lines = error_lines(output) or [line for line in result.stderr.splitlines() if 'Fix:' in line]
  assert result.returncode != 0 and lines and 'Traceback' not in output, (program, output[-3000:])
  return program, lines, output


def test_every_refusal_suggests_only_flags_its_program_has(tmp_path):
  """The programs' refusals (a missing or unranked run, bad flags, bad config values),
  each as `python -m` gives it: every flag a fix names is one its program defines. So
  embed, inspect and retrieval, which read the run's own config.json, never suggest
  --config=FILE (linear_eval and export, which take one, do), and a run without a best
  checkpoint is sent back to training for --config.keep_best."""
  run = tmp_path / 'run'
  shutil.copytree(REPO / 'tests' / 'fixtures' / 'digits_workdir', run)
  names = dict(missing=tmp_path / 'missing', run=run, tmp=tmp_path)
  cases = [(program, [a.format(**names) for a in args]) for program, args in REFUSALS]
  with futures.ThreadPoolExecutor(4) as pool:  # 4 JAX processes at a time
    refusals = list(pool.map(lambda case: _refusal(*case), cases))
  checked = set()
  for program, lines, _ in refusals:
    module = MODULE_OF_COMMAND[program]
    for owner, flag in {pair for line in lines for pair in named_flags(line, module)}:
      assert is_a_flag_of(owner, flag), f'{program} suggests --{flag} ({owner}): {lines}'
      checked.add((program, owner, flag))
  for expected in [
    ('hscl_jax.linear_eval', 'hscl_jax.linear_eval', 'config'),
    ('hscl_jax.export', 'hscl_jax.export', 'config'),
    ('hscl_jax.embed', 'hscl_jax.main', 'config.keep_best'),
    ('hscl_jax.embed', 'hscl_jax.embed', 'checkpoint'),
    ('hscl_jax.main', 'hscl_jax.main', 'config.batch_size'),
    ('hscl_jax.main', 'hscl_jax.main', 'config.folder'),
    ('hscl_jax.graphs', 'hscl_jax.prepare', 'data_dir'),
  ]:
    assert expected in checked, sorted(checked)
  missing_config = [lines for program, lines, _ in refusals[:3]]
  assert all('config.json not found' in line for lines in missing_config for line in lines)


def test_a_fix_names_the_flags_of_the_command_it_gives():
  line = (
    'no best checkpoint. Fix: pass --checkpoint=latest, or train with python -m hscl_jax.main'
    ' ... --config.keep_best=knn_top1 added (hscl-prepare --data_dir=D), or --out=F.'
  )
  assert named_flags(line, 'hscl_jax.embed') == [
    ('hscl_jax.embed', 'checkpoint'),
    ('hscl_jax.main', 'config.keep_best'),
    ('hscl_jax.prepare', 'data_dir'),
    ('hscl_jax.embed', 'out'),
  ]
  assert not is_a_flag_of('hscl_jax.embed', 'config')
  assert is_a_flag_of('hscl_jax.embed', 'noprojections')
  assert not is_a_flag_of('hscl_jax.main', 'config.learning_rate')
  assert is_a_flag_of('hscl_jax.main', 'config.optimizer.learning_rate')
