"""Fleet mode across two clusters on one store (docs/fleet.md): the local cluster and its
peer (hack/cluster-up.sh --peer: its own control plane and real node, the same S3 server),
each with its own release and operator in fleet mode, the stand-in image pinned by digest.

Per round, one identity applied in both clusters at the same moment: the tuning Jobs made in
all (goal: 1), when each cluster is Ready, so the time to Ready in the adopting cluster after
the apply and after the tuning cluster's Ready. Then the takeover: the peer claims and tunes
slowly, its operator is killed mid-Job, and the first cluster, waiting on the claim, takes
over once it expires: seconds from the kill to the first cluster's Job, and to its Ready.
The same again on the local OCI registry (`registry`: bids that stand fleet.settleSeconds,
signed bundles adopted after their signature verifies).

    python -m bench --only fleet
"""

from __future__ import annotations

import json
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from bench.results import progress
from testbed.cluster import STANDIN_IMAGE, Cluster, S3Settings, ensure_peer_cluster, pinned_image
from testbed.operator import (
    drop_namespace,
    fleet_mode,
    install,
    namespace_with_secrets,
    uninstall_release,
)
from testbed.poll import eventually
from testbed.real_node import fleet_profile
from testbed.registry import Registry, key_pair, signing_secret

CLAIM_SECONDS = 60
GOAL = (
    "1 tuning Job for the 2 clusters of one identity; the adopting cluster Ready within a few "
    "seconds of the tuning cluster; a dead tuning cluster holds the other back at most one "
    f"claim expiry ({CLAIM_SECONDS} s here, fleet.claimSeconds)"
)
NOTE = (
    "two local clusters on this 2-core machine sharing one S3 server (SeaweedFS) and one OCI "
    "registry (CNCF Distribution v3.1.2: `registry`, signed bundles, bids that stand 5 s), an "
    "operator process per cluster in fleet mode, the stand-in tuner (it computes nothing) on "
    "each cluster's real node; times from the kubectl apply, medians over the rounds"
)


PASSWORD = "bench-fleet"


@dataclass(frozen=True)
class Oci:
    """The registry every cluster shares, and the fleet's signing key pair."""

    registry: Registry
    keys: Path

    def secrets(self, c: Cluster, ns: str) -> None:
        reg = self.registry
        for name, who in (("registry-writer", reg.writer), ("registry-reader", reg.reader)):
            c.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(reg.secret(name, who)))
        signing_secret(c, ns, self.keys, PASSWORD)

    def storage(self, ns: str) -> dict[str, Any]:
        return {
            "uri": f"oci://{self.registry.host}/bench/{ns}",
            "credentialsSecret": {"name": "registry-writer"},
            "signing": _signing(self.keys),
        }


def _namespace(c: Cluster, s3: S3Settings, ns: str, keys: Path, oci: Oci | None) -> str:
    """The namespace's store Secrets and the fleet's signing key pair (fleet adoption needs a
    signature by the adopter's key, on S3 as on a registry)."""
    secret = namespace_with_secrets(c, s3, ns)
    if oci is not None:
        oci.secrets(c, ns)
    else:
        signing_secret(c, ns, keys, PASSWORD)
    return secret


def _signing(keys: Path) -> dict[str, Any]:
    return {"secret": {"name": "signing"}, "publicKey": (keys / "cosign.pub").read_text()}


def _profile(
    s3: S3Settings, secret: str, prefix: str, keys: Path, sleep: str = "0", oci: Oci | None = None
) -> str:
    doc = fleet_profile(
        s3, secret, prefix, pinned_image(STANDIN_IMAGE), FAKE_TORCH_TUNE_SLEEP=sleep
    )
    doc["spec"]["storage"]["signing"] = _signing(keys)
    if oci is not None:
        doc["spec"]["storage"] = oci.storage(prefix.rsplit("/", 1)[-1])
        doc["spec"]["serving"] = {"credentialsSecret": {"name": "registry-reader"}}
    return str(yaml.safe_dump(doc))


def _clean(clusters: dict[str, Cluster], s3: S3Settings, ns: str, prefix: str) -> None:
    for c in clusters.values():
        drop_namespace(c, ns)
    s3.delete_prefix(prefix + "/")


def _get(c: Cluster, ns: str) -> dict[str, Any]:
    done = c.kubectl("get", "tp", "-n", ns, "llama", "-o", "json", check=False)
    if done.returncode != 0:
        return {}
    return dict(json.loads(done.stdout))


def _phase(c: Cluster, ns: str) -> str:
    return str((_get(c, ns).get("status") or {}).get("phase") or "")


def _jobs(c: Cluster, ns: str) -> int:
    items = c.kubectl_json("get", "jobs", "-n", ns, "-l", "tunefleet.io/tuning-profile=llama")
    return len(items["items"])


def _until(what: str, ok: Callable[[], bool], timeout: float) -> float:
    eventually(ok, bool, what, timeout=timeout, interval=0.2)
    return time.monotonic()


def _round(
    clusters: dict[str, Cluster], s3: S3Settings, i: int, keys: Path, oci: Oci | None = None
) -> dict[str, Any]:
    ns = f"fleet-bench-{i}-{uuid.uuid4().hex[:6]}"
    prefix = f"bench-fleet/{ns}"
    secrets = {k: _namespace(c, s3, ns, keys, oci) for k, c in clusters.items()}
    ready_at: dict[str, float] = {}
    start = time.monotonic()
    try:
        applies = [
            threading.Thread(
                target=c.kubectl,
                args=("apply", "-n", ns, "-f", "-"),
                kwargs={"input": _profile(s3, secrets[k], prefix, keys, oci=oci)},
            )
            for k, c in clusters.items()
        ]
        for t in applies:
            t.start()
        for t in applies:
            t.join()

        def watch(k: str, c: Cluster) -> None:
            ready_at[k] = _until(f"{k} Ready", lambda: _phase(c, ns) == "Ready", 400)

        watchers = [threading.Thread(target=watch, args=kv) for kv in clusters.items()]
        for t in watchers:
            t.start()
        for t in watchers:
            t.join()
        jobs = {k: _jobs(c, ns) for k, c in clusters.items()}
        tuner = max(jobs, key=lambda k: jobs[k])
        adopter = next(k for k in clusters if k != tuner)
        adopted = (_get(clusters[adopter], ns)["status"]["artifacts"][0]).get("source")
        return {
            "jobs": sum(jobs.values()),
            "tuned_in": tuner,
            "adopted_with_source": bool(adopted),
            "tuner_ready_s": round(ready_at[tuner] - start, 1),
            "adopter_ready_s": round(ready_at[adopter] - start, 1),
            "adopter_after_tuner_s": round(ready_at[adopter] - ready_at[tuner], 1),
        }
    finally:
        _clean(clusters, s3, ns, prefix)


def _takeover(
    clusters: dict[str, Cluster],
    s3: S3Settings,
    peer_operator: Any,
    keys: Path,
    oci: Oci | None = None,
) -> dict[str, Any]:
    first, peer = clusters["first"], clusters["peer"]
    ns = f"fleet-takeover-{uuid.uuid4().hex[:6]}"
    prefix = f"bench-fleet/{ns}"
    secrets = {k: _namespace(c, s3, ns, keys, oci) for k, c in clusters.items()}
    dead = False
    try:
        slow = {k: _profile(s3, secrets[k], prefix, keys, "4", oci) for k in clusters}
        peer.kubectl("apply", "-n", ns, "-f", "-", input=slow["peer"])
        _until("the peer tuning", lambda: _phase(peer, ns) == "Tuning", 120)
        first.kubectl("apply", "-n", ns, "-f", "-", input=slow["first"])
        _until("the first cluster waiting", lambda: _phase(first, ns) == "Queued", 60)
        peer_operator.kill()
        dead = True
        killed = time.monotonic()
        job_at = _until("the first cluster's own Job", lambda: _jobs(first, ns) == 1, 300)
        ready = _until("the first cluster Ready", lambda: _phase(first, ns) == "Ready", 400)
        return {
            "claim_seconds": CLAIM_SECONDS,
            "kill_to_own_job_s": round(job_at - killed, 1),
            "kill_to_ready_s": round(ready - killed, 1),
        }
    finally:
        if dead:  # started again only if killed: a second one would run beside it
            peer_operator.start()
        _clean(clusters, s3, ns, prefix)


def run(cluster: Cluster, s3: S3Settings, rounds: int = 3) -> dict[str, Any]:
    peer = ensure_peer_cluster()
    clusters = {"first": cluster, "peer": peer}
    operators = {}
    for k, c in clusters.items():
        progress("fleet", f"installing the {k} cluster's operator in fleet mode")
        operators[k] = fleet_mode(c, install(c, s3.endpoint), s3, CLAIM_SECONDS)
    try:
        with tempfile.TemporaryDirectory(prefix="bench-fleet-") as scratch:
            keys = key_pair(Path(scratch) / "keys", PASSWORD)
            each = []
            for i in range(rounds):
                each.append(_round(clusters, s3, i, keys))
                progress("fleet", f"round {i + 1}/{rounds}: {each[-1]}")
            takeover = _takeover(clusters, s3, operators["peer"], keys)
            progress("fleet", f"takeover: {takeover}")
            oci = Oci(Registry.from_state(), keys)
            on_registry = []
            for i in range(rounds):
                on_registry.append(_round(clusters, s3, i, keys, oci))
                progress("fleet", f"registry round {i + 1}/{rounds}: {on_registry[-1]}")
            registry_takeover = _takeover(clusters, s3, operators["peer"], keys, oci)
            progress("fleet", f"registry takeover: {registry_takeover}")
    finally:
        for op in operators.values():
            op.stop()
        uninstall_release(peer)
    registry = {
        **_summary(on_registry),
        "settle_seconds": 5,
        "takeover": registry_takeover,
        "meets_goal": _met(on_registry, registry_takeover),
    }
    return {
        "clusters": len(clusters),
        "rounds": rounds,
        **_summary(each),
        "takeover": takeover,
        "meets_goal": _met(each, takeover) and registry["meets_goal"],
        "registry": registry,
        "goal": GOAL,
        "note": NOTE,
    }


def _summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "tuning_jobs_per_identity": [r["jobs"] for r in rounds],
        "adopted_with_source": all(r["adopted_with_source"] for r in rounds),
        "tuner_ready_s_median": statistics.median(r["tuner_ready_s"] for r in rounds),
        "adopter_ready_s_median": statistics.median(r["adopter_ready_s"] for r in rounds),
        "adopter_after_tuner_s_median": statistics.median(
            r["adopter_after_tuner_s"] for r in rounds
        ),
    }


def _met(rounds: list[dict[str, Any]], takeover: dict[str, Any]) -> bool:
    return (
        all(r["jobs"] == 1 for r in rounds) and takeover["kill_to_own_job_s"] <= CLAIM_SECONDS + 15
    )
