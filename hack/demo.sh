#!/usr/bin/env bash
# `make demo`: start the local control plane and S3 server (idempotent), then narrate the flow.
set -euo pipefail
cd "$(dirname "$0")/.."
hack/cluster-up.sh
exec .venv/bin/python hack/demo.py
