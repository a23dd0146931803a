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

from testbed.builders.fleet import profile_doc
from testbed.builders.wrappers import make_model_pod
from testbed.operator import InCluster, carry_out_publish
from testbed.poll import eventually
from tests.support.kube import apply, get_json, jobs_of, tuning_pods

pytestmark = pytest.mark.e2e

H100 = "NVIDIA-H100-80GB-HBM3"
CREATES = 60
# A model pod of the "served" profile, on an H100 node (named per create: .name(...)).
SERVED = (
    make_model_pod("served", image="registry.example.com/serve:1")
    .without("metadata", "namespace")
    .selector({"nvidia.com/gpu.product": H100})
)


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

    created_at: dict[str, float] = {}

    def create_during() -> None:
        for i in range(CREATES):
            created_at[f"during-{i:03d}"] = time.monotonic()
            out = cluster.kubectl(
                "create",
                "-n",
                namespace,
                "-f",
                "-",
                input=yaml.safe_dump(SERVED.name(f"during-{i:03d}").obj()),
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
    # What each untuned pod carries (no annotation at all: the webhook was never reached) and
    # when it was sent, from the kill: the cause differs between the two.
    why = {
        p["metadata"]["name"]: {
            "sent_after_kill_s": round(created_at[p["metadata"]["name"]] - killed_at, 2),
            "annotations": {
                k: v
                for k, v in (p["metadata"].get("annotations") or {}).items()
                if k.startswith("tunefleet.io/")
            },
        }
        for p in pods
        if p["metadata"]["name"] in untuned
    }
    summary = {
        "takeover_seconds": round(takeover, 1),
        "new_leader": new_leader,
        "same_pod_restarted": new_leader.startswith(leader_pod + "_"),
        "creates": CREATES,
        "untuned": len(untuned),
        "untuned_pods": why,
    }
    print("failover:", json.dumps(summary))
    assert takeover <= 15, summary
    assert untuned == [], summary


# --- a leader whose API calls hang: fenced before anyone else may lead ------------------------

AUDITED = {"jobs", "configmaps", "tuningprofiles"}
WRITES = {"create", "update", "patch", "delete"}


def audit_writes(since: float, operator_user: str) -> list[tuple[float, str, str]]:
    """(time the API server received it, source IP, what) of every write the operator's
    ServiceAccount made to Jobs, ConfigMaps and profile status since `since` (the API server's
    audit log, hack/cluster-up.sh)."""
    import datetime

    from testbed.cluster import state_dir

    out = []
    for line in (state_dir() / "logs" / "audit.log").read_text().splitlines():
        try:
            ev = json.loads(line)
        except ValueError:
            continue
        ref = ev.get("objectRef") or {}
        if ev.get("user", {}).get("username") != operator_user or ev.get("verb") not in WRITES:
            continue
        if ref.get("resource") not in AUDITED:
            continue
        at = datetime.datetime.fromisoformat(ev["requestReceivedTimestamp"].replace("Z", "+00:00"))
        if at.timestamp() < since:
            continue
        what = (
            f"{ev['verb']} {ref.get('resource')}/{ref.get('subresource', '')} {ref.get('name', '')}"
        )
        out.append((at.timestamp(), ev["sourceIPs"][0], what))
    return sorted(out)


class Frozen:
    """Every packet from one pod to the API server dropped: its connections hang as if the
    peer had frozen (half-open TCP), until released. nftables on this machine (the real node)."""

    TABLE = "tunefleet_e2e_freeze"

    def __init__(self, pod_ip: str, port: int) -> None:
        import subprocess

        self.run = lambda *a: subprocess.run(["nft", *a], check=True, capture_output=True)
        self.run("add", "table", "inet", self.TABLE)
        self.run(
            "add", "chain", "inet", self.TABLE, "input", "{ type filter hook input priority -10 ; }"
        )
        self.run(
            "add",
            "rule",
            "inet",
            self.TABLE,
            "input",
            "ip",
            "saddr",
            pod_ip,
            "tcp",
            "dport",
            str(port),
            "drop",
        )

    def release(self) -> None:
        import subprocess

        subprocess.run(
            ["nft", "delete", "table", "inet", self.TABLE], check=False, capture_output=True
        )


def test_a_leader_whose_api_calls_hang_stops_writing_before_another_leads(
    cluster: Any, in_cluster: InCluster, s3: Any, namespace: str, s3_secret: str
) -> None:
    from testbed.cluster import APISERVER_PORT
    from testbed.operator import SYSTEM_NS

    served = profile_doc(
        "before",
        gpu={"vendor": "nvidia", "models": [H100]},
        storage={"uri": f"s3://{s3.bucket}/fence", "credentialsSecret": {"name": s3_secret}},
    )
    apply(cluster, namespace, served)
    (pod,) = eventually(
        lambda: tuning_pods(cluster, namespace, "before"),
        lambda ps: len(ps) == 1 and ps[0]["spec"].get("nodeName"),
        "the tuning pod",
    )
    carry_out_publish(cluster.kubectl, pod, s3.env())
    ready = eventually(
        lambda: get_json(cluster, "tp", "-n", namespace, "before"),
        lambda p: (p.get("status") or {}).get("phase") == "Ready",
        "before Ready",
    )
    leader = eventually(in_cluster.leader, bool, "a leader", timeout=30).split("_")[0]
    ips = {p["metadata"]["name"]: p["status"]["podIP"] for p in in_cluster.pods()}
    old_ip, new_ip = ips.pop(leader), next(iter(ips.values()))
    user = f"system:serviceaccount:{SYSTEM_NS}:tunefleet"
    frozen_at = time.time()
    freeze = Frozen(old_ip, APISERVER_PORT)
    try:
        names = [f"during-{i}" for i in range(3)]
        apply(cluster, namespace, *(profile_doc(n) for n in names))
        taken = eventually(
            in_cluster.leader,
            lambda holder: holder and not holder.startswith(leader + "_"),
            "the other replica holding the Lease",
            timeout=30,
            interval=0.2,
        )
        took = time.time() - frozen_at
        for n in names:
            eventually(
                lambda n=n: jobs_of(cluster, namespace, n), lambda js: len(js) == 1, f"{n}'s Job"
            )
        time.sleep(max(0.0, 25 - (time.time() - frozen_at)))  # well past the Lease duration
    finally:
        freeze.release()
    released_at = time.time()
    time.sleep(12)  # the old leader's calls return: it must follow, and write nothing
    writes = audit_writes(frozen_at - 5, user)
    first_new = next((t for t, ip, _ in writes if ip == new_ip and t >= frozen_at), None)
    assert first_new is not None, writes
    late_old = [(t - frozen_at, w) for t, ip, w in writes if ip == old_ip and t >= first_new]
    assert late_old == [], late_old  # never two writers: nothing from the old one after
    for n in names:
        assert len(jobs_of(cluster, namespace, n)) == 1  # no Job duplicated
    after = get_json(cluster, "tp", "-n", namespace, "before")
    assert after["status"]["artifacts"] == ready["status"]["artifacts"]  # no status regressed
    assert after["status"]["phase"] == "Ready"
    print(
        "hung leader:",
        json.dumps(
            {
                "lease_taken_after_s": round(took, 1),
                "old_leader_last_write_s": round(
                    max((t - frozen_at for t, ip, _ in writes if ip == old_ip), default=-1), 1
                ),
                "new_leader_first_write_s": round(first_new - frozen_at, 1),
                "frozen_s": round(released_at - frozen_at, 1),
                "holder": taken,
            }
        ),
    )


# --- helm upgrade while pods are admitted ---------------------------------------------------


def test_helm_upgrade_under_traffic_admits_every_pod_with_the_same_certificate(
    cluster: Any, in_cluster: InCluster, s3: Any, namespace: str, s3_secret: str
) -> None:
    from testbed.cluster import state_dir
    from testbed.operator import SYSTEM_NS, upgrade_release

    apply(
        cluster,
        namespace,
        profile_doc(
            "served",
            gpu={"vendor": "nvidia", "models": [H100]},
            storage={"uri": f"s3://{s3.bucket}/upgrade", "credentialsSecret": {"name": s3_secret}},
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

    def cert() -> str:
        return str(
            get_json(cluster, "secret", "-n", SYSTEM_NS, "tunefleet-webhook-cert")["data"][
                "tls.crt"
            ]
        )

    before = cert()
    log = state_dir() / "logs" / "kube-apiserver.log"
    offset = log.stat().st_size
    refused: list[str] = []
    stop = threading.Event()

    def create_during() -> None:
        for i in range(120):  # one every 0.5 s for 60 s
            if stop.is_set():
                return
            out = cluster.kubectl(
                "create",
                "-n",
                namespace,
                "-f",
                "-",
                input=yaml.safe_dump(SERVED.name(f"during-{i:03d}").obj()),
                check=False,
            )
            if out.returncode != 0:
                refused.append(out.stderr)
            time.sleep(0.5)

    creator = threading.Thread(target=create_during)
    creator.start()
    try:
        time.sleep(5)
        env = in_cluster.pods()[0]["spec"]["containers"][0]["env"]
        now_ = next(e["value"] for e in env if e["name"] == "TUNEFLEET_WORKERS")
        workers = "7" if now_ != "7" else "6"  # a changed value: the Deployment rolls
        upgrade_release(
            cluster,
            "--reuse-values",
            "--set",
            f"operator.workers={workers}",
            "--wait",
            "--timeout",
            "180s",
        )
        restarted = eventually(
            in_cluster.pods,
            lambda ps: (
                len(ps) == 2
                and all(
                    any(
                        e.get("name") == "TUNEFLEET_WORKERS" and e.get("value") == workers
                        for e in ps_i["spec"]["containers"][0]["env"]
                    )
                    for ps_i in ps
                )
            ),
            "both replicas rolled",
            timeout=180,
        )
        assert len(restarted) == 2
    finally:
        creator.join()
        stop.set()
    pods = [
        p
        for p in get_json(cluster, "pods", "-n", namespace)["items"]
        if p["metadata"]["name"].startswith("during-")
    ]
    untuned = [
        p["metadata"]["name"]
        for p in pods
        if (p["metadata"].get("annotations") or {}).get("tunefleet.io/status") != "injected"
    ]
    with log.open("rb") as f:
        f.seek(offset)
        tail = f.read().decode(errors="replace")
    tls = [
        line
        for line in tail.splitlines()
        if "x509" in line or "failed calling webhook" in line.lower()
    ]
    summary = {
        "pods": len(pods),
        "untuned": len(untuned),
        "refused": len(refused),
        "tls_errors": len(tls),
    }
    print("helm upgrade under traffic:", json.dumps(summary))
    assert cert() == before  # the serving certificate survived the upgrade
    assert (len(pods), untuned, refused, tls) == (120, [], [], []), summary
