"""`python -m bench broker`: a real-size bundle (1 GiB) published through the operator's store
broker, against the same published with the profile's Secret (docs/trust.md).

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
"""

from __future__ import annotations

import contextlib
import statistics
import time
import uuid
from typing import Any

from bench.bench_large import MIB, _fresh_seed, _logs, _seconds
from bench.realnode import Run, in_namespace, tuned
from bench.results import progress
from testbed.builders.wrappers import make_config_map
from testbed.cluster import STANDIN_IMAGE, Cluster, S3Settings
from testbed.large import large_profile
from testbed.operator import operator_signing


class _Run(Run):
    public_key: str = ""


def _tuning_pod(r: Run) -> dict[str, Any]:
    pods = r.cluster.kubectl_json("get", "pods", "-n", r.ns, "-l", "batch.kubernetes.io/job-name")[
        "items"
    ]
    return dict(pods[0])


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


def _arm(r: _Run, s3: S3Settings, rounds: int) -> list[dict[str, Any]]:
    arm = "broker" if r.public_key else "secret"
    rows = []
    for i in range(rounds):
        progress("broker", f"{arm}: round {i + 1}/{rounds}")
        rows.append(_round(r, s3, arm, i))
    return rows


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


def run(cluster: Cluster, s3: S3Settings, rounds: int = 2) -> dict[str, Any]:
    started = time.monotonic()
    plain = _Run(cluster, "", STANDIN_IMAGE)
    secret_rows = in_namespace(
        cluster, s3, "bench-broker", plain, lambda r, s, n: {"rows": _arm(r, s, n)}, rounds
    )["rows"]
    with operator_signing(cluster, s3) as public:
        brokered = _Run(cluster, "", STANDIN_IMAGE)
        brokered.public_key = public
        brokered.ns = f"bench-broker-b-{int(time.time())}"
        cluster.kubectl("create", "namespace", brokered.ns)
        try:
            broker_rows = _arm(brokered, s3, rounds)
        finally:
            cluster.kubectl("delete", "namespace", brokered.ns, "--wait=false", check=False)
    secret, broker = _summary(secret_rows), _summary(broker_rows)
    return {
        "bundle_mib": 1024,
        "publish_memory_limit": "256Mi",
        "secret": secret,
        "broker": broker,
        "broker_over_secret_upload": round(broker["upload_s"] / secret["upload_s"], 2)
        if secret["upload_s"]
        else None,
        "rows": secret_rows + broker_rows,
        "seconds": round(time.monotonic() - started),
    }
