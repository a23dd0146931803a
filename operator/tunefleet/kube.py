"""The operator's own Kubernetes API calls: its profiles (read, status, finalizer), the
children it owns (create only when missing, patch, delete, each checked as ours), list pages
of what it follows, nodes as metadata, Events about a pod or Job, and the Event poster.
"Already exists" on a create is success when the object there is ours. Nothing here decides
policy.

They run over runtime/client.py (the connection, the fence, the error words: Temporary,
Permanent, Gone, Conflict, NotLeading, NotOurs), whose names are re-exported here so that the
domain says `kube.Gone`, `kube.call`.
"""

from __future__ import annotations

import datetime
import functools
import json
import logging
import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any

import kubernetes
import urllib3

from tunefleet import GROUP, PLURAL, VERSION, metrics
from tunefleet.runtime.client import (
    LIST_PAGE,
    LIST_TIMEOUT,
    META_LIST,
    META_WATCH,
    REQUEST_TIMEOUT,
    Client,
    Conflict,
    Gone,
    NotLeading,
    NotOurs,
    Permanent,
    Temporary,
    _json,
    api_message,
    call,
    call_or,
    encoded_json,
    pages,
    release,
    reraise,
    translate,
)

# What the domain reaches through kube (the rest of runtime/client.py is imported from there:
# a constant re-exported here would be a copy, and patching the copy would change nothing).
__all__ = [
    "LIST_PAGE", "LIST_TIMEOUT", "REQUEST_TIMEOUT", "Conflict", "Gone", "Kube", "NotLeading",
    "NotOurs", "Permanent", "Temporary", "api_message", "call", "release", "reraise",
    "translate",
]  # fmt: skip

log = logging.getLogger(__name__)


class _Poster:
    """Events are posted off the request and reconcile paths, by two threads of their own,
    from a bounded queue: past EVENT_QUEUE waiting, a new Event is dropped and counted, as
    client-go's recorder does (Events are best effort; a burst of 10,000 profiles must not
    queue 20,000 API writes behind the ones that make Jobs, nor hold them all in memory)."""

    def __init__(self, workers: int = 2, size: int = 1000) -> None:
        self.queue: queue.Queue[Callable[[], None]] = queue.Queue(maxsize=size)
        self.workers, self._started, self._lock = workers, False, threading.Lock()
        self.dropped = 0

    def submit(self, post: Callable[[], None]) -> None:
        with self._lock:
            if not self._started:
                for i in range(self.workers):
                    threading.Thread(target=self._run, name=f"events-{i}", daemon=True).start()
                self._started = True
        try:
            self.queue.put_nowait(post)
        except queue.Full:
            metrics.EVENTS_DROPPED.inc()
            self.dropped += 1
            if self.dropped % 1000 == 1:
                log.info(f"{self.dropped} Event(s) dropped so far: {self.queue.maxsize} waiting")

    def _run(self) -> None:
        while True:
            post = self.queue.get()
            try:
                post()
            except Exception:  # post() logs its own failures; this is a bug, not a stop
                log.exception("posting an Event failed")


def _controller_uid(obj: dict[str, Any]) -> str:
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller"):
            return str(ref.get("uid") or "")
    return ""


def _owner_name(obj: dict[str, Any]) -> str:
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller"):
            return str(ref.get("name") or "")
    return ""


class Kube(Client):
    """The operator's one client object, made once at start-up (handlers/startup.py) and
    handed to the controller, delivery, capture, the node maps and the webhook: the
    connection and the leader's fence (runtime/client.Client), the Event poster, and the
    operator's own calls below. Nothing reaches the API server around it; unit tests hand
    the code a tests/support/fake_kube.FakeKube instead."""

    def __init__(self, api: kubernetes.client.ApiClient | None = None) -> None:
        super().__init__(api)
        self._events = _Poster()
        self._minor: int | None = None

    def get_profile(
        self, namespace: str, name: str, timeout_s: float = 2.0
    ) -> dict[str, Any] | None:
        """One TuningProfile as a plain dict, or None when it does not exist."""
        custom = self.custom()
        resp, missing = call_or(
            f"reading TuningProfile {namespace}/{name}",
            lambda: custom.get_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, name,
                _preload_content=False, _request_timeout=timeout_s,
            ),
            (404,),
        )  # fmt: skip
        if missing:
            return None
        profile: dict[str, Any] = _json(resp)
        return profile

    def remove_profile_finalizer(
        self, namespace: str, name: str, uid: str, finalizers: list[str], finalizer: str
    ) -> None:
        """Take one finalizer off a profile: a JSON patch that holds only if the profile is still
        the one seen (uid) and the finalizer still where it was seen."""
        index = finalizers.index(finalizer)
        ops = [
            {"op": "test", "path": "/metadata/uid", "value": uid},
            {"op": "test", "path": f"/metadata/finalizers/{index}", "value": finalizer},
            {"op": "remove", "path": f"/metadata/finalizers/{index}"},
        ]
        api = self.api()
        # 404 or 422: gone, or it changed since; the next event says what is.
        resp, _ = call_or(
            f"removing finalizer {finalizer} from TuningProfile {namespace}/{name}",
            lambda: api.call_api(
                f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}/{name}", "PATCH",
                header_params={"Content-Type": "application/json-patch+json",
                               "Accept": "application/json"},
                body=ops, auth_settings=["BearerToken"], _preload_content=False,
                _return_http_data_only=True, _request_timeout=self.write_timeout(),
            ),
            (404, 422),
        )  # fmt: skip
        release(resp)

    def replace_profile_status(
        self, namespace: str, name: str, resource_version: str, status: dict[str, Any]
    ) -> str:
        """Write the whole status, refereed by the API server: only over the version it was
        computed from (Conflict otherwise), and fields it no longer has are gone. Returns the new
        resourceVersion."""
        custom = self.custom()
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "TuningProfile",
            "metadata": {"name": name, "namespace": namespace, "resourceVersion": resource_version},
            "status": status,
        }
        what = f"writing the status of TuningProfile {namespace}/{name}"
        resp, refused = call_or(
            what,
            lambda: custom.replace_namespaced_custom_object_status(
                GROUP, VERSION, namespace, PLURAL, name, encoded_json(body),
                _preload_content=False, _request_timeout=self.write_timeout(),
            ),
            (404, 409),
        )  # fmt: skip
        if refused == 404:
            raise Gone(f"TuningProfile {namespace}/{name} is gone")
        if refused == 409:
            raise Conflict(f"{what}: it changed since it was read")
        return str(((_json(resp).get("metadata")) or {}).get("resourceVersion") or "")

    def list_all(
        self, kind: str, label_selector: str = "", namespace: str | None = None
    ) -> Iterator[dict[str, Any]]:
        """Every TuningProfile, Job, Pod or ConfigMap (cluster-wide, or in one namespace), page
        by page."""
        if kind == "tuningprofiles":
            custom = self.custom()

            def page(token: str) -> Any:
                extra = {"_continue": token} if token else {}
                if namespace:
                    return custom.list_namespaced_custom_object(
                        GROUP, VERSION, namespace, PLURAL, limit=LIST_PAGE,
                        label_selector=label_selector, _preload_content=False,
                        _request_timeout=LIST_TIMEOUT, **extra,
                    )  # fmt: skip
                return custom.list_cluster_custom_object(
                    GROUP, VERSION, PLURAL, limit=LIST_PAGE, label_selector=label_selector,
                    _preload_content=False, _request_timeout=LIST_TIMEOUT, **extra,
                )  # fmt: skip
        else:
            client: Any = self.batch() if kind == "jobs" else self.core()
            verb = {"jobs": "job", "pods": "pod", "configmaps": "config_map"}[kind]

            def page(token: str) -> Any:
                extra = {"_continue": token} if token else {}
                args = {
                    "label_selector": label_selector,
                    "limit": LIST_PAGE,
                    "_request_timeout": LIST_TIMEOUT,
                    **extra,
                }
                if namespace:
                    fn = getattr(client, f"list_namespaced_{verb}")
                    return fn(namespace, _preload_content=False, **args)
                fn = getattr(client, f"list_{verb}_for_all_namespaces")
                return fn(_preload_content=False, **args)

        def fetch(token: str) -> dict[str, Any]:
            got: dict[str, Any] = _json(call(f"listing {kind}", functools.partial(page, token)))
            return got

        for listed in pages(fetch):
            yield from listed.get("items") or []

    def list_nodes(self, label_selector: str) -> list[dict[str, Any]]:
        core = self.core()
        resp = call(
            "listing nodes",
            lambda: core.list_node(
                label_selector=label_selector,
                _preload_content=False,
                _request_timeout=REQUEST_TIMEOUT,
            ),
        )
        items: list[dict[str, Any]] = _json(resp).get("items") or []
        return items

    def count_nodes(self, label_selector: str) -> int:
        return len(self.list_nodes(label_selector))

    def node_runtimes(self, label_selector: str) -> dict[str, str]:
        """Each labelled node's container runtime, as its kubelet reports it
        (status.nodeInfo.containerRuntimeVersion, e.g. containerd://2.4.2)."""
        return {
            str((n.get("metadata") or {}).get("name")): str(
                ((n.get("status") or {}).get("nodeInfo") or {}).get("containerRuntimeVersion") or ""
            )
            for n in self.list_nodes(label_selector)
        }

    def server_minor(self) -> int:
        """The API server's minor version (1.36 -> 36); 0 when it says none we can read.
        Read once: a server upgrade restarts nothing here, and the image-volume check that
        asks only needs a lower bound."""
        if self._minor is None:
            info = call(
                "reading the API server's version",
                lambda: kubernetes.client.VersionApi(self.api()).get_code(),
            )
            digits = "".join(ch for ch in str(getattr(info, "minor", "")) if ch.isdigit())
            self._minor = int(digits) if digits else 0
        return self._minor

    def list_pods(self, namespace: str | None, label_selector: str) -> list[dict[str, Any]]:
        """Pods across all namespaces (None) or one, as plain dicts."""
        core = self.core()
        if namespace is None:
            resp = call(
                "listing pods",
                lambda: core.list_pod_for_all_namespaces(
                    label_selector=label_selector,
                    _preload_content=False,
                    _request_timeout=LIST_TIMEOUT,
                ),
            )
        else:
            resp = call(
                f"listing pods in {namespace}",
                lambda: core.list_namespaced_pod(
                    namespace,
                    label_selector=label_selector,
                    _preload_content=False,
                    _request_timeout=LIST_TIMEOUT,
                ),
            )
        items: list[dict[str, Any]] = _json(resp)["items"]
        return items

    def events_about(self, kind: str, namespace: str, name: str) -> list[dict[str, Any]]:
        """The Events posted about one object: the kubelet's and scheduler's about a Pod (why it
        can't start), the Job controller's about a Job (why it cannot make its pods)."""
        core = self.core()
        resp = call(
            f"listing Events of {kind} {namespace}/{name}",
            lambda: core.list_namespaced_event(
                namespace,
                field_selector=f"involvedObject.kind={kind},involvedObject.name={name}",
                _preload_content=False,
                _request_timeout=REQUEST_TIMEOUT,
            ),
        )
        items: list[dict[str, Any]] = _json(resp)["items"]
        return items

    def pod_events(self, namespace: str, pod_name: str) -> list[dict[str, Any]]:
        return self.events_about("Pod", namespace, pod_name)

    def job_events(self, namespace: str, job_name: str) -> list[dict[str, Any]]:
        return self.events_about("Job", namespace, job_name)

    def post_event_soon(self, ref: dict[str, Any], type_: str, reason: str, message: str) -> None:
        """Post a core/v1 Event about `ref` in the background; losing one is only logged."""

        def post() -> None:
            meta = ref["metadata"]
            now = datetime.datetime.now(datetime.UTC)
            body = {
                "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
                "involvedObject": {
                    "apiVersion": ref["apiVersion"],
                    "kind": ref["kind"],
                    "name": meta["name"],
                    "namespace": meta["namespace"],
                    "uid": meta.get("uid"),
                },
                "type": type_,
                "reason": reason,
                "message": message[:1024],
                "source": {"component": "tunefleet"},
                "reportingComponent": "tunefleet.io/operator",
                "firstTimestamp": now.isoformat(),
                "lastTimestamp": now.isoformat(),
                "count": 1,
            }
            try:
                release(
                    self.core().create_namespaced_event(
                        meta["namespace"], body, _preload_content=False,
                        _request_timeout=self.write_timeout(),
                    )
                )  # fmt: skip
            except NotLeading:
                return  # the new leader says what needs saying
            except Exception as e:  # an Event is best effort by nature
                log.info(f"could not post Event {reason} on {meta['name']}: {e}")

        self._events.submit(post)

    def cluster_uid(self) -> str:
        """This cluster's name in the fleet (fleet/): the kube-system namespace's uid, which
        every cluster has, no two share, and no operator restart or upgrade changes."""
        core = self.core()
        resp = call(
            "reading namespace kube-system (the cluster's uid)",
            lambda: core.read_namespace(
                "kube-system", _preload_content=False, _request_timeout=REQUEST_TIMEOUT
            ),
        )
        uid = str((_json(resp).get("metadata") or {}).get("uid") or "")
        if not uid:
            raise Permanent("namespace kube-system has no uid")
        return uid

    def read_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        """One Job as a plain dict, or None when it does not exist."""
        batch = self.batch()
        resp, missing = call_or(
            f"reading Job {namespace}/{name}",
            lambda: batch.read_namespaced_job(
                name, namespace, _preload_content=False, _request_timeout=REQUEST_TIMEOUT
            ),
            (404,),
        )
        if missing:
            return None
        job: dict[str, Any] = _json(resp)
        return job

    def read_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        """One pod as a plain dict, or None when it does not exist."""
        core = self.core()
        resp, missing = call_or(
            f"reading Pod {namespace}/{name}",
            lambda: core.read_namespaced_pod(
                name, namespace, _preload_content=False, _request_timeout=REQUEST_TIMEOUT
            ),
            (404,),
        )
        if missing:
            return None
        pod: dict[str, Any] = _json(resp)
        return pod

    def review_token(self, token: str, audience: str) -> dict[str, Any]:
        """The API server's TokenReview of a bearer token for `audience`: its status."""
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": {"token": token, "audiences": [audience]},
        }
        resp = self.authentication().create_token_review(
            body, _preload_content=False, _request_timeout=REQUEST_TIMEOUT
        )
        status: dict[str, Any] = _json(resp).get("status") or {}
        return status

    def list_custom(
        self,
        group: str,
        versions: tuple[str, ...],
        namespace: str,
        plural: str,
        label_selector: str,
    ) -> list[dict[str, Any]] | None:
        """Custom objects of another project (Kueue's Workloads) in one namespace, in the first
        of `versions` (newest first) the API server serves; None when it serves none (the
        project is not installed)."""
        custom = self.custom()
        for version in versions:
            resp, unserved = call_or(
                f"listing {plural} in {namespace}",
                functools.partial(
                    custom.list_namespaced_custom_object,
                    group, version, namespace, plural, label_selector=label_selector,
                    _preload_content=False, _request_timeout=REQUEST_TIMEOUT,
                ),
                (404,),  # this version (or the project) is not served
            )  # fmt: skip
            if not unserved:
                items: list[dict[str, Any]] = _json(resp).get("items") or []
                return items
        return None

    # --- owned objects -------------------------------------------------------------------

    def _client_for(self, kind: str) -> tuple[Any, str]:
        if kind == "Job":
            return self.batch(), "job"
        if kind == "ConfigMap":
            return self.core(), "config_map"
        raise ValueError(f"no client for {kind}")

    def read(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        client, verb = self._client_for(kind)
        fn = getattr(client, f"read_namespaced_{verb}")
        resp, missing = call_or(
            f"reading {kind} {namespace}/{name}",
            lambda: fn(name, namespace, _preload_content=False, _request_timeout=REQUEST_TIMEOUT),
            (404,),
        )
        if missing:
            return None
        found: dict[str, Any] = _json(resp)
        return found

    def create_owned(self, obj: dict[str, Any]) -> dict[str, Any] | None:
        """Create a Job or ConfigMap controlled by its (first) owner reference. Returns what the
        API server made, or None when one of that name is already there and controlled by the same
        owner (names are deterministic: an earlier reconcile made it). Raises NotOurs when the one
        there is someone else's (a forged object under our name must never be taken for ours)."""
        meta = obj["metadata"]
        ns, name, kind = meta["namespace"], meta["name"], obj["kind"]
        owner = _controller_uid(obj)
        client, verb = self._client_for(kind)
        fn = getattr(client, f"create_namespaced_{verb}")
        resp, exists = call_or(
            f"creating {kind} {ns}/{name}",
            lambda: fn(
                ns,
                encoded_json(obj),
                _preload_content=False,
                _request_timeout=self.write_timeout(),
            ),
            (409,),
        )
        if exists:
            there = self.read(kind, ns, name)
            if there is None or _controller_uid(there) == owner:
                return None
            raise NotOurs(
                f"{kind} {ns}/{name} exists but is not controlled by TuningProfile "
                f"{_owner_name(obj)} (uid {owner}): it is not used; delete it "
                f"(kubectl delete {kind.lower()} -n {ns} {name}) so tunefleet can make its own"
            )
        made: dict[str, Any] = _json(resp)
        return made

    def patch_owned(
        self, kind: str, namespace: str, name: str, owner_uid: str, patch: dict[str, Any]
    ) -> bool:
        """Merge-patch an object only if it is controlled by owner_uid, and only the version that
        was checked (its resourceVersion in the patch: a 409 if it changed meanwhile). False when
        it is gone or not ours; it is then left alone."""
        there = self.read(kind, namespace, name)
        if there is None or _controller_uid(there) != owner_uid:
            if there is not None:
                log.warning(
                    f"not patching {kind} {namespace}/{name}: not controlled by {owner_uid}"
                )
            return False
        rv = there["metadata"]["resourceVersion"]
        body = {**patch, "metadata": {**(patch.get("metadata") or {}), "resourceVersion": rv}}
        client, verb = self._client_for(kind)
        fn = getattr(client, f"patch_namespaced_{verb}")
        resp, gone = call_or(
            f"writing {kind} {namespace}/{name}",
            lambda: fn(
                name, namespace, body, _preload_content=False,
                _request_timeout=self.write_timeout(),
            ),
            (404,),
        )  # fmt: skip
        release(resp)
        return not gone

    def delete_owned(self, kind: str, namespace: str, name: str, uid: str) -> None:
        """Delete exactly the object seen (its uid as a precondition), pods of a Job with it."""
        client, verb = self._client_for(kind)
        fn = getattr(client, f"delete_namespaced_{verb}")
        body = kubernetes.client.V1DeleteOptions(
            propagation_policy="Background",
            preconditions=kubernetes.client.V1Preconditions(uid=uid),
        )
        # 404 or 409: gone, or another object of that name now: not ours to delete.
        resp, _ = call_or(
            f"deleting {kind} {namespace}/{name}",
            lambda: fn(
                name, namespace, body=body, _preload_content=False,
                _request_timeout=self.write_timeout(),
            ),
            (404, 409),
        )  # fmt: skip
        release(resp)

    # --- nodes, as metadata only (the node map: placement/nodemap_keeper.py) -------------

    def _get_nodes(self, query: dict[str, Any], accept: str, timeout: Any) -> Any:
        """GET /api/v1/nodes with our own Accept (the generated client replaces any given)."""
        return self.api().call_api(
            "/api/v1/nodes",
            "GET",
            query_params=[(k, v) for k, v in query.items() if v not in (None, "")],
            header_params={"Accept": accept},
            auth_settings=["BearerToken"],
            _return_http_data_only=True,
            _preload_content=False,
            _request_timeout=timeout,
        )

    def list_node_metadata(self, label_selector: str) -> tuple[list[dict[str, Any]], str]:
        """Every node with the label (selector), metadata only, page by page; and the list's
        resourceVersion to watch from."""

        def fetch(token: str) -> dict[str, Any]:
            query = {"labelSelector": label_selector, "limit": LIST_PAGE, "continue": token}
            page = functools.partial(self._get_nodes, query, META_LIST, LIST_TIMEOUT)
            got: dict[str, Any] = _json(call("listing nodes", page))
            return got

        items: list[dict[str, Any]] = []
        version = ""
        for listed in pages(fetch):
            items += listed.get("items") or []
            version = str((listed.get("metadata") or {}).get("resourceVersion") or "")
        return items, version

    def watch_node_metadata(
        self, label_selector: str, resource_version: str, timeout_s: int
    ) -> Iterator[dict[str, Any]]:
        """Watch events ({type, object}) of nodes with the label, metadata only, from
        resource_version, for about timeout_s (the server ends the watch; bookmarks keep the
        version fresh). An ERROR event carries a Status (410: the version is too old, list
        again)."""
        query = {
            "labelSelector": label_selector,
            "watch": "true",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(timeout_s),
        }
        # No read may stall longer than a bookmark interval (about a minute) plus slack.
        resp = call(
            "watching nodes",
            lambda: self._get_nodes(query, META_WATCH, (REQUEST_TIMEOUT, timeout_s + 90)),
        )
        try:
            for line in kubernetes.watch.watch.iter_resp_lines(resp):
                if line:
                    yield json.loads(line)
        except (urllib3.exceptions.HTTPError, OSError) as e:
            reraise("watching nodes", e)
        finally:
            resp.release_conn()

    def create_config_map(self, obj: dict[str, Any]) -> dict[str, Any] | None:
        """Create a ConfigMap; None when one of that name exists (the caller reads and judges
        it)."""
        meta = obj["metadata"]
        core = self.core()
        resp, exists = call_or(
            f"creating ConfigMap {meta['namespace']}/{meta['name']}",
            lambda: core.create_namespaced_config_map(
                meta["namespace"], obj, _preload_content=False,
                _request_timeout=self.write_timeout(),
            ),
            (409,),
        )  # fmt: skip
        if exists:
            return None
        made: dict[str, Any] = _json(resp)
        return made

    def patch_config_map(
        self, namespace: str, name: str, resource_version: str, patch: dict[str, Any]
    ) -> dict[str, Any] | None:
        """Merge-patch the version that was read (Conflict if it changed since); None when gone."""
        core = self.core()
        meta = {**(patch.get("metadata") or {}), "resourceVersion": resource_version}
        what = f"writing ConfigMap {namespace}/{name}"
        resp, refused = call_or(
            what,
            lambda: core.patch_namespaced_config_map(
                name, namespace, {**patch, "metadata": meta},
                _preload_content=False, _request_timeout=self.write_timeout(),
            ),
            (404, 409),
        )  # fmt: skip
        if refused == 404:
            return None
        if refused == 409:
            raise Conflict(f"{what}: it changed since it was read")
        found: dict[str, Any] = _json(resp)
        return found
