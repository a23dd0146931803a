#!/usr/bin/env bash
# Builds the local control plane's binaries from Go modules (no release downloads) and
# caches them outside the repo, keyed by everything that decides their content, so a
# second run costs seconds. Prints the bin directory on its last line.
#
#   hack/build-tools.sh            build if missing, print the bin dir
#   hack/build-tools.sh --dir      print the bin dir only (no build)
#   hack/build-tools.sh --kueue    print the kueue binary's path only (no build)
#   hack/build-tools.sh --registry build the OCI registry if missing, print its path
#   hack/build-tools.sh --cosign   build cosign if missing, print its path
#   hack/build-tools.sh --containerd  build containerd 2 if missing, print its bin dir
#
# Kueue (the e2e tests of spec.tuning.queueName run a real one beside the cluster) is cached
# apart, by its own version, so adding or bumping it never invalidates the control plane's
# cache: a cold build of it takes about 5 minutes on 2 cores.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
K8S_VERSION="v1.36.3"      # keep in step with hack/tools/kube/go.mod
KWOK_VERSION="v0.8.0"
HELM_VERSION="v3.22.0"
# crictl: the real node's CRI client (cluster-down removes pods through it). Debian bookworm
# has no cri-tools package.
CRICTL_VERSION="v1.34.0"
KUEUE_VERSION="v0.17.0"
# The OCI registry cluster-up starts (CNCF Distribution) and cosign, which the e2e tests use to
# verify what tunefleet signed independently of tunefleet's code. Each cached apart by its
# version like kueue (cold: about 2 minutes for the registry, 6 for cosign on 2 cores).
REGISTRY_VERSION="v3.1.2"
COSIGN_VERSION="v3.1.3"
cache_root="${TUNEFLEET_CACHE:-$HOME/.cache/tunefleet}"
kueue="$cache_root/kueue/bin/kueue"

if [[ "${1:-}" == "--kueue" ]]; then echo "$kueue"; exit 0; fi

# go_tool NAME PKG VERSION: build PKG@VERSION into $cache_root/NAME-VERSION/bin once.
go_tool() {
  local name="$1" pkg="$2" version="$3" dir
  dir="$cache_root/$name-$version/bin"
  if [[ ! -x "$dir/$name" ]]; then
    echo "building $name $version into $dir" >&2
    mkdir -p "$dir.partial"
    GOBIN="$dir.partial" go install -trimpath -ldflags "-s -w" "$pkg@$version" >&2
    mkdir -p "$dir"
    mv -f "$dir.partial/$name" "$dir/$name"
    rm -rf "$dir.partial"
  fi
  echo "$dir/$name"
}
if [[ "${1:-}" == "--registry" ]]; then
  go_tool registry github.com/distribution/distribution/v3/cmd/registry "$REGISTRY_VERSION"
  exit 0
fi
# containerd 2.x for the real node (Debian bookworm's 1.6 has no image volumes): the daemon,
# its runc shim and ctr, from one module version, in one directory. Prints that directory.
CONTAINERD_VERSION="v2.4.2"
if [[ "${1:-}" == "--containerd" ]]; then
  dir="$cache_root/containerd-$CONTAINERD_VERSION/bin"
  if [[ ! -x "$dir/containerd" || ! -x "$dir/containerd-shim-runc-v2" || ! -x "$dir/ctr" ]]; then
    echo "building containerd $CONTAINERD_VERSION into $dir (about 4 minutes cold on 2 cores)" >&2
    mkdir -p "$dir.partial"
    m=github.com/containerd/containerd/v2/cmd
    GOBIN="$dir.partial" go install -trimpath -ldflags "-s -w" "$m/containerd@$CONTAINERD_VERSION" \
      "$m/containerd-shim-runc-v2@$CONTAINERD_VERSION" "$m/ctr@$CONTAINERD_VERSION" >&2
    rm -rf "$dir" && mv "$dir.partial" "$dir"
  fi
  echo "$dir"
  exit 0
fi
if [[ "${1:-}" == "--cosign" ]]; then
  go_tool cosign github.com/sigstore/cosign/v3/cmd/cosign "$COSIGN_VERSION"
  exit 0
fi

# The cached kueue, when it is the wanted version (Go records it in the binary).
kueue_current() {
  [[ -x "$kueue" ]] && go version -m "$kueue" 2>/dev/null \
    | grep -qE "^[[:space:]]+mod[[:space:]]+sigs.k8s.io/kueue[[:space:]]+$KUEUE_VERSION([[:space:]]|$)"
}

ensure_kueue() {
  kueue_current && return 0
  echo "building kueue $KUEUE_VERSION into $(dirname "$kueue") (about 5 minutes cold on 2 cores)" >&2
  mkdir -p "$(dirname "$kueue").partial"
  GOBIN="$(dirname "$kueue").partial" go install -trimpath -ldflags "-s -w" \
    "sigs.k8s.io/kueue/cmd/kueue@$KUEUE_VERSION"
  mkdir -p "$(dirname "$kueue")"
  mv -f "$(dirname "$kueue").partial/kueue" "$kueue"
  rmdir "$(dirname "$kueue").partial"
}

key="$(cat "$here/tools/kube/go.sum" "$here/tools/kube/go.mod" "$here/tools/etcd/go.sum" \
          "$here/tools/etcd/go.mod" "$here/tools/etcd/main.go" \
       | { cat; echo "$K8S_VERSION $KWOK_VERSION $HELM_VERSION $CRICTL_VERSION $(go env GOVERSION)"; } \
       | sha256sum | cut -c1-16)"
bin="$cache_root/tools-$key/bin"

if [[ "${1:-}" == "--dir" ]]; then echo "$bin"; exit 0; fi

want=(etcd kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kube-proxy kwok helm crictl)
missing=()
for b in "${want[@]}"; do [[ -x "$bin/$b" ]] || missing+=("$b"); done
if [[ ${#missing[@]} -eq 0 ]]; then ensure_kueue; echo "$bin"; exit 0; fi

echo "building control-plane tools into $bin (missing: ${missing[*]}); a cold build takes tens of minutes on 2 cores" >&2
mkdir -p "$bin.partial"
start=$(date +%s)

minor="${K8S_VERSION#v1.}"; minor="${minor%%.*}"
vpkg=k8s.io/component-base/version
cpkg=k8s.io/client-go/pkg/version
ldflags="-s -w"
for p in $vpkg $cpkg; do
  ldflags+=" -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor"
  ldflags+=" -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
done

kube_missing=()
for b in kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kube-proxy; do
  [[ -x "$bin.partial/$b" ]] || kube_missing+=("k8s.io/kubernetes/cmd/$b")
done
if [[ ${#kube_missing[@]} -gt 0 ]]; then
  (cd "$here/tools/kube" && go build -trimpath -ldflags "$ldflags" -o "$bin.partial/" "${kube_missing[@]}")
fi
if [[ ! -x "$bin.partial/etcd" ]]; then
  (cd "$here/tools/etcd" && go build -trimpath -ldflags "-s -w" -o "$bin.partial/etcd" .)
fi
[[ -x "$bin.partial/kwok" ]] || GOBIN="$bin.partial" go install -trimpath -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
[[ -x "$bin.partial/helm" ]] || GOBIN="$bin.partial" go install -trimpath -ldflags "-s -w" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
[[ -x "$bin.partial/crictl" ]] || GOBIN="$bin.partial" go install -trimpath \
  -ldflags "-s -w -X sigs.k8s.io/cri-tools/pkg/version.Version=$CRICTL_VERSION" \
  "sigs.k8s.io/cri-tools/cmd/crictl@$CRICTL_VERSION"

rm -rf "$bin" && mv "$bin.partial" "$bin"
ensure_kueue
echo "built in $(( $(date +%s) - start ))s" >&2
echo "$bin"
