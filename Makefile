# tunefleet's front door. `make demo` and `make test` work on a fresh machine: they build
# what they need (a Python venv, the control-plane binaries from Go modules) and start the
# local control plane and S3 server themselves.
SHELL := /bin/bash
.DEFAULT_GOAL := help

VENV    ?= .venv
PY      := $(VENV)/bin/python
STATE   ?= $(CURDIR)/.tunefleet
export TUNEFLEET_STATE := $(STATE)

.PHONY: help disk-check-test disk-check-demo venv tools torch-venvs wheels images images-torch demo test lint unit conformance e2e cluster-up cluster-down run bench sync-crds clean

help:
	@echo "make demo          set up and run the whole flow on the local control plane"
	@echo "make test          lint, unit, conformance (real torch wheels) and end-to-end tests"
	@echo "                   (builds the torch venvs and starts the cluster if needed)"
	@echo "make conformance   tunefleet against the real torch wheels pinned in"
	@echo "                   hack/torch-versions.txt (no GPU)"
	@echo "make cluster-up    start etcd, kube-apiserver, controller-manager, scheduler, kwok, S3"
	@echo "                   and one real node (containerd, kubelet, kube-proxy; no GPU)"
	@echo "                   kubeconfig: $(STATE)/kubeconfig   S3 settings: $(STATE)/s3.env"
	@echo "make images        build the tunefleet and stand-in images (buildah), load them on the node"
	@echo "make images-torch  also the real torch CPU image (~5 GB; bundles e2e and bench)"
	@echo "make cluster-down  stop exactly what cluster-up started and remove its state"
	@echo "make run           the operator in the foreground against \$$KUBECONFIG"
	@echo "make bench         benchmarks; figures land in bench/results.md"

# The disk each fills (~55 GB for a fresh `make test`, ~3 GB for `make demo`), checked first,
# before anything is built: not enough fails at once, naming per part the GB it needs and where
# it goes, and the free space found. Plain bash (no venv). TUNEFLEET_DISK_CHECK=0 skips it.
disk-check-test:
	@hack/disk-check.sh test

disk-check-demo:
	@hack/disk-check.sh demo

$(VENV)/.stamp: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

venv: $(VENV)/.stamp

tools:
	hack/build-tools.sh >/dev/null

# Real torch for the conformance suite, in venvs cached outside the repo (~10 GB, minutes cold,
# seconds warm: the wheels are resolved again every run, hack/wheels.sh), for exactly the
# versions in hack/torch-versions.txt; a newer torch on PyPI is a notice on stderr, never a
# failure. The project's .venv never gets torch.
torch-venvs: venv
	hack/torch-venvs.sh >/dev/null

# The wheels of every image that installs from PyPI (the torch image), resolved again every run
# by hack/wheels.sh for the image's interpreter: only missing files download (~2.7 GB cold), and
# a pin PyPI does not have fails here, before any test, naming it.
wheels: venv
	hack/images.sh --wheels

# Rebuilds only what changed (seconds when nothing did); imports into the real node if it is up,
# else cluster-up does.
images:
	hack/images.sh

# The real torch CPU image (~5 GB, minutes cold; cached like the others): the bundles e2e test
# and benchmark run torch.compile in it on the real node. Not part of `images` (the demo and
# most tests never need it); the tests that do build it.
images-torch:
	hack/images.sh --torch

cluster-up: venv tools images
	hack/cluster-up.sh

cluster-down:
	hack/cluster-down.sh

lint: venv tools
	$(VENV)/bin/ruff check operator tuner_job tests testbed bench hack scripts
	$(VENV)/bin/ruff format --check operator tuner_job tests testbed bench hack scripts
	$(VENV)/bin/mypy
	PATH="$$(hack/build-tools.sh --dir):$$PATH" helm lint charts/tunefleet

unit: venv
	$(VENV)/bin/pytest -m "not e2e and not gpu and not conformance"

conformance: venv torch-venvs
	TUNEFLEET_CONFORMANCE=required $(VENV)/bin/pytest -m conformance

e2e: venv tools images
	$(VENV)/bin/pytest -m e2e

# One pytest run for everything: the e2e fixtures start the local cluster when it is not up;
# the conformance suite must find its torch venvs (a missing one fails it, not skips it).
test: disk-check-test lint images torch-venvs wheels
	TUNEFLEET_CONFORMANCE=required $(VENV)/bin/pytest -m "not gpu"

# Outside a cluster the operator registers its own webhook by URL on loopback (needs rights
# to write MutatingWebhookConfigurations); set WEBHOOK_REGISTER= to skip that.
WEBHOOK_REGISTER ?= tunefleet-dev
WEBHOOK_PORT ?= 9443
run: venv
	@test -n "$$KUBECONFIG" || { echo "set KUBECONFIG (make cluster-up writes $(STATE)/kubeconfig)"; exit 2; }
	TUNEFLEET_WEBHOOK_ADDR=127.0.0.1 TUNEFLEET_WEBHOOK_HOST=127.0.0.1 \
	TUNEFLEET_WEBHOOK_PORT=$(WEBHOOK_PORT) TUNEFLEET_WEBHOOK_REGISTER=$(WEBHOOK_REGISTER) \
	$(VENV)/bin/tunefleet-operator

demo: disk-check-demo venv tools images
	hack/demo.sh

bench: venv tools images
	$(PY) -m bench

sync-crds:
	cp crds/tunefleet.io_tuningprofiles.yaml charts/tunefleet/files/tunefleet.io_tuningprofiles.yaml

clean: cluster-down
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
