"""Graph experiment speed: training-step throughput and the wall time of one run per dataset.

    python benchmarks/bench_graphs.py --data_dir=DIR [--datasets=MUTAG,PTC] [--epochs=20]

Per dataset: graphs/s of the jitted training epoch (one scan over batches of 128 graphs,
after a compiling warm-up) for 1 encoder and for the 10 fold encoders of a leak-free run
trained together (vmapped), and its ratio; then the wall time (train + SVM evaluation) of a
UCL run and of a leak-free H-SCL(β = 1) run at --epochs epochs, compilation included.
On a shared machine the figures move with the load (the 1-minute load average is printed).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import tempfile
import time

import jax
import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # `configs`, as from the root

from configs import graphs as graphs_config  # noqa: E402
from hscl_jax.graphs import data  # noqa: E402
from hscl_jax.graphs import train  # noqa: E402


def epoch_throughput(config, dataset, num_encoders: int, repeats: int = 3) -> float:
  """Graphs/s of one jitted epoch over the whole dataset for ``num_encoders`` encoders."""
  model = train.make_model(config, dataset)
  init, epoch, _ = train.compiled(model, float(config.learning_rate), True, config.estimator)
  rng = np.random.default_rng(0)
  num_batches = -(-dataset.num_graphs // config.batch_size)
  groups = [
    data.epoch_batches(np.arange(dataset.num_graphs), config.batch_size, num_batches, rng)
    for _ in range(num_encoders)
  ]
  budget = data.budget_for(dataset, [b for g in groups for b in g], config.batch_size)
  batches = jax.device_put(train.host_batches(dataset, groups, budget))
  state = init(
    jax.random.split(jax.random.key(0), num_encoders), jax.tree.map(lambda x: x[0, 0], batches)
  )
  state, loss = epoch(state, batches, 1.0)  # compile
  jax.block_until_ready(loss)
  best = float('inf')
  for _ in range(repeats):
    start = time.perf_counter()
    state, loss = epoch(state, batches, 1.0)
    jax.block_until_ready(loss)
    best = min(best, time.perf_counter() - start)
  return num_encoders * dataset.num_graphs / best


def run_seconds(config, method: str) -> tuple[float, float, float]:
  config = config.copy_and_resolve_references()
  config.method = method
  with tempfile.TemporaryDirectory() as workdir:
    start = time.perf_counter()
    result = train.run(config, workdir)
  return time.perf_counter() - start, result['train_seconds'], result['eval_seconds']


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument('--data_dir', required=True)
  parser.add_argument('--datasets', default='MUTAG,PTC,ENZYMES,IMDB-BINARY,IMDB-MULTI')
  parser.add_argument('--epochs', type=int, default=20)
  parser.add_argument('--skip_runs', action='store_true', help='only the step throughput')
  args = parser.parse_args()
  for name in args.datasets.split(','):
    config = graphs_config.get_config()
    config.dataset, config.data_dir, config.num_epochs = name, args.data_dir, args.epochs
    config.log_every_epochs = args.epochs
    dataset = data.load_tu(name, args.data_dir)
    one = epoch_throughput(config, dataset, 1)
    ten = epoch_throughput(config, dataset, 10)
    line = (
      f'{name}: train step {one:.0f} graphs/s (1 encoder), {ten:.0f} graphs/s '
      f'(10 vmapped fold encoders, {ten / one:.2f}x)'
    )
    if not args.skip_runs:
      ucl = run_seconds(config, 'ucl')
      hscl = run_seconds(config, 'hscl')
      line += (
        f'; one run at {args.epochs} epochs: UCL {ucl[0]:.0f} s (train {ucl[1]:.0f} s, '
        f'SVM {ucl[2]:.0f} s), leak-free H-SCL {hscl[0]:.0f} s (train {hscl[1]:.0f} s, '
        f'SVM {hscl[2]:.0f} s)'
      )
    print(f'{line}  [load {os.getloadavg()[0]:.1f}]', flush=True)


if __name__ == '__main__':
  main()
