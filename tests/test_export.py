"""The `python -m hscl_jax.export` program before any work: a workdir that holds no run, a
format it does not write and a stray argument are each refused (status 1 or absl's usage
error), naming the fix, with no traceback and nothing written. (What it writes from a
trained run: tests/test_torch_export.py.)"""

from __future__ import annotations

from test_main import assert_one_line
from test_main import run


def test_a_workdir_without_a_run_is_one_line_and_nothing_is_written(tmp_path):
  out = tmp_path / 'out' / 'backbone.safetensors'
  status, output = run(
    'hscl_jax.export', f'--workdir={tmp_path / "nope"}', '--format=torch', f'--out={out}'
  )
  assert status == 1, output[-3000:]
  assert_one_line(
    output,
    f'{tmp_path / "nope" / "config.json"} not found: --workdir must be the directory of a '
    'training run',
    'or pass --config=FILE.',
  )
  assert not (tmp_path / 'out').exists()


def test_an_unknown_format_or_a_stray_argument_is_refused_before_any_work(tmp_path):
  out = f'--out={tmp_path}/b.safetensors'
  status, output = run('hscl_jax.export', f'--workdir={tmp_path}', '--format=onnx', out)
  assert status == 1 and 'Traceback' not in output, output[-3000:]
  assert 'flag --format=onnx: value should be one of <torch>' in output
  status, output = run('hscl_jax.export', f'--workdir={tmp_path}', '--format=torch', out, 'x')
  assert status == 1 and 'Traceback' not in output, output[-3000:]
  assert 'Unexpected arguments: x' in output
  assert list(tmp_path.iterdir()) == []
