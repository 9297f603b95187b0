"""Speed and memory of H-SCL with a queue of K extra negatives, as ratios to the bare matmuls.

    python benchmarks/bench_queue.py                          # n = 1024, K = 0 ... 65536
    python benchmarks/bench_queue.py --queues=0,4096 --memory_queue=0 --repeats=1
    python benchmarks/bench_queue.py --keys --queues=4096,16384 --memory_queue=0

For each K (n = 1024 rows = batch·views, d = 128, labels in 0..99, every slot filled and
labelled) it times the jitted forward+backward of ``losses.hscl`` (exponential hardening,
``block_size=None``: dense without a queue, key blocks of 2048 with one) against the
bare matmul bound of the same shapes, measured in the same run: the similarity matmul
z [z; queue]ᵀ (n×(n+K)×d) and its two backward matmuls, as JAX's autodiff computes them
(target: loss / bound <= 1.5x at every K), and, as in ``bench_losses.py``, the CPU-time
ratio to the same three matmuls laid out as in the kernels. With ``--keys`` the loss takes
``keys=``, a second set of features as a momentum key encoder gives (training with
``queue_momentum`` > 0): the keys get no gradient, so the bound is the similarity matmul
z [keys; queue]ᵀ and the anchors' one backward matmul. Then the peak resident set of
a fresh process that runs one forward+backward at ``--memory_queue`` (target <= 1 GB),
next to one that only holds the inputs. Timings on a shared CPU are noisy: the CPU-time
ratios are the steadier figures, and the 1-minute load average is printed with them.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # hscl_jax, from any dir

from bench_losses import DIM  # noqa: E402  (a sibling script: its set-up and timing rule)
from bench_losses import _matmul_step  # noqa: E402
from bench_losses import _setup  # noqa: E402
from bench_losses import _time  # noqa: E402
from bench_losses import child_peak  # noqa: E402

ROWS = 1024
HERE = pathlib.Path(__file__).resolve().parent


def queue_setup(slots):
  """(queue [K, d] L2-normalised, queue_labels [K] in 0..99)."""
  import jax
  import jax.numpy as jnp

  kq, kl = jax.random.split(jax.random.key(1))
  queue = jax.random.normal(kq, (slots, DIM))
  queue = queue / jnp.linalg.norm(queue, axis=-1, keepdims=True)
  return queue, jax.random.randint(kl, (slots,), 0, 100)


def loss_step():
  """jit(value_and_grad) of hscl in z; a fifth argument, if given, is keys=."""
  import jax

  from hscl_jax import losses

  def loss(z, labels, queue, queue_labels, keys=None):
    hardening = losses.exponential(1.0)
    return losses.hscl(
      z, labels, hardening=hardening, queue=queue, queue_labels=queue_labels, keys=keys
    )

  return jax.jit(jax.value_and_grad(loss))


def key_encoder_features():
  """[n/2, 2, d] L2-normalised features other than _setup's: a key encoder's."""
  import jax
  import jax.numpy as jnp

  keys = jax.random.normal(jax.random.key(2), (ROWS // 2, 2, DIM))
  return keys / jnp.linalg.norm(keys, axis=-1, keepdims=True)


def speed(slots_list, repeats, with_keys=False):
  import jax
  import jax.numpy as jnp

  keys = key_encoder_features() if with_keys else None
  print(
    f'devices: {jax.devices()}  n={ROWS} d={DIM}  (best of {repeats})'
    + ('  keys= (no key gradient)' if with_keys else '')
  )
  print(
    f'{"K":>6} {"form":>6} {"loss ms":>10} {"bound ms":>10} {"ratio":>7} {"cpu ratio":>10} '
    f'{"cpu ratio, kernel layout":>24}  (load {os.getloadavg()[0]:.1f})'
  )
  z, labels = _setup(ROWS)
  for slots in slots_list:
    queue, queue_labels = queue_setup(slots)
    cotangent = jnp.ones((ROWS, ROWS + slots), jnp.float32) / ROWS
    if with_keys:  # one backward matmul, plainly laid out: the kernel layout is the same
      all_keys = jnp.concatenate([keys.reshape(-1, DIM), queue])
      bound = _time(_matmul_step(detached_keys=True), z, cotangent, all_keys, repeats=repeats)
      laid_out = bound
    else:
      bound = _time(_matmul_step(with_queue=True), z, cotangent, queue, repeats=repeats)
      laid_out = _time(
        _matmul_step(kernel_layout=True, with_queue=True), z, cotangent, queue, repeats=repeats
      )
    del cotangent
    extra = (keys,) if with_keys else ()
    loss = _time(loss_step(), z, labels, queue, queue_labels, *extra, repeats=repeats)
    form = 'blocks' if slots else 'dense'
    print(
      f'{slots:>6} {form:>6} {loss[0] * 1e3:>10.1f} {bound[0] * 1e3:>10.1f} '
      f'{loss[0] / bound[0]:>7.2f} {loss[1] / bound[1]:>10.2f} {loss[1] / laid_out[1]:>24.2f}'
      f'  (load {os.getloadavg()[0]:.1f})',
      flush=True,
    )


def memory(slots):
  """Peak RSS of fresh processes: inputs only, then one forward+backward with K slots."""
  code = (
    f'import sys, jax; sys.path[:0] = [{str(HERE)!r}];'
    'from bench_queue import ROWS, _setup, queue_setup, loss_step;'
    f'inputs = (*_setup(ROWS), *queue_setup({slots}));'
    'out = loss_step()(*inputs) if RUN else inputs;'
    'jax.block_until_ready(out);'
    'print(float(out[0]) if RUN else 0.0)'
  )
  baseline, _ = child_peak(code.replace('RUN', 'False'))
  peak, value = child_peak(code.replace('RUN', 'True'))
  print(
    f'n={ROWS} K={slots} d={DIM}: peak RSS {peak:.0f} MiB (target <= 1000 MB = 954 MiB; '
    f'inputs-only process {baseline:.0f} MiB; a dense n×(n+K) f32 matrix would be '
    f'{ROWS * (ROWS + slots) * 4 / 2**20:.0f} MiB); loss {value}',
    flush=True,
  )


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--queues', default='0,4096,16384,65536', help='the K values to time')
  parser.add_argument('--repeats', type=int, default=2)
  parser.add_argument('--memory_queue', type=int, default=65536, help='0 skips the memory check')
  parser.add_argument(
    '--keys', action='store_true', help="time with keys= (a momentum key encoder's features)"
  )
  args = parser.parse_args()
  if args.memory_queue:  # first: ru_maxrss of children is a running maximum
    memory(args.memory_queue)
  speed([int(k) for k in args.queues.split(',') if k], args.repeats, with_keys=args.keys)


if __name__ == '__main__':
  main()
