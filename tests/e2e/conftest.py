"""Fixtures for the operator's end-to-end tests (the cluster and S3 ones are in tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.operator import Operator, install


@pytest.fixture(scope="session")
def operator(cluster: Any, s3: Any) -> Iterator[Operator]:
    op = install(cluster, s3.endpoint)
    yield op
    op.stop()


@pytest.fixture
def s3_secret(cluster: Any, s3: Any, namespace: str) -> str:
    """The Secret a real user would create for tuning Jobs and model pods."""
    cluster.kubectl(
        "create",
        "secret",
        "generic",
        "s3-credentials",
        "-n",
        namespace,
        f"--from-literal=AWS_ACCESS_KEY_ID={s3.access_key}",
        f"--from-literal=AWS_SECRET_ACCESS_KEY={s3.secret_key}",
    )
    return "s3-credentials"
