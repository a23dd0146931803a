# Shared by hack/cluster-up.sh and hack/cluster-down.sh (sourced, not run).
# Names the state directory, the fixed loopback ports and the processes, and knows how to
# tell whether a process recorded in $STATE/pids/<name>.pid is still the one we started.

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
STATE="${TUNEFLEET_STATE:-$repo/.tunefleet}"
PIDS="$STATE/pids"
LOGS="$STATE/logs"
PKI="$STATE/pki"

# Loopback ports. Fixed (tests and the demo read the kubeconfig and s3.env, not these), chosen
# away from the usual defaults so a developer's own etcd/apiserver/MinIO does not clash.
ETCD_PORT=23790
ETCD_PEER_PORT=23800
APISERVER_PORT=16443
KCM_PORT=16257
SCHEDULER_PORT=16259
S3_PORT=18333
S3_GRPC_PORT=28333
WEED_MASTER_PORT=19333
WEED_MASTER_GRPC_PORT=29333
WEED_VOLUME_PORT=18380
WEED_VOLUME_GRPC_PORT=28380
WEED_FILER_PORT=18888
WEED_FILER_GRPC_PORT=28888

# Start order; cluster-down stops them in reverse.
CONTROL_PLANE=(etcd kube-apiserver kube-controller-manager kube-scheduler kwok)
ALL_PROCS=(s3 "${CONTROL_PLANE[@]}")

log() { printf '%s [cluster] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { printf 'cluster: error: %s\n' "$*" >&2; exit 1; }

# Serialise cluster-up/cluster-down runs on one state dir (concurrent pytest sessions, make).
# The lock file lives outside the state dir, which cluster-down removes.
take_lock() {
  local key
  key="$(printf '%s' "$STATE" | sha256sum | cut -c1-12)"
  exec 9>"${TMPDIR:-/tmp}/tunefleet-cluster-$key.lock"
  if ! flock -w 600 9; then die "another cluster-up/cluster-down holds the lock for $STATE"; fi
}

pid_of() { [[ -s "$PIDS/$1.pid" ]] && cat "$PIDS/$1.pid"; }

# True when the process named $1 is running and is ours: its pid file points at a live,
# non-zombie process whose command line mentions this state dir (guards against pid reuse).
alive() {
  local pid
  pid="$(pid_of "$1")" || return 1
  [[ -r "/proc/$pid/cmdline" ]] || return 1
  [[ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" != "Z" ]] || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "$STATE"
}

# Stop the process named $1 (TERM, up to $2 seconds, then KILL) and forget its pid file.
stop_proc() {
  local name="$1" grace="${2:-15}" pid i
  if alive "$name"; then
    pid="$(pid_of "$name")"
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < grace * 10; i++)); do
      alive "$name" || break
      sleep 0.1
    done
    if alive "$name"; then
      log "$name (pid $pid) still running after ${grace}s: KILL"
      kill -KILL "$pid" 2>/dev/null || true
      for ((i = 0; i < 50; i++)); do alive "$name" || break; sleep 0.1; done
    fi
    alive "$name" && die "could not stop $name (pid $pid)"
    log "stopped $name (pid $pid)"
  fi
  rm -f "$PIDS/$name.pid"
}

# SeaweedFS leaves unix sockets named after its ports in /tmp when it is killed.
weed_sockets() {
  local p
  for p in "$S3_PORT" "$S3_GRPC_PORT" "$WEED_MASTER_GRPC_PORT" "$WEED_VOLUME_GRPC_PORT" \
           "$WEED_FILER_PORT" "$WEED_FILER_GRPC_PORT"; do
    compgen -G "/tmp/seaweedfs-*-$p.sock" || true
  done
}

# Grace period (seconds) before KILL, per process. SeaweedFS waits 15s for its own gRPC
# streams on TERM; its data is thrown away with the state dir, so it gets a short one
# (cluster-down sends it TERM before stopping the control plane).
grace_of() { [[ "$1" == s3 ]] && echo 1 || echo 15; }
