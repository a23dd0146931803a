"""The operator's capture endpoint: HTTPS, beside kopf's webhook server, on every replica.

A request (contracts/capture_upload.py) is taken only from a pod that tunefleet injected:

1. its bearer token is reviewed by the API server (TokenReview) for the capture audience
   only: a token for anything else (the API server's audience, another service's) fails; a
   token that is not bound to a pod (no pod name and uid in its claims) fails;
2. the pod is read from the API server, and must be the one the token was issued to: same
   namespace, same name, same uid (a deleted pod's token is refused, even when a pod of that
   name exists again), run as the token's ServiceAccount;
3. it carries ``tunefleet.io/profile`` and the webhook's marks of an injected pod (the artifact
   it pinned: contracts/admission_record.py), and that profile, in the pod's namespace, has capture
   on.

The rows are then attributed to (namespace, profile, GPU model, software identity of the
pinned artifact) as read from the pod and the profile, never from the body, and kept in the
profile's capture store (capture/retune_sets.py), or in a store apart when the pod runs another
image than the artifact's or pins an artifact the profile does not know. Bounded: the body
(MAX_BODY_BYTES, before it is read), rows per request (MAX_ROWS), uploads per pod (a token
bucket per pod uid), concurrent store writes (beyond: 503 and Retry-After).

Every replica receives captures; the leader alone reconciles. A receiving replica writes the
store itself (compare-and-swap, retune_sets.py), so nothing it accepted is lost when it is not the
leader, or stops a moment later.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import ssl
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from aiohttp import web
from pydantic import ValidationError

from tunefleet import kube, metrics, naming
from tunefleet.api import CaptureSpec, TuningProfileSpec
from tunefleet.capture.loop import identity_of
from tunefleet.capture.retune_sets import Batch, StoreKey, StoreUnavailable, cache_load_entry
from tunefleet.contracts.admission_record import INJECTED, Admission, Code
from tunefleet.contracts.artifact_record import ArtifactRecord
from tunefleet.contracts.capture_upload import (
    AUDIENCE,
    CACHE_LOG_ENV,
    MAX_BODY_BYTES,
    MAX_REASON_CHARS,
    MISSED,
    PATH,
    BodyError,
    CacheLoad,
    Reply,
    Upload,
)
from tunefleet.kube import Kube
from tunefleet.runtime import pod_tokens
from tunefleet.runtime.pod_tokens import Caller, Denied
from tuner_job import caches as cc

log = logging.getLogger(__name__)

CACHE_ENTRIES = 4096
BURST = 6  # uploads a pod may make at once; then one per (its upload interval / 4)


def caller_of(review_status: dict[str, Any]) -> Caller:
    """Who a TokenReview's status says the token belongs to; Denied unless it is a pod-bound
    ServiceAccount token of the capture audience."""
    return pod_tokens.caller_of(review_status, AUDIENCE)


@dataclass(frozen=True)
class Attribution:
    key: StoreKey
    capture: CaptureSpec
    spec: TuningProfileSpec
    # What the artifact's caches were made with and the webhook set on the pod (Packed
    # .settings): the tuning run had them too, so they are no difference of the pod's.
    settings: dict[str, str] = field(default_factory=dict)


def _record_for(status: dict[str, Any], sha: str) -> ArtifactRecord | None:
    for doc in [*(status.get("artifacts") or []), *(status.get("history") or [])]:
        record = ArtifactRecord.from_status(doc) if isinstance(doc, dict) else None
        if record is not None and record.sha256 == sha:
            return record
    return None


def _admitted(caller: Caller, pod: dict[str, Any] | None) -> tuple[str, Admission]:
    """The caller's pod as tunefleet admitted it (the very pod of the token, in its namespace,
    running as its ServiceAccount, injected with an artifact for a GPU model): its profile's
    name and its admission; Denied with the reason otherwise."""
    where = f"pod {caller.namespace}/{caller.pod_name}"
    pod = pod_tokens.the_callers_pod(caller, pod)
    meta = pod.get("metadata") or {}
    profile_name = (meta.get("labels") or {}).get(naming.PROFILE_LABEL)
    if not profile_name:
        raise Denied(403, "forbidden", f"{where} has no {naming.PROFILE_LABEL} label")
    admitted = Admission.read(pod)
    if admitted is None or admitted.outcome != INJECTED or not admitted.sha256:
        raise Denied(
            403, "forbidden", f"{where} was not injected with an artifact by tunefleet's webhook"
        )
    if not admitted.gpu_model:
        raise Denied(403, "forbidden", f"{where} has no GPU model pinned at admission")
    return str(profile_name), admitted


def attribute(
    caller: Caller, pod: dict[str, Any] | None, profile: dict[str, Any] | None
) -> Attribution:
    """Where the rows of this caller go, read from the pod as admitted and its profile;
    Denied with the reason otherwise. Pure."""
    profile_name, admitted = _admitted(caller, pod)
    pmeta = (profile or {}).get("metadata") or {}
    if profile is None or pmeta.get("namespace") != caller.namespace:
        raise Denied(
            403, "forbidden", f"TuningProfile {caller.namespace}/{profile_name} does not exist"
        )
    try:
        spec = TuningProfileSpec.model_validate(profile.get("spec") or {})
    except ValidationError:
        raise Denied(
            403, "forbidden", f"TuningProfile {profile_name} has an invalid spec"
        ) from None
    if not spec.capture.enabled:
        raise Denied(403, "forbidden", f"capture is off for TuningProfile {profile_name}")
    record = _record_for(profile.get("status") or {}, admitted.sha256)
    apart = ""
    if record is None:
        identity = f"sha256:{admitted.sha256}"
        apart = "an artifact the profile does not list"
    else:
        identity = identity_of(record)
        if record.gpu_model and record.gpu_model != admitted.gpu_model:
            apart = "an artifact of another GPU model"
    if admitted.code == Code.IMAGE_MISMATCH:
        apart = "another image than the artifact was tuned in"
    key = StoreKey(
        namespace=caller.namespace,
        profile=str(profile_name),
        profile_uid=str(pmeta.get("uid") or ""),
        model=admitted.gpu_model,
        identity=identity,
        apart=apart,
    )
    settings = {k: v for c in (record.caches if record else ()) for k, v in c.settings}
    return Attribution(key, spec.capture, spec, settings)


def _with_variants(
    upload: Upload,
    pod: dict[str, Any] | None,
    spec: TuningProfileSpec,
    settings: Mapping[str, str] | None = None,
) -> tuple[CacheLoad, ...]:
    """The upload's cache loads, each miss with the pod's own key flags (never the body's),
    and its reason with what the pod as admitted sets otherwise than the tuning run."""
    server = _serving_container(pod)
    variant = cc.vllm_variant([*(server.get("command") or []), *(server.get("args") or [])])
    workload = spec.workload
    tuned = cc.vllm_variant([*(workload.command or []), *(workload.args or [])])
    changes = cc.flag_changes(tuned, variant)
    tuned_env = {**(settings or {})}
    tuned_env.update({e.name: e.value for e in workload.env or [] if e.value is not None})
    literal = {str(e["name"]): str(e["value"]) for e in server.get("env") or [] if "value" in e}
    env = cc.env_changes(tuned_env, literal)
    # A retune runs the workload again with the pod's key flags. Where a vLLM variable of the
    # key differs, or the flags are the tuning run's own, it would make the same key again,
    # never the pod's: no variant then, and the reason says where the difference is instead.
    if env:
        said, args = f"; vLLM variables the pod set otherwise than the tuning run: {env}", ""
    elif changes:
        said = f"; key flags the pod set otherwise than the tuning run: {changes}"
        args = _encoded(variant)
    else:
        said = (
            "; a retune cannot add this key: the pod sets vLLM's key flags as the tuning run "
            "does, so what differs is elsewhere (the factors above): set it alike in the "
            "profile's workload"
        )
        args = ""
    return tuple(
        replace(c, args=args, reason=c.reason[: MAX_REASON_CHARS - len(said)] + said)
        if c.path == MISSED
        else replace(c, args="")
        for c in upload.caches
    )


def _serving_container(pod: dict[str, Any] | None) -> dict[str, Any]:
    """The serving container as admitted that tunefleet's hook reports for ({} if none)."""
    for c in ((pod or {}).get("spec") or {}).get("containers") or []:
        if any(e.get("name") == CACHE_LOG_ENV for e in c.get("env") or []):
            return dict(c)
    return {}


def _variant_of(pod: dict[str, Any] | None) -> str:
    """A missed pod's values of vLLM's key flags, from its serving container as admitted (the
    one tunefleet's hook reports for): what a retune runs the workload with to add its key."""
    c = _serving_container(pod)
    return _encoded(cc.vllm_variant([*(c.get("command") or []), *(c.get("args") or [])]))


def _encoded(variant: tuple[str, ...]) -> str:
    """A variant as the retune set's entry carries it ("" for none)."""
    return json.dumps(list(variant), separators=(",", ":")) if variant else ""


class RateLimiter:
    """A token bucket per pod uid (bounded: the least recently seen are forgotten)."""

    def __init__(self, burst: int = BURST, entries: int = CACHE_ENTRIES) -> None:
        self.burst = burst
        self.entries = entries
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()

    def take(self, uid: str, every_s: float, now: float) -> float | None:
        """None when allowed; else seconds until the next upload is."""
        tokens, at = self._buckets.pop(uid, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + (now - at) / max(every_s, 0.1))
        if tokens < 1.0:
            self._buckets[uid] = (tokens, now)
            return (1.0 - tokens) * max(every_s, 0.1)
        self._buckets[uid] = (tokens - 1.0, now)
        while len(self._buckets) > self.entries:
            self._buckets.popitem(last=False)
        return None


@dataclass
class Deps:
    """What the endpoint asks of the cluster (the real ones below; tests give their own)."""

    review: Callable[[str], Awaitable[dict[str, Any]]]  # TokenReview status
    read_pod: Callable[[str, str], Awaitable[dict[str, Any] | None]]
    read_profile: Callable[[str, str], Awaitable[dict[str, Any] | None]]
    add: Callable[[StoreKey, Upload, int, str], Awaitable[tuple[int, int]]]


class Endpoint:
    def __init__(
        self, deps: Deps, clock: Callable[[], float] = time.monotonic, concurrency: int = 8
    ) -> None:
        self.deps = deps
        self.clock = clock
        self.limiter = RateLimiter()
        self.tokens = pod_tokens.PodTokens(AUDIENCE, deps.review, deps.read_pod, clock)
        self._busy = asyncio.Semaphore(concurrency)

    async def handle(self, request: web.Request) -> web.Response:
        started = time.perf_counter()
        try:
            reply = await self._handle(request)
            outcome, status, retry = "accepted", 200, None
        except Denied as d:
            reply = Reply(message=str(d), retry_after=d.retry_after)
            outcome, status, retry = d.outcome, d.status, d.retry_after
        metrics.CAPTURE_UPLOADS.labels(outcome).inc()
        metrics.CAPTURE_SECONDS.observe(time.perf_counter() - started)
        headers = {"Retry-After": str(int(retry + 0.999))} if retry is not None else {}
        return web.Response(
            body=reply.encode(), status=status, content_type="application/json", headers=headers
        )

    async def _handle(self, request: web.Request) -> Reply:
        length = request.content_length
        if length is not None and length > MAX_BODY_BYTES:
            raise Denied(413, "too_large", f"an upload is at most {MAX_BODY_BYTES} bytes")
        caller = await self.tokens.caller(
            pod_tokens.bearer(request.headers.get("Authorization", ""))
        )
        pod = await self.tokens.pod(caller)
        profile_name = (
            ((pod or {}).get("metadata") or {}).get("labels", {}).get(naming.PROFILE_LABEL, "")
        )
        profile = (
            await self.deps.read_profile(caller.namespace, profile_name) if profile_name else None
        )
        where = attribute(caller, pod, profile)
        every = where.capture.limits.upload_interval_seconds / 4
        wait = self.limiter.take(caller.pod_uid, every, self.clock())
        if wait is not None:
            raise Denied(429, "rate_limited", "too many uploads from this pod", round(wait, 1))
        try:
            body = await request.read()  # client_max_size bounds it, with or without a length
        except web.HTTPRequestEntityTooLarge:
            raise Denied(413, "too_large", f"an upload is at most {MAX_BODY_BYTES} bytes") from None
        except (TimeoutError, OSError) as e:
            raise Denied(400, "bad_request", f"the body could not be read: {e}") from None
        if len(body) > MAX_BODY_BYTES:
            raise Denied(413, "too_large", f"an upload is at most {MAX_BODY_BYTES} bytes")
        try:
            upload = Upload.decode(body)
        except BodyError as e:
            raise Denied(400, "bad_request", str(e)) from None
        rows = upload.rows[: where.capture.limits.max_rows_per_upload]
        loads = _with_variants(upload, pod, where.spec, where.settings)
        upload = Upload(rows, upload.not_loaded, upload.dropped, loads)
        if self._busy.locked():
            raise Denied(503, "unavailable", "the endpoint is busy", 5)
        async with self._busy:
            try:
                new, total = await asyncio.wait_for(
                    self.deps.add(
                        where.key, upload, where.capture.limits.max_shapes, caller.pod_name
                    ),
                    timeout=30.0,  # a hung API server: the sidecar keeps its rows and retries
                )
            except TimeoutError:
                raise Denied(503, "unavailable", "the store write timed out", 30) from None
            except (StoreUnavailable, kube.NotOurs) as e:
                log.info(f"capture from {caller.namespace}/{caller.pod_name} not kept: {e}")
                raise Denied(503, "unavailable", str(e), 15) from None
        metrics.CAPTURE_ROWS.labels("new").inc(new)
        metrics.CAPTURE_ROWS.labels("known").inc(max(len(rows) - new, 0))
        if new:
            log.info(
                f"capture: {new} new GEMM(s) from pod {caller.namespace}/{caller.pod_name} for "
                f"TuningProfile {where.key.profile} ({where.key.model}"
                + (f", kept apart: {where.key.apart}" if where.key.apart else "")
                + f"); {total} in its store"
            )
        return Reply(accepted=len(rows), new=new)

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY_BYTES)
        app.add_routes([web.post(PATH, self.handle)])
        return app


# --- the real dependencies --------------------------------------------------------------------


def real_deps(
    client: Kube,
    profile_from_cache: Callable[[str, str], dict[str, Any] | None],
    writer: Any,
    cached_store: Callable[[str, str], Any] = lambda ns, name: None,
) -> Deps:
    """`cached_store(namespace, name)`: the capture cache's view of a store, so an upload of
    rows it holds already (every pod of a scale-up reports the same misses) costs no API call."""

    async def review(token: str) -> dict[str, Any]:
        return await asyncio.to_thread(client.review_token, token, AUDIENCE)

    async def read_pod(namespace: str, name: str) -> dict[str, Any] | None:
        return await asyncio.to_thread(client.read_pod, namespace, name)

    async def read_profile(namespace: str, name: str) -> dict[str, Any] | None:
        found = profile_from_cache(namespace, name)
        if found is not None:
            return found
        return await asyncio.to_thread(client.get_profile, namespace, name, 2.0)

    async def add(key: StoreKey, upload: Upload, max_shapes: int, pod: str) -> tuple[int, int]:
        view = cached_store(key.namespace, key.name)
        if (
            view is not None
            and view.key.profile_uid == key.profile_uid
            and all(r in view.rows for r in upload.rows)
            and upload.not_loaded <= view.not_loaded.get(pod, 0)
            and not upload.dropped
            and all(
                view.cache_loads.get(pod) == cache_load_entry(c.to_dict())
                for c in upload.caches[:1]
            )
        ):
            return 0, len(view.rows)
        batch = Batch(
            upload.rows, pod, upload.not_loaded, upload.dropped,
            tuple(c.to_dict() for c in upload.caches),
        )  # fmt: skip
        result: tuple[int, int] = await asyncio.to_thread(
            writer.add, key, batch, max_shapes=max_shapes
        )
        return result

    return Deps(review, read_pod, read_profile, add)


class Server:
    """The endpoint on its own TLS port; the certificate is read again when its files change
    (cert-manager renews it in place)."""

    def __init__(
        self,
        endpoint: Endpoint,
        addr: str,
        port: int,
        certfile: str,
        keyfile: str,
        more: list[web.RouteDef] | None = None,
    ):
        self.endpoint = endpoint
        self.more = more or []  # other routes on this server (signer/route.py's)
        self.addr, self.port = addr, port
        self.certfile, self.keyfile = certfile, keyfile
        self._runner: web.AppRunner | None = None
        self._watch: asyncio.Task[None] | None = None
        self._mtimes: tuple[float, float] = (0.0, 0.0)
        self.context: ssl.SSLContext | None = None

    def _load(self) -> None:
        assert self.context is not None
        self.context.load_cert_chain(self.certfile, self.keyfile)
        self._mtimes = (Path(self.certfile).stat().st_mtime, Path(self.keyfile).stat().st_mtime)

    async def start(self) -> None:
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self._load()
        app = self.endpoint.app()
        app.add_routes(self.more)
        self._runner = web.AppRunner(app, handle_signals=False, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.addr, self.port, ssl_context=self.context)
        await site.start()
        self._watch = asyncio.create_task(self._reload())
        log.info(f"capture endpoint on https://{self.addr}:{self.port}{PATH}")

    async def _reload(self) -> None:
        while True:
            await asyncio.sleep(30)
            with contextlib.suppress(OSError, ssl.SSLError):
                now = (Path(self.certfile).stat().st_mtime, Path(self.keyfile).stat().st_mtime)
                if now != self._mtimes:
                    self._load()
                    log.info("capture endpoint: certificate reloaded")

    async def stop(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
        if self._runner is not None:
            await self._runner.cleanup()
