"""benchmarks/accelerator.py's arithmetic with its measurements replaced by fixed figures:
the samples each step consumes (images over two views) against the loader's, MFU against
the matmul peak of the step's own dtype, the loss kernel against the float32 peak of its own
precision, JAX / PyTorch of the same model and dtype (the fastest variant that ran), and
PyTorch's process: its command, its rows, and how it ended. No accelerator, no training.
"""

from __future__ import annotations

import json
import os
import pathlib
import sys

import numpy as np
import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / 'benchmarks')]  # a script, imported as such

import accelerator  # noqa: E402


def args_of(*words):
  return accelerator.parse_args(['--out=x', '--smoke', *words])


def test_the_loader_is_compared_with_the_samples_each_step_consumes(monkeypatch):
  """400 images/s of a step are 200 samples/s (two views a sample): a loader of 300
  samples/s keeps 1.5 times ahead; a failed step has no row."""
  seen = {}

  def loader_rate(source, batch_size, batches):
    seen.update(images=np.asarray(source[0]['image']).shape, batch=batch_size, n=len(source))
    return 300.0

  monkeypatch.setattr(accelerator.bench_input, 'loader_rate', loader_rate)
  steps = [
    dict(model='resnet18', dtype='bfloat16', images_per_s=400.0),
    dict(model='resnet50', dtype='float32', images_per_s=100.0),
    dict(model='resnet50', dtype='bfloat16', error='RuntimeError: out of memory'),
  ]
  flow = accelerator.input_pipeline(args_of('--loader_images=12', '--batch_size=4'), steps)
  assert flow == dict(
    loader_samples_per_s=300, batch_size=4,
    step_samples_per_s={'resnet18 bfloat16': 200.0, 'resnet50 float32': 50.0},
    loader_over_step={'resnet18 bfloat16': 1.5, 'resnet50 float32': 6.0},
  )  # fmt: skip
  assert seen == dict(images=(16, 16, 3), batch=4, n=12)  # --smoke's 16 px, the sizes given


@pytest.mark.parametrize(
  ('dtype', 'local_peak', 'mfu'),
  [('bfloat16', 80.0, 0.25), ('float32', 80.0, 0.5), ('bfloat16', 400.0, 0.125)],
)
def test_mfu_is_against_the_peak_of_the_steps_dtype(monkeypatch, dtype, local_peak, mfu):
  """50 GFLOP/s achieved: against bfloat16's 200 or float32's 100 (this run's peaks), or
  the peak measured beside the step where it is higher."""
  measured = dict(achieved_gflops=50.0, matmul_peak_local_gflops=local_peak)
  monkeypatch.setattr(accelerator.bench_train_step, 'bench_model', lambda model, a: dict(measured))
  peaks = {'bfloat16 default': 200.0, 'float32 default': 100.0, 'float32 highest': 20.0}
  assert accelerator.train_step('resnet18', dtype, args_of(), peaks)['mfu'] == mfu


@pytest.mark.parametrize(('precision', 'peak'), [('highest', 20.0), ('default', 100.0)])
def test_the_loss_kernel_is_against_the_matmul_bound_of_its_precision(monkeypatch, precision, peak):
  """6 n^2 d FLOPs (n = 256, d = 128) at the float32 peak of the kernel's precision."""

  class Compiled:
    def lower(self, *arrays):
      return self

    def compile(self):
      return lambda *arrays: arrays[0]

  monkeypatch.setattr(accelerator.bench_losses, '_setup', lambda n: (np.zeros(2), np.zeros(2)))
  monkeypatch.setattr(accelerator.bench_losses, '_loss_step', lambda block, p: Compiled())
  monkeypatch.setattr(accelerator.bench_train_step, 'best_time', lambda *a, repeats: 0.006)
  peaks = {'float32 highest': 20.0, 'float32 default': 100.0, 'bfloat16 default': 200.0}
  row = accelerator.loss_kernel(256, precision, args_of(), peaks)
  bound_s = 6 * 256**2 * 128 / (peak * 1e9)
  assert (row['rows'], row['dim'], row['precision'], row['loss_ms']) == (256, 128, precision, 6.0)
  assert row['matmul_bound_ms'] == round(bound_s * 1e3, 3)
  assert row['ratio'] == round(0.006 / bound_s, 2)


def test_jax_over_torch_pairs_each_step_with_pytorch_on_the_same_model_and_dtype():
  step = lambda model, dtype, rate: dict(
    model=model, dtype=dtype, images_per_s=rate, images_per_step=1024, step_s_best=1024 / rate,
    augment_ms=0.0,
  )  # fmt: skip
  # The step without a PyTorch row sits between two with one: it is skipped, not the end.
  steps = [step('resnet18', 'bfloat16', 3000.0), step('resnet50', 'bfloat16', 800.0),
           step('resnet18', 'float32', 1200.0)]  # fmt: skip
  row = lambda model, dtype, variant, rate, **extra: dict(
    model=model, dtype=dtype, variant=variant, images_per_s=rate, **extra
  )
  torch_rows = [
    row('resnet18', 'bfloat16', 'eager', 1500.0),
    row('resnet18', 'bfloat16', 'compile', 2000.0),
    row('resnet18', 'float32', 'eager', 1000.0),
    row('resnet18', 'float32', 'compile', 9999.0, error='RuntimeError: failed'),  # not a rate
    row('resnet50', 'float32', 'eager', 400.0),  # another dtype than the JAX step's
  ]
  part = dict(environment=dict(device='cuda'), rows=torch_rows)
  ratios = accelerator.jax_over_torch(steps, part, 'gpu')
  assert [(r['model'], r['dtype'], r['torch_variant'], r['jax_over_torch']) for r in ratios] == [
    ('resnet18', 'bfloat16', 'compile', 1.5),
    ('resnet18', 'float32', 'eager', 1.2),
  ]


def test_the_environment_records_the_one_minute_load_average(monkeypatch):
  """The 1-minute load average of os.getloadavg() (1, 5, 15 minutes), not another."""
  monkeypatch.setattr(accelerator.os, 'getloadavg', lambda: (1.25, 5.5, 15.75))
  environment = accelerator.environment(accelerator.parse_args(['--out=/x', '--smoke']))
  assert environment['load_average_1min'] == 1.25
  assert environment['host_cpus'] == os.cpu_count() and environment['smoke'] is True


class FakePopen:
  """torch_reference.py's process as accelerator.py sees it: printed lines, an exit."""

  def __init__(self, stdout: str, stderr: str, returncode: int, commands: list):
    self.outputs, self.returncode, self.commands = (stdout, stderr), returncode, commands
    self.pid = 0

  def __call__(self, command, **kwargs):
    self.commands.append(command)
    return self

  def communicate(self, timeout=None):
    return self.outputs


def test_pytorchs_rows_come_from_its_process_with_the_same_sizes(monkeypatch):
  environment = dict(torch='2', device='cuda', device_name='H100')
  rows = [
    dict(model='resnet18', dtype='bfloat16', variant='eager', images_per_s=10.0),
    dict(model='resnet18', dtype='float32', variant='eager', error='RuntimeError: x'),
  ]
  stdout = '\n'.join([json.dumps(dict(environment=environment)), 'a warning',
                      *map(json.dumps, rows)]) + '\n'  # fmt: skip
  commands = []
  fake = FakePopen(stdout, 'Traceback\nRuntimeError: CUDA error: unspecified\n', 1, commands)
  monkeypatch.setattr(accelerator.subprocess, 'Popen', fake)
  # PyTorch's process is faked: whether torch is installed here does not matter.
  find_spec = accelerator.importlib.util.find_spec
  monkeypatch.setattr(
    accelerator.importlib.util, 'find_spec', lambda name: name == 'torch' or find_spec(name)
  )
  args = args_of('--torch_device=cuda', '--models=resnet18', '--dtypes=float32,bfloat16',
                 '--batch_size=64', '--image_size=32', '--steps=3')  # fmt: skip
  result = accelerator.torch_reference(args)
  assert result == dict(
    environment=environment, rows=rows, ended='exit status 1: RuntimeError: CUDA error: unspecified'
  )
  (command,) = commands
  assert command[1].endswith('benchmarks/torch_reference.py')
  # The run's sizes, bfloat16 first (a time limit cuts the last rows), --smoke's variant.
  assert command[2:] == [
    '--device=cuda', '--models=resnet18', '--dtypes=bfloat16,float32', '--variants=eager',
    '--batch_size=64', '--image_size=32', '--steps=3',
  ]  # fmt: skip
  skipped = FakePopen(json.dumps(dict(skipped='no CUDA device')) + '\n', '', 0, commands)
  monkeypatch.setattr(accelerator.subprocess, 'Popen', skipped)
  assert accelerator.torch_reference(args) == dict(skipped='no CUDA device')
  assert accelerator.torch_reference(args_of('--torch_device=off')) == dict(
    skipped='--torch_device=off'
  )
