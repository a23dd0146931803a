"""Who calls one of the operator's HTTPS endpoints: a pod's projected ServiceAccount token,
reviewed by the API server (TokenReview) for one audience, and the pod it is bound to, read
back from the API server. The machinery alone: each endpoint (capture/endpoint.py,
signer/route.py) judges the pod it gets by its own rules.

A token is accepted only when the API server says it is authenticated for the endpoint's
audience and bound to a pod (its pod name and uid in the claims); the pod read back must be
that very pod (same uid: a deleted pod's token is refused even when a pod of its name exists
again), in the token's namespace, running as the token's ServiceAccount. Reviews and pods are
remembered a short while (bounded), so a burst of calls costs the API server little; a refused
token is remembered too, so a flood of bad tokens costs less.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

POD_NAME_CLAIM = "authentication.kubernetes.io/pod-name"
POD_UID_CLAIM = "authentication.kubernetes.io/pod-uid"
SA_PREFIX = "system:serviceaccount:"
REVIEW_TTL_S = 60.0  # a reviewed token is trusted this long (a refused one REFUSED_TTL_S)
REFUSED_TTL_S = 10.0
POD_TTL_S = 10.0
ENTRIES = 4096
CALL_TIMEOUT_S = 5.0


class Denied(Exception):
    """A call refused: the HTTP status, a short outcome word (for metrics), the message that
    says what to fix, and when to try again (seconds), if at all."""

    def __init__(self, status: int, outcome: str, message: str, retry_after: float | None = None):
        super().__init__(message)
        self.status = status
        self.outcome = outcome
        self.retry_after = retry_after


@dataclass(frozen=True)
class Caller:
    namespace: str
    service_account: str
    pod_name: str
    pod_uid: str


def caller_of(review_status: dict[str, Any], audience: str) -> Caller:
    """Who a TokenReview's status says the token belongs to; Denied unless it is a pod-bound
    ServiceAccount token of `audience`."""
    if not review_status.get("authenticated"):
        why = review_status.get("error") or "not authenticated"
        raise Denied(401, "unauthenticated", f"the token was refused: {why}")
    if audience not in (review_status.get("audiences") or []):
        raise Denied(401, "unauthenticated", f"the token is not for audience {audience}")
    user = review_status.get("user") or {}
    name = str(user.get("username") or "")
    if not name.startswith(SA_PREFIX) or name.count(":") != 3:
        raise Denied(403, "forbidden", f"{name or 'the caller'} is not a ServiceAccount")
    namespace, sa = name[len(SA_PREFIX) :].split(":")
    extra = user.get("extra") or {}
    pod_name = (extra.get(POD_NAME_CLAIM) or [""])[0]
    pod_uid = (extra.get(POD_UID_CLAIM) or [""])[0]
    if not (pod_name and pod_uid):
        raise Denied(403, "forbidden", "the token is not bound to a pod (use the projected token)")
    return Caller(namespace, sa, pod_name, pod_uid)


def the_callers_pod(caller: Caller, pod: dict[str, Any] | None) -> dict[str, Any]:
    """The pod read back, when it is the token's very pod in its namespace running as its
    ServiceAccount; Denied with the reason otherwise."""
    where = f"pod {caller.namespace}/{caller.pod_name}"
    meta = (pod or {}).get("metadata") or {}
    if pod is None or meta.get("uid") != caller.pod_uid:
        raise Denied(
            403,
            "forbidden",
            f"{where} (uid {caller.pod_uid}) no longer exists: its token is not accepted, "
            "whatever pod has its name now",
        )
    if meta.get("namespace") != caller.namespace:
        raise Denied(403, "forbidden", f"{where} is not in the token's namespace")
    sa = ((pod.get("spec") or {}).get("serviceAccountName")) or "default"
    if sa != caller.service_account:
        raise Denied(403, "forbidden", f"{where} does not run as {caller.service_account}")
    return pod


def bearer(header: str) -> str:
    """The token of an Authorization header; Denied when there is none (or it is absurd)."""
    if not header.startswith("Bearer ") or len(header) > 16384:
        raise Denied(401, "unauthenticated", "no bearer token")
    return header[len("Bearer ") :].strip()


class Ttl:
    """A bounded map whose entries expire (the least recently put go first)."""

    def __init__(self, entries: int = ENTRIES) -> None:
        self.entries = entries
        self._data: OrderedDict[str, tuple[float, Any]] = OrderedDict()

    def get(self, key: str, now: float) -> tuple[bool, Any]:
        found = self._data.get(key)
        if found is None or found[0] < now:
            self._data.pop(key, None)
            return False, None
        return True, found[1]

    def put(self, key: str, value: Any, until: float) -> None:
        self._data.pop(key, None)
        self._data[key] = (until, value)
        while len(self._data) > self.entries:
            self._data.popitem(last=False)


class PodTokens:
    """Tokens of one audience, reviewed, and the pods they are bound to, read; both
    remembered a short while. `review(token)` gives a TokenReview's status, `read_pod(namespace,
    name)` the pod or None; either may hang (each call is bounded by CALL_TIMEOUT_S, then the
    caller is told to retry)."""

    def __init__(
        self,
        audience: str,
        review: Callable[[str], Awaitable[dict[str, Any]]],
        read_pod: Callable[[str, str], Awaitable[dict[str, Any] | None]],
        clock: Callable[[], float],
    ) -> None:
        self.audience = audience
        self._review, self._read_pod, self._clock = review, read_pod, clock
        self._reviews = Ttl()
        self._pods = Ttl()

    async def caller(self, token: str) -> Caller:
        key = hashlib.sha256(token.encode()).hexdigest()
        now = self._clock()
        hit, cached = self._reviews.get(key, now)
        if not hit:
            try:
                status = await asyncio.wait_for(self._review(token), timeout=CALL_TIMEOUT_S)
            except Exception as e:
                raise Denied(
                    503, "unavailable", f"the token could not be reviewed now: {e}", 10
                ) from None
            try:
                cached = caller_of(status, self.audience)
                self._reviews.put(key, cached, now + REVIEW_TTL_S)
            except Denied as d:
                cached = d
                self._reviews.put(key, d, now + REFUSED_TTL_S)
        if isinstance(cached, Denied):
            raise cached
        caller: Caller = cached
        return caller

    async def pod(self, caller: Caller) -> dict[str, Any] | None:
        """The pod of the caller's name as last read (None: there is none); not yet judged."""
        key = f"{caller.namespace}/{caller.pod_name}"
        now = self._clock()
        hit, pod = self._pods.get(key, now)
        if not hit or ((pod or {}).get("metadata") or {}).get("uid") != caller.pod_uid:
            try:
                pod = await asyncio.wait_for(
                    self._read_pod(caller.namespace, caller.pod_name), timeout=CALL_TIMEOUT_S
                )
            except Exception as e:
                raise Denied(
                    503, "unavailable", f"the pod could not be read now: {e}", 10
                ) from None
            self._pods.put(key, pod, now + POD_TTL_S)
        result: dict[str, Any] | None = pod
        return result
