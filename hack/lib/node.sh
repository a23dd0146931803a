# The local cluster's real node (sourced by hack/cluster-up.sh and hack/cluster-down.sh):
# containerd 2 (built from Go modules: Debian's 1.6 has no image volumes), runc and CNI from
# Debian's packages, kubelet and kube-proxy from the Go modules.
# Everything it runs or writes lives under $STATE/node, except what the kernel and these tools
# keep elsewhere, which cluster-down puts back (see host_net_up/host_net_down):
#   - the bridge $BRIDGE ($HOST_IP/24, the pods' gateway and the cluster's host address), a
#     route sending $SERVICE_CIDR to it and an "unreachable" route for kwok's fake pod IPs,
#     so that neither ever leaves this machine;
#   - sysctls the CNI bridge plugin (ip_forward) and the kubelet (vm.overcommit_memory,
#     kernel.panic, ...) set: saved before the first start, restored by cluster-down;
#   - kube-proxy's iptables rules (removed with `kube-proxy --cleanup`), the kubelet's own
#     chains (KUBE-FIREWALL, KUBE-KUBELET-CANARY, KUBE-IPTABLES-HINT), kube-proxy's nfacct
#     counters, and the iptables (nf_tables) tables they all created: removed when absent before;
#   - cgroups named k8s.io, /var/lib/cni/results, /run/containerd/s (shim sockets), the
#     kubelet's /var/log/containers links and device-plugin socket, /run/mount (libmount):
#     removed when cluster-down leaves them empty.

# Fake GPUs (an extended resource; there is no GPU). 8, like the fleet's GPU nodes: room for
# the largest e2e test (4 at once) beside a model pod someone left running (the demo's takes 2,
# and the demo scales it to 0 when it ends); tests name the pods that hold them when short.
NODE_GPUS=8
NODE_LABELS="type=real,nvidia.com/gpu.product=STANDIN-NO-GPU"
NODE_TAINT_KEY=nvidia.com/gpu
HOST_DIR="$STATE/host"
# Host paths these tools create when missing; those absent before the first cluster-up are
# removed by cluster-down if empty (listed deepest first).
HOST_PATHS=(/run/containerd/s /run/containerd /var/lib/cni/results /var/lib/cni /var/log/containers
  /var/log/pods /var/lib/kubelet/device-plugins /var/lib/kubelet /run/mount)
# The kubelet's device manager ignores --root-dir: its socket and checkpoint are always here.
DEVICE_PLUGIN_FILES=(/var/lib/kubelet/device-plugins/kubelet.sock
  /var/lib/kubelet/device-plugins/kubelet_internal_checkpoint)
# kube-proxy's nfacct counters (iptables mode).
NFACCT_COUNTERS=(ct_state_invalid_dropped_pkts localhost_nps_accepted_pkts)
HOST_SYSCTLS=(net.ipv4.ip_forward vm.overcommit_memory vm.panic_on_oom kernel.panic
  kernel.panic_on_oops kernel.keys.root_maxkeys kernel.keys.root_maxbytes
  net.ipv4.conf.all.route_localnet net.netfilter.nf_conntrack_max
  net.netfilter.nf_conntrack_tcp_timeout_established
  net.netfilter.nf_conntrack_tcp_timeout_close_wait)

crictl_() {
  "$BIN/crictl" --runtime-endpoint "unix://$CONTAINERD_SOCK" --image-endpoint "unix://$CONTAINERD_SOCK" \
    --timeout 60s "$@"
}

# ---------------------------------------------------------------------------------------
# host network (both cluster-up modes: the S3 server listens on HOST_IP too)

# Which state dir made the bridge, kept beside it (both go at a reboot): a cluster-up from
# another checkout can then tell a running cluster from one whose processes were killed.
BRIDGE_OWNER="/run/tunefleet/$BRIDGE.owner"

# True when a process recorded in state dir $1 is still running (the same test as alive()).
state_running() {
  local STATE="$1" PIDS="$1/pids" name
  for name in "${ALL_PROCS[@]}"; do alive "$name" && return 0; done
  return 1
}

# The bridge exists and this state dir did not make it. A leftover of a cluster whose
# processes are all gone (a killed session, a CI run cut short) is taken down the way its own
# cluster-down would; a running one is left alone.
take_over_bridge() {
  local owner=""
  [[ -r "$BRIDGE_OWNER" ]] && owner="$(cat "$BRIDGE_OWNER")"
  if [[ -z "$owner" || "$owner" == "$STATE" ]]; then
    die "a network interface named $BRIDGE exists but $STATE did not create it.
  Is a cluster from another state dir running? Stop it (make cluster-down there), or remove a
  leftover with: ip link del $BRIDGE"
  fi
  if state_running "$owner"; then
    die "the local cluster of $owner is running (it owns $BRIDGE and the fixed ports).
  Stop it first: TUNEFLEET_STATE=$owner $repo/hack/cluster-down.sh"
  fi
  log "$BRIDGE is a leftover of $owner (none of its processes runs): taking that cluster down"
  TUNEFLEET_STATE="$owner" "$repo/hack/cluster-down.sh" >&2 \
    || die "could not take down the leftover cluster of $owner"
  ! ip link show "$BRIDGE" >/dev/null 2>&1 || ip link del "$BRIDGE" 2>/dev/null || true
}

host_net_up() {
  mkdir -p "$HOST_DIR"
  if ip link show "$BRIDGE" >/dev/null 2>&1 && [[ ! -f "$HOST_DIR/bridge" ]]; then
    take_over_bridge
  fi
  if ip link show "$BRIDGE" >/dev/null 2>&1; then
    :
  else
    save_host_state
    ip link add "$BRIDGE" type bridge || die "ip link add $BRIDGE type bridge failed (needs root)"
    touch "$HOST_DIR/bridge"
    mkdir -p "$(dirname "$BRIDGE_OWNER")"
    printf '%s\n' "$STATE" >"$BRIDGE_OWNER"
    log "created bridge $BRIDGE ($HOST_IP/${POD_CIDR#*/})"
  fi
  ip addr replace "$HOST_IP/${POD_CIDR#*/}" dev "$BRIDGE"
  ip link set "$BRIDGE" up
  # From this machine, Service IPs go to the bridge with HOST_IP as source (kube-proxy DNATs
  # them to pods or to the API server); kwok's pod IPs exist nowhere: refuse them at once.
  ip route replace "$SERVICE_CIDR" dev "$BRIDGE" src "$HOST_IP"
  ip route replace unreachable "$KWOK_POD_CIDR"
}

# What the node changes outside $STATE, as it was before (first start only).
save_host_state() {
  local s p
  if [[ ! -f "$HOST_DIR/sysctl" ]]; then
    for s in "${HOST_SYSCTLS[@]}"; do
      p="/proc/sys/${s//.//}"
      [[ -r "$p" ]] && printf '%s=%s\n' "$s" "$(cat "$p")"
    done >"$HOST_DIR/sysctl.tmp"
    mv "$HOST_DIR/sysctl.tmp" "$HOST_DIR/sysctl"
  fi
  if [[ ! -f "$HOST_DIR/absent" ]]; then
    for p in "${HOST_PATHS[@]}"; do [[ -e "$p" ]] || echo "$p"; done >"$HOST_DIR/absent"
  fi
}

# The netfilter objects that exist before the node first starts: what cluster-down may remove
# is what was not there.
save_netfilter_state() {
  [[ -f "$HOST_DIR/netfilter" ]] && return 0
  mkdir -p "$HOST_DIR"
  { nft list tables 2>/dev/null || echo "nft-unavailable"
    nfacct list 2>/dev/null | sed -n 's/.* = \(.*\);$/nfacct \1/p'; } >"$HOST_DIR/netfilter.tmp"
  mv "$HOST_DIR/netfilter.tmp" "$HOST_DIR/netfilter"
}

# After kube-proxy --cleanup: the kubelet's KUBE-* chains and the rules jumping to them, then
# tables and counters nobody had before the node started.
netfilter_down() {
  [[ -f "$HOST_DIR/netfilter" ]] || return 0
  local ipt t rule chain fam name
  for ipt in iptables ip6tables; do
    command -v "$ipt" >/dev/null || continue
    for t in filter nat mangle; do
      while read -r rule; do
        eval "$ipt -w -t $t ${rule/#-A/-D}" 2>/dev/null || true
      done < <($ipt -w -t "$t" -S 2>/dev/null | grep -E '^-A [A-Z]+ .*-j KUBE-' || true)
      for chain in $($ipt -w -t "$t" -S 2>/dev/null | awk '/^-N KUBE-/ {print $2}'); do
        $ipt -w -t "$t" -F "$chain" 2>/dev/null || true
      done
      for chain in $($ipt -w -t "$t" -S 2>/dev/null | awk '/^-N KUBE-/ {print $2}'); do
        $ipt -w -t "$t" -X "$chain" 2>/dev/null || true
      done
    done
  done
  if command -v nft >/dev/null && ! grep -qx nft-unavailable "$HOST_DIR/netfilter"; then
    while read -r _ fam name; do
      grep -qx "table $fam $name" "$HOST_DIR/netfilter" && continue
      # Ours (iptables-nft made it for kube-proxy, the kubelet or the CNI plugins): whatever
      # is left in it is a leftover of this cluster.
      nft delete table "$fam" "$name" 2>/dev/null || log "could not delete nftables table $fam $name"
    done < <(nft list tables 2>/dev/null)
  fi
  if command -v nfacct >/dev/null; then
    for name in "${NFACCT_COUNTERS[@]}"; do
      grep -qx "nfacct $name" "$HOST_DIR/netfilter" && continue
      nfacct del "$name" >/dev/null 2>&1 || true
    done
  fi
  # Connections tracked while the tables were there stay in the conntrack table (established
  # ones for days). Where nobody had tables before, every entry is this cluster's.
  if command -v conntrack >/dev/null; then
    if ! grep -q '^table ' "$HOST_DIR/netfilter" && [[ -z "$(nft list tables 2>/dev/null)" ]]; then
      conntrack -F >/dev/null 2>&1 || true
    else
      for name in "$POD_CIDR" "$SERVICE_CIDR" "$HOST_IP"; do
        conntrack -D -s "$name" >/dev/null 2>&1 || true
        conntrack -D -d "$name" >/dev/null 2>&1 || true
      done
    fi
  fi
}

host_net_down() {
  [[ -d "$HOST_DIR" ]] || return 0
  local line p
  if [[ -f "$HOST_DIR/bridge" ]]; then
    # Its address and the Service route go with it.
    ip link del "$BRIDGE" 2>/dev/null || true
    [[ "$(cat "$BRIDGE_OWNER" 2>/dev/null)" == "$STATE" ]] && rm -f "$BRIDGE_OWNER"
    ip route del unreachable "$KWOK_POD_CIDR" 2>/dev/null || true
    log "removed bridge $BRIDGE and the route for $KWOK_POD_CIDR"
  fi
  if [[ -f "$HOST_DIR/sysctl" ]]; then
    while IFS='=' read -r line p; do
      [[ -n "$line" ]] || continue
      printf '%s' "$p" >"/proc/sys/${line//.//}" 2>/dev/null || log "could not restore $line=$p"
    done <"$HOST_DIR/sysctl"
  fi
  # Pod cgroups are gone with the pods; the parents containerd made stay behind (rmdir only
  # removes empty ones, so a system containerd's are safe).
  for p in /sys/fs/cgroup/*/k8s.io /sys/fs/cgroup/k8s.io; do [[ -d "$p" ]] && rmdir "$p" 2>/dev/null; done
  # The kubelet links each container's log here; the targets were under $STATE.
  if [[ -d /var/log/containers ]]; then
    find /var/log/containers -maxdepth 1 -type l -lname "$STATE/*" -delete 2>/dev/null || true
  fi
  if [[ -f "$HOST_DIR/absent" ]]; then
    if grep -qx /var/lib/kubelet "$HOST_DIR/absent"; then rm -f "${DEVICE_PLUGIN_FILES[@]}"; fi
    # A directory someone else filled meanwhile (a buildah run's CNI state) stays: not ours.
    while read -r p; do [[ -d "$p" ]] && { rmdir "$p" 2>/dev/null || true; }; done <"$HOST_DIR/absent"
  fi
  true
}

# ---------------------------------------------------------------------------------------
# configuration files (made on every start, so always in step with this script)

# put FILE: write stdin to FILE only if that changes it (kube-proxy exits when its
# configuration file is touched).
put() {
  local tmp="$1.tmp"
  cat >"$tmp"
  if cmp -s "$tmp" "$1"; then rm -f "$tmp"; else mv "$tmp" "$1"; fi
}

write_node_configs() {
  mkdir -p "$NODE/cni/net.d" "$NODE/cni/ipam" "$NODE/kubelet" "$NODE/pod-logs" \
    "$NODE/containerd" "$NODE/volume-plugins"
  # Pods get no DNS server (there is none here, and they must not ask the host's).
  put "$NODE/resolv.conf" </dev/null

  put "$NODE/containerd.toml" <<EOF
# containerd for the local cluster's real node (hack/lib/node.sh); its own root, state and
# socket, so it never meets a system containerd.
version = 2
root = "$NODE/containerd/root"
state = "$NODE/containerd/state"
disabled_plugins = ["io.containerd.internal.v1.opt", "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.tracing.processor.v1.otlp"]

[grpc]
  address = "$CONTAINERD_SOCK"

[plugins."io.containerd.grpc.v1.cri"]
  # Built and imported by hack/images.sh (registry.k8s.io can't be reached).
  sandbox_image = "$PAUSE_IMAGE"
  # Without it runc fails here with "can't get final child's PID from pipe".
  restrict_oom_score_adj = true
  # Pod network namespaces under our state dir, not /var/run/netns.
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "$CONTAINERD_STREAM_PORT"
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    # The handler name "runc" is what a RuntimeClass names (tests/e2e/test_tuning_template.py
    # makes one with handler: runc for a tuning pod's spec.template.spec.runtimeClassName).
    # runc, not crun: crun refuses this machine's hybrid cgroup v1 layout.
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "/usr/sbin/runc"
        Root = "$NODE/runc"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$NODE/cni/net.d"
    max_conf_num = 1
  # Registries by host (hosts.toml): the local OCI registry's CA, for image volumes and images.
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "$NODE/certs.d"
EOF
  mkdir -p "$NODE/certs.d/$HOST_IP:$REGISTRY_PORT"
  put "$NODE/certs.d/$HOST_IP:$REGISTRY_PORT/hosts.toml" <<EOF
server = "https://$HOST_IP:$REGISTRY_PORT"
[host."https://$HOST_IP:$REGISTRY_PORT"]
  capabilities = ["pull", "resolve"]
  ca = "$REGISTRY_CA"
EOF

  # The bridge already exists (host_net_up) with HOST_IP: the plugin adopts it. No ipMasq and
  # no default route in pods: they reach this machine and Service IPs, nothing else.
  put "$NODE/cni/net.d/10-tunefleet.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "tunefleet",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$BRIDGE",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "$NODE/cni/ipam",
        "ranges": [[{"subnet": "$POD_CIDR", "rangeStart": "$POD_RANGE_START", "rangeEnd": "$POD_RANGE_END", "gateway": "$HOST_IP"}]],
        "routes": [{"dst": "$SERVICE_CIDR"}]
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}},
    {"type": "loopback"}
  ]
}
EOF

  put "$NODE/kubelet.yaml" <<EOF
# The kubelet of the local cluster's real node (hack/lib/node.sh).
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $HOST_IP
port: $KUBELET_PORT
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $KUBELET_HEALTHZ_PORT
tlsCertFile: $PKI/kubelet-serving.crt
tlsPrivateKeyFile: $PKI/kubelet-serving.key
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $PKI/ca.crt}
authorization:
  mode: Webhook
containerRuntimeEndpoint: unix://$CONTAINERD_SOCK
# What this machine needs (cgroup v1, hybrid; no systemd as PID 1).
cgroupDriver: cgroupfs
failCgroupV1: false
cgroupsPerQOS: false
enforceNodeAllocatable: []
localStorageCapacityIsolation: false
failSwapOn: false
resolvConf: $NODE/resolv.conf
podLogsDir: $NODE/pod-logs
volumePluginDir: $NODE/volume-plugins
# Images can't be pulled again once removed: never garbage-collect them.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%"}
# Only pods that request nvidia.com/gpu (the ExtendedResourceToleration admission plugin adds
# the toleration) or tolerate it explicitly land here.
registerWithTaints:
- {key: $NODE_TAINT_KEY, value: present, effect: NoSchedule}
maxPods: 110
# ConfigMap volumes follow their object within a pod sync: 10 s instead of the default 1 min,
# so a tuning pod's publish step learns the tune step's imageID (written into its ConfigMap
# by the operator) within seconds. Clusters with the default see up to a minute.
syncFrequency: 10s
EOF

  put "$NODE/kube-proxy.yaml" <<EOF
# kube-proxy of the local cluster's real node (hack/lib/node.sh): iptables mode in this
# machine's network namespace, so the API server (and pods) reach Services' pods.
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: $STATE/kubeconfigs/kube-proxy.kubeconfig
hostnameOverride: $NODE_NAME
bindAddress: $HOST_IP
healthzBindAddress: 127.0.0.1:$KUBE_PROXY_HEALTHZ_PORT
metricsBindAddress: 127.0.0.1:$KUBE_PROXY_METRICS_PORT
mode: iptables
clusterCIDR: $POD_CIDR
detectLocalMode: ClusterCIDR
nodePortAddresses: ["$HOST_IP/32"]
iptables:
  # Would set net.ipv4.conf.all.route_localnet=1.
  localhostNodePorts: false
  minSyncPeriod: 1s
# 0: leave this machine's conntrack sysctls as they are.
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
  udpTimeout: 0s
  udpStreamTimeout: 0s
EOF
}

# ---------------------------------------------------------------------------------------
# start

# RuntimeReady and NetworkReady (it has read our CNI config). Not every condition: containerd 2
# adds ContainerdHasNoDeprecationWarnings, false on this machine's cgroup v1.
containerd_ready() {
  crictl_ info 2>/dev/null | "$PY" -c '
import json, sys
conds = {c["type"]: c["status"] for c in json.load(sys.stdin)["status"]["conditions"]}
sys.exit(0 if conds.get("RuntimeReady") and conds.get("NetworkReady") else 1)'
}

# containerd 2 from Go modules (hack/build-tools.sh --containerd): image volumes need it.
containerd_bin() { "$repo/hack/build-tools.sh" --containerd | tail -n1; }

# containerd, then the images it runs (the pause image at least).
up_containerd() {
  [[ -n "$PEER_OF" ]] || save_netfilter_state  # the host's tables are the first cluster's
  write_node_configs
  if ! alive containerd; then
    port_free "$CONTAINERD_STREAM_PORT" containerd
    rm -f "$CONTAINERD_SOCK" "$CONTAINERD_SOCK.ttrpc"
    local bin
    bin="$(containerd_bin)" || die "building containerd failed (hack/build-tools.sh --containerd)"
    # Its own shim first on PATH: containerd finds containerd-shim-runc-v2 there.
    start containerd env PATH="$bin:$PATH" "$bin/containerd" --config "$NODE/containerd.toml" \
      --log-level warn
  fi
  wait_until 30 "containerd CRI ready" containerd_ready
  "$repo/hack/images.sh" --import || die "hack/images.sh --import failed"
}

up_kubelet() {
  if ! alive kubelet; then
    port_free "$KUBELET_PORT" kubelet
    port_free "$KUBELET_HEALTHZ_PORT" kubelet
    rm -f "$STATE/.node-ready"
    start kubelet "$BIN/kubelet" --config "$NODE/kubelet.yaml" \
      --kubeconfig "$STATE/kubeconfigs/kubelet.kubeconfig" --root-dir "$NODE/kubelet" \
      --hostname-override "$NODE_NAME" --node-ip "$HOST_IP" --node-labels "$NODE_LABELS" --v=1
  fi
  if [[ -z "$PEER_OF" ]] && ! alive kube-proxy; then
    port_free "$KUBE_PROXY_HEALTHZ_PORT" kube-proxy
    port_free "$KUBE_PROXY_METRICS_PORT" kube-proxy
    start kube-proxy "$BIN/kube-proxy" --config "$NODE/kube-proxy.yaml" --v=1
  fi
}

node_status() {
  "$KUBECTL" --kubeconfig "$KUBECONFIG_ADMIN" get node "$NODE_NAME" -o \
    jsonpath='{range .status.conditions[?(@.type=="Ready")]}{.status}{end} {.status.capacity.nvidia\.com/gpu} {.status.allocatable.nvidia\.com/gpu} {.spec.taints[*].key}'
}
node_registered_ready() { [[ "$(node_status 2>/dev/null)" == True* ]]; }
# Ready, with its fake GPUs, and only our own taint left (the not-ready one lifted).
real_node_ready() {
  [[ "$(node_status 2>/dev/null)" == "True $NODE_GPUS $NODE_GPUS $NODE_TAINT_KEY" ]] &&
    { [[ -n "$PEER_OF" ]] ||
      curl -sf --max-time 1 "http://127.0.0.1:$KUBE_PROXY_HEALTHZ_PORT/healthz" >/dev/null; }
}

# The node has no GPU: advertise a few fake ones (an extended resource, as the Kubernetes docs
# show for node-level resources) so GPU-requesting pods can land here. The kubelet keeps
# extended resources it does not manage; after a restart without its checkpoint it zeroes
# them, so this runs on every cluster-up.
advertise_fake_gpus() {
  [[ "$(node_status 2>/dev/null)" == "True $NODE_GPUS $NODE_GPUS "* ]] && return 0
  "$KUBECTL" --kubeconfig "$KUBECONFIG_ADMIN" patch node "$NODE_NAME" --subresource=status \
    --type=merge -p "{\"status\":{\"capacity\":{\"nvidia.com/gpu\":\"$NODE_GPUS\"},\"allocatable\":{\"nvidia.com/gpu\":\"$NODE_GPUS\"}}}" \
    >/dev/null
}

wait_real_node() {
  wait_until 90 "real node $NODE_NAME registered and Ready" node_registered_ready
  advertise_fake_gpus || die "could not patch $NODE_NAME's capacity"
  wait_until 60 "real node with $NODE_GPUS fake GPUs, kube-proxy healthy" real_node_ready
  touch "$STATE/.node-ready"
}

# ---------------------------------------------------------------------------------------
# stop (cluster-down): pods first, while containerd still runs, then the node's processes

node_down() {
  local i
  [[ -d "$NODE" ]] || return 0
  # The kubelet first, so it does not restart what we remove.
  stop_proc kubelet 15
  if alive containerd && [[ -x "$BIN/crictl" ]]; then
    # Stops and removes every pod sandbox and its containers, through the CNI plugins (veths,
    # IP leases) and containerd (shims, mounts, cgroups).
    crictl_ rmp --force --all >>"$LOGS/cluster-down.log" 2>&1 ||
      log "crictl rmp --all failed (see $LOGS/cluster-down.log); falling back to runc"
  fi
  if [[ -z "$PEER_OF" ]]; then  # the peer has no kube-proxy; the host's tables are the first's
    stop_proc kube-proxy 15
    if [[ -x "$BIN/kube-proxy" && -f "$NODE/kube-proxy.yaml" ]]; then
      "$BIN/kube-proxy" --cleanup >>"$LOGS/cluster-down.log" 2>&1 ||
        log "kube-proxy --cleanup failed (see $LOGS/cluster-down.log)"
    fi
    netfilter_down
  fi
  stop_proc containerd 15
  # Shims of our containerd that outlived it (only if a pod could not be removed above), and
  # the containers under them: found by our socket path and runc root, stopped by pid/id.
  for i in /proc/[0-9]*; do
    [[ "$(tr '\0' ' ' <"$i/cmdline" 2>/dev/null)" == *"containerd-shim"*" -address $CONTAINERD_SOCK"* ]] || continue
    log "killing leftover shim (pid ${i#/proc/})"
    kill -KILL "${i#/proc/}" 2>/dev/null || true
  done
  if [[ -d "$NODE/runc/k8s.io" ]]; then
    for i in $(runc --root "$NODE/runc/k8s.io" list -q 2>/dev/null); do
      log "removing leftover container $i (runc)"
      runc --root "$NODE/runc/k8s.io" delete --force "$i" 2>/dev/null || true
    done
  fi
  unmount_under "$STATE"
}

# Unmount everything mounted below DIR (pod volumes, the kubelet's rshared bind of its root
# dir, sandbox shm, container rootfs, network namespaces), innermost first.
unmount_under() {
  local dir="$1" m round
  for round in 1 2 3 4 5; do
    mapfile -t mounts < <(findmnt -rn -o TARGET | awk -v d="$dir/" 'index($0, d) == 1' | sort -r)
    [[ ${#mounts[@]} -eq 0 ]] && return 0
    for m in "${mounts[@]}"; do
      umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
    done
  done
  die "still mounted under $dir: ${mounts[*]}"
}
