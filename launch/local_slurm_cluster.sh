#!/usr/bin/env bash
# A one-node SLURM cluster on this machine (127.0.0.1): munge, slurmctld and slurmd with all
# configuration, state and logs in one directory. It runs launch/slurm_gpu.sbatch for real
# (on CPU) without a site cluster: to try the SLURM path, and for tests/test_slurm.py.
#
# Example (from the repository root):
#   launch/local_slurm_cluster.sh start    # idempotent: starts only what is not running
#   eval "$(launch/local_slurm_cluster.sh env)"   # SLURM_CONF for sbatch/squeue/scontrol
#   XLA_FLAGS=--xla_force_host_platform_device_count=2 JAX_PLATFORMS=cpu \
#     sbatch --ntasks=2 --cpus-per-task=1 --gpus-per-node=0 launch/slurm_gpu.sbatch \
#     configs/digits.py /tmp/digits_slurm --config.num_epochs=2
#   launch/local_slurm_cluster.sh status   # daemons and node state; exit 0 iff all is up
#   launch/local_slurm_cluster.sh stop     # cancels the cluster's jobs, stops the daemons
#
# Assumptions:
#   * the Debian/Ubuntu packages slurm-wlm and munge are installed (apt-get install
#     slurm-wlm munge), or the same programs are on PATH;
#   * the ports HSCL_SLURM_PORT and HSCL_SLURM_PORT+1 are free, and "localhost" resolves
#     (it is the node's name, which JAX's SLURM detection uses as the coordinator host).
# Nothing outside the directory is written or started (the system's own munge and slurm
# services, if any, are not touched). The node takes up to 4 jobs per CPU
# (OverSubscribe=FORCE:4) and tracks tasks without cgroups (proctrack/linuxproc), so it
# also works in containers. Jobs run as the user who started the cluster.
# Environment:
#   HSCL_SLURM_DIR   directory of the cluster (default /tmp/hscl_slurm)
#   HSCL_SLURM_CPUS  CPUs of the node (default: this machine's, at least 2)
#   HSCL_SLURM_PORT  slurmctld port; slurmd uses the next one (default 6817)
set -euo pipefail

dir=${HSCL_SLURM_DIR:-/tmp/hscl_slurm}
port=${HSCL_SLURM_PORT:-6817}
cpus=${HSCL_SLURM_CPUS:-$(nproc)}
((cpus < 2)) && cpus=2
user=$(id -un)
node=localhost  # what JAX's SLURM detection uses as the coordinator host: must resolve
conf=$dir/slurm.conf

usage() {
  echo "usage: $0 start|stop|status|env" >&2
  exit 2
}

die() {
  echo "local_slurm_cluster: $*" >&2
  exit 1
}

need_programs() {
  local missing=()
  for program in munged mungekey slurmctld slurmd sinfo scontrol; do
    command -v "$program" >/dev/null || missing+=("$program")
  done
  if ((${#missing[@]})); then
    die "${missing[*]} not found. Fix: apt-get install slurm-wlm munge (Debian/Ubuntu)."
  fi
}

# pid of a daemon from its pid file, if that process is alive.
running_pid() {
  local pid_file=$dir/run/$1.pid pid
  [[ -s $pid_file ]] || return 1
  pid=$(<"$pid_file")
  kill -0 "$pid" 2>/dev/null || return 1
  echo "$pid"
}

write_config() {
  mkdir -p "$dir"/{munge,state,spool,run,log}
  chmod 700 "$dir/munge"
  cat >"$conf.tmp" <<EOF
# Written by launch/local_slurm_cluster.sh: one node on 127.0.0.1.
ClusterName=hscl
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$port
SlurmdPort=$((port + 1))
SlurmUser=$user
SlurmdUser=$user
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/munge.socket
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/run/slurmctld.pid
SlurmdPidFile=$dir/run/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SchedulerType=sched/backfill
# One small node: look for startable jobs every 5 s (a requeued job starts within seconds
# of its begin time, not after the default 30-60 s).
SchedulerParameters=sched_interval=5,bf_interval=5
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
# The node is what this file says, even with fewer CPUs in the machine.
SlurmdParameters=config_overrides
ReturnToService=2
# SIGTERM to SIGKILL on scancel/requeue/time limit: time to save a checkpoint.
KillWait=60
NodeName=$node NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN
PartitionName=local Nodes=$node Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
EOF
  mv "$conf.tmp" "$conf"
}

start_munge() {
  running_pid munged >/dev/null && return 0
  local key=$dir/munge/munge.key
  [[ -s $key ]] || mungekey --create --keyfile="$key"
  chmod 400 "$key"
  munged --force --key-file="$key" --socket="$dir/munge/munge.socket" \
    --pid-file="$dir/run/munged.pid" --log-file="$dir/log/munged.log" \
    --seed-file="$dir/munge/munged.seed"
}

start_slurm() {
  export SLURM_CONF=$conf
  running_pid slurmctld >/dev/null || slurmctld
  running_pid slurmd >/dev/null || slurmd -N "$node"
}

# Waits until the node takes jobs (idle, mixed or allocated).
wait_for_node() {
  local state=''
  for _ in $(seq 60); do
    state=$(SLURM_CONF=$conf sinfo -h -n "$node" -o %T 2>/dev/null || true)
    case $state in
      idle* | mix* | alloc*) return 0 ;;
      drain* | down*)
        SLURM_CONF=$conf scontrol update nodename="$node" state=resume 2>/dev/null || true ;;
    esac
    sleep 1
  done
  die "node $node not ready after 60 s (state: ${state:-none}); see $dir/log/."
}

start() {
  need_programs
  write_config
  start_munge
  start_slurm
  wait_for_node
  echo "local SLURM cluster up: node $node, $cpus CPUs, $dir (export SLURM_CONF=$conf)"
}

stop_daemon() {
  local pid
  pid=$(running_pid "$1") || return 0
  kill "$pid"
  for _ in $(seq 50); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.2
  done
  kill -KILL "$pid" 2>/dev/null || true
}

# Waits up to $1 seconds for the cluster to have no running or completing job.
wait_for_no_jobs() {
  for _ in $(seq "$1"); do
    [[ -z $(SLURM_CONF=$conf squeue -h -t running,completing -o %i 2>/dev/null) ]] && return 0
    sleep 1
  done
  return 1
}

stop() {
  if running_pid slurmctld >/dev/null; then
    SLURM_CONF=$conf scancel --full --quiet --user="$user" 2>/dev/null || true
    # Jobs end (their SIGTERM handlers run) before the daemons that track them go.
    wait_for_no_jobs 30 ||
      SLURM_CONF=$conf scancel --full --quiet --signal=KILL --user="$user" 2>/dev/null || true
    wait_for_no_jobs 10 || true
  fi
  stop_daemon slurmd
  stop_daemon slurmctld
  stop_daemon munged
  echo "local SLURM cluster stopped ($dir)"
}

status() {
  local up=0 daemon
  for daemon in munged slurmctld slurmd; do
    if pid=$(running_pid "$daemon"); then
      echo "$daemon: running (pid $pid)"
    else
      echo "$daemon: stopped"
      up=1
    fi
  done
  if ((up == 0)); then
    SLURM_CONF=$conf sinfo -N -o '%N %T %c' || up=1
  fi
  return $up
}

case ${1:-} in
  start) start ;;
  stop) stop ;;
  status) status ;;
  env) echo "export SLURM_CONF=$conf" ;;
  *) usage ;;
esac
