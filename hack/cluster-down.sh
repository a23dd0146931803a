#!/usr/bin/env bash
# Stops exactly the processes hack/cluster-up.sh started (by the pid files in $STATE/pids,
# newest first: kwok, scheduler, controller-manager, apiserver, etcd; the S3 server, which
# depends on nothing, is sent TERM first), each with TERM and, after a grace period (15s,
# 3s for SeaweedFS), KILL; then removes the state dir ($TUNEFLEET_STATE, default
# <repo>/.tunefleet). Safe to run when nothing is up.
set -euo pipefail
# shellcheck source=hack/lib/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"

start_ns=$(date +%s%N)
if [[ ! -d "$STATE" ]]; then
  echo "local cluster not running (no $STATE)"
  exit 0
fi
take_lock

had_s3=false
[[ -s "$PIDS/s3.pid" ]] && had_s3=true
# The S3 server depends on nothing else and takes longest to exit: TERM it first, then stop
# the control plane newest first, then wait for (or KILL) the S3 server.
if alive s3; then kill -TERM "$(pid_of s3)" 2>/dev/null || true; fi
for ((i = ${#ALL_PROCS[@]} - 1; i >= 0; i--)); do
  stop_proc "${ALL_PROCS[$i]}" "$(grace_of "${ALL_PROCS[$i]}")"
done
# Any other pid file in $STATE/pids (none today) gets the same treatment.
shopt -s nullglob
for f in "$PIDS"/*.pid; do
  name="$(basename "$f" .pid)"
  if alive "$name"; then stop_proc "$name" 15; fi
done
if $had_s3; then weed_sockets | xargs -r rm -f; fi
rm -rf "$STATE"
echo "local cluster down in $(( ($(date +%s%N) - start_ns) / 1000000 ))ms (removed $STATE)"
