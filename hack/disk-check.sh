#!/usr/bin/env bash
# The disk `make test` and `make demo` will fill, checked before they start anything: each
# part's missing gigabytes, summed per filesystem (df) where the part goes, against that
# filesystem's free space. Not enough: it fails at once (exit 1), naming per part what it needs
# and where it goes, and the free space found; enough: one line. Needs nothing but bash, df and
# awk (no venv: the Makefile runs it first).
#
#   hack/disk-check.sh test    the parts a fresh `make test` fills (about 55 GB)
#   hack/disk-check.sh demo    the parts `make demo` fills (about 3 GB)
#
#   TUNEFLEET_DISK_CHECK=0     skip the check (this run only)
#
# Where each part goes (the same places the scripts that fill them use):
#   images       ${TUNEFLEET_CACHE:-~/.cache/tunefleet}/images (archives) and .../buildah
#                (hack/images.sh)
#   torch venvs  ${TUNEFLEET_CACHE:-~/.cache/tunefleet}/torch/<version> (hack/torch-venvs.sh)
#   wheels       ${TUNEFLEET_CACHE:-~/.cache/tunefleet}/wheels/torch-<version> (hack/wheels.sh)
#   node state   ${TUNEFLEET_STATE:-<repo>/.tunefleet}/node: the real node's containerd root,
#                kubelet, pod logs (hack/lib/node.sh)
#   e2e scratch  ${TUNEFLEET_STATE:-<repo>/.tunefleet}: what the e2e tests' pods, the S3
#                server and the registry write while they run (hack/cluster-up.sh)
#
# The estimate is deliberately simple: a part already there (its archive, stamp, wheel
# directory or the node's import marker exists) needs nothing more, a missing one its whole
# figure below; what the cluster and the tests' pods write (the node's rest, the scratch) is
# always counted, as it grows while the tests run. A stale archive or a half-filled wheel
# directory counts as there: rebuilding replaces it in about the same space.
set -euo pipefail

# What a fresh `make test` fills (issue 52, two torch versions pinned): images ~13 GB, the
# real node's state ~21 GB, torch venvs ~10 GB, wheels ~5.4 GB, and ~4 GB of scratch while the
# 1 GiB-cache e2e test runs: ~55 GB in all. Not counted: Go's own caches for the cold tool
# build (hack/build-tools.sh), and the vLLM image's wheels (~6 GB, docs/bundles.md), which
# exist only while that image builds and go before it is imported into the node.
IMAGES_GB=13
NODE_GB=21
TORCH_VENVS_GB=10
WHEELS_GB=5.4
E2E_SCRATCH_GB=4
MEASURED_TORCH_VERSIONS=2   # the venvs and wheels scale with hack/torch-versions.txt
# How the images split: the real torch CPU image ~5 GB and the vLLM image ~7 GB of archive
# (hack/images.sh), the rest (tunefleet, stand-ins, base, pause, buildah's copies) ~1 GB.
TORCH_IMAGE_GB=5
VLLM_IMAGE_GB=7
# Of the node's state, unpacked in its containerd (estimates from the docs): the vLLM image
# ~6.5 GB (docs/bundles.md), the torch image ~5 GB; the rest is the cluster's and the pods'.
NODE_TORCH_GB=5
NODE_VLLM_GB=6.5
# `make demo` fills only the small images (the ~1 GB rest above) and a node without the torch
# and vLLM images: ~650 MB of unpacked images (docs/local-cluster.md, Figures) plus etcd, S3,
# logs and the demo's pods; 2 GB is a conservative figure.
DEMO_NODE_GB=2

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
CACHE="${TUNEFLEET_CACHE:-$HOME/.cache/tunefleet}"
STATE="${TUNEFLEET_STATE:-$repo/.tunefleet}"
ARCHIVES="$CACHE/images"

log() { printf 'disk-check: %s\n' "$*" >&2; }

target="${1:-}"
case "$target" in
  test|demo) ;;
  *) log "usage: $0 test|demo"; exit 2 ;;
esac
[[ $# -eq 1 ]] || { log "usage: $0 test|demo"; exit 2; }

if [[ "${TUNEFLEET_DISK_CHECK:-1}" == "0" ]]; then
  log "skipped (TUNEFLEET_DISK_CHECK=0)"
  exit 0
fi

# Sizes are kept in MB (10^6 bytes) as integers; figures are given and printed in GB (10^9).
mb() { awk -v g="$1" 'BEGIN { printf "%d\n", g * 1000 + 0.5 }'; }
gb() { awk -v m="$1" 'BEGIN { printf "%.1f GB\n", m / 1000 }'; }

# The parts still missing: name, MB, where it goes.
names=() sizes=() paths=()
need() { names+=("$1"); sizes+=("$(mb "$2")"); paths+=("$3"); }
# have DIR GLOB: a non-empty file in DIR matches GLOB.
have() { local f; for f in "$1"/$2; do [[ -s "$f" ]] && return 0; done; return 1; }

small_images_gb=$(awk -v a="$IMAGES_GB" -v t="$TORCH_IMAGE_GB" -v v="$VLLM_IMAGE_GB" \
  'BEGIN { print a - t - v }')
small=true
for name in pause base tunefleet standin standin-nogpu standin-noshell standin-nopython; do
  have "$ARCHIVES" "$name-????????????????.tar" || small=false
done
[[ "$small" == true ]] || need "images: tunefleet, stand-ins" "$small_images_gb" "$ARCHIVES"

if [[ "$target" == demo ]]; then
  need "node: cluster, pods" "$DEMO_NODE_GB" "$STATE/node"
else
  have "$ARCHIVES" "torch-cpu-????????????????.tar" ||
    need "images: torch-cpu" "$TORCH_IMAGE_GB" "$ARCHIVES"
  have "$ARCHIVES" "vllm-cpu-????????????????.tar" ||
    need "images: vllm-cpu" "$VLLM_IMAGE_GB" "$ARCHIVES"

  # The pinned versions, as hack/torch-venvs.sh reads them (reads a file; builds nothing).
  mapfile -t versions < <("$here/torch-venvs.sh" --pinned 2>/dev/null || true)
  venv_gb=$(awk -v a="$TORCH_VENVS_GB" -v n="$MEASURED_TORCH_VERSIONS" 'BEGIN { print a / n }')
  wheels_gb=$(awk -v a="$WHEELS_GB" -v n="$MEASURED_TORCH_VERSIONS" 'BEGIN { print a / n }')
  for v in "${versions[@]}"; do
    # Built: its stamp names it (hack/torch-venvs.sh writes it last, after a verified import).
    [[ "$(cat "$CACHE/torch/$v/stamp-$v" 2>/dev/null)" == "torch==$v" ]] ||
      need "torch venv $v" "$venv_gb" "$CACHE/torch/$v"
    have "$CACHE/wheels/torch-$v" "*.whl" ||
      need "wheels torch $v" "$wheels_gb" "$CACHE/wheels/torch-$v"
  done

  # The node's state goes with cluster-down; a running node has what it imported (its marker).
  node_rest_gb=$(awk -v a="$NODE_GB" -v t="$NODE_TORCH_GB" -v v="$NODE_VLLM_GB" \
    'BEGIN { print a - t - v }')
  need "node: cluster, pods" "$node_rest_gb" "$STATE/node"
  [[ -s "$STATE/node/images/torch-cpu" ]] ||
    need "node: torch-cpu image" "$NODE_TORCH_GB" "$STATE/node"
  [[ -s "$STATE/node/images/vllm-cpu" ]] ||
    need "node: vllm-cpu image" "$NODE_VLLM_GB" "$STATE/node"
  need "e2e scratch" "$E2E_SCRATCH_GB" "$STATE"
fi

# The filesystem of each part: df of its path, or of the nearest directory above it that exists.
declare -A free_mb=() need_mb=()
mounts=() part_mount=()
for i in "${!names[@]}"; do
  p="${paths[$i]}"
  while [[ ! -e "$p" && "$p" != / ]]; do p="$(dirname "$p")"; done
  # df -P: one line per filesystem, never wrapped; the mount point is the rest of the line.
  read -r _ _ _ avail _ mnt < <(df -Pk -- "$p" | tail -n1) ||
    { log "df -Pk $p gave nothing"; exit 1; }
  [[ "$avail" =~ ^[0-9]+$ ]] || { log "df -Pk $p: no free space in its output"; exit 1; }
  if [[ -z "${free_mb[$mnt]+x}" ]]; then
    mounts+=("$mnt")
    free_mb[$mnt]=$(( avail * 1024 / 1000000 ))
    need_mb[$mnt]=0
  fi
  need_mb[$mnt]=$(( need_mb[$mnt] + sizes[i] ))
  part_mount+=("$mnt")
done

short=() summary=()
for mnt in "${mounts[@]}"; do
  summary+=("$(gb "${need_mb[$mnt]}") of $(gb "${free_mb[$mnt]}") free on $mnt")
  (( need_mb[$mnt] <= free_mb[$mnt] )) || short+=("$mnt")
done

# (The node's rest and the scratch are always counted: there is always a part.)
if [[ ${#short[@]} -eq 0 ]]; then
  line="${summary[0]}"
  for s in "${summary[@]:1}"; do line+="; $s"; done
  echo "disk-check: make $target needs about $line: enough"
  exit 0
fi

{
  echo "disk-check: not enough free disk for make $target:"
  for mnt in "${short[@]}"; do
    echo "  on $mnt: needs about $(gb "${need_mb[$mnt]}"), found $(gb "${free_mb[$mnt]}") free"
    for i in "${!names[@]}"; do
      [[ "${part_mount[$i]}" == "$mnt" ]] || continue
      printf '    %-28s %9s  %s\n' "${names[$i]}" "$(gb "${sizes[$i]}")" "${paths[$i]}"
    done
  done
  echo "Free some space, or move the caches (TUNEFLEET_CACHE) or the cluster's state"
  echo "(TUNEFLEET_STATE) to a larger disk; TUNEFLEET_DISK_CHECK=0 skips this check."
} >&2
exit 1
