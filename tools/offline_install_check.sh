#!/usr/bin/env bash
# Checks the offline installation of docs/training.md ("Offline installation") on this
# machine: (1) with network, builds a wheelhouse of hscl_jax and its whole dependency
# closure (the test extra included) for this machine's platform and Python; (2) without
# network, installs from it into a fresh venv and runs the accelerator smoke benchmark and
# the config tests there. Step 2 runs in a network namespace with no interface
# (`unshare -n`; root or user namespaces needed) where available, and always with
# --no-index, no pip config file and an unreachable proxy, so that any download fails.
# Prints the time of each step. Takes minutes and downloads a few hundred MB, hence a
# script, not a default test.
#
# Example:
#   tools/offline_install_check.sh
#   PYTHON=~/.pyenv/versions/3.12.1/bin/python CONSTRAINTS=constraints-py312.txt \
#     tools/offline_install_check.sh
# Assumptions: internet for step 1 (PyPI); PYTHON (default python3) has pip and venv;
# CONSTRAINTS (default constraints.txt) is the pinned set for that Python.
set -euo pipefail
cd "$(dirname "$0")/.."
repo="$PWD"
python="${PYTHON:-python3}"
constraints="$repo/${CONSTRAINTS:-constraints.txt}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

start=$SECONDS
"$python" -m pip wheel -q -w "$work/wheels" -c "$constraints" '.[test]'
echo "offline check: wheelhouse of $(find "$work/wheels" -name '*.whl' | wc -l) wheels," \
  "$(du -sh "$work/wheels" | cut -f1), built in $((SECONDS - start)) s"

"$python" -m venv "$work/venv"
cutoff=()
if unshare -n true 2>/dev/null; then
  cutoff=(unshare -n)
elif unshare -rn true 2>/dev/null; then
  cutoff=(unshare -rn)
else
  echo 'offline check: unshare unavailable; relying on --no-index and a dead proxy'
fi
offline=(env -u PIP_FIND_LINKS -u PIP_EXTRA_INDEX_URL -u PIP_INDEX_URL PIP_CONFIG_FILE=/dev/null
  PIP_NO_INDEX=1 http_proxy=http://127.0.0.1:9 https_proxy=http://127.0.0.1:9 JAX_PLATFORMS=cpu
  "${cutoff[@]}")
start=$SECONDS
"${offline[@]}" "$work/venv/bin/python" -m pip install -q --no-index \
  --find-links="$work/wheels" -c "$constraints" 'hscl_jax[test]'
echo "offline check: installed without network in $((SECONDS - start)) s"

start=$SECONDS
(cd "$work" && "${offline[@]}" "$work/venv/bin/python" -c \
  'import hscl_jax, sys; assert hscl_jax.__file__.startswith(sys.prefix), hscl_jax.__file__')
"${offline[@]}" "$work/venv/bin/python" benchmarks/accelerator.py --smoke --out="$work/smoke"
"${offline[@]}" "$work/venv/bin/python" -m pytest -q tests/test_configs.py
echo "offline check: passed (smoke benchmark and config tests in $((SECONDS - start)) s)"
