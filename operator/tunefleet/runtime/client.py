"""The connection to the API server that every part of the operator shares, and the words
its callers act on: client-go's rest client and apimachinery's errors, in short. Nothing here
knows a TuningProfile (kube.py makes the operator's own calls over it).

Transient failures (timeouts, 5xx, 429, RBAC not yet in place) become Temporary with a
suggested delay; a request the API server refuses for good (422) becomes Permanent. These are
the project's own words: kopf serves the webhook and runs the startup, and nothing else speaks
its errors. Every call has a timeout: a hung connection (half-open TCP, an overloaded API
server) ends the call rather than the caller. A process holds one Client (no module global:
two in one process, as in tests, never share a fence); every write asks its fence first
(`Client.set_fence`, `Client.write_timeout`): a replica that cannot prove it still holds
the Lease long enough for the write to finish does not make it (NotLeading), so two
replicas never write at once (leader.py).
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import urllib.parse
from collections.abc import Callable, Collection, Iterable, Iterator
from typing import Any, NoReturn, TypeVar, cast

import kubernetes
import orjson
import urllib3
from kubernetes.client.exceptions import ApiException

log = logging.getLogger(__name__)
T = TypeVar("T")

# Sized to the reconciler's workers plus the Event poster and the occasional scan, so that no
# request waits for (or discards) a pooled connection: urllib3's pool defaults to 5 x cores.
DEFAULT_POOL_SIZE = 16


# Seconds one read may take; writes get at most this, and never more than the fence allows.
REQUEST_TIMEOUT = 10.0
MIN_WRITE_SECONDS = 1.0  # a write with less time than this left under the Lease is not begun
# A request the API server has not acknowledged for this long aborts its connection in the
# kernel (TCP_USER_TIMEOUT). A client-side timeout alone does not stop a write: the kernel keeps
# retransmitting what it sent, and a path that comes back (a frozen node, a partition healed)
# would deliver the write long after the fence closed, beside the next leader. With this, a
# write begun inside the fence lands within UNACKED_ABORT_S or never (leader.py's margin:
# MIN_WRITE_SECONDS + lease duration - renew deadline > UNACKED_ABORT_S).
UNACKED_ABORT_S = 2.0


class Temporary(Exception):
    """A failure that may pass (the API server slow or restarting, RBAC not in place yet):
    the caller tries again, after `delay` seconds when one is suggested."""

    def __init__(self, message: str, delay: float | None = None) -> None:
        super().__init__(message)
        self.delay = delay


class Permanent(Exception):
    """A failure that retrying will not mend (a spec or object the API server refuses): it is
    reported, and nothing is tried again until the input changes."""


class Gone(Exception):
    """The namespace or object is gone or going: nothing left to do for it."""


class NotLeading(Exception):
    """This replica may not write now: it has not renewed the Lease recently enough."""


class Conflict(Exception):
    """The object changed since it was read (409 on a write with its resourceVersion)."""


class Expired(Exception):
    """410 Gone on a list or watch: the version asked for is gone; list again."""


class NotOurs(Exception):
    """An object of the name we would create exists and is not controlled by its owner."""


def _configuration() -> kubernetes.client.Configuration:
    """In a pod its ServiceAccount, elsewhere $KUBECONFIG (as kopf itself does)."""
    config = kubernetes.client.Configuration()
    try:
        kubernetes.config.load_incluster_config(client_configuration=config)
    except kubernetes.config.ConfigException:
        kubernetes.config.load_kube_config(client_configuration=config)
    return config


def _abort_unacknowledged(config: kubernetes.client.Configuration) -> None:
    if hasattr(socket, "TCP_USER_TIMEOUT"):  # Linux; elsewhere the client timeouts alone
        config.socket_options = [
            *urllib3.connection.HTTPConnection.default_socket_options,
            (socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, int(UNACKED_ABORT_S * 1000)),
        ]


def _no_fence() -> float | None:
    return None


class Encoded(bytes):
    """A request body that is JSON already (encoded_json): sent as it is."""


def encoded_json(body: Any) -> Encoded:
    """`body` for a POST or PUT of the generated client, encoded once by orjson. The generated
    client would walk it in Python (sanitize_for_serialization) and encode it with the
    stdlib: ~11% of the operator's CPU in a burst of creates (py-spy, 3,000 profiles), for
    bodies that are plain JSON documents already."""
    return Encoded(orjson.dumps(body))


_ERRORS = {
    401: kubernetes.client.exceptions.UnauthorizedException,
    403: kubernetes.client.exceptions.ForbiddenException,
    404: kubernetes.client.exceptions.NotFoundException,
}


class _Rest(kubernetes.client.rest.RESTClientObject):  # type: ignore[misc]
    """The generated client's REST layer, but a POST or PUT of an Encoded body goes out as
    those bytes, as application/json (its own request would run json.dumps over them);
    errors are raised as its own are, so callers cannot tell the two apart."""

    def request(self, method: str, url: str, *args: Any, **kw: Any) -> Any:
        # The generated layer's POST and PUT call this with keywords only.
        body = kw.get("body")
        if args or not isinstance(body, Encoded) or method.upper() not in ("POST", "PUT"):
            return super().request(method, url, *args, **kw)
        query_params, headers = kw.get("query_params"), kw.get("headers")
        preload, limit = kw.get("_preload_content", True), kw.get("_request_timeout")
        timeout = None
        if isinstance(limit, (int, float)):
            timeout = urllib3.Timeout(total=limit)
        elif isinstance(limit, tuple) and len(limit) == 2:
            timeout = urllib3.Timeout(connect=limit[0], read=limit[1])
        if query_params:
            url += "?" + urllib.parse.urlencode(query_params)
        headers = {**(headers or {}), "Content-Type": "application/json"}
        try:
            r = self.pool_manager.request(
                method.upper(), url, body=bytes(body), preload_content=preload, timeout=timeout,
                headers=headers,
            )  # fmt: skip
        except urllib3.exceptions.SSLError as e:
            raise ApiException(status=0, reason=f"{type(e).__name__}\n{e}") from None
        if preload:
            r = kubernetes.client.rest.RESTResponse(r)
        if not 200 <= r.status <= 299:
            error = _ERRORS.get(r.status)
            if error is None:
                error = (
                    kubernetes.client.exceptions.ServiceException
                    if 500 <= r.status <= 599
                    else ApiException
                )
            raise error(http_resp=r)
        return r


def api_client(config: kubernetes.client.Configuration) -> kubernetes.client.ApiClient:
    """The generated ApiClient over `config`, with the REST layer that sends Encoded bodies."""
    client = kubernetes.client.ApiClient(configuration=config)
    client.rest_client = _Rest(config)
    return client


class Client:
    """A process's one connection to the API server and the fence its writes ask first. Made
    once (the operator's: kube.Kube, at start-up); it logs in on first use, from the pod's
    ServiceAccount or $KUBECONFIG, unless given an ApiClient."""

    def __init__(self, api: kubernetes.client.ApiClient | None = None) -> None:
        self._api = api
        self._login = threading.Lock()
        self._fence: Callable[[], float | None] = _no_fence

    def login(
        self,
        pool_size: int = DEFAULT_POOL_SIZE,
        config: kubernetes.client.Configuration | None = None,
    ) -> None:
        """Connect with `config` (default: the pod's ServiceAccount, else $KUBECONFIG), its
        pool sized to `pool_size`, aborting what the API server leaves unacknowledged."""
        config = config or _configuration()
        config.connection_pool_maxsize = pool_size
        _abort_unacknowledged(config)
        self._api = api_client(config)

    def api(self) -> kubernetes.client.ApiClient:
        with self._login:
            if self._api is None:
                self.login()
            assert self._api is not None
            return self._api

    def set_fence(self, fence: Callable[[], float | None]) -> None:
        """`fence()`: seconds this replica may still write (None: no leader election)."""
        self._fence = fence

    def write_timeout(self) -> float:
        """The timeout of a write about to be made; NotLeading when none may be made."""
        left = self._fence()
        if left is None:
            return REQUEST_TIMEOUT
        if left < MIN_WRITE_SECONDS:
            raise NotLeading(f"not writing: {max(left, 0.0):.1f}s left under the Lease")
        return min(REQUEST_TIMEOUT, left)

    # The generated clients over the one connection, for calls that have no method of their
    # own on the operator's Kube (a TokenReview, a webhook's caBundle, a Lease).
    def core(self) -> kubernetes.client.CoreV1Api:
        return kubernetes.client.CoreV1Api(self.api())

    def batch(self) -> kubernetes.client.BatchV1Api:
        return kubernetes.client.BatchV1Api(self.api())

    def custom(self) -> kubernetes.client.CustomObjectsApi:
        return kubernetes.client.CustomObjectsApi(self.api())

    def coordination(self) -> kubernetes.client.CoordinationV1Api:
        return kubernetes.client.CoordinationV1Api(self.api())

    def admission(self) -> kubernetes.client.AdmissionregistrationV1Api:
        return kubernetes.client.AdmissionregistrationV1Api(self.api())

    def authentication(self) -> kubernetes.client.AuthenticationV1Api:
        return kubernetes.client.AuthenticationV1Api(self.api())

    def watch_api(self, connections: int, *, metadata_only: bool = False) -> WatchApi:
        """A pool of its own for the reflectors' long watches (see WatchApi)."""
        return WatchApi(connections, metadata_only=metadata_only)


def api_message(e: ApiException) -> str:
    try:
        return str(json.loads(e.body or "{}").get("message") or e.reason)
    except ValueError:
        return str(e.reason)


def translate(what: str, e: Exception) -> Exception:
    """The error the reconciler acts on, for a failed API call (raise it `from e`)."""
    if isinstance(e, ApiException):
        message = api_message(e)
        status = int(e.status or 0)
        if status == 403 and "being terminated" in message:
            return Gone(f"{what}: {message}")
        if status == 404 and "namespaces" in message:
            return Gone(f"{what}: {message}")
        if status == 403 and "exceeded quota" in message:
            return Temporary(f"{what}: {message}", delay=30)
        if status in (401, 403):
            return Temporary(
                f"{what}: {status} {message} (if this is RBAC, compare the operator's "
                "ServiceAccount with charts/tunefleet/templates/rbac.yaml)",
                delay=30,
            )
        if status == 422:
            return Permanent(f"{what}: the API server refused it: {message}")
        if status in (408, 409, 429) or status >= 500:
            return Temporary(f"{what}: {status} {message}", delay=5)
        return cast(Exception, e)
    if isinstance(e, urllib3.exceptions.HTTPError | OSError):
        return Temporary(f"{what}: {e}", delay=5)
    return e


def reraise(what: str, e: Exception) -> NoReturn:
    translated = translate(what, e)
    if translated is e:
        raise e
    raise translated from e


def call(what: str, fn: Callable[[], T]) -> T:
    """Run one API call; a failure comes out translated (see `translate`)."""
    try:
        return fn()
    except (ApiException, urllib3.exceptions.HTTPError, OSError) as e:
        reraise(what, e)


def call_or(what: str, fn: Callable[[], T], answers: Collection[int]) -> tuple[T | None, int]:
    """Run one API call: (its result, 0), or (None, the status) when the API server answers
    with one of `answers`, which the caller acts on (404: gone; 409: there already, or changed
    since read; 422: a JSON patch's test failed); any other failure translated (`translate`)."""
    try:
        return fn(), 0
    except ApiException as e:
        if e.status in answers:
            return None, int(e.status)
        reraise(what, e)
    except (urllib3.exceptions.HTTPError, OSError) as e:
        reraise(what, e)


def _json(resp: Any) -> Any:
    # orjson: what the API server answers (a Job, a profile, a page of pods, watch events) is
    # most of the operator's JSON; a 5 KB Job parses in 12 us against json's 24 (this machine).
    return orjson.loads(resp.data)


def release(resp: Any) -> None:
    """Read the rest of a response the caller has no use for. With _preload_content=False,
    urllib3 returns a connection to the pool only once its response is read to the end: an
    unread one is dropped, and the next call opens a new connection (a TLS handshake on both
    sides, ~2 per profile in a burst before this: bench/scale.md)."""
    getattr(resp, "data", None)


# PartialObjectMetadata: an object's metadata without its spec or status (a Node's images and
# conditions, ~20 KiB each at scale; an artifact ConfigMap's 1 MiB); served for every kind.
META_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"
META_WATCH = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json"


LIST_PAGE = 100  # objects per page of a list: what a restart holds at once (bench/scale.md)


def pages(fetch: Callable[[str], dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Every page of one list, in order: `fetch(token)` answers a page ("" asks for the
    first); the next is asked for while the API server gives a continue token. One page is
    held at a time. The list paginator of the operator, its reflectors and its tools."""
    token = ""
    while True:
        page = fetch(token)
        token = str((page.get("metadata") or {}).get("continue") or "")
        yield page
        del page  # not held while the next one is read
        if not token:
            return


LIST_TIMEOUT = 60.0  # a page of pods can be a MiB or more


# No byte for this long on a watch (no event, and no bookmark, which come ~1 a minute): the
# stream is dead (half-open TCP); the reflector resumes from the last version it saw.
WATCH_READ_TIMEOUT = 90.0


def parse_lines(chunks: Iterable[bytes]) -> Iterator[dict[str, Any]]:
    """Watch events from a stream of bytes: one JSON object a line."""
    rest = b""
    for chunk in chunks:
        rest += chunk
        *lines, rest = rest.split(b"\n")
        for line in lines:
            if line.strip():
                yield orjson.loads(line)
    if rest.strip():
        yield orjson.loads(rest)


class WatchApi:
    """reflector.Reflector's two calls over the API server, on a connection pool of their own:
    each watch holds its connection for minutes, and must not take one from the reconcile
    workers' pool (or be dropped from it)."""

    def __init__(self, connections: int, *, metadata_only: bool = False) -> None:
        config = _configuration()
        config.connection_pool_maxsize = connections
        self.client = api_client(config)
        self.metadata_only = metadata_only

    def _get(self, path: str, params: dict[str, str], timeout: Any) -> Any:
        accept = "application/json"
        if self.metadata_only:
            accept = META_WATCH if params.get("watch") else META_LIST
        return self.client.call_api(
            path, "GET", query_params=list(params.items()),
            header_params={"Accept": accept}, auth_settings=["BearerToken"],
            _preload_content=False, _return_http_data_only=True, _request_timeout=timeout,
        )  # fmt: skip

    def list_page(self, path: str, params: dict[str, str]) -> dict[str, Any]:
        try:
            page: dict[str, Any] = _json(self._get(path, params, LIST_TIMEOUT))
        except ApiException as e:
            if e.status == 410:
                raise Expired(api_message(e)) from e
            reraise(f"listing {path}", e)
        except (urllib3.exceptions.HTTPError, OSError) as e:
            reraise(f"listing {path}", e)
        return page

    def watch(self, path: str, params: dict[str, str]) -> Iterator[dict[str, Any]]:
        try:
            resp = self._get(path, params, (REQUEST_TIMEOUT, WATCH_READ_TIMEOUT))
        except (ApiException, urllib3.exceptions.HTTPError, OSError) as e:
            reraise(f"watching {path}", e)
        try:
            yield from parse_lines(resp.stream(1 << 16))
        except (urllib3.exceptions.ReadTimeoutError, urllib3.exceptions.ProtocolError) as e:
            # Silence past READ_TIMEOUT (no event, no bookmark), or the server hung up: the
            # reflector resumes from the last version it saw.
            log.debug(f"watching {path}: {e}; resuming")
        finally:
            resp.release_conn()
