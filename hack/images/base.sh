#!/usr/bin/env bash
# The local base image: Debian bookworm (minbase) with its Python 3.11, built from Debian's
# packages by debootstrap, because Docker Hub (python:3.11-slim) can't be reached here.
# hack/images.sh runs this when the cached base archive is missing or this file changed (its
# hash is the cache key); it is not meant to be run by hand.
#
#   hack/images/base.sh IMAGE_NAME      with BUILDAH set to the buildah command to use
#
# Packages: python3 (3.11.2 in bookworm) and python3-venv (the Dockerfile makes a venv: pip
# and the PEP 668 rules then behave as on python:3.11-slim), ca-certificates for pip's TLS.
set -euo pipefail
image="$1"
: "${BUILDAH:?set BUILDAH to the buildah command}"
mirror="${TUNEFLEET_DEBIAN_MIRROR:-http://deb.debian.org/debian}"

ctr="$($BUILDAH from scratch)"
trap '$BUILDAH rm "$ctr" >/dev/null 2>&1 || true' EXIT
root="$($BUILDAH mount "$ctr")"
log="$(mktemp)"
if ! debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
     bookworm "$root" "$mirror" >"$log" 2>&1; then
  tail -n 30 "$log" >&2; rm -f "$log"
  echo "debootstrap failed" >&2; exit 1
fi
rm -f "$log"
# What an image does not need: package caches and lists, docs, man pages, translations.
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* \
  "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/* \
  "$root"/usr/share/locale/* "$root"/var/log/* "$root"/var/cache/debconf/*-old \
  "$root"/tmp/* "$root"/root/.cache
printf 'deb %s bookworm main\n' "$mirror" >"$root/etc/apt/sources.list"
$BUILDAH umount "$ctr" >/dev/null
$BUILDAH config --env LANG=C.UTF-8 \
  --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  --cmd '["python3"]' \
  --label org.opencontainers.image.title="tunefleet local base: Debian bookworm + python3" \
  --label org.opencontainers.image.description="Built by hack/images.sh from Debian packages (debootstrap), for local builds only" \
  "$ctr"
$BUILDAH commit -q --rm "$ctr" "$image" >/dev/null
trap - EXIT
