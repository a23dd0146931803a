"""Two replicas with failover: kill the active replica (SIGKILL of its process on the real
node, as a crash), another process takes the Lease within 15 s (the other replica, or the
killed pod's restarted container when it asks first), no Job is duplicated, and labelled pods
created meanwhile are injected (goal: none untuned, over at least 50 creates).
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.test_operator import apply, get_json, jobs_of, profile_doc, tuning_pods
from tests.support.operator import InCluster, carry_out_publish
from tests.support.poll import eventually

pytestmark = pytest.mark.e2e

H100 = "NVIDIA-H100-80GB-HBM3"
CREATES = 60


def operator_pid(pod_name: str) -> int:
    """The operator process of one replica, found on this machine (the real node)."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().split(b"\0")
            env = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if (
            any(b"tunefleet-operator" in c for c in cmd[:2])
            and f"HOSTNAME={pod_name}".encode() in env
        ):
            return int(proc.name)
    raise AssertionError(f"no operator process of pod {pod_name} on this machine")


def labelled_pod(i: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"during-{i:03d}", "labels": {"tunefleet.io/profile": "served"}},
        "spec": {
            "nodeSelector": {"nvidia.com/gpu.product": H100},
            "containers": [{"name": "server", "image": "registry.example.com/serve:1"}],
        },
    }


def test_killing_the_active_replica_hands_over_within_15s_and_admission_never_stops(
    cluster: Any, in_cluster: InCluster, s3: Any, namespace: str, s3_secret: str
) -> None:
    apply(
        cluster,
        namespace,
        profile_doc(
            "served",
            gpu={"vendor": "nvidia", "models": [H100]},
            storage={"uri": f"s3://{s3.bucket}/failover", "credentialsSecret": {"name": s3_secret}},
        ),
    )
    (pod,) = eventually(
        lambda: tuning_pods(cluster, namespace, "served"),
        lambda ps: len(ps) == 1 and ps[0]["spec"].get("nodeName"),
        "the tuning pod",
    )
    carry_out_publish(cluster.kubectl, pod, s3.env())
    eventually(
        lambda: get_json(cluster, "tp", "-n", namespace, "served"),
        lambda p: (p.get("status") or {}).get("phase") == "Ready",
        "served Ready",
    )
    leader = eventually(in_cluster.leader, bool, "a leader", timeout=30)
    leader_pod = leader.split("_")[0]
    pids = {p["metadata"]["name"]: operator_pid(p["metadata"]["name"]) for p in in_cluster.pods()}
    assert leader_pod in pids and len(pids) == 2

    errors: list[str] = []

    def create_during() -> None:
        for i in range(CREATES):
            out = cluster.kubectl(
                "create",
                "-n",
                namespace,
                "-f",
                "-",
                input=yaml.safe_dump(labelled_pod(i)),
                check=False,
            )
            if out.returncode != 0:
                errors.append(out.stderr)
            time.sleep(0.25)

    creator = threading.Thread(target=create_during)
    creator.start()
    time.sleep(2)
    killed_at = time.monotonic()
    os.kill(pids[leader_pod], signal.SIGKILL)
    # A profile applied while nobody leads: the new leader makes its Jobs, once.
    apply(
        cluster,
        namespace,
        profile_doc(
            "during",
            gpu={"vendor": "amd", "models": ["AMD_Instinct_MI300X_OAM", "AMD_Instinct_MI325X_OAM"]},
        ),
    )
    try:
        new_leader = eventually(
            in_cluster.leader,
            # Any process but the killed one: the other replica, or the killed pod's container
            # restarted by the kubelet (a new process, a new identity), whichever asks first
            # once the Lease has gone unrenewed for its duration. Both are a handover.
            lambda holder: holder and holder != leader,
            "another process holding the Lease",
            timeout=20,
            interval=0.2,
        )
    except AssertionError as e:
        # What each replica said (the session uninstalls the chart when it ends, and its logs
        # with it): election lines, errors, and the last few lines.
        def said(pod: str, previous: bool = False) -> list[str]:
            lines = in_cluster.logs(pod, previous=previous).splitlines()
            picked = [ln for ln in lines if "leader" in ln.lower() or "error" in ln.lower()]
            return picked[-10:] + lines[-5:]

        logs = {p["metadata"]["name"]: said(p["metadata"]["name"]) for p in in_cluster.pods()}
        logs[f"{leader_pod} (killed)"] = said(leader_pod, previous=True)
        raise AssertionError(f"{e}\nthe replicas' logs: {json.dumps(logs, indent=1)}") from None
    takeover = time.monotonic() - killed_at
    creator.join()
    assert errors == []
    eventually(
        lambda: jobs_of(cluster, namespace, "during"), lambda js: len(js) == 2, "Jobs of 'during'"
    )
    time.sleep(3)  # anything duplicated would show by now
    assert len(jobs_of(cluster, namespace, "during")) == 2
    pods = [
        p
        for p in get_json(cluster, "pods", "-n", namespace)["items"]
        if p["metadata"]["name"].startswith("during-")
    ]
    assert len(pods) == CREATES
    untuned = [
        p["metadata"]["name"]
        for p in pods
        if (p["metadata"].get("annotations") or {}).get("tunefleet.io/status") != "injected"
    ]
    summary = {
        "takeover_seconds": round(takeover, 1),
        "new_leader": new_leader,
        "same_pod_restarted": new_leader.startswith(leader_pod + "_"),
        "creates": CREATES,
        "untuned": len(untuned),
    }
    print("failover:", json.dumps(summary))
    assert takeover <= 15, summary
    assert untuned == [], summary
