"""The operator's registry proxy: the store broker for oci:// stores, on the operator's HTTPS
server beside signing's, on every replica (contracts/store_broker.py, REGISTRY_PATH).

A registry has no presigned URLs, so a tuning pod's sync and publish steps speak the
distribution API to the operator itself, with the store token. The caller is vouched for as for
the store broker (signer/judge.the_job, the STORE rule); signer/registry_rules.py decides which
requests its Job may make; each one allowed is forwarded to the profile's registry with the
push identity the operator holds (the chart's signing.registryCredentialsSecret, in its own
namespace: a docker config), its body streamed through in bounded memory both ways (a GB
cache layer passes a MiB at a time). The proxy forwards only to the registries that identity
names: a profile naming another keeps its own Secret, and a request for one gets a 409.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import requests
from aiohttp import web

from tunefleet import metrics
from tunefleet.contracts import store_broker as sb
from tunefleet.runtime.pod_tokens import Denied
from tunefleet.signer import registry_rules as rules
from tunefleet.signer.judge import Seen, the_job
from tunefleet.signer.route import Calls, Deps
from tunefleet.signer.store_rules import STORE, Scope, scope_of
from tunefleet.storage import oci
from tunefleet.storage.registry import parse_uri

log = logging.getLogger(__name__)

CHUNK = 1 << 20  # bytes held per request in flight, each way
# Requests forwarded at once: each holds a thread while its body streams (a GB layer for
# minutes), so they have a pool of their own, apart from the one the other routes share.
WORKERS = 16
# A registry read is two requests (manifest, blob) where the store broker's is one URL: a sync
# step reading 500 library entries asks ~1,000 times. Then 50 a second.
BURST, REFILL_S = 1200, 0.02
# Requests of one pod in flight at once (publish makes one at a time): no pod holds the pool.
PER_POD = 4
CONNECT_S, READ_S = 10.0, 120.0
# Request headers the registry needs; every other (the pod's token first) stays here.
_UP = ("Accept", "Content-Type", "Content-Length", "Content-Range", "Range")
# Answer headers the client needs.
_DOWN = (
    "Content-Type", "Content-Length", "Docker-Content-Digest", "Docker-Upload-UUID", "Range",
    "Location", "Link", "OCI-Subject", "OCI-Filters-Applied", "Retry-After",
)  # fmt: skip
_CODES = {400: "MANIFEST_INVALID", 401: "UNAUTHORIZED", 404: "NAME_UNKNOWN", 409: "DENIED"}


@dataclass(frozen=True)
class Identity:
    """The push identity: an Authorization header per registry host, and the CA (a file, or
    True for the system's) its registries are checked with."""

    auths: dict[str, str]
    ca: str | bool = True

    @classmethod
    def load(cls, directory: str) -> Identity:
        path = Path(directory)
        ca = path / oci.CA_KEY
        return cls(oci.auth_headers(path), str(ca) if ca.is_file() else True)


class _Body:
    """The pod's request body as a file requests streams from a worker thread: read a MiB at
    a time from the event loop, never more held. `len` is its Content-Length (so requests
    sends that, not a chunked body)."""

    def __init__(self, request: web.Request, loop: asyncio.AbstractEventLoop, size: int):
        self.request, self.loop, self.size = request, loop, size
        self.buffer = b""

    def __len__(self) -> int:
        return self.size

    def __iter__(self) -> Iterator[bytes]:
        while chunk := self.read(CHUNK):
            yield chunk

    def read(self, n: int = -1) -> bytes:
        if not self.buffer:
            future = asyncio.run_coroutine_threadsafe(self.request.content.read(CHUNK), self.loop)
            try:
                self.buffer = future.result(timeout=READ_S)
            except TimeoutError:
                future.cancel()  # a pod that stopped sending: no read left pending on the loop
                raise
        n = len(self.buffer) if n is None or n < 0 else n
        out, self.buffer = self.buffer[:n], self.buffer[n:]
        return out


def _relative(value: str, host: str) -> str:
    """A Location or Link target at the registry, as a path on the proxy (so the pod comes
    back here); any other left as it is."""
    if value.startswith("<"):
        inner, _, rest = value[1:].partition(">")
        return f"<{_relative(inner, host)}>{rest}"
    parts = urlsplit(value)
    if parts.scheme and parts.netloc == host:
        return parts.path + (f"?{parts.query}" if parts.query else "")
    return value


def _error(d: Denied) -> web.Response:
    """The distribution spec's error body, with the broker's words."""
    code = _CODES.get(d.status, "DENIED" if d.status == 403 else "UNAVAILABLE")
    headers = {"Retry-After": str(int(d.retry_after + 0.999))} if d.retry_after else {}
    return web.json_response(
        {"errors": [{"code": code, "message": str(d)}]}, status=d.status, headers=headers
    )


class RegistryProxy:
    def __init__(
        self,
        deps: Deps,
        identity: Identity,
        image: str,
        library_scope: str,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.identity, self.image, self.library_scope = identity, image, library_scope
        self.calls = Calls(deps, sb.AUDIENCE, clock, burst=BURST, refill_s=REFILL_S)
        self.pool = ThreadPoolExecutor(WORKERS, thread_name_prefix="registry-proxy")
        self.session = requests.Session()
        self.in_flight: dict[str, int] = {}

    async def handle(self, request: web.Request) -> web.StreamResponse:
        try:
            answer = await self._handle(request)
            outcome = "proxied"
        except Denied as d:
            answer, outcome = _error(d), d.outcome
        metrics.STORE_BROKER_REQUESTS.labels(outcome).inc()
        return answer

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        seen = await self.calls.vouch(request)
        uid = seen.caller.pod_uid
        if self.in_flight.get(uid, 0) >= PER_POD:
            raise Denied(429, "rate_limited", f"at most {PER_POD} requests of a pod at once", 1)
        self.in_flight[uid] = self.in_flight.get(uid, 0) + 1
        try:
            return await self._proxied(request, seen)
        finally:
            self.in_flight[uid] -= 1
            if not self.in_flight[uid]:
                del self.in_flight[uid]

    async def _proxied(self, request: web.Request, seen: Seen) -> web.StreamResponse:
        v = the_job(seen, self.image, STORE)
        try:
            location = parse_uri(v.spec.storage.uri)
        except ValueError as e:
            raise Denied(409, "conflict", f"the profile's storage.uri: {e}") from None
        if location.scheme != "oci":
            raise Denied(409, "conflict", f"the proxy serves oci:// stores, not {location.uri()}")
        host, _, repository = location.bucket.partition("/")
        if host not in self.identity.auths:
            ours = ", ".join(sorted(self.identity.auths)) or "no registry"
            raise Denied(
                409, "conflict", f"the proxy pushes to {ours}, and the profile names {host}"
            )
        tail = request.match_info["tail"]
        step = rules.step(request.method, tail, dict(request.query), repository)
        body: bytes | None = None
        if step.kind == "manifest" and request.method == "PUT":
            body = await Calls.body(request, oci.MAX_MANIFEST)
            scope = scope_of(v, seen.caller.namespace, location, self.library_scope)
            write = rules.manifest_write(step.reference, body, scope)
            await self._check(write, step.reference, body, host, repository, scope)
            log.info(f"registry proxy: {step.reference} for Job {seen.caller.namespace}/{v.job}")
        return await self._forward(request, host, f"/v2/{tail}", body)

    # -- what is checked against the registry ------------------------------------------------

    async def _check(
        self, write: rules.Write, reference: str, body: bytes, host: str, repo: str, scope: Scope
    ) -> None:
        if write.create:
            there = await self._run(self._head, host, repo, reference)
            if there and there != oci.digest_of(body):
                raise Denied(
                    409,
                    "conflict",
                    f"{reference} holds another manifest: this Job adds, never replaces",
                )
        if write.subject:
            doc = await self._run(self._manifest, host, repo, write.subject)
            tags = rules.own_image_tags(doc, scope) if doc is not None else ()
            heads = [await self._run(self._head, host, repo, t) for t in tags]
            if write.subject not in heads:
                raise Denied(
                    403, "forbidden", f"{write.subject} is not an image of this Job's own artifacts"
                )

    def _upstream(
        self, method: str, host: str, path: str, headers: dict[str, str], **kw: Any
    ) -> requests.Response:
        # Bytes as stored, never compressed on the way: Content-Length and digests hold.
        headers = {"Accept-Encoding": "identity", **headers}
        try:
            return self.session.request(
                method,
                f"https://{host}{path}",
                headers={**headers, "Authorization": self.identity.auths[host]},
                verify=self.identity.ca,
                timeout=(CONNECT_S, READ_S),
                allow_redirects=method in ("GET", "HEAD"),
                **kw,
            )
        except requests.RequestException as e:
            raise Denied(
                503, "unavailable", f"the registry {host}: {type(e).__name__}: {e}", 5
            ) from None

    def _head(self, host: str, repo: str, reference: str) -> str:
        accept = f"{oci.MANIFEST_MEDIA_TYPE}, {oci.INDEX_MEDIA_TYPE}"
        resp = self._upstream("HEAD", host, f"/v2/{repo}/manifests/{reference}", {"Accept": accept})
        if resp.status_code == 404:
            return ""
        digest = resp.headers.get("Docker-Content-Digest", "")
        if resp.status_code != 200 or not digest:
            # Never taken for "nothing there": a create would then replace what is.
            why = f"the registry answered {resp.status_code} to a look at {reference}"
            raise Denied(503, "unavailable", why, 5)
        return digest

    def _manifest(self, host: str, repo: str, digest: str) -> dict[str, Any] | None:
        accept = {"Accept": oci.MANIFEST_MEDIA_TYPE}
        resp = self._upstream("GET", host, f"/v2/{repo}/manifests/{digest}", accept, stream=True)
        with resp:
            if resp.status_code != 200:
                return None
            body = resp.raw.read(oci.MAX_MANIFEST + 1, decode_content=True)
        if len(body) > oci.MAX_MANIFEST or oci.digest_of(body) != digest:
            return None
        try:
            return rules.manifest_doc(body)
        except Denied:
            return None

    async def _run(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)

    # -- forwarding ---------------------------------------------------------------------------

    async def _forward(
        self, request: web.Request, host: str, path: str, body: bytes | None
    ) -> web.StreamResponse:
        headers = {k: request.headers[k] for k in _UP if k in request.headers}
        data: Any = body
        if body is None and request.can_read_body:
            size = request.content_length or 0
            stream = _Body(request, asyncio.get_running_loop(), size)
            data = stream if size else iter(stream)  # no length: chunked, a MiB at a time
        query = request.query_string
        target = path + (f"?{query}" if query else "")
        resp = await self._run(
            lambda: self._upstream(request.method, host, target, headers, data=data, stream=True)
        )
        out = web.StreamResponse(status=resp.status_code)
        for name in _DOWN:
            if name in resp.headers:
                out.headers[name] = _relative(resp.headers[name], host)
        try:
            await out.prepare(request)
            while chunk := await self._run(resp.raw.read, CHUNK):
                await out.write(chunk)
            await out.write_eof()
        finally:
            resp.close()
        return out

    def routes(self) -> list[web.RouteDef]:
        return [web.route("*", sb.REGISTRY_PATH + "{tail:.*}", self.handle)]
