"""The few Kubernetes API calls the operator makes, with errors sorted for the reconciler.

Transient failures (timeouts, 5xx, 429, RBAC not yet in place) become kopf.TemporaryError
with a suggested delay; a request the API server refuses for good (422) becomes
kopf.PermanentError; "already exists" on a create is success. Nothing here decides policy.
"""

from __future__ import annotations

import concurrent.futures
import datetime
import functools
import json
import logging
from collections.abc import Callable, Iterator
from typing import Any, NoReturn, TypeVar, cast

import kopf
import kubernetes
import urllib3
from kubernetes.client.exceptions import ApiException

from tunefleet import GROUP, PLURAL, VERSION

log = logging.getLogger(__name__)
_api: kubernetes.client.ApiClient | None = None
T = TypeVar("T")

# Sized to the reconciler's workers plus the Event poster and the occasional scan, so that no
# request waits for (or discards) a pooled connection: urllib3's pool defaults to 5 x cores.
DEFAULT_POOL_SIZE = 16


class Gone(Exception):
    """The namespace or object is gone or going: nothing left to do for it."""


def login(pool_size: int = DEFAULT_POOL_SIZE) -> None:
    """In a pod use its ServiceAccount, elsewhere $KUBECONFIG (as kopf itself does)."""
    global _api
    config = kubernetes.client.Configuration()
    try:
        kubernetes.config.load_incluster_config(client_configuration=config)
    except kubernetes.config.ConfigException:
        kubernetes.config.load_kube_config(client_configuration=config)
    config.connection_pool_maxsize = pool_size
    _api = kubernetes.client.ApiClient(configuration=config)


def api() -> kubernetes.client.ApiClient:
    if _api is None:
        login()
    assert _api is not None
    return _api


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
            return kopf.TemporaryError(f"{what}: {message}", delay=30)
        if status in (401, 403):
            return kopf.TemporaryError(
                f"{what}: {status} {message} (if this is RBAC, compare the operator's "
                "ServiceAccount with charts/tunefleet/templates/rbac.yaml)",
                delay=30,
            )
        if status == 422:
            return kopf.PermanentError(f"{what}: the API server refused it: {message}")
        if status in (408, 409, 429) or status >= 500:
            return kopf.TemporaryError(f"{what}: {status} {message}", delay=5)
        return cast(Exception, e)
    if isinstance(e, urllib3.exceptions.HTTPError | OSError):
        return kopf.TemporaryError(f"{what}: {e}", delay=5)
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


def _json(resp: Any) -> Any:
    return json.loads(resp.data)


def create_if_missing(obj: dict[str, Any]) -> bool:
    """Create a namespaced Job or ConfigMap; False when one of that name already exists.

    Names are deterministic per (profile incarnation, model, revision), so an existing one is
    the one we made earlier: that is success, not an error.
    """
    meta = obj["metadata"]
    ns, name, kind = meta["namespace"], meta["name"], obj["kind"]
    if kind == "Job":
        batch = kubernetes.client.BatchV1Api(api())

        def create() -> Any:
            return batch.create_namespaced_job(ns, obj, _preload_content=False)
    elif kind == "ConfigMap":
        core = kubernetes.client.CoreV1Api(api())

        def create() -> Any:
            return core.create_namespaced_config_map(ns, obj, _preload_content=False)
    else:
        raise ValueError(f"create_if_missing does not handle {kind}")
    try:
        create()
    except ApiException as e:
        if e.status == 409:  # read before any translation: it means "done"
            return False
        reraise(f"creating {kind} {ns}/{name}", e)
    except (urllib3.exceptions.HTTPError, OSError) as e:
        reraise(f"creating {kind} {ns}/{name}", e)
    return True


def get_profile(namespace: str, name: str, timeout_s: float = 2.0) -> dict[str, Any] | None:
    """One TuningProfile as a plain dict, or None when it does not exist."""
    custom = kubernetes.client.CustomObjectsApi(api())
    try:
        resp = custom.get_namespaced_custom_object(
            GROUP,
            VERSION,
            namespace,
            PLURAL,
            name,
            _preload_content=False,
            _request_timeout=timeout_s,
        )
    except ApiException as e:
        if e.status == 404:
            return None
        raise
    profile: dict[str, Any] = _json(resp)
    return profile


def patch_profile_status(namespace: str, name: str, status: dict[str, Any]) -> None:
    custom = kubernetes.client.CustomObjectsApi(api())
    try:
        call(
            f"writing the status of TuningProfile {namespace}/{name}",
            lambda: custom.patch_namespaced_custom_object_status(
                GROUP,
                VERSION,
                namespace,
                PLURAL,
                name,
                {"status": status},
                _preload_content=False,
            ),
        )
    except ApiException as e:
        if e.status == 404:
            raise Gone(f"TuningProfile {namespace}/{name} is gone") from e
        raise


def patch_config_map(namespace: str, name: str, data: dict[str, str]) -> None:
    core = kubernetes.client.CoreV1Api(api())
    try:
        call(
            f"writing ConfigMap {namespace}/{name}",
            lambda: core.patch_namespaced_config_map(
                name, namespace, {"data": data}, _preload_content=False
            ),
        )
    except ApiException as e:
        if e.status != 404:  # gone with its Job: nothing left to tell
            raise


LIST_PAGE = 500  # objects per page of a startup list: bounded memory, few round trips


def list_all(
    kind: str, label_selector: str = "", namespace: str | None = None
) -> Iterator[dict[str, Any]]:
    """Every TuningProfile, Job or Pod (cluster-wide, or in one namespace), page by page."""
    if kind == "tuningprofiles":
        custom = kubernetes.client.CustomObjectsApi(api())

        def page(token: str | None) -> Any:
            extra = {"_continue": token} if token else {}
            if namespace:
                return custom.list_namespaced_custom_object(
                    GROUP, VERSION, namespace, PLURAL, limit=LIST_PAGE,
                    label_selector=label_selector, _preload_content=False, **extra,
                )  # fmt: skip
            return custom.list_cluster_custom_object(
                GROUP, VERSION, PLURAL, limit=LIST_PAGE, label_selector=label_selector,
                _preload_content=False, **extra,
            )  # fmt: skip
    else:
        client: Any = (
            kubernetes.client.BatchV1Api(api())
            if kind == "jobs"
            else kubernetes.client.CoreV1Api(api())
        )
        verb = {"jobs": "job", "pods": "pod"}[kind]

        def page(token: str | None) -> Any:
            extra = {"_continue": token} if token else {}
            args = {"label_selector": label_selector, "limit": LIST_PAGE, **extra}
            if namespace:
                fn = getattr(client, f"list_namespaced_{verb}")
                return fn(namespace, _preload_content=False, **args)
            fn = getattr(client, f"list_{verb}_for_all_namespaces")
            return fn(_preload_content=False, **args)

    token: str | None = None
    while True:
        resp = _json(call(f"listing {kind}", functools.partial(page, token)))
        yield from resp.get("items") or []
        token = (resp.get("metadata") or {}).get("continue")
        if not token:
            return


def count_nodes(label_selector: str) -> int:
    core = kubernetes.client.CoreV1Api(api())
    resp = call(
        "listing nodes",
        lambda: core.list_node(label_selector=label_selector, _preload_content=False),
    )
    return len(_json(resp)["items"])


def list_pods(namespace: str | None, label_selector: str) -> list[dict[str, Any]]:
    """Pods across all namespaces (None) or one, as plain dicts."""
    core = kubernetes.client.CoreV1Api(api())
    if namespace is None:
        resp = call(
            "listing pods",
            lambda: core.list_pod_for_all_namespaces(
                label_selector=label_selector, _preload_content=False
            ),
        )
    else:
        resp = call(
            f"listing pods in {namespace}",
            lambda: core.list_namespaced_pod(
                namespace, label_selector=label_selector, _preload_content=False
            ),
        )
    items: list[dict[str, Any]] = _json(resp)["items"]
    return items


def pod_events(namespace: str, pod_name: str) -> list[dict[str, Any]]:
    """The Events the kubelet and scheduler posted about one pod (why it can't start)."""
    core = kubernetes.client.CoreV1Api(api())
    resp = call(
        f"listing Events of pod {namespace}/{pod_name}",
        lambda: core.list_namespaced_event(
            namespace,
            field_selector=f"involvedObject.kind=Pod,involvedObject.name={pod_name}",
            _preload_content=False,
        ),
    )
    items: list[dict[str, Any]] = _json(resp)["items"]
    return items


# Events are posted off the request and reconcile paths, by a small pool of their own.
_events = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="events")


def post_event_soon(ref: dict[str, Any], type_: str, reason: str, message: str) -> None:
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
            kubernetes.client.CoreV1Api(api()).create_namespaced_event(
                meta["namespace"], body, _preload_content=False
            )
        except Exception as e:  # an Event is best effort by nature
            log.info(f"could not post Event {reason} on {meta['name']}: {e}")

    _events.submit(post)
