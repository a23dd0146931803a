#!/usr/bin/env bash
# The real TunableOp path on a machine with a ROCm or CUDA GPU and torch (no download, no S3,
# no stubs): record a small transformer, tune, publish to a directory store, fetch, then time
# the first and steady-state iterations with TunableOp off, tuning online and loading the
# fetched offline results (scripts/gpu_check.py), then run the tests marked gpu.
#
#   scripts/gpu-check.sh [--budget-seconds 120] [--iters 12] [--keep]    (PYTHON=... to pick one)
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
export PYTHONPATH="$PWD:$PWD/operator${PYTHONPATH:+:$PYTHONPATH}"

rc=0
echo "== gpu-check: end to end (scripts/gpu_check.py)"
"$PY" scripts/gpu_check.py "$@" || rc=$?

echo "== gpu-check: tests marked gpu (tests/gpu)"
if "$PY" -c "import pytest" 2>/dev/null; then
  # --noconftest: the suite's conftest starts a cluster and needs boto3; these tests need neither.
  "$PY" -m pytest --noconftest -p no:cacheprovider -m gpu tests/gpu -q || rc=$?
else
  echo "(pytest is not installed here: running tests/gpu/test_tunableop.py directly)"
  "$PY" tests/gpu/test_tunableop.py || rc=$?
fi
exit "$rc"
