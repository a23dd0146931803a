"""A slow registry for e2e tests: a TLS reverse proxy in front of the local cluster's registry
(testbed/registry.py) that holds every request `delay` seconds before passing it on, the way a
registry far away or overloaded answers. It serves with the registry's own certificate on the
same address, another port, so pods and the operator trust it as they trust the registry; each
request is its own thread, so requests are slowed side by side, not queued behind each other.

Only what the tests send passes: bodies with a Content-Length or chunked, answers read whole
(the tests' bundles are small). The Host header goes through unchanged, so the URLs the
registry builds (blob uploads' Location) name the proxy.
"""

from __future__ import annotations

import http.client
import ssl
import threading
import time
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from testbed.cluster import state_dir
from testbed.registry import Registry

# Headers that belong to one hop, never passed on (RFC 9110, 7.6.1).
_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade"}


class SlowRegistry:
    """`with SlowRegistry(registry, tmp) as slow:` serves at `slow.registry.host`; set
    `slow.delay` at any time. `slow.registry` is a Registry whose identities' configs name the
    proxy's address (what Secrets and cosign need)."""

    def __init__(self, upstream: Registry, where: Path, delay: float = 0.0) -> None:
        self.upstream, self.delay = upstream, delay
        self._lock = threading.Lock()
        self.requests: list[tuple[float, str, str]] = []  # (when, method, path)
        host = upstream.host.rsplit(":", 1)[0]
        handler = _handler(self)
        self._server = ThreadingHTTPServer((host, 0), handler)
        self._server.daemon_threads = True
        pki = state_dir() / "pki"
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(pki / "registry.crt", pki / "registry.key")
        self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        address = f"{host}:{self._server.server_address[1]}"
        self.registry = replace(
            upstream,
            host=address,
            writer=_renamed(upstream.writer, upstream.host, address, where / "writer"),
            reader=_renamed(upstream.reader, upstream.host, address, where / "reader"),
        )
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> SlowRegistry:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._server.shutdown()
        self._server.server_close()

    def seen(self, since: float = 0.0) -> list[tuple[float, str, str]]:
        with self._lock:
            return [r for r in self.requests if r[0] >= since]

    def note(self, method: str, path: str) -> None:
        with self._lock:
            self.requests.append((time.monotonic(), method, path))

    def connection(self) -> http.client.HTTPSConnection:
        host, port = self.upstream.host.rsplit(":", 1)
        context = ssl.create_default_context(cafile=str(self.upstream.ca))
        return http.client.HTTPSConnection(host, int(port), context=context, timeout=60)


def _renamed(config_dir: Path, old: str, new: str, out: Path) -> Path:
    """A copy of an identity's config directory whose files name `new` where they named `old`
    (dockerconfigjson's `auths` are keyed by host:port)."""
    out.mkdir(parents=True, exist_ok=True)
    for f in config_dir.iterdir():
        if f.is_file():
            (out / f.name).write_text(f.read_text().replace(old, new))
    return out


def _body(rfile: Any, headers: Any) -> bytes:
    length = headers.get("Content-Length")
    if length is not None:
        return bytes(rfile.read(int(length)))
    if "chunked" not in (headers.get("Transfer-Encoding") or "").lower():
        return b""
    out = bytearray()
    while True:
        size = int(rfile.readline().split(b";", 1)[0].strip() or b"0", 16)
        if size == 0:
            while rfile.readline() not in (b"\r\n", b"\n", b""):
                pass
            return bytes(out)
        out += rfile.read(size)
        rfile.readline()


def _handler(slow: SlowRegistry) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _pass(self) -> None:
            slow.note(self.command, self.path)
            body = _body(self.rfile, self.headers)
            time.sleep(slow.delay)
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
            if body or self.command in ("PUT", "POST", "PATCH"):
                headers["Content-Length"] = str(len(body))
            conn = slow.connection()
            try:
                conn.request(self.command, self.path, body=body or None, headers=headers)
                got = conn.getresponse()
                data = got.read()
                self.send_response(got.status, got.reason)
                head = self.command == "HEAD"  # its Content-Length is the object's: kept
                for k, v in got.getheaders():
                    if k.lower() not in _HOP and (head or k.lower() != "content-length"):
                        self.send_header(k, v)
                if not head:
                    self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
            finally:
                conn.close()

        do_GET = do_HEAD = do_PUT = do_POST = do_PATCH = do_DELETE = _pass

        def log_message(self, format: str, *args: Any) -> None:
            pass  # the tests read `requests`, not a log

    return Handler
