#!/usr/bin/env bash
# Trains on all GPUs of this machine: ONE process that sees every local GPU (or the
# ones in $GPUS). The global batch (config.batch_size) is split over them; the loss
# gathers the negatives of all GPUs and BatchNorm statistics are synced, so the result
# does not depend on the GPU count.
#
# Example (from the repository root):
#   launch/local.sh configs/cifar10.py runs/cifar10_hscl --config.method=hscl --config.beta=1
#   GPUS=0,1 launch/local.sh configs/digits.py /tmp/digits --config.num_epochs=5
#   DRY_RUN=1 launch/local.sh configs/cifar10.py runs/x     # print the command only
#
# Assumptions:
#   * run from the repository root, or anywhere with REPO=/path/to/repo (configs/ are files
#     of the repository, not of the installed package);
#   * the package and a GPU build of JAX are installed in $PYTHON's environment
#     (pip install -e '.[train]' 'jax[cuda13]==<the pinned jax version>'); no GPU -> JAX
#     uses the CPU;
#   * WORKDIR is a local path or a gs:// URL; rerunning the same command resumes from its
#     latest checkpoint (SIGTERM saves one and exits with 143).
# Environment: GPUS (comma-separated ids -> CUDA_VISIBLE_DEVICES), PYTHON (default python3),
#   REPO (default: the parent of this script), MEM_FRACTION (XLA_PYTHON_CLIENT_MEM_FRACTION,
#   default JAX's 0.75), DRY_RUN=1.
set -euo pipefail

usage() {
  echo "usage: $0 CONFIG WORKDIR [--config.FIELD=VALUE ...]" >&2
  exit 2
}
[[ $# -ge 2 ]] || usage
config=$1
workdir=$2
shift 2

repo=${REPO:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
# Paths relative to the caller's directory stay valid after the cd into the repository.
if [[ -f $config ]]; then config=$(cd "$(dirname "$config")" && pwd)/$(basename "$config"); fi
if [[ $workdir != *://* && $workdir != /* ]]; then workdir=$PWD/$workdir; fi
python=${PYTHON:-python3}
if [[ -n "${GPUS:-}" ]]; then
  export CUDA_VISIBLE_DEVICES=$GPUS
fi
if [[ -n "${MEM_FRACTION:-}" ]]; then
  export XLA_PYTHON_CLIENT_MEM_FRACTION=$MEM_FRACTION
fi

cmd=("$python" -m hscl_jax.main "--config=$config" "--workdir=$workdir" "$@")
if [[ -n "${DRY_RUN:-}" ]]; then
  printf '%q ' "${cmd[@]}"
  echo
  exit 0
fi
cd "$repo"
exec "${cmd[@]}"
