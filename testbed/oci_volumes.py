"""Signed oci:// profiles delivered as image volumes, and admission of pods that mount them:
what tests/e2e/test_oci.py and the `trust` benchmark (bench/bench_trust.py) share.

`admit_behind_slow_registry` is issue 54's admission case: profiles whose volume images sit
behind a registry answering every request seconds late (testbed/slow_registry.py), the
operator's replicas restarted so that no verdict is remembered, then a burst of pods at once.
"""

from __future__ import annotations

import base64
import contextlib
import json
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from testbed.cluster import wait_for_real_node_gpus
from testbed.operator import OCI_DELIVERY_SECRET, InCluster
from testbed.poll import eventually
from testbed.real_node import SHAPES, model_pod, real_profile
from testbed.registry import Registry, cosign
from testbed.slow_registry import SlowRegistry
from tunefleet.contracts.admission_record import DECISION_ANNOTATION

ROOT = Path(__file__).resolve().parents[1]
PASSWORD = "e2e-signing-password"


def _apply(cluster: Any, namespace: str, doc: dict[str, Any]) -> None:
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(doc))


def secrets(cluster: Any, namespace: str, reg: Registry) -> None:
    """The registry's writer and reader Secrets, and the key pair `signing` (cosign's own)."""
    _apply(cluster, namespace, reg.secret("registry-writer", reg.writer))
    _apply(cluster, namespace, reg.secret("registry-reader", reg.reader))
    # The key pair, as the docs say to make it: cosign writes the Secret itself.
    env = {"COSIGN_PASSWORD": PASSWORD, "KUBECONFIG": cluster.kubeconfig}
    made = cosign(
        ["generate-key-pair", f"k8s://{namespace}/signing"], {**reg.tool_env(reg.reader), **env}
    )
    assert made.returncode == 0, made.stderr
    # cosign also writes cosign.pub where it runs: in its own temporary directory, never here.
    assert not (ROOT / "cosign.pub").exists()


def public_key(cluster: Any, namespace: str, path: Any) -> Any:
    raw = cluster.kubectl_json("get", "secret", "-n", namespace, "signing", "-o", "json")
    path.write_bytes(base64.b64decode(raw["data"]["cosign.pub"]))
    return path


def volume_profile(
    name: str, s3: Any, reg: Registry, repository: str, key: str, **over: Any
) -> Any:
    spec: dict[str, Any] = {
        "workload": {"shapes": SHAPES, "env": [{"name": "FAKE_TORCH_BACKEND", "value": "rocm"}]},
        "storage": {
            "uri": f"oci://{reg.host}/{repository}",
            "credentialsSecret": {"name": "registry-writer"},
            "signing": {"secret": {"name": "signing"}, "publicKey": key},
        },
        "serving": {"credentialsSecret": {"name": "registry-reader"}},
    }
    return real_profile(name, s3, "", **{**spec, **over})


def delivery(cluster: Any, namespace: str, name: str, prefix: str) -> dict[str, Any]:
    # The status alone is polled: on a timeout, its artifacts and conditions say why.
    got = eventually(
        lambda: cluster.kubectl_json("get", "tp", "-n", namespace, name).get("status") or {},
        lambda st: str((st.get("artifacts") or [{}])[0].get("delivery", "")).startswith(prefix),
        f"{name}'s delivery to start with {prefix!r}",
        timeout=120,
        interval=1,
    )
    art: dict[str, Any] = got["artifacts"][0]
    return art


def mounted(pod: dict[str, Any]) -> list[str]:
    return [v["image"]["reference"] for v in pod["spec"].get("volumes") or [] if "image" in v]


def burst(cluster: Any, namespace: str, names: list[str], profiles: list[str]) -> float:
    """Create the model pods `names` (each on the profile at its index, modulo), five kubectl
    calls side by side; they are never scheduled (admission is the subject): the seconds the
    burst took."""
    pods = []
    for i, name in enumerate(names):
        pod = model_pod(name, profiles[i % len(profiles)], gpus=1)
        pod["spec"]["schedulerName"] = "tunefleet-e2e-never"
        pods.append(pod)

    def create_some(share: list[dict[str, Any]]) -> None:
        docs = "\n---\n".join(json.dumps(p) for p in share)
        cluster.kubectl("create", "-n", namespace, "-f", "-", input=docs, timeout=600)

    start = time.monotonic()
    with ThreadPoolExecutor(5) as pool:
        list(pool.map(create_some, [pods[i::5] for i in range(5) if pods[i::5]]))
    return time.monotonic() - start


def webhook_timeout(cluster: Any) -> int:
    configs = cluster.kubectl_json("get", "mutatingwebhookconfigurations")["items"]
    hooks = [h for c in configs for h in c.get("webhooks") or [] if "tunefleet" in h["name"]]
    return min(int(h.get("timeoutSeconds", 10)) for h in hooks)


def ready_pod(pod: dict[str, Any]) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (pod.get("status") or {}).get("conditions") or []
    ) and not pod["metadata"].get("deletionTimestamp")


def _volume_models(
    cluster: Any, namespace: str, s3: Any, reg: Registry, where: Path, names: list[str]
) -> dict[str, str]:
    """A signed oci:// profile per name, each of its own repository, Ready and delivered as
    an image volume: each one's volume reference (by digest)."""
    wait_for_real_node_gpus(cluster, 1)
    secrets(cluster, namespace, reg)
    key = public_key(cluster, namespace, where / "cosign.pub").read_text()
    repositories = {n: f"e2e/{namespace}-{n}-{uuid.uuid4().hex[:6]}" for n in names}
    for name in names:
        _apply(cluster, namespace, volume_profile(name, s3, reg, repositories[name], key))
    volumes = {}
    for name in names:
        st = eventually(
            lambda name=name: cluster.kubectl_json("get", "tp", "-n", namespace, name),
            lambda p: (p.get("status") or {}).get("phase") in ("Ready", "Failed"),
            f"{name} Ready",
            timeout=400,
            interval=1,
        )["status"]
        assert st["phase"] == "Ready", json.dumps(st, indent=2)[:4000]
        art = delivery(cluster, namespace, name, "ImageVolume")
        volumes[name] = f"{reg.host}/{repositories[name]}@{art['bundle']['volume']}"
    return volumes


def restart_replicas(cluster: Any, in_cluster: InCluster) -> int:
    """Every operator replica deleted, and as many back Ready: no verdict remembered."""
    replicas = len(in_cluster.pods())
    cluster.kubectl("delete", "pods", "-n", in_cluster.namespace, "-l", in_cluster.selector)
    eventually(
        lambda: [p for p in in_cluster.pods() if ready_pod(p)],
        lambda ready: len(ready) == replicas,
        "the operator's replicas back, their verdicts forgotten",
        timeout=180,
    )
    return replicas


@contextlib.contextmanager
def _operator_knows(cluster: Any, in_cluster: InCluster, host: str, alias: str) -> Iterator[None]:
    """The operator's registry read identity (OCI_DELIVERY_SECRET) given for `alias` too, the
    replicas restarted to read it, for the length of the block; then as it was. A
    dockerconfigjson's `auths` are keyed by host:port, and the slow proxy is another port."""
    ns = in_cluster.namespace
    was = cluster.kubectl_json("get", "secret", "-n", ns, OCI_DELIVERY_SECRET)
    config = json.loads(base64.b64decode(was["data"][".dockerconfigjson"]))
    config["auths"][alias] = config["auths"][host]
    data = {**was["data"], ".dockerconfigjson": base64.b64encode(json.dumps(config).encode())}
    _put_secret(cluster, ns, {k: v if isinstance(v, str) else v.decode() for k, v in data.items()})
    restart_replicas(cluster, in_cluster)
    try:
        yield
    finally:
        _put_secret(cluster, ns, was["data"])


def _put_secret(cluster: Any, namespace: str, data: dict[str, str]) -> None:
    patch = json.dumps({"data": data})
    cluster.kubectl("patch", "secret", "-n", namespace, OCI_DELIVERY_SECRET, "-p", patch)


@dataclass(frozen=True)
class SlowAdmission:
    """What admit_behind_slow_registry saw: the burst's pods as admitted (by name), the seconds
    the burst took, the webhook's timeout, the registry requests per volume model during the
    burst (those naming its digest), the operator's replicas, each model's volume reference and
    the volumes that pods created after the checks mounted (by profile)."""

    pods: dict[str, dict[str, Any]]
    took: float
    timeout: int
    checks: dict[str, int]
    replicas: int
    volumes: dict[str, str]
    late: dict[str, list[str]]

    def undecided(self) -> list[str]:
        """Pods the webhook let through without a decision (failurePolicy Ignore, timed out)."""
        return [
            n
            for n, p in self.pods.items()
            if DECISION_ANNOTATION not in (p["metadata"].get("annotations") or {})
        ]

    def mounted_at_once(self) -> int:
        return sum(1 for p in self.pods.values() if mounted(p))


def _labelled(cluster: Any, namespace: str, prefix: str) -> list[dict[str, Any]]:
    pods = cluster.kubectl_json("get", "pods", "-n", namespace, "-l", "tunefleet.io/profile")
    return [p for p in pods["items"] if p["metadata"]["name"].startswith(prefix)]


def admit_behind_slow_registry(
    cluster: Any,
    deployed: tuple[InCluster, Any, Registry],
    namespace: str,
    where: Path,
    pods: int = 50,
    delay: float = 2.0,
) -> SlowAdmission:
    """Three volume models behind `registry` slowed to `delay` seconds a request (`deployed`:
    the chart's operator, the S3 settings, the registry), replicas restarted, then `pods`
    pods at once; then, once the checks had time, three more, one per model."""
    in_cluster, s3, registry = deployed
    with (
        SlowRegistry(registry, where / "slow") as slow,
        _operator_knows(cluster, in_cluster, registry.host, slow.registry.host),
    ):
        names = ["m1", "m2", "m3"]
        volumes = _volume_models(cluster, namespace, s3, slow.registry, where, names)
        slow.delay = delay
        replicas = restart_replicas(cluster, in_cluster)
        timeout = webhook_timeout(cluster)
        since = time.monotonic()
        took = burst(cluster, namespace, [f"burst-{i}" for i in range(pods)], names)
        admitted = {p["metadata"]["name"]: p for p in _labelled(cluster, namespace, "burst-")}
        checks = {
            name: sum(1 for _, _, path in slow.seen(since) if ref.rsplit(":", 1)[1] in path)
            for name, ref in volumes.items()
        }
        # The checks run on past the pods they were too slow for; pods admitted now mount.
        time.sleep(3 * slow.delay * 4)  # a check's few requests, each `delay` late
        burst(cluster, namespace, [f"late-{i}" for i in range(3)], names)
        late = {
            p["metadata"]["labels"]["tunefleet.io/profile"]: mounted(p)
            for p in _labelled(cluster, namespace, "late-")
        }
        cluster.kubectl(
            "delete", "pods", "-n", namespace, "-l", "tunefleet.io/profile", "--wait=false"
        )
    return SlowAdmission(admitted, took, timeout, checks, replicas, volumes, late)
