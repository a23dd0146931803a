#!/usr/bin/env bash
# The one way tunefleet's scripts get Python wheels from PyPI (torch and the stacks built on it):
# pip's own resolver, binary wheels only, into a directory cached outside the repo, from which
# the real-torch venvs (hack/torch-venvs.sh) and the local images (hack/images.sh) then install
# with --no-index. It resolves every time it is called: pip asks the index again and downloads
# only the files the directory lacks, so a warm machine exercises the same resolution a fresh
# one does, and a wheel deleted from the directory comes back.
#
#   hack/wheels.sh [--image] NAME REQUIREMENT... [-r FILE] [-c FILE]
#
# Prints ${TUNEFLEET_CACHE:-~/.cache/tunefleet}/wheels/NAME on its last line.
#
#   (default)  for this host's own interpreter (${PYTHON:-python3}): its own platform tags,
#              exactly what a venv made from it installs
#   --image    for the local images' interpreter, whatever runs this script: Debian bookworm's
#              CPython 3.11 on x86_64 with glibc 2.36 (hack/images/base.sh), so every
#              manylinux tag that glibc accepts (pip would otherwise take only the tags given,
#              and a wheel tagged for an older glibc than the one named would not resolve)
#
# On failure it names what did not resolve and where that pin lives (WHEELS_PIN_SOURCE, set by
# the callers), with pip's own last lines, and exits 1.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
CACHE="${TUNEFLEET_CACHE:-$HOME/.cache/tunefleet}"

log() { printf 'wheels: %s\n' "$*" >&2; }
usage() { log "usage: $0 [--image] NAME REQUIREMENT... [-r FILE] [-c FILE]"; exit 2; }

# The images' interpreter (hack/images/base.sh: debootstrap bookworm, python3 3.11).
IMAGE_PYTHON_VERSION=3.11
IMAGE_ABI=cp311
IMAGE_GLIBC_MINOR=36   # glibc 2.36
IMAGE_ARCH=x86_64

target=host
if [[ "${1:-}" == "--image" ]]; then target=image; shift; fi
[[ $# -ge 2 ]] || usage
name="$1"; shift
[[ "$name" =~ ^[A-Za-z0-9][A-Za-z0-9._-]*$ ]] || { log "not a directory name: '$name'"; exit 2; }
dest="$CACHE/wheels/$name"

# A pip to resolve with: the project's venv (make venv keeps its pip current), else python3's.
py="${PYTHON:-python3}"
if [[ -x "$repo/.venv/bin/python" && -z "${PYTHON:-}" ]]; then py="$repo/.venv/bin/python"; fi
"$py" -m pip --version >/dev/null 2>&1 || {
  log "$py has no pip: install python3-pip, or run make venv first"; exit 1; }

flags=(--only-binary=:all: --disable-pip-version-check --no-cache-dir --progress-bar off)
if [[ "$target" == image ]]; then
  flags+=(--implementation cp --python-version "$IMAGE_PYTHON_VERSION" --abi "$IMAGE_ABI")
  for minor in $(seq "$IMAGE_GLIBC_MINOR" -1 5); do
    flags+=(--platform "manylinux_2_${minor}_$IMAGE_ARCH")
  done
  # The legacy aliases of 2_17, 2_12 and 2_5 (PEP 599, PEP 571, PEP 513).
  flags+=(--platform "manylinux2014_$IMAGE_ARCH" --platform "manylinux2010_$IMAGE_ARCH"
          --platform "manylinux1_$IMAGE_ARCH")
fi

mkdir -p "$dest"
# One resolver per directory at a time (make test's steps and a developer's may overlap).
exec 7>"$dest/.lock"
flock -w 1800 7 || { log "another hack/wheels.sh holds $dest/.lock"; exit 1; }

before="$(find "$dest" -maxdepth 1 -name '*.whl' | wc -l)"
out="$(mktemp)"
trap 'rm -f "$out"' EXIT
t0=$(date +%s)
if ! "$py" -m pip download "${flags[@]}" -d "$dest" "$@" >"$out" 2>&1; then
  missing="$(sed -n 's/.*Could not find a version that satisfies the requirement \([^ ]*\).*/\1/p' \
    "$out" | head -n1)"
  log "could not resolve $* for the $target interpreter into $dest${missing:+: no wheel of $missing fits}"
  log "pip said:"
  tail -n 15 "$out" | sed 's/^/  /' >&2
  log "what to do: check the pin${WHEELS_PIN_SOURCE:+ in $WHEELS_PIN_SOURCE} against PyPI" \
    "(pip index versions NAME), and that PyPI is reachable"
  exit 1
fi
after="$(find "$dest" -maxdepth 1 -name '*.whl' | wc -l)"
got=$(grep -c '^Saved ' "$out" || true)
if [[ "$got" -gt 0 ]]; then
  log "$name: resolved $* for the $target interpreter in $(( $(date +%s) - t0 ))s;" \
    "downloaded $got file(s), $after wheel(s) in $dest (had $before)"
fi
echo "$dest"
