# Shared by hack/cluster-up.sh, hack/cluster-down.sh and hack/images.sh (sourced, not run).
# Names the state directory, the cluster's addresses, fixed ports and processes, and knows how
# to tell whether a process recorded in $STATE/pids/<name>.pid is still the one we started.

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
STATE="${TUNEFLEET_STATE:-$repo/.tunefleet}"
# The peer (hack/cluster-up.sh --peer, docs/local-cluster.md): a second cluster beside the one
# of $PEER_OF, with its own control plane, CA and real node under $PEER_OF/peer, sharing that
# cluster's bridge, S3 server and registry. Empty: this is the first cluster.
PEER_OF="${TUNEFLEET_PEER_OF:-}"
PIDS="$STATE/pids"
LOGS="$STATE/logs"
PKI="$STATE/pki"

# The real node's pod network: a bridge of our own whose gateway address is also the cluster's
# host address. Pods can't reach 127.0.0.1, so what they need (the API server, the S3 server)
# listens on HOST_IP, which exists only on this machine (no route out, nothing masqueraded).
# POD_CIDR must not overlap kwok's fake pod IPs (KWOK_POD_CIDR) or the Services (SERVICE_CIDR).
BRIDGE=tunefleet0
HOST_IP=10.250.0.1
POD_CIDR=10.250.0.0/24
SERVICE_CIDR=10.96.0.0/16
KWOK_POD_CIDR=10.244.0.0/16
NODE_NAME=tunefleet-real-0
NODE="$STATE/node"
CONTAINERD_SOCK="$NODE/containerd.sock"
# The pod sandbox image (registry.k8s.io/pause can't be pulled): built and imported by
# hack/images.sh, named in containerd's config.
PAUSE_IMAGE=tunefleet.local/pause:local

# Ports. Fixed (tests and the demo read the kubeconfig and s3.env, not these), chosen away
# from the usual defaults so a developer's own etcd/apiserver/MinIO/kubelet does not clash.
# On HOST_IP: the API server, S3 (SeaweedFS) and the kubelet; everything else on 127.0.0.1.
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
REGISTRY_PORT=15000           # the OCI registry (TLS, HOST_IP)
REGISTRY_DEBUG_PORT=15001     # its debug server: /metrics (blob pulls counted by the bench)
KUBELET_PORT=20250            # HOST_IP: the API server's logs/exec/port-forward calls
KUBELET_HEALTHZ_PORT=20248
CONTAINERD_STREAM_PORT=20251  # containerd's exec/attach/port-forward streams (the kubelet proxies them)
KUBE_PROXY_HEALTHZ_PORT=20256
KUBE_PROXY_METRICS_PORT=20249

# The first cluster's pods get addresses up to .129 on the bridge, the peer's from .130.
POD_RANGE_START="${HOST_IP%.*}.10"
POD_RANGE_END="${HOST_IP%.*}.129"
REGISTRY_CA="$PKI/ca.crt"  # the registry's certificate is the first cluster's CA's

if [[ -n "$PEER_OF" ]]; then
  ETCD_PORT=23890
  ETCD_PEER_PORT=23900
  APISERVER_PORT=16543
  KCM_PORT=16357
  SCHEDULER_PORT=16359
  KUBELET_PORT=20350
  KUBELET_HEALTHZ_PORT=20348
  CONTAINERD_STREAM_PORT=20351
  NODE_NAME=tunefleet-peer-0
  POD_RANGE_START="${HOST_IP%.*}.130"
  POD_RANGE_END="${HOST_IP%.*}.250"
  REGISTRY_CA="$PEER_OF/pki/ca.crt"
fi

# Bumped when a state dir of an older cluster-up can't be reused (cluster-up says so, even
# while that cluster runs): 2 added the real node; 3 tainted the kwok fleet, gave the real
# node 8 fake GPUs and the API server PodTolerationRestriction; 4 added the API server's audit
# log and a read-only S3 identity; 5 the OCI registry (CNCF Distribution, TLS, two identities).
STATE_LAYOUT=5

# Start order; cluster-down stops them in reverse (the node first, with its pods).
CONTROL_PLANE=(etcd kube-apiserver kube-controller-manager kube-scheduler kwok)
NODE_PROCS=(containerd kubelet kube-proxy)
ALL_PROCS=(s3 registry "${CONTROL_PLANE[@]}" "${NODE_PROCS[@]}")
if [[ -n "$PEER_OF" ]]; then
  # No kwok fleet, no kube-proxy (its pods reach S3 on HOST_IP, no Service), no S3 or registry
  # of its own.
  CONTROL_PLANE=(etcd kube-apiserver kube-controller-manager kube-scheduler)
  NODE_PROCS=(containerd kubelet)
  ALL_PROCS=("${CONTROL_PLANE[@]}" "${NODE_PROCS[@]}")
fi

# Debian packages the real node needs (kube-proxy drives iptables and conntrack; nft and
# nfacct let cluster-down remove the netfilter tables and counters it leaves), and those
# hack/images.sh needs to build images without a registry.
NODE_DEBS=(runc containernetworking-plugins iptables conntrack nftables nfacct)
# libjemalloc2: the allocator the operator runs under (as in the image) when run from the venv.
NODE_DEBS+=(libjemalloc2)
# runc: buildah runs RUN steps with it (only a Recommends of buildah's).
IMAGE_DEBS=(buildah runc debootstrap)

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

# True when process $1 exists and is not a zombie (whatever it runs).
pid_running() {
  [[ -r "/proc/$1/cmdline" ]] || return 1
  [[ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" != "Z" ]]
}

# True when the process named $1 is running and is ours: its pid file points at a live,
# non-zombie process whose command line mentions this state dir (guards against pid reuse).
alive() {
  local pid
  pid="$(pid_of "$1")" || return 1
  pid_running "$pid" || return 1
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

# ensure_debs PKG...: install the Debian packages that are missing (quietly; idempotent).
ensure_debs() {
  local p missing=()
  for p in "$@"; do
    dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null | grep -qx installed || missing+=("$p")
  done
  [[ ${#missing[@]} -eq 0 ]] && return 0
  command -v apt-get >/dev/null || die "missing Debian packages (${missing[*]}) and no apt-get to install them"
  [[ "$(id -u)" -eq 0 ]] || die "missing Debian packages (${missing[*]}): install them as root"
  log "installing Debian packages: ${missing[*]}"
  local out; out="$(mktemp)"
  # A stale package list can name versions the mirror no longer has: update first. Errors from
  # unrelated third-party sources must not stop the install.
  apt-get update -qq >"$out" 2>&1 || log "apt-get update reported errors (trying the install anyway)"
  if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        -o DPkg::Lock::Timeout=300 "${missing[@]}" >>"$out" 2>&1; then
    tail -n 30 "$out" >&2; rm -f "$out"
    die "apt-get install ${missing[*]} failed"
  fi
  rm -f "$out"
}
