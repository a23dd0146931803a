"""The plugin's API server access: kubeconfig as kubectl reads it, a few reads, errors as one
line each. Objects come back as plain dicts shaped like `kubectl get -o json`."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from typing import Any, TypeVar

import urllib3
from kubernetes.client.exceptions import ApiException

from tunefleet import GROUP, KIND, PLURAL, VERSION
from tunefleet.runtime.kubeconfig import KubeconfigError
from tunefleet.runtime.kubeconfig import connect as kubeconfig_connect

from .errors import PluginError

T = TypeVar("T")
REQUEST_TIMEOUT = (5, 30)  # (connect, read) seconds per request
# Read-change-write rounds before giving up on a profile that keeps changing under us: each
# lost round means another writer's change landed. Rounds after a conflict wait a random,
# growing while (full jitter, at most UPDATE_BACKOFF_MAX_S), so a hundred writers at once
# spread out instead of colliding again in lockstep.
UPDATE_ATTEMPTS = 64
UPDATE_BACKOFF_S = 0.02
UPDATE_BACKOFF_MAX_S = 1.0


def _message(e: ApiException) -> str:
    try:
        return str(json.loads(e.body or "{}").get("message") or e.reason)
    except (ValueError, AttributeError):
        return str(e.reason)


class _Conflict(Exception):
    """The API server refused a write made from a stale read (409 Conflict)."""


class Cluster:
    """Reads for one kubeconfig context."""

    def __init__(self, api: Any, namespace: str, host: str) -> None:
        self.api = api
        self.namespace = namespace  # the context's namespace, or -n
        self.host = host

    def _call(self, what: str, fn: Callable[[], T]) -> T | None:
        """Run one read; None when the object is not found, PluginError for the rest."""
        try:
            return fn()
        except ApiException as e:
            status = int(e.status or 0)
            if status == 404:
                return None
            if status == 401:
                raise PluginError(
                    f"the API server at {self.host} refused the credentials while reading "
                    f"{what} (401 Unauthorized): log in again or pick another --context"
                ) from None
            if status == 403:
                raise PluginError(
                    f"not allowed to read {what}: {_message(e)}: ask for read access "
                    "(get/list) to it, or use another --context"
                ) from None
            raise PluginError(
                f"reading {what} failed: {status} {_message(e)}: try again; if it persists, "
                "check the API server"
            ) from None
        except (urllib3.exceptions.HTTPError, OSError) as e:
            reason = getattr(e, "reason", None) or e
            raise PluginError(
                f"cannot reach the API server at {self.host} ({reason}): check --kubeconfig/"
                "--context and that the cluster is up"
            ) from None

    def _get(self, what: str, path: str, query: list[tuple[str, str]] | None = None) -> Any:
        def call() -> Any:
            resp = self.api.call_api(
                path,
                "GET",
                query_params=query or [],
                header_params={"Accept": "application/json"},
                auth_settings=["BearerToken"],
                _return_http_data_only=True,
                _preload_content=False,
                _request_timeout=REQUEST_TIMEOUT,
            )
            return json.loads(resp.data)

        return self._call(what, call)

    def profile(self, namespace: str, name: str) -> dict[str, Any] | None:
        got = self._get(
            f"{KIND} {namespace}/{name}",
            f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}/{name}",
        )
        return dict(got) if got is not None else None

    def update_profile(
        self,
        namespace: str,
        name: str,
        change: Callable[[dict[str, Any]], tuple[T, dict[str, Any] | None]],
    ) -> tuple[T, dict[str, Any]] | None:
        """Read the profile, ask `change` for (result, merge patch) and write the patch with the
        resourceVersion it was computed from; when another writer got there first (409), read
        and change again. Two on-call engineers pinning two GPU models at once both land: a
        patch of the one annotation computed from a stale read would drop the other's pin.
        None when the profile does not exist; (result, profile as written or as read when the
        patch is None)."""
        what = f"{KIND} {namespace}/{name}"
        for attempt in range(UPDATE_ATTEMPTS):
            if attempt:
                cap = min(UPDATE_BACKOFF_MAX_S, UPDATE_BACKOFF_S * 2 ** min(attempt, 16))
                time.sleep(random.uniform(0, cap))
            profile = self.profile(namespace, name)
            if profile is None:
                return None
            result, patch = change(profile)
            if patch is None:
                return result, profile
            version = (profile.get("metadata") or {}).get("resourceVersion")
            fenced = {**patch, "metadata": {**(patch.get("metadata") or {}),
                                            "resourceVersion": version}}  # fmt: skip
            try:
                written = self.patch_profile(namespace, name, fenced)
            except _Conflict:
                continue
            if written is None:
                return None
            return result, written
        raise PluginError(
            f"{what} changed {UPDATE_ATTEMPTS} times while this command tried to write it: "
            "someone else is writing it in a loop; try again"
        )

    def patch_profile(
        self, namespace: str, name: str, patch: dict[str, Any]
    ) -> dict[str, Any] | None:
        """Merge-patch a TuningProfile (metadata only, here); None when it does not exist.
        A patch that carries metadata.resourceVersion raises _Conflict when the profile has
        moved on since (the API server's precondition)."""
        what = f"{KIND} {namespace}/{name}"

        def call() -> Any:
            resp = self.api.call_api(
                f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}/{name}",
                "PATCH",
                body=patch,
                header_params={
                    "Accept": "application/json",
                    "Content-Type": "application/merge-patch+json",
                },
                auth_settings=["BearerToken"],
                _return_http_data_only=True,
                _preload_content=False,
                _request_timeout=REQUEST_TIMEOUT,
            )
            return json.loads(resp.data)

        def guarded() -> Any:
            try:
                return call()
            except ApiException as e:
                if int(e.status or 0) == 409:
                    raise _Conflict(what) from None
                raise

        try:
            got = self._call(what, guarded)
        except PluginError as e:
            if "not allowed to read" in str(e):
                raise PluginError(
                    f"not allowed to annotate {what}: ask for patch access to tuningprofiles "
                    "(or annotate it yourself: kubectl annotate tp ...)"
                ) from None
            raise
        return dict(got) if got is not None else None

    def pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        got = self._get(f"Pod {namespace}/{name}", f"/api/v1/namespaces/{namespace}/pods/{name}")
        return dict(got) if got is not None else None

    def deployments(self, namespace: str | None, selector: str) -> list[dict[str, Any]]:
        """Deployments with these labels, in one namespace or (None) in every namespace."""
        if namespace is None:
            what, path = "Deployments in all namespaces", "/apis/apps/v1/deployments"
        else:
            what = f"Deployments in namespace {namespace}"
            path = f"/apis/apps/v1/namespaces/{namespace}/deployments"
        got = self._get(what, path, [("labelSelector", selector)])
        return list((got or {}).get("items") or [])

    def profile_events(self, profile: dict[str, Any]) -> list[dict[str, Any]]:
        """The core/v1 Events about this profile (this incarnation: same uid)."""
        meta = profile.get("metadata") or {}
        ns, name, uid = meta.get("namespace", ""), meta.get("name", ""), meta.get("uid")
        selector = f"involvedObject.kind={KIND},involvedObject.name={name}"
        got = self._get(
            f"Events of {KIND} {ns}/{name}",
            f"/api/v1/namespaces/{ns}/events",
            [("fieldSelector", selector)],
        )
        items = list((got or {}).get("items") or [])
        return [
            e
            for e in items
            if not uid or (e.get("involvedObject") or {}).get("uid") in (None, "", uid)
        ]


def connect(kubeconfig: str | None, context: str | None, namespace: str | None) -> Cluster:
    """A Cluster for the kubeconfig and context as kubectl finds them (runtime/kubeconfig.py);
    in a pod without one, its ServiceAccount."""
    try:
        found = kubeconfig_connect(kubeconfig, context)
    except KubeconfigError as e:
        raise PluginError(str(e)) from None
    return Cluster(found.api, namespace or found.namespace, found.host)
