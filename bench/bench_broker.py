"""`python -m bench broker`: a real-size bundle (1 GiB) published through the operator's store
broker, against the same published with the profile's Secret (docs/trust.md); and the same on
an oci:// store, through the operator's registry proxy against the profile's registry Secret.

Real node, S3, the operator as the chart's Deployment. Arm `secret`: the release as the other
benchmarks have it, the tuning pod's sync and publish writing with the profile's
credentialsSecret. Arm `broker`: the release upgraded with signing.secret and
signing.storeCredentialsSecret (testbed/operator.operator_signing); the profile signs, so its
tuning pod holds no Secret and every object goes up on a URL the operator presigned. Each round
tunes the stand-in image's 1 GiB cache of a fresh seed (a new artifact each time; testbed/large.py)
and reads publish's own line for the caches' upload seconds; apply to Ready is the whole. Both
uploads run in the publish step's 256 MiB memory limit (builders/security.SMALL_RESOURCES): a
finished round is an upload in bounded memory. Whether the tuning pod read any Secret is
checked in each round. Medians per arm.

The oci:// pair (group registry_proxy_large): the stand-in's 1 GiB cache on the local registry
(testbed/large.volume_profile), its publish pushing the cache archive, the bundle and the
volume image (a second GiB layer); arm `secret` with the profile's registry Secret and signing
key pair, arm `proxy` through the operator (signing.registryCredentialsSecret), which streams
every byte. The publish step's own seconds (its container's start to end) are the figure.
"""

from __future__ import annotations

import contextlib
import statistics
import time
import uuid
from datetime import datetime
from typing import Any

from bench.bench_large import MIB, _fresh_seed, _logs, _registry_for, _seconds
from bench.realnode import Run, in_namespace, tuned
from bench.results import progress
from testbed.builders.wrappers import make_config_map
from testbed.cluster import STANDIN_IMAGE, Cluster, S3Settings
from testbed.large import large_profile, volume_profile
from testbed.operator import operator_signing
from tunefleet import naming


class _Run(Run):
    public_key: str = ""
    store: str = "s3"


def _tuning_pod(r: Run, profile: str = "") -> dict[str, Any]:
    selector = "batch.kubernetes.io/job-name"
    if profile:
        selector += f",{naming.TUNING_PROFILE_LABEL}={profile}"
    pods = r.cluster.kubectl_json("get", "pods", "-n", r.ns, "-l", selector)["items"]
    return dict(pods[0])


def _publish_s(pod: dict[str, Any]) -> float | None:
    """The publish step's own seconds: its container's start to end (the API's seconds)."""
    for st in (pod.get("status") or {}).get("containerStatuses") or []:
        done = (st.get("state") or {}).get("terminated") or {}
        if st.get("name") == "publish" and done.get("startedAt") and done.get("finishedAt"):
            start, end = (
                datetime.fromisoformat(done[k].replace("Z", "+00:00"))
                for k in ("startedAt", "finishedAt")
            )
            return (end - start).total_seconds()
    return None


def _reads_a_secret(pod: dict[str, Any]) -> bool:
    spec = pod["spec"]
    steps = spec.get("initContainers", []) + spec["containers"]
    env = any(
        "secretKeyRef" in (e.get("valueFrom") or {}) for c in steps for e in c.get("env") or []
    )
    return env or any("secret" in v for v in spec.get("volumes") or [])


def _round(r: _Run, s3: S3Settings, arm: str, i: int) -> dict[str, Any]:
    prefix = f"bench-broker/{uuid.uuid4().hex[:12]}"
    name = f"big-{arm}-{i}"
    try:

        def profile(secret: str) -> dict[str, Any]:
            p = large_profile(name, s3, secret, prefix, MIB, _fresh_seed())
            if r.public_key:
                p["spec"]["storage"]["signing"] = {"policy": "Required", "publicKey": r.public_key}
            return p

        marker = make_config_map("bench-large", "").obj()
        prof, ready_s = tuned(r, s3, marker, profile, name)
        pod = _tuning_pod(r)
        upload = _seconds(
            r"caches uploaded, \d+ bytes in ([\d.]+) s",
            _logs(r, pod["metadata"]["name"], "publish"),
        )
        (art,) = prof["status"]["artifacts"]
        r.cluster.kubectl("delete", "tp", "-n", r.ns, name, "--wait=true")
        return {
            "arm": arm,
            "bytes": art["caches"][0]["size"],
            "upload_s": upload,
            "apply_to_ready_s": round(ready_s, 1),
            "pod_reads_a_secret": _reads_a_secret(pod),
        }
    finally:
        with contextlib.suppress(Exception):
            s3.delete_prefix(prefix + "/")


def _oci_round(r: _Run, s3: S3Settings, repository: str, public: str, i: int) -> dict[str, Any]:
    arm = "proxy" if r.public_key else "secret"
    name, seed = f"vol-{arm}-{i}", _fresh_seed()
    marker = make_config_map("bench-large", "").obj()
    prof, ready_s = tuned(
        r, s3, marker, lambda _s: volume_profile(name, s3, MIB, repository, public, seed), name
    )
    pod = _tuning_pod(r, name)
    upload = _seconds(
        r"caches uploaded, \d+ bytes in ([\d.]+) s", _logs(r, pod["metadata"]["name"], "publish")
    )
    (art,) = prof["status"]["artifacts"]
    r.cluster.kubectl("delete", "tp", "-n", r.ns, name, "--wait=true")
    return {
        "arm": arm,
        "bytes": art["caches"][0]["size"],
        "upload_s": upload,
        "publish_s": _publish_s(pod),
        "apply_to_ready_s": round(ready_s, 1),
        "pod_reads_a_secret": _reads_a_secret(pod),
    }


def _rounds(label: str, rounds: int, one: Any) -> list[dict[str, Any]]:
    """`one(i)` for each round, each announced."""
    rows = []
    for i in range(rounds):
        progress("broker", f"{label}: round {i + 1}/{rounds}")
        rows.append(one(i))
    return rows


def _oci_arm(r: _Run, s3: S3Settings, rounds: int) -> list[dict[str, Any]]:
    """The rounds on the local registry: the profile's own key pair signs in the `secret`
    arm, the operator's (r.public_key) in the `proxy` arm."""
    _, repository, keys = _registry_for(r)
    public = r.public_key or keys["cosign.pub"]
    label = f"oci {'proxy' if r.public_key else 'secret'}"
    return _rounds(label, rounds, lambda i: _oci_round(r, s3, repository, public, i))


def _arm(r: _Run, s3: S3Settings, rounds: int) -> list[dict[str, Any]]:
    arm = "broker" if r.public_key else "secret"
    return _rounds(arm, rounds, lambda i: _round(r, s3, arm, i))


def _summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "rounds": len(rows),
        "upload_s": round(statistics.median(x["upload_s"] or 0 for x in rows), 2),
        "apply_to_ready_s": round(statistics.median(x["apply_to_ready_s"] for x in rows), 1),
        "mib_per_s": round(
            statistics.median(
                x["bytes"] / (1 << 20) / x["upload_s"] for x in rows if x["upload_s"]
            ),
            1,
        ),
        "pods_reading_a_secret": sum(1 for x in rows if x["pod_reads_a_secret"]),
    }


def _both(r: _Run, s3: S3Settings, rounds: int) -> dict[str, Any]:
    return {"s3": _arm(r, s3, rounds), "oci": _oci_arm(r, s3, rounds)}


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 2) if a and b else None


def _oci_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out = _summary(rows)
    out["publish_s"] = round(statistics.median(x["publish_s"] or 0 for x in rows), 1)
    return out


def _group(
    secret_rows: list[Any],
    other: tuple[str, list[Any]],
    ratio: tuple[str, str],
    seconds: int,
    summary: Any = _summary,
) -> dict[str, Any]:
    """One group: the `secret` arm, the `other` (name, rows), and `ratio` (its key, the field
    compared: other's over secret's)."""
    secret, theirs = summary(secret_rows), summary(other[1])
    return {
        "bundle_mib": 1024,
        "publish_memory_limit": "256Mi",
        "secret": secret,
        other[0]: theirs,
        ratio[0]: _ratio(theirs[ratio[1]], secret[ratio[1]]),
        "rows": secret_rows + other[1],
        "seconds": seconds,
    }


def run(cluster: Cluster, s3: S3Settings, rounds: int = 2) -> dict[str, dict[str, Any]]:
    """Both groups: store_broker_large (s3://) and registry_proxy_large (oci://)."""
    started = time.monotonic()
    plain = _Run(cluster, "", STANDIN_IMAGE)
    unsigned = in_namespace(cluster, s3, "bench-broker", plain, _both, rounds)
    with operator_signing(cluster, s3) as public:
        brokered = _Run(cluster, "", STANDIN_IMAGE)
        brokered.public_key = public
        brokered.ns = f"bench-broker-b-{int(time.time())}"
        cluster.kubectl("create", "namespace", brokered.ns)
        try:
            signed = _both(brokered, s3, rounds)
        finally:
            cluster.kubectl("delete", "namespace", brokered.ns, "--wait=false", check=False)
    seconds = round(time.monotonic() - started)
    return {
        "store_broker_large": _group(
            unsigned["s3"],
            ("broker", signed["s3"]),
            ("broker_over_secret_upload", "upload_s"),
            seconds,
        ),
        "registry_proxy_large": _group(
            unsigned["oci"],
            ("proxy", signed["oci"]),
            ("proxy_over_secret_publish", "publish_s"),
            seconds,
            _oci_summary,
        ),
    }
