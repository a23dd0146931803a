"""`FakeKube`: the one fake of the operator's client object (tunefleet.kube.Kube) for unit
tests, handed to the code as the real one is (no module patched). It records every call as
(kind, verb, object) in `calls`, answers as an empty cluster would, and keeps what it was
asked to make. A test scripts an answer the way controller-runtime's interceptor funcs do:
`FakeKube(intercept={"read": fn})` (or `fake.intercept["read"] = fn`) runs `fn` with the
method's own arguments instead of the fake's answer (FakeKube.DEFAULT from `fn`: the fake's
own answer after all). Beside it, the stand-ins for the generated clients it hands out
(`generated=`: FakeLeases, HangingLeases for the Lease API, `Generated(method=fn)` for one
test's answers, OneConfigMap with a rival writer, `raw(obj)` for a body read without preloading) and for the reflectors' watch
API (FakeWatchApi): every fake API a unit test talks to lives here. It never reaches an API server: a call
with no fake answer (a generated client no test gave) fails the test, naming the call."""

from __future__ import annotations

import datetime
import inspect
import json
import threading
import time
import types
from collections.abc import Callable, Iterator
from typing import Any

from kubernetes.client.exceptions import ApiException

from tunefleet import kube
from tunefleet.runtime import client

# Where every write of a reconcile comes from (reconciler/apply.py): the unit tests of
# sync_profile hand FakeKube(writers=RECONCILE_WRITERS), so a gather or decide step that
# wrote would fail them.
RECONCILE_WRITERS = ("tunefleet/reconciler/apply.py",)


class _StandIns(kube.Kube):
    """A client that reaches no API server: the generated clients it hands out are the
    stand-ins a test gave (`generated`), and asking for any other fails the test."""

    def __init__(self, generated: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.generated: dict[str, Any] = dict(generated or {})
        self.calls: list[tuple[str, str, Any]] = []  # (kind, verb, object or name)

    def api(self) -> Any:
        raise AssertionError(f"{type(self).__name__} reaches no API server: give it an answer")

    def _generated(self, name: str) -> Any:
        if name not in self.generated:
            raise AssertionError(f"{type(self).__name__}: no stand-in for the {name} client")
        self.calls.append((name, "client", None))
        return self.generated[name]

    def core(self) -> Any:
        return self._generated("core")

    def batch(self) -> Any:
        return self._generated("batch")

    def custom(self) -> Any:
        return self._generated("custom")

    def coordination(self) -> Any:
        return self._generated("coordination")

    def admission(self) -> Any:
        return self._generated("admission")

    def authentication(self) -> Any:
        return self._generated("authentication")


class FakeKube(_StandIns):
    """`existing` names answer a create as the API server does when an object of that name is
    there and ours (None); `foreign` ones as when it is someone else's (NotOurs)."""

    def __init__(
        self,
        existing: set[str] | None = None,
        foreign: set[str] | None = None,
        intercept: dict[str, Callable[..., Any]] | None = None,
        generated: dict[str, Any] | None = None,
        writers: tuple[str, ...] = (),
    ) -> None:
        super().__init__(generated)  # stand-ins for core, batch, custom, ... by accessor
        # Set: a write from code outside these files (paths' ends) fails the test, e.g.
        # RECONCILE_WRITERS: nothing but the reconcile's apply step writes.
        self.writers = writers
        self.existing = set(existing or ())
        self.foreign = set(foreign or ())
        self.intercept: dict[str, Callable[..., Any]] = dict(intercept or {})
        self.created: list[tuple[str, str]] = []
        self.patches: list[dict[str, Any]] = []  # status writes
        self.status_versions: list[str] = []  # the resourceVersion each was made over
        self.owned_patches: list[tuple[str, str, dict[str, Any]]] = []
        self.deleted: list[tuple[str, str]] = []
        self.events: list[tuple[str, str]] = []
        self.fail_job_with: Exception | None = None
        self.conflict = False
        # What a list answers, by kind ("configmaps", "pods"), and the lists made.
        self.listed: dict[str, list[dict[str, Any]]] = {}
        self.lists: list[tuple[str, str]] = []
        self.events_of_jobs: list[dict[str, Any]] = []  # what Events about any Job answer
        self.nodes = 0  # what count_nodes answers
        self.finalizers_removed: list[tuple[str, str, str, list[str], str]] = []

    # What an intercept returns to leave this call to the fake's own answer.
    DEFAULT: Any = object()

    def _scripted(self, verb: str, *args: Any) -> tuple[bool, Any]:
        fn = self.intercept.get(verb)
        answer = self.DEFAULT if fn is None else fn(*args)
        return (False, None) if answer is self.DEFAULT else (True, answer)

    def _writing(self, what: str) -> None:
        if not self.writers:
            return
        # The nearest frame in the product (below this fake) is the one that wrote.
        for frame in inspect.stack()[2:]:
            path = frame.filename.replace("\\", "/")
            if "/tunefleet/" in path and "/tests/" not in path:
                if not path.endswith(self.writers):
                    raise AssertionError(f"{what} written from {path}:{frame.lineno}")
                return

    def verbs(self, verb: str) -> list[tuple[str, str, Any]]:
        return [c for c in self.calls if c[1] == verb]

    # --- profiles -------------------------------------------------------------------------

    def get_profile(
        self, namespace: str, name: str, timeout_s: float = 2.0
    ) -> dict[str, Any] | None:
        self.calls.append(("TuningProfile", "get", f"{namespace}/{name}"))
        done, answer = self._scripted("get_profile", namespace, name, timeout_s)
        return answer if done else None

    def remove_profile_finalizer(
        self, namespace: str, name: str, uid: str, finalizers: list[str], finalizer: str
    ) -> None:
        self._writing("remove_profile_finalizer")
        removed = (namespace, name, uid, list(finalizers), finalizer)
        self.calls.append(("TuningProfile", "patch", removed))
        self.finalizers_removed.append(removed)

    def replace_profile_status(
        self, namespace: str, name: str, resource_version: str, status: dict[str, Any]
    ) -> str:
        self._writing("replace_profile_status")
        self.calls.append(("TuningProfile", "update_status", status))
        self.status_versions.append(resource_version)
        if self.conflict:
            raise kube.Conflict("changed")
        self.patches.append(status)
        return f"rv-{len(self.patches)}"

    # --- lists, nodes, Events ---------------------------------------------------------------

    def list_all(
        self, kind: str, label_selector: str = "", namespace: str | None = None
    ) -> Iterator[dict[str, Any]]:
        self.calls.append((kind, "list", label_selector))
        self.lists.append((kind, label_selector))
        yield from self.listed.get(kind, [])

    def list_pods(self, namespace: str | None, label_selector: str) -> list[dict[str, Any]]:
        self.calls.append(("pods", "list", label_selector))
        done, answer = self._scripted("list_pods", namespace, label_selector)
        return list(answer) if done else list(self.listed.get("pods", []))

    def count_nodes(self, label_selector: str) -> int:
        self.calls.append(("nodes", "list", label_selector))
        return self.nodes

    def list_nodes(self, label_selector: str) -> list[dict[str, Any]]:
        self.calls.append(("nodes", "list", label_selector))
        done, answer = self._scripted("list_nodes", label_selector)
        return list(answer) if done else []

    def node_runtimes(self, label_selector: str) -> dict[str, str]:
        self.calls.append(("nodes", "list", label_selector))
        done, answer = self._scripted("node_runtimes", label_selector)
        return dict(answer) if done else {}

    def server_minor(self) -> int:
        done, answer = self._scripted("server_minor")
        return int(answer) if done else 0

    def events_about(self, kind: str, namespace: str, name: str) -> list[dict[str, Any]]:
        self.calls.append(("events", "list", (kind, namespace, name)))
        done, answer = self._scripted("events_about", kind, namespace, name)
        if done:
            return list(answer)
        return list(self.events_of_jobs) if kind == "Job" else []

    def post_event_soon(self, ref: dict[str, Any], type_: str, reason: str, message: str) -> None:
        self._writing("post_event_soon")
        self.calls.append(("events", "create", (reason, message)))
        self.events.append((reason, message))

    def list_node_metadata(self, label_selector: str) -> tuple[list[dict[str, Any]], str]:
        self.calls.append(("nodes", "list", label_selector))
        done, answer = self._scripted("list_node_metadata", label_selector)
        return answer if done else ([], "1")

    def watch_node_metadata(
        self, label_selector: str, resource_version: str, timeout_s: int
    ) -> Iterator[dict[str, Any]]:
        self.calls.append(("nodes", "watch", label_selector))
        done, answer = self._scripted(
            "watch_node_metadata", label_selector, resource_version, timeout_s
        )
        yield from answer if done else ()

    def list_custom(
        self,
        group: str,
        versions: tuple[str, ...],
        namespace: str,
        plural: str,
        label_selector: str,
    ) -> list[dict[str, Any]] | None:
        self.calls.append((plural, "list", label_selector))
        done, answer = self._scripted(
            "list_custom", group, versions, namespace, plural, label_selector
        )
        return answer if done else []  # installed, and nothing there yet

    def read_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.calls.append(("Pod", "get", f"{namespace}/{name}"))
        done, answer = self._scripted("read_pod", namespace, name)
        return answer if done else None

    def review_token(self, token: str, audience: str) -> dict[str, Any]:
        self.calls.append(("TokenReview", "create", audience))
        done, answer = self._scripted("review_token", token, audience)
        return dict(answer) if done else {"authenticated": False}

    # --- owned objects ----------------------------------------------------------------------

    def read(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        self.calls.append((kind, "get", f"{namespace}/{name}"))
        done, answer = self._scripted("read", kind, namespace, name)
        return answer if done else None

    def create_owned(self, obj: dict[str, Any]) -> dict[str, Any] | None:
        self._writing("create_owned")
        self.calls.append((obj["kind"], "create", obj))
        done, answer = self._scripted("create_owned", obj)
        if done:
            return answer  # type: ignore[no-any-return]
        if obj["kind"] == "Job" and self.fail_job_with is not None:
            raise self.fail_job_with
        name = obj["metadata"]["name"]
        if name in self.foreign:
            raise kube.NotOurs(
                f"{obj['kind']} ml/{name} exists but is not controlled by it: it is not used; "
                "delete it"
            )
        if (obj["kind"], name) in {(k, n) for k, n in self.created} or name in self.existing:
            return None
        self.created.append((obj["kind"], name))
        return {**obj, "metadata": {**obj["metadata"], "uid": f"juid-{name}"}}  # as jobs_for

    def patch_owned(
        self, kind: str, namespace: str, name: str, owner_uid: str, patch: dict[str, Any]
    ) -> bool:
        self._writing("patch_owned")
        self.calls.append((kind, "patch", patch))
        done, answer = self._scripted("patch_owned", kind, namespace, name, owner_uid, patch)
        if done:
            return bool(answer)
        self.owned_patches.append((kind, name, patch))
        return True

    def delete_owned(self, kind: str, namespace: str, name: str, uid: str) -> None:
        self._writing("delete_owned")
        self.calls.append((kind, "delete", f"{namespace}/{name}"))
        done, _ = self._scripted("delete_owned", kind, namespace, name, uid)
        if not done:
            self.deleted.append((kind, name))

    def create_config_map(self, obj: dict[str, Any]) -> dict[str, Any] | None:
        self._writing("create_config_map")
        self.calls.append(("ConfigMap", "create", obj))
        done, answer = self._scripted("create_config_map", obj)
        return answer if done else {**obj, "metadata": {**obj["metadata"], "uid": "u"}}

    def patch_config_map(
        self, namespace: str, name: str, resource_version: str, patch: dict[str, Any]
    ) -> dict[str, Any] | None:
        self._writing("patch_config_map")
        self.calls.append(("ConfigMap", "patch", patch))
        done, answer = self._scripted("patch_config_map", namespace, name, resource_version, patch)
        return answer if done else None


class OverGenerated(_StandIns):
    """The real client's own logic (kube.Kube's methods, untouched) over stand-ins for the
    generated clients it calls (`core=`, `batch=`, `custom=`, ...): for tests of how it reads
    the API server's answers (a 409, a 404), where FakeKube would answer for it."""

    def __init__(self, **generated: Any) -> None:
        super().__init__(generated)


def raw(obj: Any) -> Any:
    """A generated client's answer to a call with `_preload_content=False`: the body as JSON."""
    return types.SimpleNamespace(data=json.dumps(obj).encode())


class Generated:
    """A generated API client (BatchV1Api, CustomObjectsApi, ...) whose methods are the
    functions a test gives: `OverGenerated(batch=Generated(read_namespaced_job=fn))`. A method
    no test gave fails the test, naming it."""

    def __init__(self, **methods: Callable[..., Any]) -> None:
        self._methods = methods

    def __getattr__(self, name: str) -> Callable[..., Any]:
        if name.startswith("_") or name not in self._methods:
            raise AssertionError(f"Generated: no stand-in for {name}")
        return self._methods[name]


class OneConfigMap:
    """The ConfigMap API over one object, with resourceVersions as the API server keeps them (a
    patch of an older one is a 409) and a rival writer on demand: `rival`, a function from the
    object there (or None) to the one another writer leaves, runs once just before our next
    create (which then loses: 409) or patch."""

    def __init__(self) -> None:
        self.cm: dict[str, Any] | None = None
        self.rv = 0
        self.rival: Callable[[dict[str, Any] | None], dict[str, Any]] | None = None
        self.writes = 0  # ours, that took

    def put(self, cm: dict[str, Any]) -> None:
        """The object as stored: the next resourceVersion, a uid."""
        self.rv += 1
        cm["metadata"]["resourceVersion"] = str(self.rv)
        cm["metadata"].setdefault("uid", "cm-uid")
        self.cm = cm

    def _race(self) -> bool:
        rival, self.rival = self.rival, None
        if rival is not None:
            self.put(rival(self.cm))
        return rival is not None

    def read_namespaced_config_map(self, name: str, ns: str, **_: Any) -> Any:
        if self.cm is None:
            raise ApiException(status=404)
        return raw(self.cm)

    def create_namespaced_config_map(self, ns: str, body: dict[str, Any], **_: Any) -> Any:
        if self._race():  # the other writer created it first
            raise ApiException(status=409)
        self.writes += 1
        self.put(body)
        return raw(body)

    def patch_namespaced_config_map(
        self, name: str, ns: str, body: dict[str, Any], **_: Any
    ) -> Any:
        self._race()
        assert self.cm is not None
        if body["metadata"]["resourceVersion"] != self.cm["metadata"]["resourceVersion"]:
            raise ApiException(status=409)
        self.writes += 1
        self.cm["data"] = body["data"]
        self.put(self.cm)
        return raw(self.cm)


# --- stand-ins for what the machinery talks to (runtime/: the Lease API, the watch API) -------


class FakeLeases:
    """read/create/replace with resourceVersion checks, as the API server does."""

    def __init__(self) -> None:
        self.lease: dict[str, Any] | None = None
        self.version = 0

    def _obj(self) -> Any:
        assert self.lease is not None
        spec = self.lease["spec"]

        def ts(v: str | None) -> datetime.datetime | None:
            return datetime.datetime.strptime(v, "%Y-%m-%dT%H:%M:%S.%fZ") if v else None

        return types.SimpleNamespace(
            metadata=types.SimpleNamespace(resource_version=str(self.version)),
            spec=types.SimpleNamespace(
                holder_identity=spec.get("holderIdentity"),
                renew_time=ts(spec.get("renewTime")),
                acquire_time=ts(spec.get("acquireTime")),
                lease_duration_seconds=spec.get("leaseDurationSeconds"),
                lease_transitions=spec.get("leaseTransitions"),
            ),
        )

    def read_namespaced_lease(self, name: str, ns: str, **_: Any) -> Any:
        if self.lease is None:
            raise ApiException(status=404)
        return self._obj()

    def create_namespaced_lease(self, ns: str, body: dict[str, Any], **_: Any) -> None:
        if self.lease is not None:
            raise ApiException(status=409)
        self.lease, self.version = body, self.version + 1

    def replace_namespaced_lease(self, name: str, ns: str, body: dict[str, Any], **_: Any) -> None:
        if body["metadata"].get("resourceVersion") != str(self.version):
            raise ApiException(status=409)
        self.lease, self.version = body, self.version + 1


class HangingLeases:
    """A Lease API whose calls hang once `hang` is set (a frozen TCP peer)."""

    def __init__(self) -> None:
        self.hang = threading.Event()
        self.lease: Any = None

    def _wait(self, timeout: float) -> None:
        if self.hang.is_set():
            time.sleep(timeout)
            raise TimeoutError("read timed out")

    def read_namespaced_lease(self, name: str, ns: str, _request_timeout: float = 0) -> Any:
        self._wait(_request_timeout)
        if self.lease is None:
            raise ApiException(status=404)
        return self.lease

    def create_namespaced_lease(
        self, ns: str, body: dict[str, Any], _request_timeout: float = 0
    ) -> None:
        self._wait(_request_timeout)
        self.lease = types.SimpleNamespace(
            metadata=types.SimpleNamespace(resource_version="1"),
            spec=types.SimpleNamespace(
                holder_identity=body["spec"]["holderIdentity"], renew_time="t",
                acquire_time=None, lease_duration_seconds=1, lease_transitions=0,
            ),
        )  # fmt: skip

    def replace_namespaced_lease(
        self, name: str, ns: str, body: dict[str, Any], _request_timeout: float = 0
    ) -> None:
        self._wait(_request_timeout)


class FakeWatchApi:
    """Serves pages and scripted watch streams; records what was asked."""

    def __init__(self, items: list[dict[str, Any]], page: int = 2, rv: str = "10") -> None:
        self.items, self.page, self.rv = items, page, rv
        self.lists: list[dict[str, str]] = []
        self.watches: list[dict[str, str]] = []
        self.streams: list[list[dict[str, Any]] | Exception] = []
        self.expire_continue = 0  # answer this many continued pages with 410

    def list_page(self, path: str, params: dict[str, str]) -> dict[str, Any]:
        self.lists.append(params)
        start = int(params.get("continue") or 0)
        if start and self.expire_continue:
            self.expire_continue -= 1
            raise client.Expired("continue token expired")
        chunk = self.items[start : start + self.page]
        more = start + self.page < len(self.items)
        meta = {
            "resourceVersion": self.rv,
            **({"continue": str(start + self.page)} if more else {}),
        }
        return {"items": chunk, "metadata": meta}

    def watch(self, path: str, params: dict[str, str]) -> Iterator[dict[str, Any]]:
        self.watches.append(params)
        if not self.streams:
            raise StopTest
        stream = self.streams.pop(0)
        if isinstance(stream, Exception):
            raise stream
        yield from stream


class StopTest(BaseException):
    """The fake ran out of scripted streams (not an Exception: the reflector retries those)."""
