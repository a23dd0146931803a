"""The few Kubernetes API calls the handlers make, with errors sorted for kopf.

Transient failures (timeouts, 5xx, 429, RBAC not yet in place) become kopf.TemporaryError so
kopf retries with a delay; nothing here decides policy.
"""

from __future__ import annotations

import concurrent.futures
import datetime
import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import kopf
import kubernetes
import urllib3
from kubernetes.client.exceptions import ApiException

from tunefleet import GROUP, PLURAL, VERSION, naming

log = logging.getLogger(__name__)
_api: kubernetes.client.ApiClient | None = None


def login() -> None:
    """In a pod use its ServiceAccount, elsewhere $KUBECONFIG (as kopf itself does)."""
    global _api
    try:
        kubernetes.config.load_incluster_config()
    except kubernetes.config.ConfigException:
        kubernetes.config.load_kube_config()
    _api = kubernetes.client.ApiClient()


def api() -> kubernetes.client.ApiClient:
    if _api is None:
        login()
    assert _api is not None
    return _api


@contextmanager
def transient(what: str) -> Iterator[None]:
    try:
        yield
    except ApiException as e:
        if e.status in (401, 403):
            # Also returned for a namespace being deleted; the API's own words tell which.
            raise kopf.TemporaryError(
                f"{what}: {e.status} {_api_message(e)} (if this is RBAC, compare the "
                "operator's ServiceAccount with charts/tunefleet/templates/rbac.yaml)",
                delay=30,
            ) from e
        if e.status in (408, 409, 429) or (e.status or 0) >= 500:
            raise kopf.TemporaryError(f"{what}: {e.status} {e.reason}", delay=10) from e
        raise
    except (urllib3.exceptions.HTTPError, OSError) as e:
        raise kopf.TemporaryError(f"{what}: {e}", delay=10) from e


def _api_message(e: ApiException) -> str:
    try:
        return str(json.loads(e.body or "{}").get("message") or e.reason)
    except ValueError:
        return str(e.reason)


def _json(resp: Any) -> Any:
    return json.loads(resp.data)


def create_job_if_missing(job: dict[str, Any]) -> bool:
    """Create the Job; False when it already exists (the deterministic name says it's ours)."""
    batch = kubernetes.client.BatchV1Api(api())
    ns, name = job["metadata"]["namespace"], job["metadata"]["name"]
    try:
        with transient(f"creating Job {ns}/{name}"):
            batch.create_namespaced_job(ns, job)
    except ApiException as e:
        if e.status == 409:
            return False
        raise
    return True


def list_jobs(namespace: str, uid: str) -> list[dict[str, Any]]:
    batch = kubernetes.client.BatchV1Api(api())
    with transient(f"listing Jobs in {namespace}"):
        resp = batch.list_namespaced_job(
            namespace,
            label_selector=f"{naming.PROFILE_UID_LABEL}={uid}",
            _preload_content=False,
        )
    items: list[dict[str, Any]] = _json(resp)["items"]
    return items


def job_pods(namespace: str, job_uid: str) -> list[dict[str, Any]]:
    core = kubernetes.client.CoreV1Api(api())
    with transient(f"listing pods in {namespace}"):
        resp = core.list_namespaced_pod(
            namespace,
            label_selector=f"batch.kubernetes.io/controller-uid={job_uid}",
            _preload_content=False,
        )
    items: list[dict[str, Any]] = _json(resp)["items"]
    return items


def get_profile(namespace: str, name: str) -> dict[str, Any] | None:
    custom = kubernetes.client.CustomObjectsApi(api())
    try:
        with transient(f"reading TuningProfile {namespace}/{name}"):
            resp = custom.get_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, name, _preload_content=False
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
        with transient(f"writing the status of TuningProfile {namespace}/{name}"):
            custom.patch_namespaced_custom_object_status(
                GROUP, VERSION, namespace, PLURAL, name, {"status": status}
            )
    except ApiException as e:
        if e.status == 404:
            return  # deleted meanwhile: nothing left to report on
        raise


# Admission must answer in milliseconds: Events about it are posted off the request path.
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
            "firstTimestamp": now.isoformat(),
            "lastTimestamp": now.isoformat(),
            "count": 1,
        }
        try:
            kubernetes.client.CoreV1Api(api()).create_namespaced_event(meta["namespace"], body)
        except Exception as e:  # an Event is best effort by nature
            log.warning(f"could not post Event {reason} on {meta['name']}: {e}")

    _events.submit(post)
