"""kubectl as the e2e tests use it against the local cluster (`cluster` is the fixture's
testbed.cluster handle): read objects as JSON (`get_json`, `pod_of`, `jobs_of`,
`tuning_pods`), make them (`apply`, `create`), read a profile's condition or a pod's container
statuses, and wait for a pod to end (`ended`) or a profile to be Ready or Failed (`ready`)."""

from __future__ import annotations

import json
from typing import Any

import yaml

from testbed.poll import eventually


def get_json(cluster: Any, *args: str) -> Any:
    return json.loads(cluster.kubectl("get", *args, "-o", "json").stdout)


def apply(cluster: Any, namespace: str, *docs: dict[str, Any], check: bool = True) -> Any:
    return cluster.kubectl(
        "apply",
        "-n",
        namespace,
        "-f",
        "-",
        input="\n---\n".join(yaml.safe_dump(d) for d in docs),
        check=check,
    )


def create(cluster: Any, namespace: str, doc: dict[str, Any], check: bool = True) -> Any:
    return cluster.kubectl(
        "create", "-n", namespace, "-f", "-", input=yaml.safe_dump(doc), check=check
    )


def pod_of(cluster: Any, namespace: str, name: str) -> dict[str, Any]:
    return dict(get_json(cluster, "pod", "-n", namespace, name))


def jobs_of(cluster: Any, namespace: str, profile: str) -> list[dict[str, Any]]:
    items = get_json(
        cluster, "jobs", "-n", namespace, "-l", f"tunefleet.io/tuning-profile={profile}"
    )["items"]
    return list(items)


def tuning_pods(cluster: Any, namespace: str, profile: str) -> list[dict[str, Any]]:
    return list(
        get_json(cluster, "pods", "-n", namespace, "-l", f"tunefleet.io/tuning-profile={profile}")[
            "items"
        ]
    )


def events_about(cluster: Any, namespace: str, name: str, **fields: str) -> list[dict[str, Any]]:
    """The Events about the object `name` in `namespace`, with these fields (reason=...,
    type=...) as the API server selects them."""
    selector = ",".join([f"involvedObject.name={name}", *(f"{k}={v}" for k, v in fields.items())])
    items = get_json(cluster, "events", "-n", namespace, "--field-selector", selector)["items"]
    return list(items)


def condition(profile: dict[str, Any], type_: str) -> dict[str, Any]:
    return next(
        (c for c in (profile.get("status") or {}).get("conditions", []) if c["type"] == type_), {}
    )


def statuses(pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    st = pod.get("status") or {}
    return {
        c["name"]: c
        for c in (st.get("initContainerStatuses") or []) + (st.get("containerStatuses") or [])
    }


def ended(cluster: Any, namespace: str, name: str, what: str) -> dict[str, Any]:
    """The pod once it has run to its end (restartPolicy Never), Succeeded or Failed."""
    return dict(
        eventually(
            lambda: pod_of(cluster, namespace, name),
            lambda p: p["status"].get("phase") in ("Succeeded", "Failed"),
            what,
            timeout=120,
            interval=1,
        )
    )


def ready(cluster: Any, namespace: str, name: str, timeout: float = 180) -> dict[str, Any]:
    return dict(
        eventually(
            lambda: get_json(cluster, "tp", "-n", namespace, name),
            lambda p: (p.get("status") or {}).get("phase") in ("Ready", "Failed"),
            f"{name} Ready",
            timeout=timeout,
            interval=1,
        )
    )
