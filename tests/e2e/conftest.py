"""Fixtures for the operator's end-to-end tests (the cluster and S3 ones are in tests/conftest.py).

The operator runs one way at a time (see testbed/operator.py): `operator` gives the
process on this machine, `in_cluster` the chart's Deployment on the real node; asking for
one stops the other, so two operators never reconcile side by side. `no_release` gives a
cluster with neither (and no release), for tests that install the chart themselves.

A session that installed the chart uninstalls it when it ends (the CRD stays), so the
README's `helm install` finds the release name free afterwards.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from testbed.cluster import ensure_images
from testbed.operator import (
    SERVING_SECRET,
    InCluster,
    Operator,
    create_s3_secret,
    install,
    install_in_cluster,
    uninstall_release,
)

# "cluster" is set once this session has installed the release.
_running: dict[str, Any] = {"process": None, "in_cluster": None, "cluster": None}


@pytest.fixture(scope="session", autouse=True)
def _stop_operators() -> Iterator[None]:
    yield
    if _running["process"] is not None:
        _running["process"].stop()
    if _running["cluster"] is not None:
        uninstall_release(_running["cluster"])


@pytest.fixture
def operator(cluster: Any, s3: Any) -> Operator:
    if _running["in_cluster"] is not None:
        _running["in_cluster"].uninstall()
        _running["in_cluster"] = None
    op: Operator | None = _running["process"]
    if op is None:
        _running["cluster"] = cluster
        op = install(cluster, s3.endpoint)
        _running["process"] = op
    elif op.proc is None or op.proc.poll() is not None:
        op.start()
    return op


@pytest.fixture
def in_cluster(cluster: Any, s3: Any) -> InCluster:
    if _running["process"] is not None:
        _running["process"].stop()
        _running["process"] = None
    if _running["in_cluster"] is None:
        ensure_images()
        _running["cluster"] = cluster
        _running["in_cluster"] = install_in_cluster(cluster, s3)
    deployed: InCluster = _running["in_cluster"]
    return deployed


@pytest.fixture
def no_release(cluster: Any) -> Iterator[None]:
    """No operator running and no release installed, before the test and after it."""
    if _running["process"] is not None:
        _running["process"].stop()
    _running["process"] = _running["in_cluster"] = None
    uninstall_release(cluster)
    yield
    uninstall_release(cluster)


@pytest.fixture
def s3_secret(cluster: Any, s3: Any, namespace: str) -> str:
    """The publish Secret (returned), and beside it the read-only one model pods fetch with."""
    create_s3_secret(
        cluster.kubectl, namespace, s3.reader_access_key, s3.reader_secret_key, SERVING_SECRET
    )
    return create_s3_secret(cluster.kubectl, namespace, s3.access_key, s3.secret_key)


@pytest.fixture
def prefix(request: pytest.FixtureRequest, s3: Any) -> Iterator[str]:
    """An S3 key prefix of this test's own, emptied afterwards."""
    value = f"{request.module.__name__.rsplit('.', 1)[-1]}/{uuid.uuid4().hex[:12]}"
    yield value
    s3.delete_prefix(value + "/")
