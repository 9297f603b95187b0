"""Speed and memory of the H-SCL kernel, as ratios to the bare similarity matmuls.

    python benchmarks/bench_losses.py                 # n = 1024, 4096, 16384 and memory at 65536
    python benchmarks/bench_losses.py --sizes=1024 --memory_rows=0
    python benchmarks/bench_losses.py --sizes= --memory_rows=0       # only the optax row
    python benchmarks/bench_losses.py --sizes= --memory_rows=0 --optax_rows=0  # compositions

For each n (rows = batch·views, d = 128) it times the jitted forward+backward of
``losses.hscl`` (exponential hardening) in the dense and the blockwise form, and the
bare matmul bound measured in the same run: the forward similarity matmul z zᵀ plus the
two matmuls of its backward pass. The ratio loss/matmul is the figure of merit (targets:
<= 1.5x for the dense form at n = 1024, <= 2x for the blockwise form at n = 16384). Each
is given in wall time and in process CPU time (all threads): on a shared machine the CPU
time ratio is the steadier one. The bound is JAX's autodiff of z zᵀ, one of whose
backward matmuls (cotangentᵀ z) XLA:CPU runs ~3.5x slower than a plain one; the kernels
lay it out as (zᵀ cotangent)ᵀ. The last column is the CPU-time ratio to the same three
matmuls laid out as in the kernels: it isolates what the element-wise work costs. The
peak memory of the blockwise form at ``--memory_rows`` is the peak resident set of a
child process that runs one forward+backward, next to a child that only holds the inputs.
Then, at ``--optax_rows``, ``losses.ucl`` against ``optax.losses.ntxent``, the same loss
(NT-Xent, M = n - 2), which materialises an n×n×d tensor. Last, at ``--compose_rows``, the
dense step composed as users write it (grad∘jit, grad∘checkpoint∘jit, a scan over
micro-batches) against jit∘grad: the composed forms must cost what jit∘grad costs.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time

DIM = 128


def _setup(n):
  import jax
  import jax.numpy as jnp

  kf, kl = jax.random.split(jax.random.key(0))
  z = jax.random.normal(kf, (n // 2, 2, DIM))
  z = z / jnp.linalg.norm(z, axis=-1, keepdims=True)
  labels = jax.random.randint(kl, (n // 2,), 0, 100)
  return z, labels


def _loss_step(block_size, precision=None):
  """The jitted forward+backward of H-SCL(beta = 1); `precision` of its similarity matmuls
  (None: the kernels' default)."""
  import jax

  from hscl_jax import losses
  from hscl_jax.losses import kernel

  precision = kernel.DEFAULT_PRECISION if precision is None else precision

  def loss(z, labels):
    return losses.hscl(
      z, labels, hardening=losses.exponential(1.0), block_size=block_size, precision=precision
    )

  return jax.jit(jax.value_and_grad(loss))


def _matmul_step(kernel_layout=False, with_queue=False, detached_keys=False):
  """z zᵀ forward and its backward (two n×n×d matmuls): the bound any kernel must pay;
  with ``kernel_layout``, the backward matmuls as the loss kernels lay them out. With
  ``with_queue`` the step takes a third argument, K more keys: z [z; queue]ᵀ (n×(n+K)×d)
  and both backward matmuls in full (the queue is differentiated too). With
  ``detached_keys`` the third argument is all the keys (a key encoder's rows, then the
  queue), which get no gradient: z keysᵀ and the anchors' one backward matmul."""
  import jax
  import jax.numpy as jnp

  from hscl_jax.losses import kernel

  @jax.custom_vjp
  def gram(rows, keys):
    return rows @ keys.T

  def gram_backward(saved, cotangent):
    return kernel.similarity_pullback(cotangent, *saved, None)

  gram.defvjp(lambda rows, keys: (gram(rows, keys), (rows, keys)), gram_backward)

  def bare(z, cotangent, queue=None):
    rows = z.reshape(-1, DIM)
    keys = rows if queue is None else queue if detached_keys else jnp.concatenate([rows, queue])
    return jnp.vdot(gram(rows, keys) if kernel_layout else rows @ keys.T, cotangent)

  argnums = (0, 2) if with_queue and not detached_keys else 0
  return jax.jit(jax.value_and_grad(bare, argnums=argnums))


def _time(fn, *args, repeats):
  """(best wall time, best process CPU time) of ``repeats`` calls after a warm-up."""
  from bench_train_step import best_time  # a sibling script: same timing rule
  import jax

  jax.block_until_ready(fn(*args))  # compile + warm up
  cpu = float('inf')
  for _ in range(repeats):
    start = time.process_time()
    jax.block_until_ready(fn(*args))
    cpu = min(cpu, time.process_time() - start)
  return best_time(fn, *args, repeats=repeats), cpu


def speed(sizes, block_size, repeats):
  import jax
  import jax.numpy as jnp

  print(f'devices: {jax.devices()}  d={DIM}  (best of {repeats})')
  print(
    f'{"n":>6} {"form":>10} {"loss ms":>10} {"matmul ms":>10} {"ratio":>7} '
    f'{"cpu ratio":>10} {"cpu ratio, kernel layout":>24}  (load {os.getloadavg()[0]:.1f})'
  )
  for n in sizes:
    z, labels = _setup(n)
    cotangent = jnp.ones((n, n), jnp.float32) / n
    matmul = _time(_matmul_step(), z, cotangent, repeats=repeats)
    laid_out = _time(_matmul_step(kernel_layout=True), z, cotangent, repeats=repeats)
    del cotangent
    forms = [('dense', 0)] if n <= 4096 else []
    forms.append((f'block{block_size}', block_size))
    for name, size in forms:
      loss = _time(_loss_step(size), z, labels, repeats=repeats)
      print(
        f'{n:>6} {name:>10} {loss[0] * 1e3:>10.1f} {matmul[0] * 1e3:>10.1f} '
        f'{loss[0] / matmul[0]:>7.2f} {loss[1] / matmul[1]:>10.2f} {loss[1] / laid_out[1]:>24.2f}',
        flush=True,
      )


def versus_optax(n, repeats):
  """losses.ucl against optax.losses.ntxent (the same loss, M = n - 2), forward+backward."""
  import jax
  import optax

  from hscl_jax import losses

  z, _ = _setup(n)
  rows, labels = z.reshape(n, DIM), jax.numpy.repeat(jax.numpy.arange(n // 2), 2)
  ours = jax.jit(jax.value_and_grad(lambda z: losses.ucl(z, temperature=0.5)))
  theirs = jax.jit(
    jax.value_and_grad(lambda rows: optax.losses.ntxent(rows, labels, temperature=0.5))
  )
  ours_s, theirs_s = _time(ours, z, repeats=repeats)[0], _time(theirs, rows, repeats=repeats)[0]
  gap = abs(float(ours(z)[0]) - float(theirs(rows)[0]))
  print(
    f'n={n} forward+backward: losses.ucl {ours_s * 1e3:.1f} ms, optax.losses.ntxent '
    f'{theirs_s * 1e3:.1f} ms: ours {theirs_s / ours_s:.0f}x faster; |value gap| {gap:.1e}'
  )


def compositions(n, repeats):
  """The same forward+backward (H-SCL(β = 1), dense) as users compose it: jit∘grad (the
  rows above), grad∘jit and grad∘checkpoint∘jit (each call re-traces the outer grad, as
  in a user's eager loop), and jit∘grad∘scan over two micro-batches of n/2 rows."""
  import jax

  from hscl_jax import losses

  z, labels = _setup(n)
  loss = lambda z, y: losses.hscl(z, y, hardening=losses.exponential(1.0), block_size=0)

  def over_micro_batches(z, y):
    halves = (z.reshape(2, -1, *z.shape[1:]), y.reshape(2, -1))
    return jax.lax.scan(lambda c, zy: (c + loss(*zy), None), 0.0, halves)[0]

  steps = {
    'jit(grad)': jax.jit(jax.value_and_grad(loss)),
    'grad(jit)': jax.value_and_grad(jax.jit(loss)),
    'grad(checkpoint(jit))': jax.value_and_grad(jax.checkpoint(jax.jit(loss))),
    'jit(grad(scan)), 2 x n/2': jax.jit(jax.value_and_grad(over_micro_batches)),
  }
  times = {name: _time(step, z, labels, repeats=repeats) for name, step in steps.items()}
  base_wall, base_cpu = times['jit(grad)']
  for name, (wall, cpu) in times.items():
    print(
      f'n={n} {name:>26}: {wall * 1e3:7.1f} ms  / jit(grad) wall {wall / base_wall:.2f}, '
      f'cpu {cpu / base_cpu:.2f}'
    )


def _child_peak(rows, block_size, run_loss):
  """Peak RSS (MiB) of a fresh process that builds the inputs and optionally runs the loss."""
  return child_peak(
    "import sys, jax; sys.path.insert(0, '.');"
    'from benchmarks.bench_losses import _setup, _loss_step;'
    f'z, y = _setup({rows});'
    f'out = _loss_step({block_size})(z, y) if {run_loss} else (z, y);'
    'jax.block_until_ready(out);'
    'print(float(out[0]) if {run_loss} else 0.0)'.replace('{run_loss}', str(run_loss))
  )


def child_peak(code):
  """(peak RSS in MiB, stdout) of a fresh Python process that runs ``code``; the peak must
  be above every earlier child's (ru_maxrss of children is a running maximum)."""
  before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
  result = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=True)
  peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
  if peak <= before:
    raise RuntimeError("child peak not above an earlier child's; run the memory check first")
  return peak / 1024, result.stdout.strip()


def memory(rows, block_size):
  baseline, _ = _child_peak(rows, block_size, run_loss=False)
  start = time.perf_counter()
  peak, value = _child_peak(rows, block_size, run_loss=True)
  elapsed = time.perf_counter() - start
  dense_gib = rows * rows * 4 / 2**30
  print(
    f'blockwise n={rows} d={DIM} block={block_size}: peak RSS {peak:.0f} MiB '
    f'(inputs-only process {baseline:.0f} MiB; one dense n×n f32 matrix would be '
    f'{dense_gib:.0f} GiB); loss {value}; forward+backward incl. compile {elapsed:.0f} s'
  )
  return peak


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--sizes', default='1024,4096,16384')
  parser.add_argument('--block_size', type=int, default=2048)
  parser.add_argument('--repeats', type=int, default=3)
  parser.add_argument('--memory_rows', type=int, default=65536, help='0 skips the memory check')
  parser.add_argument('--optax_rows', type=int, default=1024, help='0 skips the optax row')
  parser.add_argument(
    '--compose_rows', type=int, default=1024, help='0 skips grad(jit) against jit(grad)'
  )
  args = parser.parse_args()
  if args.memory_rows:  # first: ru_maxrss of children is a running maximum
    memory(args.memory_rows, args.block_size)
  speed([int(s) for s in args.sizes.split(',') if s], args.block_size, args.repeats)
  if args.optax_rows:
    versus_optax(args.optax_rows, args.repeats)
  if args.compose_rows:
    compositions(args.compose_rows, args.repeats)


if __name__ == '__main__':
  main()
