"""Every API call hands its connection back to the pool, whether or not its answer is used.

An unread response (_preload_content=False) keeps its connection out of urllib3's pool, so
the next call opens a new one: over TLS, a handshake on both sides for every Event, patch and
delete of a burst (bench/scale.md). Here a local HTTP/1.1 server counts the connections the
operator's calls open."""

from __future__ import annotations

import http.server
import json
import threading
import time
from collections.abc import Iterator
from typing import Any, ClassVar

import kubernetes
import pytest

from testbed.builders.wrappers import make_config_map, make_job
from tunefleet import kube
from tunefleet.capture.retune_sets import Batch, StoreKey, Writer

OWNER = "owner-uid"
# What the fake API server answers: the Job a patch reads (controlled by OWNER), the Job as
# patched, and what a create made.
JOB = make_job("j", "ns").resource_version("7").owner(OWNER)
PATCHED = JOB.resource_version("8")
MADE = make_config_map("made", "ns")


class _Api(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: one connection serves many requests
    connections = 0
    requests: ClassVar[list[tuple[str, str]]] = []
    lock = threading.Lock()

    def setup(self) -> None:
        super().setup()
        with _Api.lock:
            _Api.connections += 1

    def _answer(self, status: int, body: dict[str, Any]) -> None:
        length = int(self.headers.get("content-length") or 0)
        if length:
            self.rfile.read(length)
        with _Api.lock:
            _Api.requests.append((self.command, self.path))
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if "/configmaps/" in self.path:
            self._answer(404, {"kind": "Status", "code": 404, "message": "not found"})
            return
        self._answer(200, JOB.obj())

    def do_PATCH(self) -> None:
        self._answer(200, PATCHED.obj())

    def do_DELETE(self) -> None:
        self._answer(200, {"kind": "Status", "status": "Success"})

    def do_POST(self) -> None:
        self._answer(201, MADE.obj())

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def api_server() -> Iterator[tuple[type[_Api], kube.Kube]]:
    _Api.connections, _Api.requests = 0, []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Api)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    config = kubernetes.client.Configuration()
    config.host = f"http://127.0.0.1:{server.server_address[1]}"
    yield _Api, kube.Kube(kubernetes.client.ApiClient(configuration=config))
    server.shutdown()
    server.server_close()


def _wait_requests(server: type[_Api], n: int) -> None:
    deadline = time.monotonic() + 10
    while len(server.requests) < n and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(server.requests) >= n, server.requests


def test_writes_whose_answer_is_not_used_reuse_one_connection(
    api_server: tuple[type[_Api], kube.Kube],
) -> None:
    server, one = api_server
    for _ in range(10):
        assert one.patch_owned("Job", "ns", "j", OWNER, {"metadata": {"labels": {"a": "b"}}})
        one.delete_owned("Job", "ns", "j", "uid-1")
        one.remove_profile_finalizer("ns", "p", "uid-1", ["a", "tunefleet.io/f"], "tunefleet.io/f")
    _wait_requests(server, 40)  # patch_owned reads before it writes
    assert server.connections == 1, f"{server.connections} connections for 40 requests"


def test_events_reuse_their_connections(api_server: tuple[type[_Api], kube.Kube]) -> None:
    server, one = api_server
    ref = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ns"}}
    for i in range(20):
        one.post_event_soon(ref, "Normal", "Test", f"event {i}")
    _wait_requests(server, 20)
    # The poster's threads: at most one connection each, however many Events.
    assert server.connections <= one._events.workers, server.connections


def test_capture_store_writes_reuse_one_connection(
    api_server: tuple[type[_Api], kube.Kube],
) -> None:
    server, one = api_server
    store = Writer(one)
    key = StoreKey(namespace="ns", profile="p", profile_uid="uid-1", model="m", identity="i")
    for i in range(5):
        store.add(key, Batch((f"GemmTunableOp_float_NT,nt_{i}_8_8",)), max_shapes=100)
    _wait_requests(server, 10)  # a read (404 here) and a create, each time
    assert server.connections == 1, server.connections
