"""launch/: the sweep's commands are valid configs; the shell scripts parse (and lint)."""

from __future__ import annotations

import json
import pathlib
import shutil
import subprocess
import sys

from absl import flags
from ml_collections import config_flags
import pytest

# ml_collections loads config files with importlib's deprecated load_module() (its code,
# not ours; a DeprecationWarning that Python hides outside __main__).
pytestmark = pytest.mark.filterwarnings(
  r'ignore:the load_module\(\) method is deprecated:DeprecationWarning'
)

REPO = pathlib.Path(__file__).resolve().parents[1]
LAUNCH = REPO / 'launch'
SCRIPTS = ('local.sh', 'slurm_gpu.sbatch', 'tpu_vm.sh', 'local_slurm_cluster.sh')
sys.path.insert(0, str(REPO))  # `from configs import default`, as from the repo root

from hscl_jax.config import schema  # noqa: E402


def run_sweep(*args: str) -> subprocess.CompletedProcess:
  return subprocess.run(
    [sys.executable, str(LAUNCH / 'sweep.py'), *args],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=60,
    check=False,
  )


def sweep_json(*args: str) -> list[dict]:
  done = run_sweep('--format=json', *args)
  assert done.returncode == 0, done.stderr
  return json.loads(done.stdout)


def parse_config(config_file: str, overrides: list[str]):
  """The ConfigDict hscl_jax.main would get: config_flags with the same flag definition."""
  argv = ['main', f'--config={REPO / config_file}', *overrides]
  flag_values = flags.FlagValues()
  # sys_argv: config_flags defines an override flag for each --config.* it sees there.
  config_flags.DEFINE_config_file(
    'config', None, flag_values=flag_values, lock_config=True, sys_argv=argv
  )
  flag_values(argv)
  return flag_values.config


@pytest.fixture(scope='module')
def paper_sweep():
  return sweep_json('--datasets=cifar10,cifar100,stl10,digits', '--seeds=0,1')


def test_sweep_covers_the_paper_grid(paper_sweep):
  per_dataset_seed = 1 + 5 + 1 + 5 + 9  # ucl, hucl(beta), scl, hscl-exp(beta), hscl-threshold
  assert len(paper_sweep) == per_dataset_seed * 4 * 2
  workdirs = [run['workdir'] for run in paper_sweep]
  assert len(set(workdirs)) == len(workdirs)
  cifar10_seed0 = [r for r in paper_sweep if r['dataset'] == 'cifar10' and r['seed'] == 0]
  betas = sorted(
    float(o.split('=')[1])
    for r in cifar10_seed0
    if r['name'].startswith('hscl-exp')
    for o in r['overrides']
    if o.startswith('--config.beta=')
  )
  assert betas == [0.1, 0.5, 1.0, 2.0, 5.0]
  taus = sorted(
    tuple(
      float(o.split('=')[1])
      for o in r['overrides']
      if o.startswith(('--config.tau_start=', '--config.tau_end='))
    )
    for r in cifar10_seed0
    if r['name'].startswith('hscl-threshold')
  )
  assert taus == [(s, e) for s in (-0.5, -0.3, -0.1) for e in (-0.1, 0.0, 0.1)]


def test_every_command_is_a_valid_config(paper_sweep):
  for run in paper_sweep:
    config = parse_config(run['config'], run['overrides'])
    for override in run['overrides']:
      field, value = override.removeprefix('--config.').split('=', 1)
      node = config
      for part in field.split('.'):
        node = node[part]
      assert str(node) == value or node == type(node)(value), (override, node)
    assert config.seed == run['seed']
    # As on 8 accelerators (the paper's batch of 512) and on the tests' 4 CPU devices.
    schema.validate_config(config, num_devices=8, num_processes=2)
    schema.validate_config(config, num_devices=4, num_processes=1)
    method = {'ucl': 'ucl', 'hucl': 'hucl', 'scl': 'scl'}.get(run['name'].split('_')[0], 'hscl')
    assert config.method == method
    assert run['command'][:3] == ['python', '-m', 'hscl_jax.main']


def test_extra_overrides_and_label_positives():
  runs = sweep_json(
    '--datasets=digits',
    '--methods=hscl-exp',
    '--betas=2',
    '--positive_mode=label',
    '--set=num_epochs=3',
    '--set=model.name=small_cnn',
  )
  (run,) = runs
  config = parse_config(run['config'], run['overrides'])
  assert (config.positive_mode, config.num_epochs, config.beta) == ('label', 3, 2.0)
  schema.validate_config(config, num_devices=4)


def test_a_bad_override_is_rejected_by_the_config_machinery():
  (run,) = sweep_json('--datasets=digits', '--methods=scl', '--set=num_epochs=many')
  with pytest.raises(flags.IllegalFlagValueError):
    parse_config(run['config'], run['overrides'])
  (run,) = sweep_json('--datasets=digits', '--methods=scl', '--set=no_such_field=1')
  with pytest.raises((flags.IllegalFlagValueError, KeyError, AttributeError)):
    parse_config(run['config'], run['overrides'])


def test_submission_commands_use_the_launch_scripts():
  slurm = run_sweep(
    '--datasets=digits',
    '--methods=ucl,scl',
    '--submit=slurm',
    '--dry_run',
    '--sbatch_args=--nodes=2 --gpus-per-node=4',
  )
  assert slurm.returncode == 0, slurm.stderr
  lines = slurm.stdout.splitlines()
  assert len(lines) == 2
  assert all(
    line.startswith('sbatch --job-name=hscl_digits_')
    and 'slurm_gpu.sbatch' in line
    and '--nodes=2 --gpus-per-node=4' in line
    for line in lines
  )
  tpu = run_sweep('--datasets=digits', '--methods=ucl', '--submit=tpu', '--dry_run')
  assert tpu.returncode == 2 and '--tpu_name' in tpu.stderr
  local = run_sweep('--datasets=digits', '--methods=ucl', '--submit=local', '--dry_run')
  assert (
    local.returncode == 0 and 'local.sh configs/digits.py runs/digits/ucl/seed0' in local.stdout
  )


@pytest.mark.parametrize('script', SCRIPTS)
def test_script_parses(script):
  done = subprocess.run(
    ['bash', '-n', str(LAUNCH / script)], capture_output=True, text=True, check=False
  )
  assert done.returncode == 0, done.stderr


@pytest.mark.parametrize('script', SCRIPTS)
def test_script_passes_shellcheck(script):
  if shutil.which('shellcheck') is None:
    pytest.skip('shellcheck is not installed (apt-get install shellcheck)')
  done = subprocess.run(
    ['shellcheck', str(LAUNCH / script)], capture_output=True, text=True, check=False
  )
  assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize('script', ['.ci/run', 'tools/offline_install_check.sh'])
def test_ci_and_tool_scripts_pass_shellcheck(script):
  if shutil.which('shellcheck') is None:
    pytest.skip('shellcheck is not installed (apt-get install shellcheck)')
  done = subprocess.run(['shellcheck', str(REPO / script)], capture_output=True, text=True)
  assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize('script', SCRIPTS)
def test_script_has_an_example_and_assumptions(script):
  header = (LAUNCH / script).read_text().split('set -euo pipefail')[0]
  assert 'Example' in header and 'Assumptions' in header


def test_dry_runs_print_the_training_command(tmp_path):
  env = {'PATH': '/usr/bin:/bin', 'DRY_RUN': '1', 'HOME': str(tmp_path)}
  local = subprocess.run(
    ['bash', str(LAUNCH / 'local.sh'), 'configs/digits.py', 'runs/x', '--config.beta=2.0'],
    cwd=REPO,
    env=env,
    capture_output=True,
    text=True,
    check=True,
  )
  assert (
    f'-m hscl_jax.main --config={REPO}/configs/digits.py --workdir={REPO}/runs/x'
    ' --config.beta=2.0' in local.stdout
  )
  slurm = subprocess.run(
    ['bash', str(LAUNCH / 'slurm_gpu.sbatch'), 'configs/digits.py', '/w'],
    cwd=REPO,
    env={**env, 'SLURM_GPUS_ON_NODE': '4', 'SLURM_NTASKS_PER_NODE': '1'},
    capture_output=True,
    text=True,
    check=True,
  )
  assert 'JAX_LOCAL_DEVICE_IDS=0,1,2,3' in slurm.stdout
  assert 'srun --kill-on-bad-exit=1' in slurm.stdout and '--workdir=/w' in slurm.stdout
  tpu = subprocess.run(
    [
      'bash',
      str(LAUNCH / 'tpu_vm.sh'),
      'tpu1',
      'us-central2-b',
      'v4-32',
      'configs/digits.py',
      'gs://bucket/run',
      '--config.seed=1',
    ],
    cwd=REPO,
    env=env,
    capture_output=True,
    text=True,
    check=True,
  )
  assert '--worker=all' in tpu.stdout and 'create tpu1' in tpu.stdout
  assert (
    'hscl_jax.main\\ --multihost\\ --config=configs/digits.py\\ '
    '--workdir=gs://bucket/run\\ --config.seed=1' in tpu.stdout
  )
  assert 'scp --recurse' not in tpu.stdout  # a gs:// workdir is not copied back
