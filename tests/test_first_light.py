"""tools/first_light.py's plan, against plans worked out by hand: which rate (the ResNet-18
bfloat16 step's samples, two views an image pair, or the loader's where it is slower), which
split (the training split's images, not the test split's), the rounding (whole epochs that
fit; a plan that exactly fits is taken) and the program's wiring of them into the training
command. No training: the steps' processes are replaced by a fake that records them.
"""

from __future__ import annotations

import json
import pathlib
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / 'tools')]  # a script, imported as such

import first_light  # noqa: E402
import gpu_bundle  # noqa: E402

# Exact in binary floating point: reserves 10 + 20 + 5 x 2 = 40 s, half the rate planned.
EXACT = ['--out=x', '--startup_s=10', '--linear_eval_s=20', '--knn_s=2', '--efficiency=0.5',
         '--max_epochs=50']  # fmt: skip


def split_folder(root: pathlib.Path, split: str, sizes: tuple[int, ...]) -> None:
  for label, size in enumerate(sizes):
    (root / split / f'class{label}').mkdir(parents=True)
    for i in range(size):
      (root / split / f'class{label}' / f'{i}.png').touch()


@pytest.mark.parametrize(
  ('seconds_left', 'rate', 'epochs', 'every_epochs', 'epoch_s'),
  [
    (54.0, dict(step_samples_per_s=100.0), 7, 1, 2.0),  # 14 s to train, 2 s an epoch: fits
    (53.9, dict(step_samples_per_s=100.0), 6, 1, 2.0),  # 13.9 s: the 7th is not taken
    (54.0, dict(step_samples_per_s=100.0, loader_samples_per_s=1000.0), 7, 1, 2.0),
    (54.0, dict(step_samples_per_s=100.0, loader_samples_per_s=40.0), 2, 1, 5.0),  # loader
    (112.0, dict(step_samples_per_s=100.0), 36, 9, 2.0),  # 72 s: 36, a quarter 9
    (114.0, dict(step_samples_per_s=100.0), 37, 9, 2.0),  # a quarter of 37 rounds down
    (1000.0, dict(step_samples_per_s=100.0), 50, 12, 2.0),  # 480 s would be 240: the cap
    (30.0, dict(step_samples_per_s=100.0), 1, 1, 2.0),  # no time to train: still one
  ],
)
def test_the_plan_takes_the_whole_epochs_that_fit(
  seconds_left, rate, epochs, every_epochs, epoch_s
):
  args = first_light.parse_args(EXACT)
  plan = first_light.plan_epochs(rate, seconds_left, 100, args)
  assert plan == dict(
    rate, examples=100, seconds_left=seconds_left, train_s=round(seconds_left - 40, 1),
    epoch_s=epoch_s, efficiency=0.5, epochs=epochs, every_epochs=every_epochs,
  )  # fmt: skip


def test_the_examples_of_an_epoch_are_the_training_splits_files(tmp_path):
  split_folder(tmp_path, 'train', (5, 7, 2))
  split_folder(tmp_path, 'test', (3, 3, 3))
  (tmp_path / 'train' / 'LICENSE').touch()  # not a class folder
  assert first_light.count_images(tmp_path / 'train') == 14
  assert first_light.count_images(tmp_path / 'test') == 9
  assert first_light.count_images(tmp_path / 'validation') == 0


def accelerator_report(out: pathlib.Path, resnet18_bfloat16: dict, loader: float) -> None:
  """An accelerator.json whose other rows, if read, give other plans."""
  steps = [
    dict(model='resnet18', dtype='float32', images_per_s=6.0),
    dict(model='resnet50', dtype='bfloat16', images_per_s=4.0),
    dict(model='resnet18', dtype='bfloat16', **resnet18_bfloat16),
  ]
  report = dict(train_step=steps, input=dict(loader_samples_per_s=loader))
  (out / 'accelerator.json').write_text(json.dumps(report))


def run_main(
  tmp_path, monkeypatch, resnet18_bfloat16: dict, loader=15.0, bench_lines=(), limits=None
):
  """first_light.main on a folder of 24 training and 9 test images, every step faked (the
  accelerator's writes accelerator.json); returns (first_light.json, {step: command});
  `limits`, where given, gets {step: its time limit}."""
  data, out = tmp_path / 'data', tmp_path / 'out'
  split_folder(data, 'train', (10, 8, 6))
  split_folder(data, 'test', (3, 3, 3))
  commands, limits = {}, {} if limits is None else limits

  def fake_step(name, command, limit_s, log, env):
    commands[name], limits[name] = command, limit_s
    if name == 'accelerator':
      accelerator_report(out, resnet18_bfloat16, loader)
    lines = list(bench_lines) if name == 'step rate' else []
    return dict(step=name, status='ok', seconds=0.0), lines

  monkeypatch.setattr(first_light, 'run_step', fake_step)
  first_light.main([f'--out={out}', f'--data={data}', f'--work={tmp_path / "work"}',
                    f'--bundle={tmp_path / "no_bundle"}'])  # fmt: skip
  return json.loads((out / 'first_light.json').read_text()), commands


@pytest.mark.parametrize(
  ('loader', 'epoch_s', 'epochs', 'every_epochs'), [(15.0, 3.0, 116, 29), (8.0, 3.75, 93, 23)]
)
def test_the_program_plans_from_the_resnet18_bfloat16_samples_and_the_training_split(
  tmp_path, monkeypatch, loader, epoch_s, epochs, every_epochs
):
  """20 images/s of ResNet-18 bfloat16 are 10 samples/s; with the loader's 15 (faster) 8 at
  0.8: 3 s an epoch of the 24 training images; 540 - 90 - 75 - 25 = 350 s (less the moments
  the fake steps took) hold 116 epochs (the test split's 9 images would give the cap, 200;
  20 samples/s 174; the float32 or ResNet-50 rows 38 or 25). A loader of 8 binds: 3.75 s."""
  summary, commands = run_main(tmp_path, monkeypatch, dict(images_per_s=20.0), loader)
  plan = summary['plan']
  assert (plan['examples'], plan['step_samples_per_s'], plan['source']) == (
    24,
    10.0,
    'accelerator.json',
  )
  assert plan['loader_samples_per_s'] == loader
  assert (plan['epoch_s'], plan['epochs'], plan['every_epochs']) == (epoch_s, epochs, every_epochs)
  assert 'step rate' not in commands  # measured: bench_train_step.py is not run
  assert 'install' not in commands  # no bundle
  train = commands['train']
  for flag in (f'--config.folder={tmp_path / "data"}', f'--config.num_epochs={epochs}',
               f'--config.knn.every_epochs={every_epochs}',
               f'--config.checkpoint_every_epochs={every_epochs}',
               '--config.model.name=resnet18', '--config.model.dtype=bfloat16',
               '--config.batch_size=512', '--config.train_examples=0'):  # fmt: skip
    assert flag in train
  (workdir,) = [word for word in train if word.startswith('--workdir=')]
  assert commands['linear eval'][-1] == workdir  # the run just trained, evaluated


def test_without_a_measured_step_the_plan_takes_bench_train_steps_samples(tmp_path, monkeypatch):
  """The accelerator's ResNet-18 bfloat16 step failed: bench_train_step.py's 30 images/s
  are 15 samples/s, 12 at 0.8, 2 s an epoch; 350 s (less the moments the fake steps took)
  hold 174 epochs (no loader rate now)."""
  failed = dict(error='RuntimeError: RESOURCE_EXHAUSTED')
  printed = ['compiling\n', json.dumps(dict(model='resnet18', images_per_s=30.0)) + '\n']
  limits = {}
  summary, commands = run_main(tmp_path, monkeypatch, failed, bench_lines=printed, limits=limits)
  # 540 s: the accelerator gets its 300 (not the 315 left after the reserves), the step's
  # own measurement its 150 (not the 340 left after 200).
  assert (limits['accelerator'], limits['step rate']) == (300, 150)
  plan = summary['plan']
  assert (plan['step_samples_per_s'], plan['source']) == (15.0, 'benchmarks/bench_train_step.py')
  assert (plan['epoch_s'], plan['epochs'], plan['every_epochs']) == (2.0, 174, 43)
  assert (
    '--models=resnet18' in commands['step rate'] and '--dtype=bfloat16' in commands['step rate']
  )
  assert '--config.num_epochs=174' in commands['train']


@pytest.mark.parametrize(('data', 'data_sets'), [(None, 'cifar10'), ('/images', '')])
def test_the_bundle_is_installed_and_its_data_unpacked_unless_data_names_a_folder(
  tmp_path, monkeypatch, data, data_sets
):
  """With --data the install puts in the wheels alone (unpacking CIFAR-10 takes half a
  minute of the node's time) and the run reads --data's folder."""
  (tmp_path / 'bundle').mkdir()
  commands = []

  def fake_step(name, command, limit_s, log, env):
    commands.append(command)
    return dict(step=name, status='ok', seconds=0.0), []

  monkeypatch.setattr(first_light, 'run_step', fake_step)
  given = [f'--data={data}'] if data else []
  args = first_light.parse_args(['--out=x', f'--bundle={tmp_path / "bundle"}', *given])
  folder = first_light.unpack(args, tmp_path / 'work', None, {}, [])
  assert folder == (data or str(tmp_path / 'work' / 'data'))
  (command,) = commands
  assert command[1:4] == ['tools/gpu_bundle.py', f'--bundle={tmp_path / "bundle"}', 'install']
  assert gpu_bundle.parse_args(command[2:]).data_sets == ([data_sets] if data_sets else [])


def test_the_summary_reads_the_last_epoch_and_the_median_rate(tmp_path):
  """metrics.jsonl's last record gives the epochs done and the last loss; the rates their
  median (the middle of three), the epoch times their sum in minutes."""
  records = [
    dict(epoch=1, samples_per_second=50.0, epoch_time=60.0, train_loss=5.0, knn_top1=0.2),
    dict(epoch=2, samples_per_second=90.0, epoch_time=30.0, train_loss=4.0),
    dict(epoch=3, samples_per_second=70.0, epoch_time=30.0, train_loss=3.5, knn_top1=0.4),
  ]
  (tmp_path / 'metrics.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in records))
  assert first_light.run_summary(tmp_path) == dict(
    epochs_done=3,
    train_minutes=2.0,
    median_samples_per_s=70.0,
    knn_top1={1: 0.2, 3: 0.4},
    last_train_loss=3.5,
  )
