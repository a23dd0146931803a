"""Fixtures for the operator's end-to-end tests (the cluster and S3 ones are in tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.operator import Operator, create_s3_secret, install


@pytest.fixture(scope="session")
def operator(cluster: Any, s3: Any) -> Iterator[Operator]:
    op = install(cluster, s3.endpoint)
    yield op
    op.stop()


@pytest.fixture
def s3_secret(cluster: Any, s3: Any, namespace: str) -> str:
    return create_s3_secret(cluster.kubectl, namespace, s3.access_key, s3.secret_key)
