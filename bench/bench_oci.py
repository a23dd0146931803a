"""`python -m bench oci`: one TunableOp artifact served to bursts of model pods on the real node,
each way tunefleet can, against the same pods with no profile, with the registry's own count
of what it served.

The operator runs as the chart's Deployment (with the registry read identity the e2e tests give
it). Four profiles hold the same artifact (the stand-in tuner's, which says so):
- oci:// with the operator's copy of the public key, so pods mount the volume image
  (delivery ImageVolume), pulled by the kubelet;
- oci:// without that copy, so each pod's fetch init container verifies the bundle's
  signature and reads it by digest;
- s3:// delivered as a ConfigMap;
- s3:// with serving.delivery Store, so each pod's fetch reads it.

Each round creates a burst of `pods` pods per arm (arms in turn; the first arm is the pods with
no profile). A pod asks for no GPU (the node's fake GPUs would queue a burst 8 at a time) and
runs the stand-in server once. Figures per arm, medians over the pods of every round:
- create to the server container's start (the kubelet's startedAt, whole seconds);
- the burst from its first create to every pod Succeeded (polled every 0.5 s);
- the registry's requests (Distribution's /metrics): blob GETs and manifest GETs answered 200,
  per burst. An image volume's blobs are pulled once per node: the first round's burst pays
  them (a volume image tunefleet pushed minutes before), later rounds none.

Goal (the OCI issue): one pull per node; create-to-start with the image volume within 1.15x of
pods with no profile.
"""

from __future__ import annotations

import json
import re
import statistics
import time
import urllib.request
from typing import Any

import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from bench.results import progress
from testbed.builders.objects import object_list
from testbed.builders.wrappers import make_pod
from testbed.cluster import REAL_NODE_GPU_MODEL, STANDIN_IMAGE, Cluster, S3Settings
from testbed.operator import SERVING_SECRET, create_s3_secret, install_in_cluster
from testbed.poll import eventually
from testbed.real_node import KEY, SHAPES, real_profile
from testbed.registry import Registry

ARMS = ("none", "image_volume", "oci_fetch", "s3_config_map", "s3_fetch")
PROFILE_OF = {
    "image_volume": "vol",
    "oci_fetch": "ocifetch",
    "s3_config_map": "cm",
    "s3_fetch": "s3fetch",
}
GOAL = "one pull of the volume image per node; create-to-start <= 1.15x pods with no profile"


def _epoch(stamp: str) -> float:
    return time.mktime(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ")) - time.timezone


def _registry_counts(metrics_url: str) -> dict[str, int]:
    with urllib.request.urlopen(metrics_url, timeout=10) as resp:
        text = resp.read().decode()
    out = {"blob_get": 0, "manifest_get": 0}
    pattern = r'^registry_http_requests_total\{code="200",handler="(blob|manifest)",method="get"\}'
    for line in text.splitlines():
        m = re.match(pattern + r" (\d+)", line)
        if m:
            out[f"{m.group(1)}_get"] += int(m.group(2))
    return out


def key_pair() -> dict[str, str]:
    key = ec.generate_private_key(ec.SECP256R1())
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    public = (
        key.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )
    return {"cosign.key": private, "cosign.password": "", "cosign.pub": public}


class _Run:
    def __init__(self, cluster: Cluster, ns: str) -> None:
        self.cluster, self.ns = cluster, ns

    def apply(self, doc: dict[str, Any]) -> None:
        self.cluster.kubectl("apply", "-n", self.ns, "-f", "-", input=yaml.safe_dump(doc))

    def profile(self, name: str) -> dict[str, Any]:
        out = self.cluster.kubectl("get", "tp", "-n", self.ns, name, "-o", "json").stdout
        doc: dict[str, Any] = json.loads(out)
        return doc

    def pods(self) -> list[dict[str, Any]]:
        out = self.cluster.kubectl("get", "pods", "-n", self.ns, "-o", "json").stdout
        items: list[dict[str, Any]] = json.loads(out)["items"]
        return items


def _pod(name: str, profile: str | None) -> dict[str, Any]:
    labels = {"tunefleet.io/profile": profile} if profile else {}
    pod = (
        make_pod(name, "")
        .labels({"bench": "oci", **labels})
        .spec(
            restartPolicy="Never",
            nodeSelector={KEY: REAL_NODE_GPU_MODEL},
            tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists"}],
        )
    )
    command = ["standin-server", "--once"]
    return pod.container("server", STANDIN_IMAGE, imagePullPolicy="Never", command=command).obj()


def _burst(r: _Run, arm: str, round_: int, pods: int, metrics_url: str) -> dict[str, Any]:
    before = _registry_counts(metrics_url)
    names = [f"{arm.replace('_', '-')}-{round_}-{i}" for i in range(pods)]
    doc = object_list([_pod(n, PROFILE_OF.get(arm)) for n in names])
    t0 = time.time()
    r.cluster.kubectl("create", "-n", r.ns, "-f", "-", input=yaml.safe_dump(doc))

    def ours() -> list[dict[str, Any]]:
        return [p for p in r.pods() if p["metadata"]["name"] in names]

    done = eventually(
        ours,
        lambda ps: (
            len(ps) == pods and all(p["status"].get("phase") in ("Succeeded", "Failed") for p in ps)
        ),
        f"{arm} burst {round_} to finish",
        timeout=900,
        interval=0.5,
    )
    burst_s = time.time() - t0
    after = _registry_counts(metrics_url)
    failed = [p["metadata"]["name"] for p in done if p["status"]["phase"] != "Succeeded"]
    if failed:
        raise AssertionError(f"{arm}: pods failed: {failed}")
    starts = []
    for p in done:
        server = next(c for c in p["status"]["containerStatuses"] if c["name"] == "server")
        started = _epoch(server["state"]["terminated"]["startedAt"])
        starts.append(started - _epoch(p["metadata"]["creationTimestamp"]))
    mounted = sum(1 for p in done for v in p["spec"].get("volumes") or [] if "image" in v)
    fetched = sum(
        1 for p in done for c in p["spec"].get("initContainers") or []
        if c["name"] == "tunefleet-fetch"
    )  # fmt: skip
    r.cluster.kubectl("delete", "pods", "-n", r.ns, "-l", "bench=oci", "--wait=true")
    return {
        "arm": arm,
        "round": round_,
        "create_to_start_median_s": statistics.median(starts),
        "create_to_start_max_s": max(starts),
        "burst_s": round(burst_s, 2),
        "blob_gets": after["blob_get"] - before["blob_get"],
        "manifest_gets": after["manifest_get"] - before["manifest_get"],
        "pods_with_image_volume": mounted,
        "pods_with_fetch": fetched,
    }


def _profiles(r: _Run, s3: S3Settings, reg: Registry, keys: dict[str, str]) -> None:
    repository = f"bench/{r.ns}"
    oci = {
        "uri": f"oci://{reg.host}/{repository}",
        "credentialsSecret": {"name": "registry-writer"},
        "signing": {"secret": {"name": "signing"}},
    }
    reader = {"credentialsSecret": {"name": "registry-reader"}}
    workload = {"shapes": SHAPES, "env": [{"name": "FAKE_TORCH_BACKEND", "value": "rocm"}]}
    with_key = {**oci, "signing": {**oci["signing"], "publicKey": keys["cosign.pub"]}}
    secret = "s3-credentials"
    r.apply(real_profile("vol", s3, "", workload=workload, storage=with_key, serving=reader))
    r.apply(real_profile("ocifetch", s3, "", workload=workload, storage=oci, serving=reader))
    r.apply(real_profile("cm", s3, secret, workload=workload))
    r.apply(real_profile("s3fetch", s3, secret, workload=workload, serving={"delivery": "Store"}))
    want = {"vol": "ImageVolume", "ocifetch": "Store", "cm": "ConfigMap", "s3fetch": "Store"}
    for name, delivery in want.items():
        eventually(
            lambda n=name: r.profile(n),  # type: ignore[misc]
            lambda p, d=delivery: str(  # type: ignore[misc]
                (((p.get("status") or {}).get("artifacts") or [{}])[0]).get("delivery", "")
            ).startswith(d),
            f"profile {name} Ready and delivered as {delivery}",
            timeout=600,
            interval=1,
        )


def run(cluster: Cluster, s3: S3Settings, pods: int = 20, rounds: int = 2) -> dict[str, Any]:
    install_in_cluster(cluster, s3)
    reg = Registry.from_state()
    metrics_url = next(
        line.split("=", 1)[1]
        for line in (reg.data.parent.parent / "oci.env").read_text().splitlines()
        if line.startswith("TUNEFLEET_OCI_METRICS=")
    )
    ns = f"bench-oci-{int(time.time())}"
    cluster.kubectl("create", "namespace", ns)
    r = _Run(cluster, ns)
    try:
        for doc in (
            reg.secret("registry-writer", reg.writer),
            reg.secret("registry-reader", reg.reader),
        ):
            r.apply(doc)
        keys = key_pair()
        cluster.kubectl(
            "create", "secret", "generic", "signing", "-n", ns,
            *[f"--from-literal={k}={v}" for k, v in keys.items()],
        )  # fmt: skip
        create_s3_secret(cluster.kubectl, ns, s3.access_key, s3.secret_key)
        create_s3_secret(
            cluster.kubectl, ns, s3.reader_access_key, s3.reader_secret_key, SERVING_SECRET
        )
        _profiles(r, s3, reg, keys)
        rows = []
        for round_ in range(rounds):
            for arm in ARMS:
                progress("oci", f"round {round_ + 1}/{rounds}, {arm}: {pods} pods")
                rows.append(_burst(r, arm, round_, pods, metrics_url))
        return _summary(rows, pods, rounds)
    finally:
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def _summary(rows: list[dict[str, Any]], pods: int, rounds: int) -> dict[str, Any]:
    med = {
        arm: {
            "create_to_start_s": round(
                statistics.median(x["create_to_start_median_s"] for x in rows if x["arm"] == arm),
                2,
            ),
            "burst_s": round(statistics.median(x["burst_s"] for x in rows if x["arm"] == arm), 2),
            "blob_gets_first_burst": next(
                x["blob_gets"] for x in rows if x["arm"] == arm and x["round"] == 0
            ),
            "blob_gets_later_bursts": sum(
                x["blob_gets"] for x in rows if x["arm"] == arm and x["round"] > 0
            ),
        }
        for arm in ARMS
    }
    none = med["none"]["create_to_start_s"] or 1.0
    return {
        "pods_per_burst": pods,
        "rounds": rounds,
        "medians": med,
        "ratio_image_volume_over_none": round(med["image_volume"]["create_to_start_s"] / none, 3),
        "ratio_burst_image_volume_over_none": round(
            med["image_volume"]["burst_s"] / (med["none"]["burst_s"] or 1.0), 3
        ),
        "goal": GOAL,
        "runs": rows,
    }
