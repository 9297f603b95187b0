"""The benchmark scripts start as benchmarks/README.md runs them: `python benchmarks/NAME.py`.

They are scripts, not modules: `sys.path[0]` is `benchmarks/`, so whatever they import from
the repository (e.g. `configs`) must be found without PYTHONPATH. Their `--help` in fresh
processes (all started at once) imports everything they need. The first ten minutes on a
GPU (`tools/first_light.py`, with the accelerator benchmark and PyTorch's step) run end to
end at smoke sizes.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import pathlib
import re
import shlex
import subprocess
import sys

from absl import flags
from end_to_end.test_image_folder_run import write_folder
import jax
from ml_collections import config_flags
import numpy as np
import pytest

from hscl_jax.config import schema

REPO = pathlib.Path(__file__).resolve().parents[1]
BENCHMARKS = sorted((REPO / 'benchmarks').glob('bench_*.py'))
sys.path[:0] = [str(REPO / 'benchmarks'), str(REPO / 'tools')]  # scripts, imported as such

import accelerator  # noqa: E402
import first_light as first_light_script  # noqa: E402
import gpu_bundle  # noqa: E402
import gpu_grid  # noqa: E402


def test_every_benchmark_script_starts_without_pythonpath(tmp_path):
  assert BENCHMARKS, 'no benchmarks/bench_*.py found'
  env = {key: value for key, value in os.environ.items() if key != 'PYTHONPATH'}
  env['JAX_PLATFORMS'] = 'cpu'
  procs = {
    script.name: subprocess.Popen(
      [sys.executable, str(script), '--help'],
      cwd=tmp_path,  # not the repository root: nothing may rely on the working directory
      env=env,
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
    )
    for script in BENCHMARKS
  }
  for name, proc in procs.items():
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, f'{name}:\n{err[-3000:]}'
    assert out.startswith('usage:'), f'{name}:\n{out[:500]}'


@pytest.fixture(scope='module')
def first_light(tmp_path_factory):
  """`tools/first_light.py --smoke` as the docs run it (no PYTHONPATH), on a bundle that
  holds a generated image folder (no wheels): install, devices, `accelerator.py --smoke`
  with PyTorch on the CPU, the plan, 2 epochs and the linear evaluation. Returns OUT."""
  root = tmp_path_factory.mktemp('first_light')
  write_folder(root / 'images', {'train': 10, 'test': 3})  # 4 classes: 40 + 12 images
  (root / 'bundle').mkdir()
  gpu_bundle.pack_data(root / 'images', root / 'bundle' / gpu_bundle.DATA_ARCHIVE)
  env = {key: value for key, value in os.environ.items() if key != 'PYTHONPATH'}
  env['JAX_PLATFORMS'] = 'cpu'
  out = root / 'out'
  # fmt: off
  subprocess.run(
    [sys.executable, str(REPO / 'tools' / 'first_light.py'), '--smoke', f'--out={out}',
     f'--bundle={root / "bundle"}', f'--work={root / "work"}', '--torch_device=cpu',
     '--budget_s=300', '--startup_s=30', '--linear_eval_s=30', '--max_epochs=2'],
    cwd=root, env=env, check=True, capture_output=True, timeout=400,
  )
  # fmt: on
  return out


def test_accelerator_smoke_run_writes_consistent_figures(first_light):
  """`benchmarks/accelerator.py --smoke` ran end to end (first_light's step) and each derived
  figure in its JSON equals the one recomputed from its measured parts."""
  report = json.loads((first_light / 'accelerator.json').read_text())
  table = (first_light / 'accelerator.md').read_text()
  assert report['environment']['jax'] == jax.__version__
  assert report['environment']['device_count'] == jax.device_count()  # 4 fake CPU devices
  peaks = report['matmul_peak_gflops']
  assert set(peaks) == {'float32 default', 'bfloat16 default', 'float32 highest'}
  (step,) = report['train_step']
  assert (step['model'], step['dtype'], step['batch_size']) == ('small_cnn', 'bfloat16', 8)
  assert step['images_per_s'] == pytest.approx(16 / step['step_s_best'], rel=1e-2)
  peak = max(peaks['bfloat16 default'], step['matmul_peak_local_gflops'])
  assert step['mfu'] == pytest.approx(step['achieved_gflops'] / peak, abs=2e-3)
  assert step['gflop_per_image'] > 0
  for row in report['loss']:
    bound_ms = 6 * row['rows'] ** 2 * 128 / (peaks[f'float32 {row["precision"]}'] * 1e6)
    assert row['matmul_bound_ms'] == pytest.approx(bound_ms, rel=1e-2)
    assert row['ratio'] == pytest.approx(row['loss_ms'] / row['matmul_bound_ms'], rel=2e-2)
    assert (
      f'| n = 256 | {row["precision"]} | 128 | {row["compile_s"]} | {row["loss_ms"]} |' in table
    )
  assert [row['precision'] for row in report['loss']] == ['highest', 'default']
  consumed = report['input']['step_samples_per_s']['small_cnn bfloat16']
  assert consumed == pytest.approx(step['images_per_s'] / 2, rel=1e-3)
  assert report['input']['loader_over_step']['small_cnn bfloat16'] == pytest.approx(
    report['input']['loader_samples_per_s'] / consumed, rel=1e-2
  )
  assert f'| small_cnn bfloat16 | 8 | 16 | {step["compile_s"]} | {step["images_per_s"]} |' in table
  if report['torch'].get('skipped'):  # only where PyTorch is not installed
    assert report['torch']['skipped'].startswith('PyTorch is not installed'), report['torch']
    return
  (torch_row,) = report['torch']['rows']
  assert (torch_row['model'], torch_row['dtype'], torch_row['variant']) == (
    'small_cnn',
    'bfloat16',
    'eager',
  )
  assert torch_row['images_per_s'] == pytest.approx(16 / torch_row['step_s_best'], rel=1e-2)
  (ratio,) = report['ratio']
  assert ratio['jax_over_torch'] == pytest.approx(
    step['images_per_s'] / torch_row['images_per_s'], rel=2e-3
  )
  without_augment = 16 / (step['step_s_best'] - step['augment_ms'] / 1e3)
  assert ratio['jax_without_augment_over_torch'] == pytest.approx(
    without_augment / torch_row['images_per_s'], rel=2e-3
  )
  assert (
    f'| small_cnn bfloat16 | eager | {torch_row["warmup_s"]} | {torch_row["images_per_s"]} |'
    in table
  )


def test_first_light_plans_the_epochs_trains_and_evaluates(first_light):
  """The plan's epochs follow from the rate the accelerator step just measured; the run
  trained that many epochs on the bundle's data (unpacked), with its kNN monitor, and the
  linear evaluation read its last checkpoint; OUT holds at most 8 files of <= 16 MiB."""
  files = sorted(path.name for path in first_light.iterdir())
  assert files == sorted([
    'accelerator.json', 'accelerator.md', 'config.json', 'first_light.json', 'first_light.log',
    'first_light.md', 'linear_eval.json', 'metrics.jsonl',
  ])  # fmt: skip
  assert all((first_light / name).stat().st_size <= 16 * 2**20 for name in files)
  summary = json.loads((first_light / 'first_light.json').read_text())
  assert [(s['step'], s['status']) for s in summary['steps']] == [
    ('install', 'ok'), ('devices', 'ok'), ('accelerator', 'ok'), ('train', 'ok'),
    ('linear eval', 'ok'),
  ]  # fmt: skip
  plan, report = summary['plan'], json.loads((first_light / 'accelerator.json').read_text())
  (step,) = report['train_step']
  assert plan['step_samples_per_s'] == step['images_per_s'] / 2
  assert plan['loader_samples_per_s'] == report['input']['loader_samples_per_s']
  assert plan['examples'] == 40  # the bundle's train/ split, unpacked
  usable = min(plan['step_samples_per_s'], plan['loader_samples_per_s']) * plan['efficiency']
  assert plan['epoch_s'] == pytest.approx(40 / usable, abs=0.01)
  fit = int(plan['train_s'] // (40 / usable))
  assert plan['epochs'] == min(max(fit, 1), 2) == 2  # --max_epochs=2 binds at this rate
  records = [json.loads(line) for line in (first_light / 'metrics.jsonl').read_text().splitlines()]
  assert [r['epoch'] for r in records] == [1, 2] and [r['step'] for r in records] == [5, 10]
  assert summary['run']['knn_top1'] == {str(r['epoch']): r['knn_top1'] for r in records}
  linear = json.loads((first_light / 'linear_eval.json').read_text())
  assert (linear['checkpoint_step'], linear['num_train'], linear['num_test']) == (10, 40, 12)
  assert summary['run']['linear_eval']['top1'] == linear['top1']
  config = json.loads((first_light / 'config.json').read_text())
  assert (config['model']['name'], config['model']['dtype'], config['num_epochs']) == (
    'small_cnn',
    'bfloat16',
    2,
  )
  assert (
    f'| accelerator | ok | {summary["steps"][2]["seconds"]} |'
    in (first_light / 'first_light.md').read_text()
  )


def test_a_first_light_step_stops_at_its_limit_and_the_plan_goes_on_without_a_rate(tmp_path):
  log = first_light_script.Log(tmp_path / 'log')
  sleeper = [sys.executable, '-c', 'import time; print("started", flush=True); time.sleep(60)']
  record, lines = first_light_script.run_step('sleep', sleeper, 2, log, dict(os.environ))
  assert record['status'] == 'stopped at its limit of 2 s' and 2 <= record['seconds'] < 30
  assert lines == ['started\n']
  args = first_light_script.parse_args(['--out=x', '--max_epochs=7'])
  unmeasured = first_light_script.plan_epochs({}, 500, 50_000, args)
  assert (unmeasured['epochs'], unmeasured['epoch_s']) == (1, None)  # no rate: 1 epoch
  rate = dict(step_samples_per_s=1000.0)  # 62.5 s an epoch at 0.8; 310 s to train: 4
  plan = first_light_script.plan_epochs(rate, 500, 50_000, args)
  assert (plan['train_s'], plan['epochs'], plan['every_epochs']) == (500 - 90 - 75 - 25, 4, 1)
  faster = first_light_script.plan_epochs(dict(step_samples_per_s=1e5), 500, 50_000, args)
  assert faster['epochs'] == 7  # --max_epochs


@pytest.mark.filterwarnings('ignore:the load_module:DeprecationWarning')
def test_first_light_trains_a_valid_config_at_full_size(monkeypatch):
  """The node's training command (not the smoke's) parses and validates: ResNet-18,
  H-SCL(beta = 1), bfloat16, batch 512, the whole split, the planned epochs."""
  monkeypatch.chdir(REPO)
  args = first_light_script.parse_args(['--out=x'])
  plan = first_light_script.plan_epochs(dict(step_samples_per_s=1e4), 300, 50_000, args)
  assert (plan['epochs'], plan['every_epochs']) == (17, 4)  # 110 s at 8,000 samples/s
  command = first_light_script.train_command('/data', pathlib.Path('/run'), plan, args)
  assert command[1:] == [
    '-m', 'hscl_jax.main', '--config=configs/cifar10_folder.py', '--workdir=/run',
    *(word for word in command[5:] if word.startswith('--config.')),
  ]  # fmt: skip
  argv = ['prog', *command[3:4], *command[5:]]
  flag_values = flags.FlagValues()
  config_flags.DEFINE_config_file('config', None, flag_values=flag_values, sys_argv=argv)
  flag_values(argv)
  config = flag_values.config
  schema.validate_config(config, num_devices=1)
  assert (config.model.name, config.model.dtype, config.batch_size, config.train_examples) == (
    'resnet18',
    'bfloat16',
    512,
    0,
  )
  assert (config.method, config.hardening, config.beta, config.optimizer.schedule) == (
    'hscl',
    'exp',
    1.0,
    'cosine',
  )
  assert (config.num_epochs, config.knn.every_epochs, config.checkpoint_every_epochs) == (17, 4, 4)


def test_torch_reference_loss_equals_the_jax_kernel():
  """torch_reference.hscl_loss (dense, sample-major views) and losses.hscl: the same value
  and gradient, with several samples per label (positives beyond the other view)."""
  torch = pytest.importorskip('torch')
  import torch_reference

  from hscl_jax import losses

  rng = np.random.default_rng(0)
  z = rng.normal(size=(6, 2, 8))
  z /= np.linalg.norm(z, axis=-1, keepdims=True)
  labels = np.array([0, 1, 0, 2, 1, 0])
  hscl = lambda z: losses.hscl(z, labels, hardening=losses.exponential(1.0), temperature=0.5)
  value, grad = jax.value_and_grad(hscl)(z.astype(np.float32))
  z_torch = torch.tensor(z.reshape(12, 8), requires_grad=True)
  torch_value = torch_reference.hscl_loss(z_torch, torch.tensor(labels).repeat_interleave(2))
  torch_value.backward()
  np.testing.assert_allclose(float(value), torch_value.item(), rtol=1e-5)
  np.testing.assert_allclose(np.asarray(grad).reshape(12, 8), z_torch.grad.numpy(), atol=1e-6)


# `python[3] SCRIPT.py ARGS` in the docs and in the scripts' own docstrings.
_SCRIPT_COMMAND = re.compile(
  r'python3? ((?:tools|benchmarks)/'
  r'(?:first_light|gpu_bundle|gpu_grid|accelerator|torch_reference)\.py)'
  r'((?:\\\n|[^\n`#|&;])*)'  # a continuation first: its backslash is no word
)


def test_documented_script_commands_parse():
  """Each command of the first hour that a doc or a script's docstring shows parses with
  that script's own argument parser (torch_reference.py's where PyTorch is installed)."""
  scripts = {
    'tools/first_light.py': first_light_script,
    'tools/gpu_bundle.py': gpu_bundle,
    'tools/gpu_grid.py': gpu_grid,
    'benchmarks/accelerator.py': accelerator,
  }
  docs = [REPO / 'README.md', REPO / 'benchmarks' / 'README.md', *(REPO / 'docs').rglob('*.md')]
  texts = [path.read_text() for path in docs] + [module.__doc__ for module in scripts.values()]
  for config in sorted((REPO / 'configs').glob('*.py')):  # their docstrings show commands too
    texts.append(ast.get_docstring(ast.parse(config.read_text()), clean=False) or '')
  if importlib.util.find_spec('torch') is not None:
    import torch_reference

    scripts['benchmarks/torch_reference.py'] = torch_reference
    texts.append(torch_reference.__doc__)
  commands = [m.groups() for text in texts for m in _SCRIPT_COMMAND.finditer(text)]
  assert {script for script, _ in commands} >= {
    'tools/first_light.py',
    'tools/gpu_bundle.py',
    'tools/gpu_grid.py',
  }
  for script, words in commands:
    if script in scripts:
      scripts[script].parse_args(shlex.split(words.replace('\\\n', ' ')))  # exits if bad


def test_accelerator_records_a_failed_measurement_and_goes_on():
  def out_of_memory():
    raise RuntimeError('RESOURCE_EXHAUSTED: Out of memory\nwhile allocating 40.0GiB')

  failed = accelerator.measured(out_of_memory, model='resnet50', dtype='float32')
  assert failed == {
    'model': 'resnet50',
    'dtype': 'float32',
    'error': 'RuntimeError: RESOURCE_EXHAUSTED: Out of memory',
  }
  assert accelerator.measured(lambda: {'mfu': 0.5}, model='resnet18') == {'mfu': 0.5}
  environment = dict(
    device_kind='H100', platform='gpu', device_count=1, jax='0', jaxlib='0', python='3',
    date='today', smoke=False,
  )  # fmt: skip
  table = accelerator.markdown(dict(environment=environment, train_step=[failed]))
  assert '| resnet50 float32 | failed: RuntimeError: RESOURCE_EXHAUSTED: Out of memory |' in table
  assert 'loss kernel' not in table and 'Input' not in table  # not measured yet
  measured_step = dict(model='resnet18', dtype='bfloat16', images_per_s=2000.0,
                       images_per_step=1024, step_s_best=0.512, augment_ms=12.0)  # fmt: skip
  torch_part = dict(
    environment=dict(device='cuda', device_name='H100'),
    rows=[dict(model='resnet18', dtype='bfloat16', variant=variant, images_per_s=rate)
          for variant, rate in (('eager', 1000.0), ('compile', 1600.0))],
  )  # fmt: skip
  (ratio,) = accelerator.jax_over_torch([measured_step, failed], torch_part, 'gpu')
  assert (ratio['torch_variant'], ratio['jax_over_torch']) == ('compile', 1.25)  # the fastest
  assert ratio['jax_without_augment_over_torch'] == round(1024 / 0.5 / 1600, 3)  # 1.28
  assert accelerator.jax_over_torch([measured_step], torch_part, 'cpu') == []  # not the same
  skipped = dict(skipped='no CUDA device visible to PyTorch')
  assert accelerator.jax_over_torch([measured_step], skipped, 'gpu') == []
  table = accelerator.markdown(dict(environment=environment, torch=skipped))
  assert 'PyTorch: skipped (no CUDA device visible to PyTorch).' in table


@pytest.mark.parametrize(
  'name', ['accelerator', 'torch_reference', 'first_light', 'gpu_bundle', 'gpu_grid']
)
def test_each_gpu_program_help_opens_with_its_docstring_first_line(name, capsys, monkeypatch):
  """What a user reads first in --help is what the program is: its docstring's first line
  (not another of its lines), read here from the file's source, not from the module."""
  if name == 'torch_reference':
    pytest.importorskip('torch')  # imported at its top: the `bench` extra
  script = importlib.import_module(name)
  source = pathlib.Path(script.__file__).read_text()
  first = ast.get_docstring(ast.parse(source)).splitlines()[0]
  monkeypatch.setenv('COLUMNS', '1000')  # one line: argparse wraps at the terminal's width
  with pytest.raises(SystemExit) as exit_:
    script.parse_args(['--help'])
  assert exit_.value.code == 0
  usage, description = capsys.readouterr().out.split('\n\n')[:2]
  assert usage.startswith('usage:') and description == first
