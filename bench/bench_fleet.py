"""Fleet mode across two clusters on one store (docs/fleet.md): the local cluster and its
peer (hack/cluster-up.sh --peer: its own control plane and real node, the same S3 server),
each with its own release and operator in fleet mode, the stand-in image pinned by digest.

Per round, one identity applied in both clusters at the same moment: the tuning Jobs made in
all (goal: 1), when each cluster is Ready, so the time to Ready in the adopting cluster after
the apply and after the tuning cluster's Ready. Then the takeover: the peer claims and tunes
slowly, its operator is killed mid-Job, and the first cluster, waiting on the claim, takes
over once it expires: seconds from the kill to the first cluster's Job, and to its Ready.

    python -m bench --only fleet
"""

from __future__ import annotations

import json
import statistics
import threading
import time
import uuid
from collections.abc import Callable
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

CLAIM_SECONDS = 60
GOAL = (
    "1 tuning Job for the 2 clusters of one identity; the adopting cluster Ready within a few "
    "seconds of the tuning cluster; a dead tuning cluster holds the other back at most one "
    f"claim expiry ({CLAIM_SECONDS} s here, fleet.claimSeconds)"
)
NOTE = (
    "two local clusters on this 2-core machine sharing one S3 server (SeaweedFS), an operator "
    "process per cluster in fleet mode, the stand-in tuner (it computes nothing) on each "
    "cluster's real node; times from the kubectl apply, medians over the rounds"
)


def _profile(s3: S3Settings, secret: str, prefix: str, sleep: str = "0") -> str:
    doc = fleet_profile(
        s3, secret, prefix, pinned_image(STANDIN_IMAGE), FAKE_TORCH_TUNE_SLEEP=sleep
    )
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


def _round(clusters: dict[str, Cluster], s3: S3Settings, i: int) -> dict[str, Any]:
    ns = f"fleet-bench-{i}-{uuid.uuid4().hex[:6]}"
    prefix = f"bench-fleet/{ns}"
    secrets = {k: namespace_with_secrets(c, s3, ns) for k, c in clusters.items()}
    ready_at: dict[str, float] = {}
    start = time.monotonic()
    try:
        applies = [
            threading.Thread(
                target=c.kubectl,
                args=("apply", "-n", ns, "-f", "-"),
                kwargs={"input": _profile(s3, secrets[k], prefix)},
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


def _takeover(clusters: dict[str, Cluster], s3: S3Settings, peer_operator: Any) -> dict[str, Any]:
    first, peer = clusters["first"], clusters["peer"]
    ns = f"fleet-takeover-{uuid.uuid4().hex[:6]}"
    prefix = f"bench-fleet/{ns}"
    secrets = {k: namespace_with_secrets(c, s3, ns) for k, c in clusters.items()}
    dead = False
    try:
        peer.kubectl("apply", "-n", ns, "-f", "-", input=_profile(s3, secrets["peer"], prefix, "4"))
        _until("the peer tuning", lambda: _phase(peer, ns) == "Tuning", 120)
        first.kubectl(
            "apply", "-n", ns, "-f", "-", input=_profile(s3, secrets["first"], prefix, "4")
        )
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
        each = []
        for i in range(rounds):
            each.append(_round(clusters, s3, i))
            progress("fleet", f"round {i + 1}/{rounds}: {each[-1]}")
        takeover = _takeover(clusters, s3, operators["peer"])
        progress("fleet", f"takeover: {takeover}")
    finally:
        for op in operators.values():
            op.stop()
        uninstall_release(peer)
    return {
        "clusters": len(clusters),
        "rounds": rounds,
        "tuning_jobs_per_identity": [r["jobs"] for r in each],
        "adopted_with_source": all(r["adopted_with_source"] for r in each),
        "tuner_ready_s_median": statistics.median(r["tuner_ready_s"] for r in each),
        "adopter_ready_s_median": statistics.median(r["adopter_ready_s"] for r in each),
        "adopter_after_tuner_s_median": statistics.median(r["adopter_after_tuner_s"] for r in each),
        "takeover": takeover,
        "meets_goal": all(r["jobs"] == 1 for r in each)
        and takeover["kill_to_own_job_s"] <= CLAIM_SECONDS + 15,
        "goal": GOAL,
        "note": NOTE,
    }
