#!/usr/bin/env bash
# Real PyTorch for the conformance suite (tests/conformance): one virtualenv per torch version,
# built once and cached outside the repo, like the control-plane binaries:
#
#   ${TUNEFLEET_CACHE:-$HOME/.cache/tunefleet}/torch/<version>/venv
#
# for exactly the versions pinned in hack/torch-versions.txt, the single list of the torch
# versions CI tests (PyPI's default wheels: the CUDA build with its nvidia-* dependencies,
# ~5 GB per venv; they import without a GPU). The project's own .venv never gets torch: the
# suite runs these interpreters as subprocesses. The wheels come the one way every torch of the
# project comes (hack/wheels.sh, resolved for this host's interpreter every run: only missing
# files download, and a pin PyPI does not have fails here, at once, naming it); the venv
# installs them with --no-index.
#
#   hack/torch-venvs.sh           resolve, build what is missing (minutes cold, seconds warm),
#                                 print "<version> <python>" per venv, record them in torch/venvs
#   hack/torch-venvs.sh --list    print the recorded list only (no build, no network)
#   hack/torch-venvs.sh --pinned  print the pinned versions only (no build, no network)
#
#   TUNEFLEET_TORCH_VERSIONS="2.11.0 2.15.0"  override the pinned list (this run only)
#   TUNEFLEET_TORCH_PYPI_CHECK=0              skip the look-up below
#   TUNEFLEET_WHEELS_SCRIPT=PATH              resolve with PATH instead of hack/wheels.sh
#                                             (its unit tests; same arguments, same output)
#
# After building, PyPI is asked (by the newest venv's pip, within TUNEFLEET_TORCH_PYPI_TIMEOUT
# seconds, 20 by default) for its newest torch: one newer than the newest pinned is reported as
# one notice line on stderr, never a failure; offline, or on any failure, the look-up says
# nothing. Nothing follows PyPI by itself: a version enters the matrix by a change to
# hack/torch-versions.txt (docs/tuner.md, "Adding a torch version"). A venv counts as built only
# once a stamp file, written after a verified import, names its version; a half-built one is
# rebuilt.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
MATRIX="$HERE/torch-versions.txt"
CACHE="${TUNEFLEET_CACHE:-$HOME/.cache/tunefleet}"
ROOT="$CACHE/torch"
PYTHON="${PYTHON:-python3}"
export PIP_DISABLE_PIP_VERSION_CHECK=1

WHEELS="${TUNEFLEET_WHEELS_SCRIPT:-$HERE/wheels.sh}"

log() { printf 'torch-venvs: %s\n' "$*" >&2; }

# The pinned versions, one a line: TUNEFLEET_TORCH_VERSIONS, else the matrix file.
pinned() {
  if [[ -n "${TUNEFLEET_TORCH_VERSIONS:-}" ]]; then
    local -a listed
    read -r -a listed <<<"$TUNEFLEET_TORCH_VERSIONS"
    printf '%s\n' "${listed[@]}"
    return
  fi
  [[ -s "$MATRIX" ]] || { log "no torch versions pinned: $MATRIX is missing or empty"; return 1; }
  sed -e 's/#.*//' -e 's/[[:space:]]//g' "$MATRIX" | grep -v '^$' || true
}

case "${1:-}" in
  --list)
    [[ -s "$ROOT/venvs" ]] && cat "$ROOT/venvs"
    exit 0 ;;
  --pinned)
    pinned
    exit 0 ;;
  "") ;;
  *) log "usage: $0 [--list | --pinned]"; exit 2 ;;
esac
[[ $# -le 1 ]] || { log "usage: $0 [--list | --pinned]"; exit 2; }

mapfile -t versions < <(pinned)
[[ ${#versions[@]} -gt 0 ]] || { log "no torch versions pinned in $MATRIX"; exit 1; }
for v in "${versions[@]}"; do
  [[ "$v" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || { log "not a torch release: '$v' (in $MATRIX)"; exit 1; }
done

mkdir -p "$ROOT"
# One builder at a time (make test and a developer's run may start together).
exec 9>"$ROOT/.lock"
flock -w 1800 9 || { log "another hack/torch-venvs.sh holds $ROOT/.lock"; exit 1; }

ensure() {
  local ver="$1" dir="$ROOT/$1" venv="$ROOT/$1/venv" stamp="$ROOT/$1/stamp-$1"
  local py="$venv/bin/python" wheels
  # Every run, built or not: a deleted wheel comes back, a pin PyPI lacks fails now.
  wheels="$(PYTHON="$PYTHON" WHEELS_PIN_SOURCE="$MATRIX" "$WHEELS" "torch-$ver" \
    "torch==$ver" | tail -n1)" || { log "torch==$ver: its wheels did not resolve (above)"; return 1; }
  if [[ -f "$stamp" && -x "$py" ]] && [[ "$(cat "$stamp")" == "torch==$ver" ]]; then
    echo "$ver $py"; return
  fi
  log "building the venv for torch==$ver in $venv (about 5 GB; a few minutes)"
  rm -rf "$venv" "$stamp"
  mkdir -p "$dir"
  "$PYTHON" -m venv "$venv"
  # PyPI's default torch wheel for Linux x86_64 is the CUDA build; it pulls nvidia-* wheels.
  "$py" -m pip install --quiet --no-index --find-links "$wheels" "torch==$ver"
  local got
  got=$("$py" -W ignore -c 'import torch; print(torch.__version__.split("+")[0])' 2>/dev/null)
  if [[ "$got" != "$ver" ]]; then log "torch $got imported, wanted $ver"; return 1; fi
  echo "torch==$ver" >"$stamp.tmp" && mv "$stamp.tmp" "$stamp"
  echo "$ver $py"
}

# A newer torch on PyPI than the newest pinned: one notice line, never a failure. Every failure
# of the look-up (offline, a timeout, pip without `index`, output it does not expect) is silent.
notice_newer() {
  [[ "${TUNEFLEET_TORCH_PYPI_CHECK:-1}" != "0" ]] || return 0
  local newest latest py
  newest=$(printf '%s\n' "${versions[@]}" | sort -V | tail -n1)
  py="$ROOT/$newest/venv/bin/python"  # just built or checked: it has pip
  # "torch (2.15.0)" is the first line of `pip index versions torch` (stable releases only).
  latest=$(timeout "${TUNEFLEET_TORCH_PYPI_TIMEOUT:-20}" "$py" -m pip index versions torch \
             2>/dev/null </dev/null | sed -n 's/^torch (\([0-9][0-9.]*\)).*/\1/p' | head -n1) \
    || return 0
  [[ -n "$latest" && "$latest" != "$newest" ]] || return 0
  [[ "$(printf '%s\n%s\n' "$newest" "$latest" | sort -V | tail -n1)" == "$latest" ]] || return 0
  log "notice: torch $latest is on PyPI; the matrix tests ${versions[*]}." \
    "To add it: pin it in hack/torch-versions.txt and give the stand-in torch its persona" \
    "(docs/tuner.md, \"Adding a torch version\")"
}

out=""
for v in "${versions[@]}"; do out+="$(ensure "$v")"$'\n' || exit 1; done
printf '%s' "$out" >"$ROOT/venvs.tmp" && mv "$ROOT/venvs.tmp" "$ROOT/venvs"
printf '%s' "$out"
notice_newer || true
