"""The client's REST layer (runtime/client._Rest): a POST or PUT body encoded once by orjson
goes out byte for byte as application/json through the generated client, and what the API
server answers is raised exactly as the generated client's own layer raises it."""

from __future__ import annotations

import json
from typing import Any

import kubernetes
import pytest
import urllib3

from tunefleet.runtime import client

JOB = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "tune-a", "namespace": "ml"}}


class Pool:
    """urllib3's PoolManager as the REST layer calls it: the request recorded, `status`
    answered."""

    def __init__(self, status: int = 201, data: bytes = b"{}") -> None:
        self.status, self.data = status, data
        self.sent: list[dict[str, Any]] = []

    def request(self, method: str, url: str, **kw: Any) -> urllib3.HTTPResponse:
        self.sent.append({"method": method, "url": url, **kw})
        return urllib3.HTTPResponse(
            body=self.data, status=self.status, headers={"Content-Type": "application/json"}
        )


def api(pool: Pool) -> kubernetes.client.ApiClient:
    config = kubernetes.client.Configuration()
    config.host = "https://api.example:6443"
    made = client.api_client(config)
    made.rest_client.pool_manager = pool
    return made


def test_an_encoded_body_is_sent_as_its_bytes_through_the_generated_client() -> None:
    pool = Pool()
    batch = kubernetes.client.BatchV1Api(api(pool))
    batch.create_namespaced_job("ml", client.encoded_json(JOB), _preload_content=False)
    (sent,) = pool.sent
    assert sent["method"] == "POST" and sent["url"].endswith("/apis/batch/v1/namespaces/ml/jobs")
    assert sent["body"] == json.dumps(JOB, separators=(",", ":")).encode()
    assert sent["headers"]["Content-Type"] == "application/json"


def test_a_body_not_encoded_still_goes_through_the_generated_clients_own_path() -> None:
    pool = Pool()
    batch = kubernetes.client.BatchV1Api(api(pool))
    batch.create_namespaced_job("ml", JOB, _preload_content=False)
    (sent,) = pool.sent
    assert json.loads(sent["body"]) == JOB  # the stdlib's encoding, as before


@pytest.mark.parametrize(
    ("status", "error"),
    [
        (404, kubernetes.client.exceptions.NotFoundException),
        (403, kubernetes.client.exceptions.ForbiddenException),
        (409, kubernetes.client.ApiException),
        (503, kubernetes.client.exceptions.ServiceException),
    ],
)
def test_the_api_servers_refusals_are_raised_as_the_generated_clients_are(
    status: int, error: type[Exception]
) -> None:
    pool = Pool(status, b'{"kind":"Status","message":"no"}')
    custom = kubernetes.client.CustomObjectsApi(api(pool))
    with pytest.raises(error) as raised:
        custom.replace_namespaced_custom_object_status(
            "tunefleet.io", "v1alpha1", "ml", "tuningprofiles", "p", client.encoded_json({})
        )
    assert isinstance(raised.value, kubernetes.client.ApiException)
    assert raised.value.status == status and "no" in str(raised.value.body)
    assert pool.sent[0]["method"] == "PUT"
