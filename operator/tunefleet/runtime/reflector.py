"""List, then watch: client-go's reflector, in short. One Reflector follows one kind in one
namespace (or cluster-wide) and feeds every object to the event handler registered for that
kind (`on`); the kinds the operator follows, and why these and not kopf's watches, are in
watched/kinds.py. Nothing here knows what the objects are.

A reflector lists its kind page by page (client.LIST_PAGE objects a page): each object goes
to the handler as it is read, and the page is dropped before the next is read, so a restart
with 10,000 profiles never holds more than one page of raw objects. It then watches from the
list's resourceVersion, with bookmarks; a dropped stream resumes from the last version seen,
and a version the API server no longer has (410 Gone) means listing again. After every list,
what the cache holds of this kind and namespace but the list did not return is gone (a delete
missed while the stream was down): the handler gets it as DELETED, so nothing outlives what
the API server holds.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from tunefleet.runtime.client import LIST_PAGE, Expired, pages

log = logging.getLogger(__name__)

Handler = Callable[[str | None, dict[str, Any]], None]  # (event type, object); None: listed

WATCH_SECONDS = 300  # the API server ends each watch after this; it is then resumed
BACKOFF = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0)  # after failed calls, in turn; success resets


@dataclass(frozen=True)
class Kind:
    """A watched kind: its name (cache.py's), API path, and what selects it server-side."""

    name: str  # "tuningprofiles" | "jobs" | "pods" | ...: unique per kind followed
    group_path: str  # /api/v1, /apis/batch/v1, ...
    plural: str
    label_selector: str = ""
    # Metadata only (PartialObjectMetadata): what is followed is the object's existence and
    # identity, not its content (an artifact ConfigMap holds up to 1 MiB).
    metadata_only: bool = False

    def path(self, namespace: str | None) -> str:
        where = f"/namespaces/{namespace}" if namespace else ""
        return f"{self.group_path}{where}/{self.plural}"


# What `on` registers: a handler handed first the object the reflectors are built by (the
# operator binds its handlers to itself), then the event: so that no handler reaches what it
# keeps through a module's global. The machinery does not know what that object is.
Registered = Callable[[Any, str | None, dict[str, Any]], None]

# kind name -> its event handler (handlers/ register theirs with @on, as kopf's decorators do)
HANDLERS: dict[str, tuple[Kind, Registered]] = {}


def on(kind: Kind) -> Callable[[Registered], Registered]:
    """Register the event handler of a kind: the reflectors of that kind feed it, bound."""

    def register(fn: Registered) -> Registered:
        HANDLERS[kind.name] = (kind, fn)
        return fn

    return register


class Api(Protocol):
    """The two calls a reflector makes (client.WatchApi over the API server; fakes in tests)."""

    def list_page(self, path: str, params: dict[str, str]) -> dict[str, Any]: ...

    def watch(self, path: str, params: dict[str, str]) -> Iterator[dict[str, Any]]: ...


@dataclass(frozen=True)
class Held:
    """The cache as a reflector sees it (client-go's Store): `known()` says which uids of its
    kind and namespace the cache holds now (to find what a relist no longer returns);
    `forget(uid)` hands one of them to the handler as DELETED."""

    known: Callable[[], set[str]]
    forget: Callable[[str], None]


@dataclass(frozen=True)
class Clock:
    """The reflector's time, which tests replace: `now` (monotonic), and `sleep(seconds)`
    (None: wait on the reflector's stop event; returns whether it was stopped)."""

    now: Callable[[], float] = time.monotonic
    sleep: Callable[[float], bool] | None = None


class Reflector:
    """Lists and watches one kind in one namespace (None: all), feeding `handler`, and tells
    the cache (`held`) what a relist no longer returns."""

    def __init__(
        self,
        api: Api,
        kind: Kind,
        namespace: str | None,
        handler: Handler,
        held: Held,
        clock: Clock = Clock(),
    ) -> None:
        self.api, self.kind, self.namespace = api, kind, namespace
        self.handler, self.known, self.forget = handler, held.known, held.forget
        sleep = clock.sleep
        self.listed = threading.Event()  # the first list is in the cache
        self.lists = 0  # lists made (the first, and one per expiry)
        self._stop = threading.Event()
        self._sleep = sleep or (lambda s: self._stop.wait(s))
        self._clock = clock.now
        self._failures = 0
        self._thread = threading.Thread(
            target=self.run, name=f"watch-{kind.name}-{namespace or 'all'}", daemon=True
        )

    @property
    def where(self) -> str:
        return f"{self.kind.name} in {self.namespace}" if self.namespace else self.kind.name

    def start(self) -> Reflector:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def run(self) -> None:
        version = ""
        while not self._stop.is_set():
            try:
                if not version:
                    version = self.list_all()
                    self.listed.set()
                version = self.watch(version)
                self._failures = 0
            except Expired:
                log.info(f"{self.where}: watch expired; listing again")
                version = ""
            except Exception as e:  # a call failed: the API server restarts, RBAC lags, ...
                delay = BACKOFF[min(self._failures, len(BACKOFF) - 1)]
                self._failures += 1
                log.warning(f"{self.where}: {e}; again in {delay:.1f}s")
                self._sleep(delay)

    def list_all(self) -> str:
        """One consistent list, page by page; returns its resourceVersion. Whatever the cache
        holds of this kind and namespace that the list did not return is gone."""
        seen: set[str] = set()

        def fetch(token: str) -> dict[str, Any]:
            params = {"limit": str(LIST_PAGE)}
            if self.kind.label_selector:
                params["labelSelector"] = self.kind.label_selector
            if token:
                params["continue"] = token
            return self.api.list_page(self.kind.path(self.namespace), params)

        meta: dict[str, Any] = {}
        while True:
            try:
                for page in pages(fetch):  # one page of raw objects at a time
                    for obj in page.get("items") or []:
                        seen.add(((obj.get("metadata") or {}).get("uid")) or "")
                        self.handler(None, obj)
                    meta = page.get("metadata") or {}
                    del page  # one page of raw objects at a time
                break
            except Expired:
                # The continue token outlived the snapshot: start the list over.
                seen.clear()
        for uid in self.known() - seen:
            self.forget(uid)
        self.lists += 1
        return str(meta.get("resourceVersion") or "")

    def watch(self, version: str) -> str:
        """Follow changes from `version` until the API server ends the stream; returns the
        last version seen (to resume from). Expired when the version is too old."""
        params = {
            "watch": "true",
            "allowWatchBookmarks": "true",
            "resourceVersion": version,
            "timeoutSeconds": str(WATCH_SECONDS),
        }
        if self.kind.label_selector:
            params["labelSelector"] = self.kind.label_selector
        for event in self.api.watch(self.kind.path(self.namespace), params):
            kind, obj = event.get("type"), event.get("object") or {}
            if kind == "ERROR":
                if obj.get("code") == 410:
                    raise Expired(obj.get("message", ""))
                raise RuntimeError(f"watch error: {obj.get('message') or obj}")
            version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
            if kind in ("ADDED", "MODIFIED", "DELETED"):
                self.handler(kind, obj)
            if self._stop.is_set():
                break
        return version


class Reflectors:
    """A process's reflectors: one per kind, per watched namespace."""

    def __init__(self, reflectors: list[Reflector]) -> None:
        self.all = reflectors

    def start(self) -> Reflectors:
        for r in self.all:
            r.start()
        return self

    def wait_listed(self, timeout: float | None = None) -> bool:
        """Block until every reflector's first list is in the cache."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for r in self.all:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not r.listed.wait(left):
                return False
        return True

    def stop(self) -> None:
        for r in self.all:
            r.stop()
