#!/usr/bin/env bash
# Stops exactly what hack/cluster-up.sh started and puts the machine back as it was:
#   1. the real node: the kubelet, then every pod sandbox and container (crictl rmp against our
#      containerd: CNI teardown, shims, mounts, cgroups), kube-proxy and its iptables rules
#      (kube-proxy --cleanup), containerd; then whatever is still mounted under the state dir;
#   2. the processes by the pid files in $STATE/pids, newest first (the S3 server, which depends
#      on nothing, is sent TERM first), each with TERM and, after a grace period (15s, 1s for
#      SeaweedFS), KILL;
#   3. the bridge and routes, the sysctls the node changed, the host paths it created;
# then removes the state dir ($TUNEFLEET_STATE, default <repo>/.tunefleet). A peer cluster
# (cluster-up.sh --peer, in $STATE/peer) is stopped first, the same way but for the host's
# network, which is the first cluster's. Safe to run when nothing is up. Installed Debian packages and ~/.cache/tunefleet stay.
set -euo pipefail
# shellcheck source=hack/lib/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"
# shellcheck source=hack/lib/node.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/node.sh"

start_ns=$(date +%s%N)
if [[ ! -d "$STATE" ]]; then
  echo "local cluster not running (no $STATE)"
  exit 0
fi
# The peer cluster first (cluster-up.sh --peer), this script again with its state dir.
if [[ -z "$PEER_OF" && -d "$STATE/peer" ]]; then
  TUNEFLEET_PEER_OF="$STATE" TUNEFLEET_STATE="$STATE/peer" "$0" || die "stopping the peer cluster failed"
fi
take_lock
mkdir -p "$LOGS"
BIN="$("$repo/hack/build-tools.sh" --dir 2>/dev/null || true)"

had_s3=false
[[ -s "$PIDS/s3.pid" ]] && had_s3=true
# The S3 server depends on nothing else and takes longest to exit: TERM it first.
if alive s3; then kill -TERM "$(pid_of s3)" 2>/dev/null || true; fi
# The node while the API server still answers (not needed, but its components log less).
node_down
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
[[ -n "$PEER_OF" ]] || host_net_down  # the bridge, routes and sysctls are the first cluster's
unmount_under "$STATE"
# --one-file-system: should anything still be mounted below, leave it rather than delete
# through it.
rm -rf --one-file-system "$STATE"
echo "local cluster down in $(( ($(date +%s%N) - start_ns) / 1000000 ))ms (removed $STATE)"
