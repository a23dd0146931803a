"""The flows that play a tuning pod's publish step on the kwok fleet (fake GPU nodes, no
containers run; testbed.operator.carry_out_publish) until the profile is Ready, for e2e tests:
`ready_profile`, `publish_first_revision`, `publish_next_revision`. The profiles and model pods
they apply are testbed/builders/fleet.py's (`profile_doc`, `pod_doc`)."""

from __future__ import annotations

from typing import Any

from testbed.builders.fleet import profile_doc
from testbed.operator import carry_out_publish
from testbed.poll import eventually
from tests.support.kube import apply, get_json, tuning_pods


def publish_first_revision(
    cluster: Any, s3: Any, namespace: str, profile: str
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """Apply a profile, play its tuning pod's publish step and wait for Ready. Returns (the
    tuning pod, what was published, the profile)."""
    apply(cluster, namespace, profile_doc(profile))
    (first,) = eventually(
        lambda: tuning_pods(cluster, namespace, profile),
        lambda ps: len(ps) == 1 and ps[0]["spec"].get("nodeName"),
        "the first tuning pod",
    )
    published = carry_out_publish(cluster.kubectl, first, s3.env())
    ready = eventually(
        lambda: get_json(cluster, "tp", "-n", namespace, profile),
        lambda p: (p.get("status") or {}).get("phase") == "Ready",
        "revision 1 Ready",
    )
    return first, published, ready


def publish_next_revision(
    cluster: Any, s3: Any, namespace: str, profile: str, first: dict[str, Any]
) -> dict[str, Any]:
    """After a spec change: play the publish step of the new tuning pod (not `first`) with
    results that differ from the first revision's, and return the profile once it serves
    them."""
    (second,) = eventually(
        lambda: [
            p
            for p in tuning_pods(cluster, namespace, profile)
            if p["metadata"]["uid"] != first["metadata"]["uid"]
        ],
        lambda ps: len(ps) == 1 and ps[0]["spec"].get("nodeName"),
        "the second tuning pod",
    )
    # The stand-in results differ per revision only in the manifest; make the CSV differ too.
    new = carry_out_publish(cluster.kubectl, second, s3.env(), salt="v2")
    return eventually(
        lambda: get_json(cluster, "tp", "-n", namespace, profile),
        lambda p: (
            (p.get("status") or {}).get("phase") == "Ready"
            and p["status"]["artifacts"][0]["sha256"] == new["sha256"]
        ),
        "revision 2 Ready",
    )


def ready_profile(
    cluster: Any, s3: Any, namespace: str, name: str, models: list[str], **over: Any
) -> dict[str, Any]:
    """A profile tuned for real as far as this machine allows (stand-in results, real S3)."""
    apply(cluster, namespace, profile_doc(name, gpu={"vendor": "nvidia", "models": models}, **over))
    pods = eventually(
        lambda: tuning_pods(cluster, namespace, name),
        lambda ps: len(ps) == len(models) and all(p["spec"].get("nodeName") for p in ps),
        f"tuning pods of {name}",
    )
    for pod in pods:
        carry_out_publish(cluster.kubectl, pod, s3.env())
    return dict(
        eventually(
            lambda: get_json(cluster, "tp", "-n", namespace, name),
            lambda p: (p.get("status") or {}).get("phase") == "Ready",
            f"{name} Ready",
        )
    )
