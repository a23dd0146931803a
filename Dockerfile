# The tunefleet image: the operator, and the bootstrap / publish / fetch steps it adds to
# tuning Jobs and model pods. The tuner itself runs in the user's image (copied by bootstrap).
#
#   docker build -t ghcr.io/tunefleet/tunefleet:0.2.0 --build-arg VERSION=0.2.0 .
#
# BASE_IMAGE: any image with Python 3.11+ and its venv module. The default is the official
# python:3.11-slim; `make images` builds with a local Debian bookworm base instead (Docker Hub
# can't be reached there; hack/images.sh). Everything below works on both: a venv hides where
# Python lives (/usr/local vs /usr) and whether pip comes with it (PEP 668).
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}

ARG VERSION=dev
LABEL org.opencontainers.image.title="tunefleet" \
      org.opencontainers.image.description="tunefleet operator, webhook and artifact CLIs (publish, fetch, bootstrap)" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"

# HOME=/tmp: the pods run with a read-only root filesystem and a writable /tmp emptyDir
# (charts/tunefleet, builders/security.py). No .pyc files are written at run time.
ENV VIRTUAL_ENV=/opt/tunefleet \
    PATH=/opt/tunefleet/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    HOME=/tmp \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1

# Build-time only (ARGs are not kept in the image). PIP_CERT: a CA bundle for pip where HTTPS
# goes through a TLS-inspecting proxy (hack/images.sh mounts the build machine's bundle).
ARG PIP_NO_CACHE_DIR=1
ARG PIP_DISABLE_PIP_VERSION_CHECK=1
ARG PIP_CERT

# jemalloc: the allocator the operator runs under where it is installed (tunefleet/__main__.py;
# memory handed back after thousands of profiles are deleted, bench/scale.md). Debian's package
# on both bases (python:3.11-slim is Debian too); the package lists are not kept.
RUN apt-get update -qq \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends libjemalloc2 >/dev/null \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb /var/log/*

# UID/GID 65532 (builders/security.py TUNEFLEET_UID, the chart's securityContext), named so
# that tools which look the user up find it; its home is the writable /tmp.
RUN python3 -m venv "$VIRTUAL_ENV" \
 && echo 'tunefleet:x:65532:65532:tunefleet:/tmp:/usr/sbin/nologin' >>/etc/passwd \
 && echo 'tunefleet:x:65532:' >>/etc/group

# Dependencies first, from pyproject.toml alone: a code-only change reuses this layer.
# The build backend (setuptools) is installed here too, so the code layer needs no network.
COPY pyproject.toml /src/
RUN python3 -c 'import tomllib; p = tomllib.load(open("/src/pyproject.toml", "rb")); print("\n".join(p["project"]["dependencies"] + p["build-system"]["requires"]))' >/tmp/requirements.txt \
 && pip install -r /tmp/requirements.txt \
 && rm -f /tmp/requirements.txt

COPY README.md /src/
COPY operator /src/operator
COPY tuner_job /src/tuner_job
RUN pip install --no-deps --no-build-isolation /src \
 && rm -rf /src /tmp/* \
 && tunefleet-operator --help >/dev/null \
 && TUNEFLEET_ALLOCATOR=jemalloc tunefleet-operator --help >/dev/null \
 && for c in tunefleet-publish tunefleet-fetch tunefleet-bootstrap tunefleet-capture; do "$c" --help >/dev/null; done

USER 65532:65532
WORKDIR /tmp
ENTRYPOINT []
CMD ["tunefleet-operator"]
