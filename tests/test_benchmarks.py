"""The benchmark scripts start as benchmarks/README.md runs them: `python benchmarks/NAME.py`.

They are scripts, not modules: `sys.path[0]` is `benchmarks/`, so whatever they import from
the repository (e.g. `configs`) must be found without PYTHONPATH. Their `--help` in fresh
processes (all started at once) imports everything they need.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import jax
import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
BENCHMARKS = sorted((REPO / 'benchmarks').glob('bench_*.py'))


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


def test_accelerator_smoke_run_writes_consistent_figures(tmp_path):
  """`benchmarks/accelerator.py --smoke` runs end to end (as the docs run it, no PYTHONPATH)
  and each derived figure in its JSON equals the one recomputed from its measured parts."""
  env = {key: value for key, value in os.environ.items() if key != 'PYTHONPATH'}
  env['JAX_PLATFORMS'] = 'cpu'
  out = tmp_path / 'out'
  subprocess.run(
    [sys.executable, str(REPO / 'benchmarks' / 'accelerator.py'), '--smoke', f'--out={out}'],
    cwd=tmp_path,
    env=env,
    check=True,
    capture_output=True,
    timeout=300,
  )
  report = json.loads((out / 'accelerator.json').read_text())
  table = (out / 'accelerator.md').read_text()
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


def test_accelerator_records_a_failed_measurement_and_goes_on():
  sys.path.insert(0, str(REPO / 'benchmarks'))
  import accelerator

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
