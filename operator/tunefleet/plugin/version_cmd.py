"""`kubectl tunefleet version`: this client's release and the operator's, read from the cluster.

The operator's release is the `app.kubernetes.io/version` label the chart puts on each replica
slot's Deployment (the chart's appVersion, the tag of its default image); a Deployment without
it (a hand-made one) is read by its operator container's image tag. Deployments are grouped by
release (namespace and `app.kubernetes.io/instance`): a cluster may run several releases on
disjoint namespaces, and during `helm upgrade` a release's slots may say two versions.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tunefleet import __version__

NAME_LABEL = "app.kubernetes.io/name"
INSTANCE_LABEL = "app.kubernetes.io/instance"
VERSION_LABEL = "app.kubernetes.io/version"
SELECTOR = f"{NAME_LABEL}=tunefleet"
INSTALL = "helm install tunefleet charts/tunefleet -n tunefleet-system --create-namespace"


def image_tag(image: str) -> str:
    """The tag of an image reference ("" for none, or a reference by digest only)."""
    name = image.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    return last.rsplit(":", 1)[1] if ":" in last else ""


def _operator_image(deployment: dict[str, Any]) -> str:
    containers = ((deployment.get("spec") or {}).get("template") or {}).get("spec") or {}
    listed = list(containers.get("containers") or [])
    chosen = next((c for c in listed if c.get("name") == "operator"), listed[0] if listed else {})
    return str(chosen.get("image") or "")


def version_report(
    deployments: Iterable[dict[str, Any]], namespace: str | None = None
) -> dict[str, Any]:
    """The client's version and one entry per operator release found. `namespace`: where the
    Deployments were looked for (None: every namespace)."""
    releases: dict[tuple[str, str], dict[str, Any]] = {}
    for d in deployments:
        meta = d.get("metadata") or {}
        if meta.get("deletionTimestamp"):
            continue
        labels = meta.get("labels") or {}
        ns = str(meta.get("namespace") or "")
        release = str(labels.get(INSTANCE_LABEL) or meta.get("name") or "")
        image = _operator_image(d)
        version = str(labels.get(VERSION_LABEL) or image_tag(image) or "unknown")
        entry = releases.setdefault(
            (ns, release),
            {
                "namespace": ns,
                "release": release,
                "versions": [],
                "images": [],
                "deployments": [],
                "replicas": 0,
                "ready": 0,
            },
        )
        entry["deployments"].append(str(meta.get("name") or ""))
        for key, value in (("versions", version), ("images", image)):
            if value and value not in entry[key]:
                entry[key].append(value)
        spec, status = d.get("spec") or {}, d.get("status") or {}
        entry["replicas"] += int(spec.get("replicas", 1) or 0)
        entry["ready"] += int(status.get("readyReplicas") or 0)
    operators = [releases[k] for k in sorted(releases)]
    for op in operators:
        op["versions"].sort()
        op["images"].sort()
        op["deployments"].sort()
    return {
        "client": {"version": __version__},
        "operators": operators,
        "searched": namespace or "*",
    }


def format_version(report: dict[str, Any]) -> str:
    lines = [f"Client:   kubectl-tunefleet {report['client']['version']}"]
    if report.get("operators") is None:  # --client
        return "\n".join(lines) + "\n"
    searched = report.get("searched") or "*"
    if not report["operators"]:
        where = "in any namespace" if searched == "*" else f"in namespace {searched}"
        lines.append(
            f"Operator: not found: no tunefleet operator Deployment (label {SELECTOR}) {where}; "
            f"install it with `{INSTALL}`"
            + (" or look in another namespace (drop -n)" if searched != "*" else "")
        )
        return "\n".join(lines) + "\n"
    for op in report["operators"]:
        versions = op["versions"]
        version = versions[0] if len(versions) == 1 else f"{', '.join(versions)} (rolling)"
        images = ", ".join(op["images"]) or "?"
        lines.append(
            f"Operator: {version} (release {op['release']} in {op['namespace']}, "
            f"{op['ready']}/{op['replicas']} replicas ready, image {images})"
        )
    return "\n".join(lines) + "\n"
