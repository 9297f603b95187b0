"""Multi-process start-up: `jax.distributed` from explicit flags or the cluster environment.

Call `initialize(...)` once, first thing in the program, before any other JAX call
(anything that touches devices, e.g. `jax.devices()`, creating an array, `jax.jit`
execution). Which mode is used:

  explicit  `coordinator_address`, `num_processes` and `process_id` all given (e.g. the
            flags --coordinator_address=10.0.0.1:1234 --num_processes=2 --process_id=0 on
            every host, with its own id). Giving only some of them is an error.
  slurm     launched by `srun` with more than one task (SLURM_JOB_ID and SLURM_STEP_NODELIST
            set, SLURM_NTASKS > 1; a batch script run without srun is one process):
            `jax.distributed.initialize()` reads the job from the environment. With one
            task per node and several GPUs per node, every task is given all GPUs of its
            node (JAX would otherwise give each task only GPU SLURM_LOCALID).
  tpu       a multi-host Cloud TPU slice, recognised by the TPU worker variables
            (TPU_WORKER_HOSTNAMES / TPU_PROCESS_ADDRESSES listing several hosts, or
            MEGASCALE_COORDINATOR_ADDRESS), or forced with `multihost=True` (launch/tpu_vm.sh
            does that: on GCE TPU VMs the worker list comes from the metadata server, not
            from environment variables). `jax.distributed.initialize()` auto-detects it.
  single    none of the above: nothing is initialised; JAX runs as one process on all
            local devices.

With several processes on CPU (tests, debugging), cross-process collectives go through
gloo (`jax_cpu_collectives_implementation`), which must be chosen before the CPU
backend is created; `initialize` does that unless another implementation was chosen.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
import dataclasses
import os

import jax

EXPLICIT = 'explicit'
SLURM = 'slurm'
TPU = 'tpu'
FORCED = 'forced'  # multihost=True outside a recognised environment: JAX's own detection
SINGLE = 'single'

CPU_COLLECTIVES_OPTION = 'jax_cpu_collectives_implementation'


@dataclasses.dataclass(frozen=True)
class Setup:
  """What `initialize` decided (returned for logging; the processes are JAX's)."""

  mode: str  # one of EXPLICIT, SLURM, TPU, FORCED, SINGLE
  coordinator_address: str | None = None
  num_processes: int | None = None
  process_id: int | None = None
  local_device_ids: tuple[int, ...] | None = None

  @property
  def initialized(self) -> bool:
    return self.mode != SINGLE


def _int_env(env: Mapping[str, str], name: str) -> int | None:
  value = env.get(name, '').strip()
  if not value:
    return None
  # SLURM writes e.g. SLURM_TASKS_PER_NODE=2(x3); only a plain count is used here.
  try:
    return int(value)
  except ValueError:
    return None


def _slurm_multi_task(env: Mapping[str, str]) -> bool:
  """Inside a SLURM job step with more than one task (srun -n N, N > 1).

  The batch script of an `sbatch --ntasks=N` job has SLURM_NTASKS=N and SLURM_PROCID=0
  too, but it is one process: only srun's tasks (SLURM_STEP_NODELIST, which JAX reads for
  the coordinator) join a jax.distributed run.
  """
  if 'SLURM_JOB_ID' not in env or not env.get('SLURM_STEP_NODELIST'):
    return False
  tasks = _int_env(env, 'SLURM_NTASKS') or _int_env(env, 'SLURM_NPROCS') or 1
  return tasks > 1 and 'SLURM_PROCID' in env


def _tpu_multi_host(env: Mapping[str, str]) -> bool:
  if env.get('MEGASCALE_COORDINATOR_ADDRESS'):
    return True
  for name in ('TPU_PROCESS_ADDRESSES', 'TPU_WORKER_HOSTNAMES'):
    hosts = [h for h in env.get(name, '').split(',') if h.strip()]
    if len(hosts) > 1:
      return True
  return False


def _slurm_local_device_ids(env: Mapping[str, str]) -> tuple[int, ...] | None:
  """All GPUs of the node for one task per node; None (JAX's default) otherwise.

  JAX's SLURM detection gives task i of a node only GPU i (one process per GPU). With
  one task per node that would leave the other GPUs idle, so every GPU the job step
  sees (CUDA_VISIBLE_DEVICES, else SLURM_GPUS_ON_NODE) is given to the task.
  JAX_LOCAL_DEVICE_IDS, if set, is read by JAX itself and wins.
  """
  if env.get('JAX_LOCAL_DEVICE_IDS'):
    return None
  tasks = _int_env(env, 'SLURM_NTASKS') or 1
  nodes = _int_env(env, 'SLURM_STEP_NUM_NODES') or _int_env(env, 'SLURM_NNODES') or tasks
  if tasks != nodes:  # several tasks per node: one GPU each (JAX's default)
    return None
  visible = [d for d in env.get('CUDA_VISIBLE_DEVICES', '').split(',') if d.strip()]
  count = len(visible) or _int_env(env, 'SLURM_GPUS_ON_NODE') or 0
  if count <= 1:
    return None
  return tuple(range(count))


def decide(
  coordinator_address: str | None = None,
  num_processes: int | None = None,
  process_id: int | None = None,
  *,
  multihost: bool | None = None,
  local_device_ids: Sequence[int] | None = None,
  env: Mapping[str, str] | None = None,
) -> Setup:
  """The start-up mode for these arguments and environment (no side effects)."""
  env = os.environ if env is None else env
  explicit = {
    'coordinator_address': coordinator_address,
    'num_processes': num_processes,
    'process_id': process_id,
  }
  given = [name for name, value in explicit.items() if value is not None]
  if given and len(given) < len(explicit):
    missing = [name for name in explicit if name not in given]
    raise ValueError(
      f'Multi-process flags: {", ".join(given)} given but {", ".join(missing)} missing. '
      'Give all three (--coordinator_address=HOST:PORT --num_processes=N '
      '--process_id=I, with I in [0, N) different on every process), or none of them '
      'under SLURM or on a Cloud TPU VM.'
    )
  ids = None if local_device_ids is None else tuple(int(i) for i in local_device_ids)
  if given:
    if not isinstance(num_processes, int) or num_processes < 1:
      raise ValueError(f'num_processes must be a positive integer, got {num_processes!r}')
    if not isinstance(process_id, int) or not 0 <= process_id < num_processes:
      raise ValueError(f'process_id must be an integer in [0, {num_processes}), got {process_id!r}')
    if ':' not in coordinator_address:
      raise ValueError(f'coordinator_address must be HOST:PORT, got {coordinator_address!r}')
    return Setup(EXPLICIT, coordinator_address, num_processes, process_id, ids)
  if multihost is False:
    return Setup(SINGLE)
  if _slurm_multi_task(env):
    return Setup(SLURM, local_device_ids=ids or _slurm_local_device_ids(env))
  if _tpu_multi_host(env):
    return Setup(TPU, local_device_ids=ids)
  if multihost:
    return Setup(FORCED, local_device_ids=ids)
  return Setup(SINGLE)


def use_gloo_on_cpu() -> None:
  """Cross-process CPU collectives through gloo, unless an implementation was chosen.

  Must run before the CPU backend exists (before any JAX computation); it is a no-op for
  GPU/TPU computations, which use NCCL / ICI.
  """
  if getattr(jax.config, CPU_COLLECTIVES_OPTION, None) is None:
    jax.config.update(CPU_COLLECTIVES_OPTION, 'gloo')


def initialize(
  coordinator_address: str | None = None,
  num_processes: int | None = None,
  process_id: int | None = None,
  *,
  multihost: bool | None = None,
  local_device_ids: Sequence[int] | None = None,
  initialization_timeout: int = 300,
) -> Setup:
  """Starts `jax.distributed` if this is one of several processes (see the module doc).

  Args:
    coordinator_address, num_processes, process_id: explicit set-up (all or none).
    multihost: None = detect SLURM / multi-host TPU from the environment; True = always
      call `jax.distributed.initialize()` (JAX detects the cluster; e.g. GCE TPU VMs);
      False = single process unless the explicit arguments are given.
    local_device_ids: devices of this process (default: JAX's choice, see `decide`).
    initialization_timeout: seconds to wait for all processes to connect.

  Returns:
    The `Setup` used. Idempotent: a second call returns without re-initialising.
  """
  setup = decide(
    coordinator_address,
    num_processes,
    process_id,
    multihost=multihost,
    local_device_ids=local_device_ids,
  )
  if not setup.initialized or jax.distributed.is_initialized():
    return setup
  use_gloo_on_cpu()
  jax.distributed.initialize(
    coordinator_address=setup.coordinator_address,
    num_processes=setup.num_processes,
    process_id=setup.process_id,
    local_device_ids=list(setup.local_device_ids) if setup.local_device_ids else None,
    initialization_timeout=initialization_timeout,
  )
  return setup


def describe(setup: Setup) -> str:
  """One log line: mode, process, local and global devices (call after `initialize`)."""
  return (
    f'{setup.mode}: process {jax.process_index()}/{jax.process_count()}, '
    f'{jax.local_device_count()} local of {jax.device_count()} devices '
    f'({jax.default_backend()})'
  )
