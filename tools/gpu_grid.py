"""The Tiny-ImageNet-100 grid (configs/tin100.py), advanced by one command on each GPU lent.

    python3 tools/gpu_grid.py run --out=OUT                   # on the node (~9 minutes)
    python tools/gpu_grid.py merge --returned=OUT --data=/tmp/tin100   # here, afterwards
    python tools/gpu_grid.py run --out=OUT --smoke --data=DIR/tin100 --max_runs=2  # the test

`run`, on a lent node (carry bundle/, which `gpu_bundle.py tin100` or `build --tin100_zip`
writes), in at most --budget_s (540 s):

1. install: `tools/gpu_bundle.py install --data_sets=tin100` (the wheels into a target
   folder on the later steps' PYTHONPATH; the pack unpacked), unless --data names it;
2. E: configs/tin100.py's EPOCHS, or while it is unmeasured the calibration: the
   ResNet-18 bfloat16 step rate of docs/results/gpu/accelerator.json (first light's) or
   of `benchmarks/bench_train_step.py` run now, and the epochs that make one run take
   --run_target_s (epochs_for);
3. the runs of GRID not yet recorded in docs/results/tin100_gpu/runs/, in GRID's order,
   each in a process of its own (`gpu_grid.py one`: hscl_jax.experiments.grid'
   run_one, the kNN monitor and the linear evaluation, its record written as `compare`
   writes one), started only while the time left holds the run's estimate (the slowest
   run this session or a merged one took, else the calibration's prediction, x --margin):
   a run cut off cannot resume on the next machine. The runs share one JAX compilation
   cache (the model's init, the kNN's and the linear evaluation's programs recur).

OUT then holds 4 files: records.tar.gz (runs/<setting>/seed<k>/ of each finished run:
config.json, metrics.jsonl, linear_eval.json), gpu_grid.json and .md (the device, jax's
version, the date, E and its calibration, each run's status and seconds), gpu_grid.log.

`merge`, here: unpacks the records into docs/results/tin100_gpu/runs/, keeps the session
as sessions/<date>.json, writes E into configs/tin100.py the first time (refuses records
of another E after that), and rewrites docs/results/tin100_gpu/report.md with
hscl_jax.experiments.reports (Table I, paired differences by seed, the same-class count
per anchor measured from the batches, Fig. 1's epochs to SCL's final kNN) and a note on
the data and the devices. --data is the pack unpacked (configs/tin100.py's first command
writes it): the report's raw-pixel kNN and its batch counts read it.

--smoke: small_cnn at batch 8 for SMOKE_EPOCHS epochs, for the chain's test on a CPU
(tests/test_gpu_grid.py).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import pathlib
import re
import shutil
import sys
import tarfile
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path[1:1] = [str(REPO)]  # configs and hscl_jax, as from the repository root
import first_light  # noqa: E402  (tools/, beside this file)

RESULTS = REPO / 'docs' / 'results' / 'tin100_gpu'
FIRST_LIGHT = REPO / 'docs' / 'results' / 'gpu'
CONFIG_FILE = REPO / 'configs' / 'tin100.py'
RECORDS_ARCHIVE = 'records.tar.gz'
SESSIONS_DIR = 'sessions'
# The grid, in the order its runs are started: the pair the paper's central claim rests on
# (H-SCL(beta), H-UCL), then SCL, seed by seed; then UCL and H-SCL(tau).
GRID = (
  *((method, seed) for seed in range(3) for method in ('H-SCL(β)', 'H-UCL', 'SCL')),
  *((method, seed) for seed in range(3) for method in ('UCL', 'H-SCL(τ)')),
)
SMOKE_EPOCHS = 2
SMOKE = {  # a few dozen images on a CPU: the chain, not a result
  'model.name': 'small_cnn', 'batch_size': 8, 'knn.k': 5, 'knn.batch_size': 8,
  'linear_eval.num_epochs': 2, 'linear_eval.batch_size': 8, 'log_every_steps': 50,
}  # fmt: skip


def grid_config(folder: str, epochs: int, smoke: bool):
  """configs/tin100.py reading `folder`, training `epochs` epochs (--smoke: SMOKE's sizes)."""
  from configs import tin100

  config = tin100.with_epochs(tin100.get_config(), epochs)
  config.folder = str(folder)
  for field, value in (SMOKE if smoke else {}).items():
    node, _, name = field.rpartition('.')
    (config[node] if node else config)[name] = value
  return config


def grid_plan(config) -> list:
  """GRID as grid's (Setting, seed) pairs (the config's beta and tau schedule)."""
  from hscl_jax.experiments import grid

  setting = {s.method: s for s in grid.settings(config, set())}
  return [(setting[method], seed) for method, seed in GRID]


def recorded(config, plan, results: pathlib.Path) -> list:
  """The pairs of `plan` whose finished record (this config's, as `compare` reads it) is
  in results/runs/."""
  from hscl_jax.experiments import grid
  from hscl_jax.experiments import run_records

  done = []
  for setting, seed in plan:
    run = grid.run_config(config, setting, seed, config.linear_eval.protocol)
    directory = run_records.record_dir(str(results), setting.slug, seed)
    linear_eval = run.linear_eval.to_dict()
    keys = grid.LINEAR_EVAL_KEYS
    if run_records.read_record(directory, run, linear_eval, keys) is not None:
      done.append((setting, seed))
  return done


def split_recorded(config, plan, results: pathlib.Path) -> tuple[list, list]:
  """(the pairs of `plan` recorded in results/runs/, the others in plan's order: the runs
  a session starts)."""
  done = recorded(config, plan, results)
  return done, [pair for pair in plan if pair not in done]


def epochs_for(samples_per_s: float, examples: int, args) -> dict:
  """E from a step rate: the epochs of `examples` (uniform batches of 512, the remainder
  dropped) at --efficiency of the rate that fit --run_target_s once the start-up, the
  KNN_POINTS kNN evaluations and the linear evaluation are taken off."""
  from configs import tin100

  batch = 512
  epoch_s = examples // batch * batch / (samples_per_s * args.efficiency)
  train_s = args.run_target_s - args.startup_s - args.linear_eval_s
  train_s -= tin100.KNN_POINTS * args.knn_s
  epochs = max(math.floor(train_s / epoch_s), 1)
  predicted = args.startup_s + args.linear_eval_s + tin100.KNN_POINTS * args.knn_s
  return dict(
    samples_per_s=samples_per_s,
    epochs=epochs,
    epoch_s=round(epoch_s, 2),
    predicted_run_s=round(predicted + epochs * epoch_s, 1),
  )


def past_run_seconds(results: pathlib.Path) -> list[float]:
  """The seconds of every finished run the merged sessions (results/sessions/) record."""
  seconds = []
  for path in sorted((results / SESSIONS_DIR).glob('*.json')):
    runs = first_light.read_json(path).get('runs', [])
    seconds += [run['seconds'] for run in runs if run.get('status') == 'ok']
  return seconds


def run_estimate_s(finished_s: list[float], predicted_s: float | None, margin: float):
  """A run's seconds, planned: the slowest finished run's, else the prediction, x margin
  (0 where nothing is known: the first run of a --smoke)."""
  base = max(finished_s) if finished_s else (predicted_s or 0.0)
  return margin * base


def calibrate(args, log: first_light.Log, env: dict, steps: list, left) -> dict | None:
  """E and where it came from: configs/tin100.py's, or measured now while it has none
  (first light's recorded step rate, else bench_train_step.py's); None without a rate."""
  from configs import tin100

  if args.smoke:
    return dict(epochs=SMOKE_EPOCHS, source='--smoke')
  if tin100.EPOCHS:
    return dict(tin100.CALIBRATION or {}, epochs=tin100.EPOCHS, source_of_epochs=str(CONFIG_FILE))
  rate = first_light.measured_rate(FIRST_LIGHT, 'resnet18')
  if rate:  # measured by first light, maybe on another card than this session's
    environment = first_light.read_json(FIRST_LIGHT / 'accelerator.json').get('environment', {})
    rate['device'] = environment.get('device_kind')
  else:
    rate, record = first_light.bench_rate('resnet18', 512, min(150, left() - 300), log, env)
    steps.append(record)
  if not rate:
    return None
  examples = first_light.count_images(pathlib.Path(args.data) / 'train')
  measured = epochs_for(rate['step_samples_per_s'], examples, args)
  where = {key: rate[key] for key in ('source', 'device') if key in rate}
  return dict(measured, **where, date=today(), efficiency=args.efficiency)


def today() -> str:
  return datetime.datetime.now(datetime.UTC).strftime('%Y-%m-%d %H:%M UTC')


def worker_command(args, work: pathlib.Path, epochs: int, setting, seed: int) -> list[str]:
  return [sys.executable, 'tools/gpu_grid.py', 'one', f'--data={args.data}',
          f'--epochs={epochs}', f'--slug={setting.slug}', f'--seed={seed}',
          f'--root={work / "runs"}', f'--records={work / "records"}',
          *(['--smoke'] * args.smoke)]  # fmt: skip


def run_pending(args, work, calibration, pending, log, env, left) -> list[dict]:
  """The pending runs in order, each started only while its estimate fits the time left."""
  from hscl_jax.experiments import run_records

  finished_s, runs = past_run_seconds(pathlib.Path(args.results)), []
  for setting, seed in pending[: args.max_runs]:
    estimate = run_estimate_s(finished_s, calibration.get('predicted_run_s'), args.margin)
    entry = dict(method=setting.method, slug=setting.slug, seed=seed, estimate_s=round(estimate))
    if estimate > left() - args.reserve_s:
      log.line(f'{setting.label} seed {seed}: not started, ~{estimate:.0f} s > {left():.0f} s')
      runs.append(dict(entry, status='not started: would not finish', seconds=0.0))
      break
    command = worker_command(args, work, calibration['epochs'], setting, seed)
    name = f'{setting.label} seed {seed}'
    record, lines = first_light.run_step(name, command, left() - args.reserve_s, log, env)
    info = next((json.loads(line) for line in reversed(lines) if line.startswith('{')), {})
    directory = run_records.record_dir(str(work / 'records'), setting.slug, seed)
    if record['status'] == 'ok' and not (pathlib.Path(directory) / 'linear_eval.json').is_file():
      record['status'] = 'failed: no record written'
    runs.append(dict(entry, status=record['status'], seconds=record['seconds'], **info))
    if record['status'] == 'ok':
      finished_s.append(record['seconds'])
  return runs


def pack_records(work: pathlib.Path, out: pathlib.Path) -> int:
  """OUT/records.tar.gz: work/records/runs/ (the finished runs' records); their count."""
  runs = work / 'records' / 'runs'
  finished = sorted(runs.glob('*/seed*/linear_eval.json')) if runs.is_dir() else []
  if finished:
    with tarfile.open(out / RECORDS_ARCHIVE, 'w:gz') as tar:
      tar.add(runs, arcname='runs')
  return len(finished)


def session_markdown(session: dict) -> str:
  line = lambda cells: '| ' + ' | '.join(str(cell) for cell in cells) + ' |'
  calibration = session.get('calibration') or {}
  return '\n'.join([
    f'# Tiny-ImageNet-100 grid: {session["date"]}{" (--smoke: not figures)" * session["smoke"]}',
    '',
    f'{session.get("device")}, jax {session.get("jax")}; E = {calibration.get("epochs")} '
    f'epochs ({calibration.get("source") or calibration.get("source_of_epochs")}); '
    f'{session["recorded_before"]} of {len(GRID)} runs recorded before, '
    f'{session["records"]} finished now.',
    '',
    line(['step', 'status', 'seconds']),
    '|---|---|---|',
    *(line([s['step'], s['status'], s['seconds']]) for s in session['steps']),
    *(line([f'{r["method"]} seed {r["seed"]} (estimate {r["estimate_s"]} s, linear '
            f'{r.get("top1")})', r['status'], r['seconds']]) for r in session['runs']),
    '',
  ])  # fmt: skip


def install(args, work: pathlib.Path, log: first_light.Log, env: dict) -> list[dict]:
  """The bundle's wheels (importable by this process too) and the pack, unless --data
  names it; the step's record."""
  steps = []
  if not args.data:
    args.data = str(work / 'data' / 'tin100')
    command = [sys.executable, 'tools/gpu_bundle.py', f'--bundle={args.bundle}', 'install',
               f'--site={work / "site"}', f'--data_to={work / "data"}',
               '--data_sets=tin100']  # fmt: skip
    steps.append(first_light.run_step('install', command, 120, log, env)[0])
  sys.path[1:1] = [str(work / 'site')]
  return steps


def run(args) -> None:
  deadline = time.monotonic() + args.budget_s
  left = lambda: deadline - time.monotonic()
  out, work = pathlib.Path(args.out), pathlib.Path(args.work)
  out.mkdir(parents=True, exist_ok=True)
  shutil.rmtree(work / 'runs', ignore_errors=True)  # a run cut off last time cannot resume
  shutil.rmtree(work / 'records', ignore_errors=True)  # OUT gets this session's alone
  work.mkdir(parents=True, exist_ok=True)
  log, env = first_light.Log(out / 'gpu_grid.log'), first_light.environment(work / 'site')
  # One compilation cache for the session's runs: the model's init, the kNN's and the
  # linear evaluation's programs are the same in every run (the step differs by method).
  env.setdefault('JAX_COMPILATION_CACHE_DIR', str(work / 'jax_cache'))
  env.setdefault('JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS', '0')  # the small ones too
  steps = install(args, work, log, env)
  session = dict(date=today(), smoke=args.smoke, budget_s=args.budget_s, steps=steps, runs=[])
  session['calibration'] = calibration = calibrate(args, log, env, steps, left)
  config = grid_config(args.data, (calibration or {}).get('epochs', 1), args.smoke)
  plan = grid_plan(config)
  done, pending = split_recorded(config, plan, pathlib.Path(args.results))
  session.update(recorded_before=len(done), pending_before=len(pending))
  if calibration is None:
    log.line('no step rate measured: E cannot be fixed, no run started')
  else:
    session['runs'] = run_pending(args, work, calibration, pending, log, env, left)
  started = [r for r in session['runs'] if 'device' in r]
  session.update({key: started[0][key] for key in ('device', 'jax') if started})
  session['records'] = pack_records(work, out)
  (out / 'gpu_grid.json').write_text(json.dumps(session, indent=2) + '\n')
  (out / 'gpu_grid.md').write_text(session_markdown(session))
  log.line(f'done in {args.budget_s - left():.0f} s: {session["records"]} runs recorded in {out}')
  log.write(session_markdown(session))


def one(args) -> None:
  """One run of the grid (grid.run_one: train, kNN monitor, linear evaluation, the
  record in --records), then a JSON line: the device, jax's version, linear top-1."""
  import jax

  from hscl_jax.experiments import grid
  from hscl_jax.rundir import metrics

  metrics.show_only_own_info_logs()
  config = grid_config(args.data, args.epochs, args.smoke)
  (pair,) = [(s, k) for s, k in grid_plan(config) if (s.slug, k) == (args.slug, args.seed)]
  protocol = config.linear_eval.protocol
  result = grid.run_one(config, *pair, args.root, protocol, args.records)
  top1 = None if result is None else result['linear']['top1']
  print(json.dumps(dict(device=jax.devices()[0].device_kind, jax=jax.__version__, top1=top1)))


def fix_epochs(config_file: pathlib.Path, epochs: int, calibration: dict | None) -> str:
  """Writes E (and the calibration it came from) into configs/tin100.py where it has none;
  refuses records of another E. Returns what it did."""
  text = config_file.read_text()
  (current,) = re.findall(r'^EPOCHS = (.*)$', text, flags=re.MULTILINE)
  if current != 'None':
    if int(current) != epochs:
      raise SystemExit(
        f'the returned runs trained {epochs} epochs but {config_file} fixes EPOCHS = {current}: '
        'runs pair only at equal E, so these records are not merged (run the grid again '
        'with this checkout, whose E the tool reads)'
      )
    return f'E = {epochs}, as {config_file.name} fixes it'
  kept = {k: v for k, v in (calibration or {}).items() if k != 'epochs'}
  literal = repr(kept)  # as ruff formats it: on one line where it fits, else one item a line
  if len(f'CALIBRATION = {literal}') > 100:
    literal = '{\n' + ''.join(f'  {k!r}: {v!r},\n' for k, v in kept.items()) + '}'
  text = re.sub(r'^EPOCHS = None$', f'EPOCHS = {epochs}', text, flags=re.MULTILINE)
  text = re.sub(r'^CALIBRATION = None$', lambda _: f'CALIBRATION = {literal}', text, flags=re.M)
  config_file.write_text(text)
  return f'E = {epochs} written into {config_file} (from {kept.get("source")})'


def data_note(config, sessions: list[dict], calibration: dict) -> str:
  """The report's closing section: what the data is (half of CIFAR-100's images per
  class), E and the step rate it came from, and each session's device, jax, date."""
  rate = (
    f'{calibration["samples_per_s"]:.0f} samples/s of the ResNet-18 bfloat16 step, '
    f'{calibration.get("source")}, {calibration.get("device")}, {calibration.get("date")}'
    if 'samples_per_s' in calibration
    else calibration.get('source', 'no rate')
  )
  rows = [
    f'| {s["date"]} | {s.get("device")} | {s.get("jax")} | '
    f'{sum(r["status"] == "ok" for r in s["runs"])} |'
    for s in sessions
  ]
  return '\n'.join([
    '',
    '## Data and devices',
    '',
    'Tiny-ImageNet-100: the first 100 classes of Tiny-ImageNet-200 (its wnids.txt order), '
    '250 training images per class (half of CIFAR-100\'s 500) and their 50 validation '
    'images as the test split, resized 64 -> 32 px (antialiased) and stored as JPEG q75 '
    '(tools/gpu_bundle.py). CIFAR-100\'s class count and image size, and with uniform '
    "batches of 512 CIFAR-100's same-class density (Labels in a batch, above); not CIFAR-100: "
    'these figures are not the paper\'s Table I.',
    '',
    f'Every run: E = {config.num_epochs} epochs (configs/tin100.py), fixed once from {rate}; '
    'one process on one accelerator.',
    '',
    '| session | device | jax | runs finished |',
    '|---|---|---|---|',
    *rows,
    '',
  ])  # fmt: skip


def unpack_returned(returned: pathlib.Path, results: pathlib.Path) -> dict:
  """The session's gpu_grid.json kept in results/sessions/ and its records unpacked into
  results/runs/; returns the session."""
  session = first_light.read_json(returned / 'gpu_grid.json')
  if not session:
    raise SystemExit(f'{returned} holds no gpu_grid.json: pass the folder that `gpu_grid.py '
                     'run --out` wrote (the files the lent machine returned)')  # fmt: skip
  (results / SESSIONS_DIR).mkdir(parents=True, exist_ok=True)
  stamp = session['date'].replace(' ', '_').replace(':', '')
  shutil.copyfile(returned / 'gpu_grid.json', results / SESSIONS_DIR / f'{stamp}.json')
  if (returned / RECORDS_ARCHIVE).is_file():
    with tarfile.open(returned / RECORDS_ARCHIVE) as tar:
      tar.extractall(results, filter='data')
  return session


def merge(args) -> None:
  from hscl_jax.experiments import reports

  results, data = pathlib.Path(args.results), pathlib.Path(args.data)
  if data.name != 'tin100' or not (data / 'train').is_dir():
    raise SystemExit(f'--data={data}: pass the pack unpacked, a folder named tin100 with '
                     'train/ and test/ (python tools/gpu_bundle.py tin100 --zip=... '
                     '--folder=/tmp/tin100)')  # fmt: skip
  session = unpack_returned(pathlib.Path(args.returned), results)
  epochs = (session.get('calibration') or {}).get('epochs')
  if epochs is None:
    print('the session fixed no E (no step rate): nothing trained, the report is as it was')
    return
  calibration = dict(session['calibration'])
  calibration.setdefault('device', session.get('device'))
  if not session['smoke']:
    print(fix_epochs(pathlib.Path(args.config_file), epochs, calibration))
  config = grid_config(str(data), epochs, session['smoke'])
  sessions = [first_light.read_json(p) for p in sorted((results / SESSIONS_DIR).glob('*.json'))]
  with tempfile.TemporaryDirectory() as root:  # no workdirs: the records alone
    report = reports.write_report(
      config, root, grid_plan(config), set(), config.linear_eval.protocol, str(results)
    )
  if report is None:
    print(f'no finished run recorded in {results} yet')
    return
  note = data_note(config, sessions, calibration)
  (results / reports.REPORT_FILE).write_text(report + note)
  print(f'{results / reports.REPORT_FILE}: {report.splitlines()[-1]}')


def parse_args(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  commands = parser.add_subparsers(dest='command', required=True)
  run_parser = commands.add_parser('run', help='on a lent node: the next runs of the grid')
  run_parser.add_argument('--out', required=True, help='the (4) files go here')
  run_parser.add_argument('--budget_s', type=float, default=540, help='wall time, all of it')
  run_parser.add_argument('--bundle', default=str(REPO / 'bundle'), help='gpu_bundle.py build')
  run_parser.add_argument('--data', help='the tin100 folder (default: the bundle, unpacked)')
  run_parser.add_argument('--work', default='/tmp/hscl_grid', help='site, data, the runs')
  run_parser.add_argument('--results', default=str(RESULTS), help='the records made so far')
  run_parser.add_argument('--max_runs', type=int, default=len(GRID))
  run_parser.add_argument('--margin', type=float, default=1.1, help="on a run's estimate")
  run_parser.add_argument('--reserve_s', type=float, default=10, help='kept for the packing')
  run_parser.add_argument('--run_target_s', type=float, default=230, help='calibration: a run')
  run_parser.add_argument('--startup_s', type=float, default=60, help='calibration: start-up')
  run_parser.add_argument('--knn_s', type=float, default=3, help='calibration: one kNN')
  run_parser.add_argument('--linear_eval_s', type=float, default=45, help='calibration')
  run_parser.add_argument('--efficiency', type=float, default=0.8, help='calibration')
  run_parser.add_argument('--smoke', action='store_true', help='tiny sizes, for the test')
  merge_parser = commands.add_parser('merge', help='here: the returned records and the report')
  merge_parser.add_argument('--returned', required=True, help="the run's OUT, as returned")
  merge_parser.add_argument('--data', required=True, help='the tin100 folder (unpacked pack)')
  merge_parser.add_argument('--results', default=str(RESULTS), help='records and report')
  merge_parser.add_argument('--config_file', default=str(CONFIG_FILE), help='where E is fixed')
  one_parser = commands.add_parser('one', help="one run (run's worker process)")
  for flag in ('--data', '--slug', '--root', '--records'):
    one_parser.add_argument(flag, required=True)
  one_parser.add_argument('--epochs', type=int, required=True)
  one_parser.add_argument('--seed', type=int, required=True)
  one_parser.add_argument('--smoke', action='store_true')
  return parser.parse_args(argv)


def main(argv=None):
  args = parse_args(argv)
  dict(run=run, merge=merge, one=one)[args.command](args)


if __name__ == '__main__':
  main()
