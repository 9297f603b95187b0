"""Speed and memory of the sigmoid (SigLIP) losses, beside the softmax losses and the matmuls.

    python benchmarks/bench_sigmoid.py                       # all three parts
    python benchmarks/bench_sigmoid.py --memory_rows=0 --ring_devices=   # speed only
    python benchmarks/bench_sigmoid.py --speed_rows=0 --memory_rows=0    # the ring only

Speed, at ``--speed_rows`` (n = m rows, d = 128): the jitted forward+backward of
``losses.siglip`` without hardening beside ``losses.ucl`` on n rows (batch n/2, 2 views),
and with ``exponential(1)`` beside ``losses.hucl(beta=1)``, all dense, with the bare matmul
bound measured in the same run (the similarity matmul and its two backward matmuls, as in
``bench_losses.py``). The figures: each loss's time, its ratio to the bound, and the
sigmoid loss's ratio to its softmax counterpart (target <= 1), in wall and CPU time, the
calls alternated so that the machine's load falls on both alike.

Memory, at ``--memory_rows`` (n = m, d = 128): the peak resident set of a fresh process
that runs one forward+backward of ``losses.siglip`` (blockwise: ``block_size=None`` picks
blocks of 2048 above 2^24 logits), unhardened and hardened, next to one that only holds the
inputs (target <= 1 GB; the dense n×m float32 logits alone would be n·m·4 bytes).

Ring, at ``--ring_devices`` (fake CPU devices, each in its own process): the compiled
program's temporary memory per device (XLA's memory analysis) of jit(shard_map(grad)) of
``losses.siglip`` at a fixed per-device batch (``--ring_rows`` rows per device, blockwise),
for ``collective='ring'`` and ``'all_gather'``: the ring's must not grow with the devices.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # hscl_jax, from any dir

DIM = 128


def towers(n, dim=DIM, seed=0):
  import jax

  from hscl_jax import losses

  kx, ky = jax.random.split(jax.random.key(seed))
  x = losses.l2_normalize(jax.random.normal(kx, (n, dim)))
  return x, losses.l2_normalize(jax.random.normal(ky, (n, dim)))


def siglip_step(hardened, block_size=None):
  """jit(value_and_grad) of siglip in (x, y, t, b) at SigLIP's initial t and b."""
  import jax

  from hscl_jax import losses

  hardening = losses.exponential(1.0) if hardened else None

  def loss(x, y, t, b):
    return losses.siglip(x, y, t=t, b=b, hardening=hardening, block_size=block_size)

  return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3)))


def softmax_step(hardened):
  """jit(value_and_grad) of ucl (or hucl, β = 1) on n rows: batch n/2, 2 views."""
  import jax

  from hscl_jax import losses

  def loss(z):
    return losses.hucl(z, beta=1.0) if hardened else losses.ucl(z)

  return jax.jit(jax.value_and_grad(loss))


def alternated_times(steps, repeats):
  """{name: (best wall, best CPU time)} of the steps, called in turn ``repeats`` times
  after a warm-up each (steps: name -> (fn, args))."""
  import jax

  best = {name: (float('inf'), float('inf')) for name in steps}
  for fn, args in steps.values():
    jax.block_until_ready(fn(*args))  # compile + warm up
  for _ in range(repeats):
    for name, (fn, args) in steps.items():
      wall, cpu = time.perf_counter(), time.process_time()
      jax.block_until_ready(fn(*args))
      wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
      best[name] = (min(best[name][0], wall), min(best[name][1], cpu))
  return best


def speed(n, repeats):
  from bench_losses import _matmul_step  # a sibling script: the same bound
  import jax
  import jax.numpy as jnp

  x, y = towers(n)
  z = x.reshape(n // 2, 2, DIM)
  t, b = jnp.float32(10.0), jnp.float32(-10.0)
  steps = {
    'matmul bound': (_matmul_step(), (z, jnp.ones((n, n), jnp.float32) / n)),
    'siglip': (siglip_step(False), (x, y, t, b)),
    'ucl': (softmax_step(False), (z,)),
    'siglip exponential(1)': (siglip_step(True), (x, y, t, b)),
    'hucl(beta=1)': (softmax_step(True), (z,)),
  }
  times = alternated_times(steps, repeats)
  bound = times['matmul bound']
  print(f'devices: {jax.devices()}  n={n} d={DIM}  (best of {repeats}, alternated)')
  print(f'load {os.getloadavg()[0]:.1f}')
  for name, (wall, cpu) in times.items():
    ratios = f'wall {wall / bound[0]:.2f}, cpu {cpu / bound[1]:.2f}'
    print(f'{name:>22}: {wall * 1e3:7.2f} ms  / bound {ratios}')
  for sigmoid, softmax in (('siglip', 'ucl'), ('siglip exponential(1)', 'hucl(beta=1)')):
    (sw, sc), (fw, fc) = times[sigmoid], times[softmax]
    print(f'{sigmoid} / {softmax}: wall {sw / fw:.2f}, cpu {sc / fc:.2f} (target <= 1)')
  return times


def child(code, env=None):
  """(peak RSS of the child in MiB, its stdout's last line) of a fresh process."""
  import resource

  before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
  result = subprocess.run(
    [sys.executable, '-c', code], capture_output=True, text=True, check=True, env=env
  )
  peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
  if peak <= before:
    raise RuntimeError("child peak not above an earlier child's; run the memory check first")
  return peak / 1024, result.stdout.strip().splitlines()[-1]


def memory_code(rows, hardened, run):
  here = pathlib.Path(__file__).resolve().parent
  return (
    f'import sys, jax, jax.numpy as jnp; sys.path.insert(0, {str(here)!r});'
    'from bench_sigmoid import towers, siglip_step;'
    f'x, y = towers({rows}); jax.block_until_ready((x, y));'
    f'out = siglip_step({hardened})(x, y, jnp.float32(10.0), jnp.float32(-10.0)) if {run} else x;'
    'jax.block_until_ready(out);'
    f'print(float(out[0]) if {run} else 0.0)'
  )


def memory(rows):
  """Peak RSS of one forward+backward (unhardened, then hardened) and of the inputs alone."""
  baseline, _ = child(memory_code(rows, False, False))
  print(
    f'n = m = {rows}, d = {DIM}: inputs-only process {baseline:.0f} MiB peak RSS; '
    f'the dense n×m float32 logits would be {rows * rows * 4 / 2**30:.0f} GiB'
  )
  for hardened in (False, True):
    start = time.perf_counter()
    peak, value = child(memory_code(rows, hardened, True))
    name = 'siglip exponential(1)' if hardened else 'siglip'
    print(
      f'{name}: peak RSS {peak:.0f} MiB, loss {value}, forward+backward incl. compile '
      f'{time.perf_counter() - start:.0f} s',
      flush=True,
    )


def ring_memory_code(rows, block_size, collective, dim):
  here = pathlib.Path(__file__).resolve().parent
  return (
    f'import sys, json; sys.path.insert(0, {str(here)!r});'
    'from bench_sigmoid import compiled_memory;'
    f'print(json.dumps(compiled_memory({rows}, {block_size}, {collective!r}, {dim})))'
  )


def compiled_memory(rows, block_size, collective, dim):
  """XLA's memory analysis (bytes per device) of jit(shard_map(value_and_grad(siglip)))
  over every device, ``rows`` rows of each tower per device."""
  import jax
  from jax.sharding import PartitionSpec as P

  from hscl_jax import losses

  devices = jax.device_count()
  mesh = jax.sharding.Mesh(jax.devices(), ('data',))

  def loss(x, y, t, b):
    return losses.siglip(
      x, y, t=t, b=b, hardening=losses.exponential(1.0), axis_name='data',
      collective=collective, block_size=block_size,
    )  # fmt: skip

  step = jax.jit(
    jax.shard_map(
      jax.value_and_grad(loss, argnums=(0, 1, 2, 3)),
      mesh=mesh,
      in_specs=(P('data'), P('data'), P(), P()),
      out_specs=(P(), (P('data'), P('data'), P(), P())),
    )
  )
  tower = jax.ShapeDtypeStruct((rows * devices, dim), 'float32')
  scalar = jax.ShapeDtypeStruct((), 'float32')
  analysis = step.lower(tower, tower, scalar, scalar).compile().memory_analysis()
  return dict(
    devices=devices,
    collective=collective,
    temp_bytes=int(analysis.temp_size_in_bytes),
    argument_bytes=int(analysis.argument_size_in_bytes),
  )


def ring_memory(device_counts, rows, block_size, dim=DIM):
  """[compiled_memory(...)] per device count and collective, each in its own process."""
  flags = [f for f in os.environ.get('XLA_FLAGS', '').split() if 'device_count' not in f]
  results = []
  for devices in device_counts:
    env = dict(os.environ, JAX_PLATFORMS='cpu')
    env['XLA_FLAGS'] = ' '.join([*flags, f'--xla_force_host_platform_device_count={devices}'])
    for collective in ('ring', 'all_gather'):
      code = ring_memory_code(rows, block_size, collective, dim)
      out = subprocess.run(
        [sys.executable, '-c', code], capture_output=True, text=True, check=True, env=env
      )
      results.append(json.loads(out.stdout.strip().splitlines()[-1]))
  return results


def print_ring_memory(results, rows, block_size):
  print(
    f'compiled temporary memory per device, {rows} rows per device, d={DIM}, '
    f'block {block_size}, exponential(1):'
  )
  for row in results:
    print(
      f'  {row["devices"]} devices, {row["collective"]:>10}: '
      f'{row["temp_bytes"] / 2**20:8.2f} MiB temp, {row["argument_bytes"] / 2**20:.2f} MiB args'
    )


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--speed_rows', type=int, default=1024, help='0 skips the speed rows')
  parser.add_argument('--repeats', type=int, default=20)
  parser.add_argument('--memory_rows', type=int, default=65536, help='0 skips the memory check')
  parser.add_argument('--ring_devices', default='2,4,8', help='empty skips the ring check')
  parser.add_argument('--ring_rows', type=int, default=4096, help='rows per device')
  parser.add_argument('--ring_block_size', type=int, default=1024)
  args = parser.parse_args()
  if args.memory_rows:  # first: ru_maxrss of children is a running maximum
    memory(args.memory_rows)
  if args.speed_rows:
    speed(args.speed_rows, args.repeats)
  if args.ring_devices:
    counts = [int(d) for d in args.ring_devices.split(',')]
    results = ring_memory(counts, args.ring_rows, args.ring_block_size)
    print_ring_memory(results, args.ring_rows, args.ring_block_size)


if __name__ == '__main__':
  main()
