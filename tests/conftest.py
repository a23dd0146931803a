"""Fixtures for every test tier.

- `cluster` (session): the local control plane (testbed/cluster.py: Cluster), started
  with hack/cluster-up.sh when it is not up and left running afterwards (reuse is the point;
  `make cluster-down` stops it).
- `s3` (session): the local S3 server (S3Settings), started with `--s3-only` when not up.
- `namespace` (function): a fresh namespace, deleted (not waited for) after the test.
- Tests marked `gpu` are skipped unless torch is installed and sees a CUDA/ROCm GPU.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from collections.abc import Iterator
from functools import cache

import pytest

from testbed.cluster import (
    Cluster,
    S3Settings,
    create_namespace,
    delete_namespace,
    ensure_cluster,
    ensure_s3,
    namespace_name,
)


@pytest.fixture(scope="session")
def cluster() -> Cluster:
    try:
        return ensure_cluster()
    except (RuntimeError, subprocess.SubprocessError) as e:
        pytest.fail(f"local control plane unavailable: {e}", pytrace=False)


@pytest.fixture(scope="session")
def s3() -> S3Settings:
    try:
        return ensure_s3()
    except (RuntimeError, subprocess.SubprocessError) as e:
        pytest.fail(f"local S3 server unavailable: {e}", pytrace=False)


@pytest.fixture
def namespace(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    name = namespace_name(request.node.name)
    api = cluster.api_client()
    try:
        create_namespace(api, name)
        yield name
        delete_namespace(api, name)
    finally:
        api.close()


@cache
def gpu_available() -> bool:
    """torch importable and torch.cuda.is_available() (true on ROCm builds too)."""
    if importlib.util.find_spec("torch") is None:
        return False
    probe = "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"
    try:
        return subprocess.run([sys.executable, "-c", probe], timeout=300).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_items or gpu_available():
        return
    skip = pytest.mark.skip(reason="needs torch with a ROCm or CUDA GPU (none found)")
    for item in gpu_items:
        item.add_marker(skip)
