#!/usr/bin/env bash
# The real TunableOp path on a machine with a ROCm or CUDA GPU and torch (no download, no S3,
# no stubs): record a small transformer, tune, publish to a directory store, fetch, time the
# first and steady-state iterations with TunableOp off, tuning online and loading the fetched
# offline results, check that the loaded results were used, run the tests marked gpu, and print
# a short table at the end (scripts/gpu_check.py).
#
#   scripts/gpu-check.sh [--budget-seconds 120] [--iters 12] [--repeats 3] [--keep]
#
# Everything runs under one deadline of GPU_CHECK_DEADLINE_SECONDS (default and maximum 450):
# gpu_check.py gives each step what is left and prints the table of what it measured 15 s before
# the deadline whatever happened; `timeout` is the backstop should the interpreter itself hang.
# PYTHON=... picks the interpreter.
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
export PYTHONPATH="$PWD:$PWD/operator${PYTHONPATH:+:$PYTHONPATH}"

deadline="${GPU_CHECK_DEADLINE_SECONDS:-450}"
if ! [[ "$deadline" =~ ^[0-9]+$ ]] || ((deadline > 450 || deadline < 60)); then
  echo "gpu-check: GPU_CHECK_DEADLINE_SECONDS must be a whole number of seconds, 60..450" >&2
  exit 2
fi
exec timeout --kill-after=10 "$deadline" \
  "$PY" scripts/gpu_check.py --deadline-seconds "$((deadline - 15))" "$@"
