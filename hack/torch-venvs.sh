#!/usr/bin/env bash
# Real PyTorch for the conformance suite (tests/conformance): one virtualenv per torch version,
# built once and cached outside the repo, like the control-plane binaries:
#
#   ${TUNEFLEET_CACHE:-$HOME/.cache/tunefleet}/torch/<version>/venv
#
# for torch 2.11.0 and the newest torch PyPI serves (PyPI's default wheels: the CUDA build with
# its nvidia-* dependencies, ~5 GB per venv; they import without a GPU). The project's own
# .venv never gets torch: the suite runs these interpreters as subprocesses.
#
#   hack/torch-venvs.sh           build what is missing (minutes cold, ~1 s warm), print
#                                 "<version> <python>" per venv, record them in torch/venvs
#   hack/torch-venvs.sh --list    print the recorded list only (no build, no network)
#
#   TUNEFLEET_TORCH_VERSIONS="2.11.0 2.15.0"  pin the list (skips the PyPI look-up)
#   TUNEFLEET_TORCH_NEWEST=2.15.0             pin only the newest
# Without a pin, the newest is asked of PyPI (`pip index versions torch`) and remembered in
# torch/newest; offline, the remembered value is used. A venv counts as built only once a stamp
# file, written after a verified import, names its version; a half-built one is rebuilt.
set -euo pipefail

CACHE="${TUNEFLEET_CACHE:-$HOME/.cache/tunefleet}"
ROOT="$CACHE/torch"
PYTHON="${PYTHON:-python3}"
BASELINE="2.11.0"
export PIP_CACHE_DIR="$ROOT/pip-cache"
export PIP_DISABLE_PIP_VERSION_CHECK=1
mkdir -p "$ROOT"

log() { printf 'torch-venvs: %s\n' "$*" >&2; }

if [[ "${1:-}" == "--list" ]]; then
  [[ -s "$ROOT/venvs" ]] && cat "$ROOT/venvs"
  exit 0
fi
[[ $# -eq 0 ]] || { log "usage: $0 [--list]"; exit 2; }

# One builder at a time (make test and a developer's run may start together).
exec 9>"$ROOT/.lock"
flock -w 1800 9 || { log "another hack/torch-venvs.sh holds $ROOT/.lock"; exit 1; }

newest() {
  if [[ -n "${TUNEFLEET_TORCH_NEWEST:-}" ]]; then echo "$TUNEFLEET_TORCH_NEWEST"; return; fi
  local v=""
  # "torch (2.15.0)" is the first line of `pip index versions torch`.
  if v=$(timeout 60 "$PYTHON" -m pip index versions torch 2>/dev/null \
        | sed -n 's/^torch (\([0-9][0-9.]*\)).*/\1/p' | head -n1) && [[ -n "$v" ]]; then
    echo "$v" >"$ROOT/newest.tmp" && mv "$ROOT/newest.tmp" "$ROOT/newest"
    echo "$v"; return
  fi
  if [[ -s "$ROOT/newest" ]]; then log "PyPI not reachable; using the remembered newest"; cat "$ROOT/newest"; return; fi
  log "cannot find the newest torch (PyPI unreachable, nothing remembered)"; return 1
}

ensure() {
  local ver="$1" dir="$ROOT/$1" venv="$ROOT/$1/venv" stamp="$ROOT/$1/stamp-$1"
  local py="$venv/bin/python"
  if [[ -f "$stamp" && -x "$py" ]] && [[ "$(cat "$stamp")" == "torch==$ver" ]]; then
    echo "$ver $py"; return
  fi
  log "building the venv for torch==$ver in $venv (about 5 GB; a few minutes)"
  rm -rf "$venv" "$stamp"
  mkdir -p "$dir"
  "$PYTHON" -m venv "$venv"
  "$py" -m pip install --quiet --upgrade pip
  # PyPI's default torch wheel for Linux x86_64 is the CUDA build; it pulls nvidia-* wheels.
  "$py" -m pip install --quiet "torch==$ver"
  local got
  got=$("$py" -W ignore -c 'import torch; print(torch.__version__.split("+")[0])' 2>/dev/null)
  if [[ "$got" != "$ver" ]]; then log "torch $got imported, wanted $ver"; return 1; fi
  echo "torch==$ver" >"$stamp.tmp" && mv "$stamp.tmp" "$stamp"
  echo "$ver $py"
}

if [[ -n "${TUNEFLEET_TORCH_VERSIONS:-}" ]]; then
  read -r -a versions <<<"$TUNEFLEET_TORCH_VERSIONS"
else
  n=$(newest)
  versions=("$BASELINE")
  [[ "$n" != "$BASELINE" ]] && versions+=("$n")
fi
out=""
for v in "${versions[@]}"; do out+="$(ensure "$v")"$'\n'; done
printf '%s' "$out" >"$ROOT/venvs.tmp" && mv "$ROOT/venvs.tmp" "$ROOT/venvs"
printf '%s' "$out"
