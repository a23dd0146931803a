"""`tunefleet-webhook-check` (the chart's `helm test`): the shared Service and each replica
slot's, against a local HTTPS server that answers as the webhook does."""

from __future__ import annotations

import base64
import json
import socket
import ssl
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tunefleet.webhook import check, tls


class _Webhook(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        patch = [
            {"op": "add", "path": "/metadata/labels/tunefleet.io~1admission", "value": "untuned"}
        ]
        # As the API server asks: the review it sent (its apiVersion and kind), answered.
        answer = {key: value for key, value in review.items() if key != "request"}
        answer["response"] = {
            "uid": review["request"]["uid"],
            "allowed": True,
            "patchType": "JSONPatch",
            "patch": base64.b64encode(json.dumps(patch).encode()).decode(),
        }
        body = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def webhook(tmp_path: Path) -> Iterator[tuple[int, str]]:
    ca, cert, key = tls.generate(tmp_path, ["svc-a.ns.svc", "svc-b.ns.svc"])
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Webhook)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(cert), str(key))
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1], str(ca)
    server.shutdown()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_every_service_named_is_checked_and_one_that_does_not_answer_fails_naming_it(
    webhook: tuple[int, str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    port, ca = webhook
    monkeypatch.setenv("A_HOST", "127.0.0.1")
    monkeypatch.setenv("B_HOST", "127.0.0.1")
    common = ["--port", str(port), "--ca", ca, "--namespace", "ns"]
    ok = [
        "--address-env",
        "A_HOST",
        "--server-name",
        "svc-a.ns.svc",
        "--also",
        "B_HOST=svc-b.ns.svc",
    ]
    assert check.main([*ok, *common]) == 0
    out = capsys.readouterr().out
    assert "(svc-a.ns.svc) admitted" in out and "(svc-b.ns.svc) admitted" in out

    # A name the certificate does not hold: that target fails, named.
    bad = [*ok, "--also", "B_HOST=svc-c.ns.svc"]
    assert check.main([*bad, *common]) == 1
    assert "svc-c.ns.svc" in capsys.readouterr().out

    # A variable the pod lacks (a Service made after it): refused before any call, named.
    assert check.main([*ok, "--also", "C_HOST=svc-b.ns.svc", *common]) == 2
    assert "svc-b.ns.svc" in capsys.readouterr().err


def test_a_slot_whose_replica_is_down_fails_the_check(
    webhook: tuple[int, str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _, ca = webhook
    monkeypatch.setenv("A_HOST", "127.0.0.1")
    args = [
        "--address-env",
        "A_HOST",
        "--server-name",
        "svc-a.ns.svc",
        "--port",
        str(closed_port()),
    ]
    assert check.main([*args, "--ca", ca]) == 1
    assert "did not answer" in capsys.readouterr().out
