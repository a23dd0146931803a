"""How tunefleet's steps in pods reach the operator's HTTPS endpoint (capture's sidecar, the
publish step asking for a signature): by the endpoint's Service name, checked against its
certificate by that name and the CA the operator hands out; where the name does not resolve
(a cluster without DNS for pods), by the Service's address instead. Standard library only."""

from __future__ import annotations

import http.client
import socket
import ssl
import urllib.parse
from dataclasses import dataclass


class _Connection(http.client.HTTPSConnection):
    def __init__(
        self, host: str, port: int | None, address: str, tls: ssl.SSLContext, timeout: float
    ) -> None:
        super().__init__(host, port, timeout=timeout, context=tls)
        self._address = address
        self._tls = tls

    def connect(self) -> None:
        try:
            sock = socket.create_connection((self.host, self.port), self.timeout)
        except socket.gaierror:
            if not self._address:
                raise
            sock = socket.create_connection((self._address, self.port), self.timeout)
        self.sock = self._tls.wrap_socket(sock, server_hostname=self.host)


@dataclass(frozen=True)
class Answer:
    status: int
    reason: str
    retry_after: str  # the Retry-After header, as sent ("" for none)
    body: bytes


class Endpoint:
    """`url`: https://host[:port][/prefix] (http:// for tests); `ca_pem`: the CA bundle to
    check it with ("" for the system's); `address`: where to connect if the host won't
    resolve. ValueError for a URL that is neither."""

    def __init__(self, url: str, ca_pem: str = "", address: str = "", timeout_s: float = 10.0):
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme not in ("https", "http") or not parsed.hostname:
            raise ValueError(f"the endpoint must be https://host[:port], not {url!r}")
        self.url, self.address, self.timeout_s = url, address, timeout_s
        self._parsed = parsed
        self._context = (
            ssl.create_default_context(cadata=ca_pem or None)
            if (parsed.scheme == "https")
            else None
        )

    def post(self, path: str, body: bytes, token: str, limit: int) -> Answer:
        """POST `body` (JSON) to `path` with the bearer `token`; the answer, its body read up
        to `limit` bytes. OSError or http.client.HTTPException when it cannot be reached."""
        p = self._parsed
        conn: http.client.HTTPConnection
        if self._context is not None:
            conn = _Connection(
                p.hostname or "", p.port, self.address, self._context, self.timeout_s
            )
        else:
            conn = http.client.HTTPConnection(p.hostname or "", p.port, timeout=self.timeout_s)
        try:
            conn.request(
                "POST",
                (p.path.rstrip("/") or "") + path,
                body=body,
                headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
            )
            resp = conn.getresponse()
            data = resp.read(limit)
            return Answer(resp.status, resp.reason, resp.getheader("Retry-After") or "", data)
        finally:
            conn.close()
