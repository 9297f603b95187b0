"""The Tiny-ImageNet-100 grid for the lent GPUs (configs/tin100.py, tools/gpu_grid.py).

The pack (tools/gpu_bundle.py tin100) from a generated zip in the official layout, its
resize against an independent filter, the config's protocol and its density claim, E's
calibration, and the whole chain at smoke sizes on the CPU: pack, bundle, `gpu_grid.py
run --smoke` (two runs of the grid, each in its own process, as on a node), the merge
and the report.
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import pathlib
import subprocess
import sys
import tarfile
import zipfile

import numpy as np
from PIL import Image
import pytest

from hscl_jax.config import fields
from hscl_jax.config import schema
from hscl_jax.data import image_folder
from hscl_jax.experiments import grid as image_grid
from hscl_jax.experiments import grid as image_runs
from hscl_jax.experiments import reports as image_batches
from hscl_jax.experiments import run_records
from hscl_jax.rundir import metrics

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / 'tools'), str(REPO)]  # the tools are scripts, imported as such

import gpu_bundle  # noqa: E402
import gpu_grid  # noqa: E402

from configs import tin100  # noqa: E402

WNIDS = ['n09000004', 'n01000002', 'n05000000', 'n02000003', 'n07000001']  # not sorted


def class_colour(index: int) -> np.ndarray:
  return np.array([40 * index + 20, 200 - 30 * index, 90], np.uint8)


def fake_tin_zip(path: pathlib.Path, train: int = 6, val: int = 3) -> None:
  """tiny-imagenet-200.zip's layout: wnids.txt, words.txt, train/<wnid>/images/*.JPEG,
  val/images/* with val_annotations.txt (classes interleaved); each class one colour
  with noise, so that a packed image's class shows in its pixels."""
  rng = np.random.default_rng(0)
  root, annotations = 'tiny-imagenet-200/', []
  with zipfile.ZipFile(path, 'w') as archive:
    archive.writestr(root + 'wnids.txt', ''.join(f'{wnid}\n' for wnid in WNIDS))
    words = ''.join(f'{wnid}\tthing {i}, other\n' for i, wnid in enumerate(WNIDS))
    archive.writestr(root + 'words.txt', words + 'n99999999\tunused\n')
    for i in range(train + val):
      for label, wnid in enumerate(WNIDS):
        noise = rng.integers(-10, 11, (64, 64, 3))
        pixels = np.clip(class_colour(label) + noise, 0, 255).astype(np.uint8)
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(buffer, 'JPEG', quality=95)
        if i < train:
          archive.writestr(f'{root}train/{wnid}/images/{wnid}_{i}.JPEG', buffer.getvalue())
        else:
          name = f'val_{i * len(WNIDS) + label}.JPEG'
          archive.writestr(f'{root}val/images/{name}', buffer.getvalue())
          annotations.append(f'{name}\t{wnid}\t0\t0\t63\t63\n')
    archive.writestr(f'{root}train/{WNIDS[0]}/{WNIDS[0]}_boxes.txt', '')  # not an image
    archive.writestr(root + 'val/val_annotations.txt', ''.join(annotations))


def triangle_halving(image: np.ndarray) -> np.ndarray:
  """64 -> 32 by the separable filter (1, 3, 3, 1) / 8 over source pixels 2i-1 .. 2i+2
  (a triangle two source pixels wide on each side of the output's centre), weights
  renormalised at the borders: the antialiased bilinear, written out."""
  taps = np.array([1, 3, 3, 1], np.float64)

  def along(x, axis):
    x = np.moveaxis(x.astype(np.float64), axis, 0)
    out = np.zeros((x.shape[0] // 2, *x.shape[1:]))
    for i in range(out.shape[0]):
      index = np.arange(2 * i - 1, 2 * i + 3)
      inside = (index >= 0) & (index < x.shape[0])
      weights = taps[inside] / taps[inside].sum()
      out[i] = np.tensordot(weights, x[index[inside]], axes=1)
    return np.moveaxis(out, 0, axis)

  return along(along(image, 0), 1)


def test_the_pack_resizes_with_an_antialiased_triangle_filter():
  """PIL's bilinear at a halving equals the (1, 3, 3, 1) / 8 triangle (to rounding), not
  a 2 x 2 average (the point-sampled bilinear); a grey file becomes RGB."""
  image = np.random.default_rng(1).integers(0, 256, (64, 64, 3), np.uint8)
  buffer = io.BytesIO()
  Image.fromarray(image).save(buffer, 'PNG')
  resized = np.asarray(gpu_bundle.downsized(buffer.getvalue()), np.float64)
  assert resized.shape == (32, 32, 3)
  assert np.abs(resized - triangle_halving(image)).max() <= 1
  box = image.reshape(32, 2, 32, 2, 3).mean(axis=(1, 3))
  assert np.abs(resized - box).max() > 20  # a 2 x 2 average would be another image
  grey = io.BytesIO()
  Image.fromarray(image[..., 0]).save(grey, 'PNG')
  rgb = np.asarray(gpu_bundle.downsized(grey.getvalue()), np.float64)
  assert rgb.shape == (32, 32, 3) and np.abs(rgb[..., 0] - rgb[..., 2]).max() == 0


def test_the_pack_takes_the_first_classes_with_their_train_and_val_images(tmp_path):
  fake_tin_zip(tmp_path / 'tin.zip')
  bundle = tmp_path / 'bundle'
  gpu_bundle.main([f'--bundle={bundle}', 'tin100', f'--zip={tmp_path / "tin.zip"}',
                   '--classes=4', f'--folder={tmp_path / "local" / "tin100"}'])  # fmt: skip
  manifest = json.loads((bundle / 'manifest.json').read_text())
  assert manifest['tin100']['images'] == {'train': 24, 'test': 12}
  assert manifest['data_bytes'] == {'tin100.tar.gz': (bundle / 'tin100.tar.gz').stat().st_size}
  gpu_bundle.main([f'--bundle={bundle}', 'install', f'--site={tmp_path / "site"}',
                   f'--data_to={tmp_path / "node"}', '--data_sets=tin100'])  # fmt: skip
  folder = tmp_path / 'node' / 'tin100'  # as the node unpacks it
  assert (folder / 'wnids.txt').read_text().split() == WNIDS[:4]
  assert [line.split('\t')[0] for line in (folder / 'words.txt').read_text().splitlines()] == (
    WNIDS[:4]
  )
  for split, per_class in (('train', 6), ('test', 3)):
    scanned = image_folder.scan_image_folder(str(folder), split)
    assert scanned.class_ids == WNIDS[:4] and scanned.class_names[0] == 'thing 0'
    assert np.bincount(scanned.labels).tolist() == [per_class] * 4
    for path, label in zip(scanned.paths, scanned.labels):
      with Image.open(path) as image:
        assert (image.format, image.size, image.mode) == ('JPEG', (32, 32), 'RGB')
        mean = np.asarray(image, np.float64).mean(axis=(0, 1))
      assert np.abs(mean - class_colour(label)).max() < 6, path  # the annotated class's
  with pytest.raises(SystemExit, match='lists 5 classes, fewer than 6'):
    gpu_bundle.pack_tin100(tmp_path / 'tin.zip', tmp_path / 'six', classes=6)


@pytest.mark.filterwarnings('ignore:the load_module:DeprecationWarning')
def test_the_config_is_the_papers_protocol_at_the_density_it_claims():
  config = tin100.get_config()
  config.folder = '/data/tin100'  # the command line's --config.folder
  for devices in (1, 4):
    schema.validate_config(config, num_devices=devices)
  for section, names in fields.CONFIG_FIELDS.items():
    assert sorted((config[section] if section else config).keys()) == sorted(names)
  assert (config.model.name, config.model.stem, config.model.dtype) == (
    'resnet18',
    'cifar',
    'bfloat16',
  )
  assert (config.batch_size, config.optimizer.name, config.optimizer.learning_rate) == (
    512,
    'adam',
    1e-3,
  )
  assert (config.optimizer.weight_decay, config.temperature, config.beta) == (1e-6, 0.5, 1.0)
  assert (config.augment.image_size, config.augment.crop_scale) == (32, (0.08, 1.0))
  assert config.num_epochs == (tin100.EPOCHS or tin100.PROVISIONAL_EPOCHS)
  tin100.with_epochs(config, 23)
  assert (config.knn.every_epochs, config.checkpoint_every_epochs) == (2, 23)
  # 100 classes x 250 images in uniform batches of 512: 511 x 249 / 24,999 others of the
  # anchor's class, measured in the batches the loader draws (one epoch, seed 0).
  labels = np.repeat(np.arange(100), 250)
  mean, with_one = image_batches.same_class_per_anchor(labels, 512, seed=0, num_epochs=1)
  assert abs(mean - 511 * 249 / 24_999) < 0.05 and with_one > 0.99


def test_calibration_fits_a_run_to_its_target_and_a_run_starts_only_if_it_fits():
  args = gpu_grid.parse_args(['run', '--out=x'])
  measured = gpu_grid.epochs_for(5000.0, 25_000, args)
  epoch_s = 48 * 512 / (5000 * 0.8)  # 48 full batches at 80 % of the rate: 6.144 s
  train_s = 230 - 60 - 45 - 10 * 3  # the target less start-up, linear eval, 10 kNN
  assert measured['epochs'] == int(train_s // epoch_s) == 15
  assert measured['predicted_run_s'] == round(230 - train_s + 15 * epoch_s, 1)
  assert gpu_grid.epochs_for(1.0, 25_000, args)['epochs'] == 1  # never 0
  # An exact fit is taken: 1,100 images are 2 full batches, 0.5 s an epoch at half of
  # 4,096 samples/s; 95 s hold 190 epochs exactly.
  half = gpu_grid.parse_args(['run', '--out=x', '--efficiency=0.5'])
  exact = gpu_grid.epochs_for(4096.0, 1100, half)
  assert (exact['epoch_s'], exact['epochs'], exact['predicted_run_s']) == (0.5, 190, 230.0)
  assert gpu_grid.run_estimate_s([100.0, 130.0], 240.0, 1.15) == pytest.approx(149.5)
  assert gpu_grid.run_estimate_s([], 240.0, 1.15) == pytest.approx(276.0)
  assert [method for method, seed in gpu_grid.GRID[:3]] == ['H-SCL(β)', 'H-UCL', 'SCL']
  assert {seed for _, seed in gpu_grid.GRID[:9]} == {0, 1, 2} and len(set(gpu_grid.GRID)) == 15


def write_record(results: pathlib.Path, config, setting, seed: int) -> pathlib.Path:
  """A finished run's record as `run` returns it: config.json, every epoch's metrics, the
  linear evaluation of the last step with the config's settings."""
  run = image_grid.run_config(config, setting, seed, config.linear_eval.protocol)
  directory = pathlib.Path(run_records.record_dir(str(results), setting.slug, seed))
  directory.mkdir(parents=True)
  (directory / 'config.json').write_text(json.dumps(metrics.config_as_json(run)))
  epochs = range(1, run.num_epochs + 1)
  lines = [json.dumps(dict(epoch=epoch, step=3 * epoch)) for epoch in epochs]
  (directory / 'metrics.jsonl').write_text('\n'.join(lines) + '\n')
  linear = {key: run.linear_eval[key] for key in image_runs.LINEAR_EVAL_KEYS}
  linear.update(checkpoint_step=3 * run.num_epochs, top1=0.5)
  (directory / 'linear_eval.json').write_text(json.dumps(linear))
  return directory


def test_a_session_starts_the_unrecorded_runs_in_the_grids_order(tmp_path):
  """Runs 1 and 3 recorded: 0 (recorded at another E), 2 (a record without its linear
  evaluation) and 4-14 are the runs to start, in GRID's order."""
  config = gpu_grid.grid_config('/data/tin100', gpu_grid.SMOKE_EPOCHS, smoke=True)
  plan = gpu_grid.grid_plan(config)
  for index in (1, 3):
    write_record(tmp_path, config, *plan[index])
  other_e = gpu_grid.grid_config('/data/tin100', gpu_grid.SMOKE_EPOCHS + 1, smoke=True)
  write_record(tmp_path, other_e, *plan[0])
  (write_record(tmp_path, config, *plan[2]) / 'linear_eval.json').unlink()
  done, pending = gpu_grid.split_recorded(config, plan, tmp_path)
  assert done == [plan[1], plan[3]]
  assert pending == [plan[0], plan[2], *plan[4:]] and len(pending) == 13


def fake_runs(monkeypatch, work: pathlib.Path, durations: list, clock: list):
  """first_light.run_step for the grid's runs: the i-th takes durations[i] = (seconds,
  writes its record) off the clock, ends 'ok'; returns the (run, limit) of each start."""
  started = []

  def run_step(name, command, limit_s, log, env):
    started.append((name, limit_s))
    seconds, writes = durations[len(started) - 1]
    clock[0] += seconds
    flags = dict(word[2:].split('=', 1) for word in command if word.startswith('--'))
    if writes:
      records = str(work / 'records')
      directory = pathlib.Path(run_records.record_dir(records, flags['slug'], int(flags['seed'])))
      directory.mkdir(parents=True)
      (directory / 'linear_eval.json').write_text('{}')
    return dict(step=name, status='ok', seconds=seconds), ['{"top1": 0.5}\n']

  monkeypatch.setattr(gpu_grid.first_light, 'run_step', run_step)
  return started


def run_pending_faked(tmp_path, monkeypatch, durations, predicted_s, budget_s, first=0):
  """run_pending over GRID's runs from `first` on (margin 1.25, 10 s kept back, budget_s
  on a clock the faked runs advance); returns (those runs, their entries, the starts)."""
  config = gpu_grid.grid_config('/data/tin100', gpu_grid.SMOKE_EPOCHS, smoke=True)
  pending = gpu_grid.grid_plan(config)[first:]
  args = gpu_grid.parse_args(
    ['run', '--out=x', f'--results={tmp_path / "results"}', '--margin=1.25', '--reserve_s=10']
  )
  log = gpu_grid.first_light.Log(tmp_path / 'gpu_grid.log')
  clock = [0.0]
  started = fake_runs(monkeypatch, tmp_path, durations, clock)
  calibration = dict(epochs=2, predicted_run_s=predicted_s)
  left = lambda: budget_s - clock[0]
  return pending, gpu_grid.run_pending(args, tmp_path, calibration, pending, log, {}, left), started


def test_a_run_starts_only_while_the_slowest_run_so_far_fits(tmp_path, monkeypatch):
  """500 s, 10 kept back, margin 1.25, predicted 200 s: the first run (250 s planned) starts
  with 490 s; it takes 180: the second (225) with 310; it takes 150: the third (225 still,
  the slowest's) would not finish in 160, and nothing after it starts."""
  durations = [(180.0, True), (150.0, True)]
  pending, runs, started = run_pending_faked(tmp_path, monkeypatch, durations, 200.0, 500, 3)
  assert [(r['slug'], r['seed'], r['estimate_s'], r['status'], r['seconds']) for r in runs] == [
    (pending[0][0].slug, pending[0][1], 250, 'ok', 180.0),
    (pending[1][0].slug, pending[1][1], 225, 'ok', 150.0),
    (pending[2][0].slug, pending[2][1], 225, 'not started: would not finish', 0.0),
  ]
  assert [limit for _, limit in started] == [490.0, 310.0]


def test_a_run_that_exactly_fits_starts_and_a_run_without_its_record_sets_no_estimate(
  tmp_path, monkeypatch
):
  """A merged session's finished run took 160 s (its failed one, 400 s, counts for
  nothing): 1.25 x 160 = 200 s planned (before the prediction), 210 - 10 left: it starts.
  It ends 'ok' after 170 s without writing its record: failed, and no estimate; the next
  (200 s still) does not fit in 40 - 10."""
  sessions = tmp_path / 'results' / gpu_grid.SESSIONS_DIR
  sessions.mkdir(parents=True)
  ran = [dict(status='ok', seconds=160.0), dict(status='failed: exit status 1', seconds=400.0)]
  (sessions / '2026-12-01_1000_UTC.json').write_text(json.dumps(dict(runs=ran)))
  pending, runs, started = run_pending_faked(tmp_path, monkeypatch, [(170.0, False)], 1000.0, 210)
  assert [(r['estimate_s'], r['status']) for r in runs] == [
    (200, 'failed: no record written'),
    (200, 'not started: would not finish'),
  ]
  assert started == [(f'{pending[0][0].label} seed 0', 200.0)]


@pytest.mark.filterwarnings('ignore:the load_module:DeprecationWarning')
def test_an_unmeasured_epoch_count_is_calibrated_from_first_lights_step_rate(tmp_path, monkeypatch):
  """While configs/tin100.py has no E, `run` takes it from the ResNet-18 bfloat16 rate
  that first light recorded (half its images/s: two views a sample) and the pack's
  training images; every run of the grid at that E is a valid full-size config."""
  steps = [dict(model='resnet18', dtype='float32', images_per_s=4000.0),
           dict(model='resnet18', dtype='bfloat16', images_per_s=10_000.0)]  # fmt: skip
  (tmp_path / 'gpu').mkdir()
  environment = dict(device_kind='NVIDIA H100 80GB HBM3', jax='0.11.0')
  first_light = dict(environment=environment, train_step=steps)
  (tmp_path / 'gpu' / 'accelerator.json').write_text(json.dumps(first_light))
  for split, per_class in (('train', 1000), ('test', 600)):  # the training split's count
    for label in range(3):
      (tmp_path / 'tin100' / split / f'c{label}').mkdir(parents=True)
      for i in range(per_class):
        (tmp_path / 'tin100' / split / f'c{label}' / f'{i}.jpg').touch()
  monkeypatch.setattr(gpu_grid, 'FIRST_LIGHT', tmp_path / 'gpu')
  monkeypatch.setattr(tin100, 'EPOCHS', None)
  args = gpu_grid.parse_args(['run', '--out=x', f'--data={tmp_path / "tin100"}'])
  calibration = gpu_grid.calibrate(args, None, {}, [], lambda: 500.0)
  assert calibration == dict(
    gpu_grid.epochs_for(5000.0, 3000, args), source='accelerator.json',
    device='NVIDIA H100 80GB HBM3', date=calibration['date'], efficiency=0.8,
  )  # fmt: skip
  assert calibration['epochs'] == int((230 - 135) // (5 * 512 / 4000))  # 5 batches an epoch
  config = gpu_grid.grid_config('/data/tin100', calibration['epochs'], smoke=False)
  plan = gpu_grid.grid_plan(config)
  assert [(s.method, seed) for s, seed in plan] == list(gpu_grid.GRID)
  for setting, seed in plan:
    run = image_grid.run_config(config, setting, seed, 'features')
    schema.validate_config(run, num_devices=1)
    assert (run.num_epochs, run.model.name, run.batch_size) == (
      calibration['epochs'],
      'resnet18',
      512,
    )


def test_the_merge_fixes_epochs_once_and_refuses_another(tmp_path):
  config_file = tmp_path / 'tin100.py'
  config_file.write_text((REPO / 'configs' / 'tin100.py').read_text())
  calibration = dict(epochs=17, samples_per_s=5000.0, source='accelerator.json', device='H100')
  calibration.update(date='2026-12-01 10:00 UTC', predicted_run_s=229.9)  # over one line
  assert 'written' in gpu_grid.fix_epochs(config_file, 17, calibration)
  spec = importlib.util.spec_from_file_location('written_tin100', config_file)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  assert module.EPOCHS == 17 and module.get_config().num_epochs == 17
  assert module.CALIBRATION == {k: v for k, v in calibration.items() if k != 'epochs'}
  # The installed ruff by its interpreter: the venv's bin/ need not be on PATH.
  checked = subprocess.run([sys.executable, '-m', 'ruff', 'format', '--check', '--diff',
                            str(config_file)], capture_output=True, text=True)  # fmt: skip
  assert checked.returncode == 0, checked.stdout  # the committed config stays formatted
  assert 'as tin100.py fixes it' in gpu_grid.fix_epochs(config_file, 17, calibration)
  with pytest.raises(SystemExit, match='trained 18 epochs but .* fixes EPOCHS = 17'):
    gpu_grid.fix_epochs(config_file, 18, calibration)


@pytest.fixture(scope='module')
def smoke_chain(tmp_path_factory):
  """pack -> bundle -> `gpu_grid.py run --smoke --max_runs=2` as on a node (no
  PYTHONPATH, its own processes) -> merge into a results folder. Returns the paths."""
  root = tmp_path_factory.mktemp('gpu_grid')
  fake_tin_zip(root / 'tin.zip', train=6, val=3)
  local = root / 'local' / 'tin100'
  gpu_bundle.main([f'--bundle={root / "bundle"}', 'tin100', f'--zip={root / "tin.zip"}',
                   '--classes=4', f'--folder={local}'])  # fmt: skip
  env = {key: value for key, value in os.environ.items() if key != 'PYTHONPATH'}
  env['JAX_PLATFORMS'] = 'cpu'
  results, out = root / 'results', root / 'out'
  subprocess.run(
    [sys.executable, str(REPO / 'tools' / 'gpu_grid.py'), 'run', '--smoke', f'--out={out}',
     f'--bundle={root / "bundle"}', f'--work={root / "work"}', f'--results={results}',
     '--max_runs=2'],
    cwd=root, env=env, check=True, capture_output=True, timeout=600,
  )  # fmt: skip
  config_before = (REPO / 'configs' / 'tin100.py').read_text()
  gpu_grid.main(['merge', f'--returned={out}', f'--data={local}', f'--results={results}'])
  assert (REPO / 'configs' / 'tin100.py').read_text() == config_before  # --smoke fixes no E
  return dict(out=out, results=results, local=local)


def test_a_lent_session_runs_the_grid_in_order_and_returns_its_records(smoke_chain):
  out = smoke_chain['out']
  assert sorted(p.name for p in out.iterdir()) == [
    'gpu_grid.json', 'gpu_grid.log', 'gpu_grid.md', 'records.tar.gz'
  ]  # fmt: skip
  session = json.loads((out / 'gpu_grid.json').read_text())
  assert [(r['method'], r['seed'], r['status']) for r in session['runs']] == [
    ('H-SCL(β)', 0, 'ok'),
    ('H-UCL', 0, 'ok'),
  ]
  assert session['device'] == 'cpu' and session['records'] == 2
  assert [s['step'] for s in session['steps']] == ['install']
  with tarfile.open(out / 'records.tar.gz') as tar:
    names = sorted(n for n in tar.getnames() if n.endswith(('.json', '.jsonl')))
  assert names == sorted(
    f'runs/{slug}/seed0/{name}'
    for slug in ('hscl_beta_beta1.0', 'hucl_beta1.0')
    for name in ('config.json', 'linear_eval.json', 'metrics.jsonl')
  )


def test_the_merge_records_the_runs_and_writes_the_report(smoke_chain):
  results = smoke_chain['results']
  config = gpu_grid.grid_config(str(smoke_chain['local']), gpu_grid.SMOKE_EPOCHS, smoke=True)
  plan = gpu_grid.grid_plan(config)
  assert gpu_grid.recorded(config, plan, results) == plan[:2]  # the next session skips them
  report = (results / 'report.md').read_text()
  linear = {}
  for slug in ('hscl_beta_beta1.0', 'hucl_beta1.0'):
    run_dir = results / 'runs' / slug / 'seed0'
    linear[slug] = json.loads((run_dir / 'linear_eval.json').read_text())['top1']
    epochs = [json.loads(line)['epoch'] for line in (run_dir / 'metrics.jsonl').open()]
    assert epochs == [1, 2]
  assert f'| H-SCL(β) | H-SCL(β) (beta=1.0) | {100 * linear["hscl_beta_beta1.0"]:.2f} |' in report
  assert f'| H-UCL | H-UCL (beta=1.0) | {100 * linear["hucl_beta1.0"]:.2f} |' in report
  assert '## Labels in a batch' in report and '2 runs finished, 13 missing.' in report
  assert "half of CIFAR-100's 500" in report
  jax_version = json.loads((smoke_chain['out'] / 'gpu_grid.json').read_text())['jax']
  assert f'| cpu | {jax_version} | 2 |' in report
  assert len(list((results / 'sessions').glob('*.json'))) == 1


def test_the_pack_reads_the_shallowest_wnids_txt(tmp_path):
  """A zip that also holds a deeper wnids.txt (another folder's, listing other classes):
  the dataset is the one whose wnids.txt lies nearest the zip's root."""
  fake_tin_zip(tmp_path / 'tin.zip', train=1, val=1)
  with zipfile.ZipFile(tmp_path / 'tin.zip', 'a') as archive:
    nested = 'tiny-imagenet-200/backup/'
    archive.writestr(nested + 'wnids.txt', 'n00000001\nn00000002\n')
    archive.writestr(nested + 'val/val_annotations.txt', '')
  with zipfile.ZipFile(tmp_path / 'tin.zip') as archive:
    wnids, root, members = gpu_bundle.tin_members(archive, 2)
  assert (wnids, root) == (WNIDS[:2], 'tiny-imagenet-200/')
  assert sorted(wnid for _, wnid in members['train']) == sorted(WNIDS[:2])
