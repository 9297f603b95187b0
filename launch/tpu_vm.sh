#!/usr/bin/env bash
# Cloud TPU VM or pod slice: create it (or reuse it if it exists), install this
# repository and JAX for TPU on every worker, and run one config on all workers at once.
# hscl_jax.main is started with --multihost, so every worker calls
# jax.distributed.initialize() (JAX reads the slice from the TPU metadata); the global
# batch is split over all TPU cores of all workers.
#
# Example (from the repository root):
#   launch/tpu_vm.sh hscl-v4 us-central2-b v4-32 configs/cifar100.py \
#       gs://my-bucket/runs/c100_hscl_b1 --config.method=hscl --config.beta=1
#   SPOT=1 launch/tpu_vm.sh hscl-v5e us-west4-a v5litepod-8 configs/cifar10.py \
#       gs://my-bucket/runs/c10_ucl --config.method=ucl
#   DRY_RUN=1 launch/tpu_vm.sh t us-central2-b v4-8 configs/digits.py gs://b/x  # print only
#
# Assumptions:
#   * gcloud is installed and authenticated, with a default project (or PROJECT=...),
#     and TPU quota in ZONE; the TPU service account can write the gs:// workdir;
#   * WORKDIR is a gs:// URL (Orbax/etils write checkpoints there collectively from every
#     worker; process 0 writes the metrics). A local path is allowed only on a single-host
#     TPU VM; it is then copied back from the VM to LOCAL_COPY (default ./tpu_runs/<name>)
#     when the run ends. Nothing else is copied back;
#   * the workers can reach PyPI; RUNTIME (default tpu-ubuntu2204-base) has Python >= 3.11
#     (else set PYTHON to an interpreter that has it);
#   * the run is in the foreground: interrupting the script (or losing the SSH session)
#     stops it. DETACH=1 starts it under nohup on every worker instead (log:
#     ~/hscl_run.log); rerunning the same command resumes from the latest checkpoint.
#   * the VM is not deleted: gcloud compute tpus tpu-vm delete NAME --zone ZONE.
# Environment: PROJECT, RUNTIME, SPOT=1, JAX_VERSION (default: the jax pin of setup.py),
#   PYTHON (default python3), LOCAL_COPY, DETACH=1, DRY_RUN=1 (print the gcloud commands).
set -euo pipefail

if [[ $# -lt 5 ]]; then
  echo "usage: $0 TPU_NAME ZONE ACCELERATOR_TYPE CONFIG WORKDIR [--config.FIELD=VALUE ...]" >&2
  exit 2
fi
name=$1
zone=$2
accelerator=$3
config=$4
workdir=$5
shift 5

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
runtime=${RUNTIME:-tpu-ubuntu2204-base}
python=${PYTHON:-python3}
jax_version=${JAX_VERSION:-$(sed -n 's/.*"jax==\([0-9.]*\)".*/\1/p' "$repo/setup.py" | head -n 1)}
remote_dir=hscl_jax_src
# The config as a path inside the repository (it is shipped with it).
case $config in
  "$repo"/*) config=${config#"$repo"/} ;;
esac

gcloud_tpu=(gcloud compute tpus tpu-vm)
common=(--zone="$zone")
if [[ -n "${PROJECT:-}" ]]; then
  common+=(--project="$PROJECT")
fi

run() {
  if [[ -n "${DRY_RUN:-}" ]]; then
    printf '%q ' "$@"
    echo
  else
    "$@"
  fi
}

# 1. Create the TPU VM / slice unless it exists.
if [[ -n "${DRY_RUN:-}" ]] || ! "${gcloud_tpu[@]}" describe "$name" "${common[@]}" >/dev/null 2>&1; then
  create=("${gcloud_tpu[@]}" create "$name" "${common[@]}"
    --accelerator-type="$accelerator" --version="$runtime")
  if [[ -n "${SPOT:-}" ]]; then
    create+=(--spot)
  fi
  run "${create[@]}"
else
  echo "Reusing TPU VM $name in $zone."
fi

# A local workdir is only coherent on a single host (checkpoints are written by all).
if [[ $workdir != gs://* ]]; then
  hosts=1
  if [[ -z "${DRY_RUN:-}" ]]; then
    endpoints=$("${gcloud_tpu[@]}" describe "$name" "${common[@]}" \
      --format='value(networkEndpoints[].ipAddress)')
    hosts=$(tr ';,' '\n' <<<"$endpoints" | grep -c . || true)
  fi
  if [[ $hosts -gt 1 ]]; then
    echo "error: $name has $hosts workers; use a gs:// WORKDIR (shared by all of them)." >&2
    exit 1
  fi
fi

# 2. Ship the repository (without .git and local runs) and install it on every worker.
archive=$(mktemp -t hscl_src.XXXXXX.tar.gz)
trap 'rm -f "$archive"' EXIT
run tar -czf "$archive" -C "$repo" --exclude=.git --exclude=runs --exclude=tpu_runs \
  --exclude='*.egg-info' --exclude=__pycache__ .
run "${gcloud_tpu[@]}" scp "$archive" "$name:hscl_src.tar.gz" "${common[@]}" --worker=all
install="rm -rf $remote_dir && mkdir -p $remote_dir && tar -xzf hscl_src.tar.gz -C $remote_dir"
install+=" && $python -m pip install -q -U 'jax[tpu]==$jax_version' -e './${remote_dir}[train]'"
run "${gcloud_tpu[@]}" ssh "$name" "${common[@]}" --worker=all --command="$install"

# 3. Run the config on all workers at once.
train=$(printf '%q ' "$python" -m hscl_jax.main --multihost "--config=$config" \
  "--workdir=$workdir" "$@")
if [[ -n "${DETACH:-}" ]]; then
  remote="cd $remote_dir && nohup $train > ~/hscl_run.log 2>&1 < /dev/null &"
else
  remote="cd $remote_dir && $train"
fi
run "${gcloud_tpu[@]}" ssh "$name" "${common[@]}" --worker=all --command="$remote"

# 4. Copy back the workdir (only if it is on the VM, and only it).
if [[ $workdir != gs://* && -z "${DETACH:-}" ]]; then
  local_copy=${LOCAL_COPY:-tpu_runs/$name}
  mkdir -p "$local_copy"
  case $workdir in
    /*) remote_workdir=$workdir ;;
    *) remote_workdir=$remote_dir/$workdir ;;
  esac
  run "${gcloud_tpu[@]}" scp --recurse "$name:$remote_workdir" "$local_copy" \
    "${common[@]}" --worker=0
fi
