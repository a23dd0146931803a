"""The operator's signing endpoint: a route beside capture's on the operator's HTTPS server,
on every replica (contracts/sign_request.py is the protocol).

A publishing pod's projected token is reviewed for the signing audience, its pod and the pod's
Job are read from the API server, the profile from the cache (else the API server); signer/judge.py
decides; the manifest's bytes and the attestation are signed with the key the operator holds
(the chart's signing.secret, in its own namespace). Each API call is bounded; a hung one is a
503 the publish step retries. A pod asks a few times per artifact; more is throttled per pod.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from aiohttp import web
from cryptography.hazmat.primitives.asymmetric import ec

from tunefleet import metrics, naming
from tunefleet.artifacts import signing
from tunefleet.contracts.sign_request import (
    ATTESTATION_TYPE,
    AUDIENCE,
    MAX_BODY_BYTES,
    PATH,
    BodyError,
    OciSigned,
    Reply,
    Request,
    envelope,
    pae,
)
from tunefleet.kube import Kube
from tunefleet.runtime import pod_tokens
from tunefleet.runtime.pod_tokens import Denied
from tunefleet.signer.judge import Seen, job_of, judge
from tunefleet.storage.registry import parse_uri
from tunefleet.storage.store import StoreOptions

log = logging.getLogger(__name__)

BURST = 6  # requests a pod may make at once; then one per REFILL_S
REFILL_S = 10.0
JOB_TTL_S = 10.0  # a Job read is trusted this long (as a pod read: pod_tokens.POD_TTL_S)


@dataclass
class Deps:
    """What the endpoint asks of the cluster (real_deps below; tests give their own)."""

    review: Callable[[str], Awaitable[dict[str, Any]]]  # TokenReview status
    read_pod: Callable[[str, str], Awaitable[dict[str, Any] | None]]
    read_job: Callable[[str, str], Awaitable[dict[str, Any] | None]]
    read_profile: Callable[[str, str], Awaitable[dict[str, Any] | None]]
    # oci:// stores: why the image (store URI, digest) is not the artifact of the manifest
    # ("" when it is), read with the operator's registry identity; None: none is signed.
    check_oci: Callable[[str, str, bytes], Awaitable[str]] | None = None


@dataclass(frozen=True)
class Signer:
    """The key and what the operator knows of itself: its image and its cluster."""

    key: ec.EllipticCurvePrivateKey
    image: str
    cluster: str


class Calls:
    """What the operator's pod-facing routes share: the token reviewed for one audience, the
    caller's pod, its Job and the profile that Job names, read with bounds; a per-pod
    throttle of `burst` requests, then one per `refill_s`."""

    def __init__(
        self,
        deps: Deps,
        audience: str,
        clock: Callable[[], float] = time.monotonic,
        burst: int = BURST,
        refill_s: float = REFILL_S,
    ) -> None:
        self.deps, self.clock, self.burst, self.refill_s = deps, clock, burst, refill_s
        self.tokens = pod_tokens.PodTokens(audience, deps.review, deps.read_pod, clock)
        self._buckets = pod_tokens.Ttl()
        self._jobs = pod_tokens.Ttl()

    async def _job(self, namespace: str, name: str, uid: str) -> dict[str, Any] | None:
        """The pod's Job, remembered JOB_TTL_S by its uid (a sync step asks for each library
        entry: a read each would cost the API server one per request). One of another uid
        is never remembered: the caller is then refused, and asks again."""
        key, now = f"{namespace}/{name}/{uid}", self.clock()
        hit, job = self._jobs.get(key, now)
        if hit:
            return dict(job)
        job = await self.read(self.deps.read_job(namespace, name), "the Job")
        if job and ((job.get("metadata") or {}).get("uid")) == uid:
            self._jobs.put(key, job, now + JOB_TTL_S)
        return job  # type: ignore[no-any-return]

    def _throttle(self, uid: str) -> None:
        now, burst, refill = self.clock(), float(self.burst), self.refill_s
        hit, got = self._buckets.get(uid, now)
        tokens, at = got if hit else (burst, now)
        tokens = min(burst, tokens + (now - at) / refill)
        if tokens < 1.0:
            self._buckets.put(uid, (tokens, now), now + burst * refill)
            wait = round((1.0 - tokens) * refill, 1)
            raise Denied(429, "rate_limited", "too many requests from this pod", wait)
        self._buckets.put(uid, (tokens - 1.0, now), now + burst * refill)

    async def read(self, what: Awaitable[Any], name: str) -> Any:
        """`what`, awaited within CALL_TIMEOUT_S; Denied (503, to retry) when it fails or hangs."""
        try:
            return await asyncio.wait_for(what, timeout=pod_tokens.CALL_TIMEOUT_S)
        except Exception as e:
            raise Denied(503, "unavailable", f"{name} could not be read now: {e}", 10) from None

    async def seen(self, request: web.Request, max_body: int) -> tuple[Seen, bytes]:
        """Who calls, as the API server says, and the request's body (at most max_body)."""
        length = request.content_length
        if length is not None and length > max_body:
            raise Denied(413, "too_large", f"a request is at most {max_body} bytes")
        seen = await self.vouch(request)
        return seen, await self.body(request, max_body)

    async def vouch(self, request: web.Request) -> Seen:
        """Who calls, as the API server says: its pod, Job and profile (the body unread)."""
        token = pod_tokens.bearer(request.headers.get("Authorization", ""))
        caller = await self.tokens.caller(token)
        self._throttle(caller.pod_uid)
        pod = pod_tokens.the_callers_pod(caller, await self.tokens.pod(caller))
        job = await self._job(caller.namespace, *job_of(pod))
        labels = ((job or {}).get("metadata") or {}).get("labels") or {}
        profile_name = str(labels.get(naming.TUNING_PROFILE_LABEL) or "")
        profile = (
            await self.read(self.deps.read_profile(caller.namespace, profile_name), "the profile")
            if profile_name
            else None
        )
        return Seen(caller, pod, job, profile)

    @staticmethod
    async def body(request: web.Request, max_body: int) -> bytes:
        """The request's body, refused past max_body."""
        body = bytearray()
        try:
            while len(body) <= max_body:
                chunk = await request.content.read(max_body + 1 - len(body))
                if not chunk:
                    break
                body += chunk
        except web.HTTPRequestEntityTooLarge:
            raise Denied(413, "too_large", f"a request is at most {max_body} bytes") from None
        except (TimeoutError, OSError) as e:
            raise Denied(400, "bad_request", f"the body could not be read: {e}") from None
        if len(body) > max_body:
            raise Denied(413, "too_large", f"a request is at most {max_body} bytes")
        return bytes(body)


def respond(body: bytes, status: int, retry: float | None) -> web.Response:
    headers = {"Retry-After": str(int(retry + 0.999))} if retry is not None else {}
    return web.Response(body=body, status=status, content_type="application/json", headers=headers)


class Endpoint:
    def __init__(
        self,
        deps: Deps,
        signer: Signer,
        clock: Callable[[], float] = time.monotonic,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.signer, self.now = signer, now
        self.calls = Calls(deps, AUDIENCE, clock)

    async def handle(self, request: web.Request) -> web.Response:
        try:
            reply = await self._handle(request)
            outcome, status, retry = "signed", 200, None
        except Denied as d:
            reply = Reply(message=str(d), retry_after=d.retry_after)
            outcome, status, retry = d.outcome, d.status, d.retry_after
        metrics.SIGNING_REQUESTS.labels(outcome).inc()
        return respond(reply.encode(), status, retry)

    async def _handle(self, request: web.Request) -> Reply:
        seen, body = await self.calls.seen(request, MAX_BODY_BYTES)
        try:
            req = Request.decode(body)
        except BodyError as e:
            raise Denied(400, "bad_request", str(e)) from None
        s, caller = self.signer, seen.caller
        attestation = judge(seen, req.manifest, s.image, s.cluster, self.now())
        oci = await self._oci(seen, req)
        payload = attestation.to_json()
        signed_payload = signing.sign_blob(pae(ATTESTATION_TYPE, payload), s.key)
        log.info(
            f"signed the manifest {attestation.manifest_sha256[:12]} of TuningProfile "
            f"{caller.namespace}/{attestation.profile} ({attestation.gpu_model}) for Job "
            f"{attestation.job}"
        )
        return Reply(
            signature=signing.sign_blob(req.manifest, s.key),
            attestation=envelope(payload, signed_payload),
            oci=oci,
        )

    async def _oci(self, seen: Seen, req: Request) -> tuple[OciSigned, ...]:
        """The images of an oci:// artifact signed, each once the operator has read it from
        the registry as the bundle or volume image of this very manifest (the judge vouched
        for the manifest); Denied otherwise."""
        if not req.oci_digests:
            return ()
        uri = str((((seen.profile or {}).get("spec") or {}).get("storage") or {}).get("uri", ""))
        check = self.calls.deps.check_oci
        if check is None or not uri.startswith("oci://"):
            raise Denied(409, "conflict", "this operator signs no images for this profile")
        for digest in req.oci_digests:
            why = await self.calls.read(check(uri, digest, req.manifest), "the image")
            if why:
                raise Denied(403, "forbidden", f"not this artifact's image: {why}")
        repository = parse_uri(uri).bucket
        made = [signing.signatures(repository, d, self.signer.key) for d in req.oci_digests]
        return tuple(OciSigned(m.digest, m.legacy, m.bundle) for m in made)

    def routes(self) -> list[web.RouteDef]:
        return [web.post(PATH, self.handle)]


def real_deps(
    client: Kube,
    profile_from_cache: Callable[[str, str], dict[str, Any] | None],
    audience: str = AUDIENCE,
    oci_config: str = "",
) -> Deps:
    async def review(token: str) -> dict[str, Any]:
        return await asyncio.to_thread(client.review_token, token, audience)

    async def read_pod(namespace: str, name: str) -> dict[str, Any] | None:
        return await asyncio.to_thread(client.read_pod, namespace, name)

    async def read_job(namespace: str, name: str) -> dict[str, Any] | None:
        return await asyncio.to_thread(client.read_job, namespace, name)

    async def read_profile(namespace: str, name: str) -> dict[str, Any] | None:
        found = profile_from_cache(namespace, name)
        if found is not None:
            return found
        return await asyncio.to_thread(client.get_profile, namespace, name, 2.0)

    async def check_oci(uri: str, digest: str, manifest: bytes) -> str:
        def read() -> str:
            from tunefleet.artifacts import ocibundle
            from tunefleet.storage.oci import OciStore
            from tunefleet.storage.registry import open_store

            options = StoreOptions(
                oci_config=oci_config or None, timeout_s=pod_tokens.CALL_TIMEOUT_S
            )
            store = open_store(parse_uri(uri), options)
            assert isinstance(store, OciStore)
            return ocibundle.names_manifest(store, digest, manifest)

        return await asyncio.to_thread(read)

    return Deps(review, read_pod, read_job, read_profile, check_oci)
