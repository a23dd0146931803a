"""The operator off the happy path: kill storms, oversized and stuck profiles, pods it can't
place, pods the webhook never saw, and a quiet log when nothing happens.

Real kube-apiserver, scheduler, Job and GC controllers, kwok nodes; the operator runs as the
chart's ServiceAccount (testbed/operator.py).
"""

from __future__ import annotations

import json
import random
import re
import threading
import time
from typing import Any

import pytest
import yaml

from testbed.builders.fleet import profile_doc
from testbed.builders.largest import largest_spec
from testbed.operator import ROOT, SYSTEM_NS, Operator, helm
from testbed.poll import eventually
from tests.support.kube import apply, condition, events_about, get_json, jobs_of
from tunefleet.placement import gate

pytestmark = pytest.mark.e2e

AMD = ["AMD_Instinct_MI300X_OAM", "AMD_Instinct_MI325X_OAM"]
LOUD = re.compile(r"\[(WARNING|ERROR|CRITICAL) ?\]|Traceback")


def profiles(cluster: Any, namespace: str) -> list[dict[str, Any]]:
    return list(get_json(cluster, "tp", "-n", namespace)["items"])


def all_jobs(cluster: Any, namespace: str) -> list[dict[str, Any]]:
    return list(get_json(cluster, "jobs", "-n", namespace)["items"])


def settled(cluster: Any, namespace: str, names: list[str], models: list[str]) -> list[str]:
    """What is still wrong with the picture (empty when right): one Job per (profile, model),
    nothing orphaned, status listing exactly the Jobs that exist."""
    problems = []
    live = {p["metadata"]["name"]: p for p in profiles(cluster, namespace)}
    jobs = all_jobs(cluster, namespace)
    cms = list(
        get_json(
            # A tuning Job's own ConfigMap (role tune); the namespace's node map is not one.
            cluster,
            "configmaps",
            "-n",
            namespace,
            "-l",
            "app.kubernetes.io/managed-by=tunefleet,tunefleet.io/role=tune",
        )["items"]
    )
    by_profile: dict[str, list[dict[str, Any]]] = {}
    for j in jobs:
        owner = (j["metadata"].get("ownerReferences") or [{}])[0]
        prof = live.get(owner.get("name", ""))
        if prof is None or prof["metadata"]["uid"] != owner.get("uid"):
            problems.append(f"orphan Job {j['metadata']['name']}")
            continue
        by_profile.setdefault(owner["name"], []).append(j)
    # Each Job has its ConfigMap, under its own name, but one the GPU gate holds: that one
    # gets it when it starts (no pod mounts it before).
    started = sorted(j["metadata"]["name"] for j in jobs if not gate.held(j))
    configs = sorted(c["metadata"]["name"] for c in cms)
    if not set(started) <= set(configs) or len(configs) > len(jobs):
        problems.append(f"ConfigMaps {configs} for the started Jobs {started}")
    for name in names:
        mine = by_profile.get(name, [])
        got = sorted(j["metadata"]["labels"]["tunefleet.io/gpu-model"] for j in mine)
        if got != sorted(models):
            problems.append(f"{name}: Jobs for {got}")
            continue
        st = (live.get(name) or {}).get("status") or {}
        listed = {(j.get("name"), j.get("uid")) for j in st.get("jobs") or []}
        actual = {(j["metadata"]["name"], j["metadata"]["uid"]) for j in mine}
        if listed != actual:
            problems.append(f"{name}: status lists {sorted(listed)}, Jobs are {sorted(actual)}")
    return problems


def test_kill_storm_leaves_exactly_one_job_per_model_and_true_statuses(
    cluster: Any, operator: Operator, namespace: str
) -> None:
    names = [f"storm-{i:02d}" for i in range(20)]
    rng = random.Random(8)
    done = threading.Event()

    def create_slowly() -> None:
        for name in names:
            apply(cluster, namespace, profile_doc(name, gpu={"vendor": "amd", "models": AMD}))
            time.sleep(rng.uniform(0.05, 0.4))
        done.set()

    creator = threading.Thread(target=create_slowly)
    creator.start()
    try:
        for i in range(100):
            operator.kill()
            # At random moments: often mid-startup, sometimes while it reconciles.
            operator.start(wait=False)
            time.sleep(rng.uniform(0.0, 2.0) if i % 10 else rng.uniform(2.0, 4.0))
    finally:
        creator.join()
        operator.kill()
        operator.start()
    assert done.is_set()
    restarted = time.monotonic()
    eventually(
        lambda: settled(cluster, namespace, names, AMD),
        lambda problems: problems == [],
        "one Job per (profile, model), no orphans, statuses listing the Jobs",
        timeout=30,
        interval=1,
    )
    print(f"settled {time.monotonic() - restarted:.1f}s after the last restart")


def test_an_idle_operator_logs_nothing_loud(
    cluster: Any, operator: Operator, namespace: str
) -> None:
    apply(cluster, namespace, *(profile_doc(f"idle-{i}") for i in range(5)))
    eventually(
        lambda: [p for p in profiles(cluster, namespace) if (p.get("status") or {}).get("jobs")],
        lambda ps: len(ps) == 5,
        "five profiles with their Jobs in status",
    )
    time.sleep(3)  # let the last watch events and status writes land
    mark = operator.log_size()
    time.sleep(20)
    loud = [line for line in operator.logs(mark).splitlines() if LOUD.search(line)]
    assert loud == [], "\n".join(loud[:20])


def test_the_largest_valid_profile_gets_its_jobs_and_one_character_more_is_refused(
    cluster: Any, operator: Operator, namespace: str
) -> None:
    doc = {
        "apiVersion": "tunefleet.io/v1alpha1",
        "kind": "TuningProfile",
        "metadata": {"name": "largest"},
        "spec": largest_spec(),
    }
    # Client-side apply keeps a copy of the object in an annotation (256 KiB at most): large
    # profiles are applied server-side, as the README says.
    cluster.kubectl(
        "apply", "--server-side", "-n", namespace, "-f", "-", input=json.dumps(doc), timeout=120
    )
    jobs = eventually(
        lambda: jobs_of(cluster, namespace, "largest"),
        lambda js: len(js) == 16,
        "16 Jobs for the largest profile",
        timeout=90,
    )
    tune = next(
        c for c in jobs[0]["spec"]["template"]["spec"]["initContainers"] if c["name"] == "tune"
    )
    assert len(tune["args"]) == 64 and sum(len(a) for a in tune["args"]) == 262144
    prof = eventually(
        lambda: get_json(cluster, "tp", "-n", namespace, "largest"),
        # The largest spec names a Kueue queue (spec.tuning.queueName): its Jobs are created
        # suspended and wait there, whether or not Kueue runs beside this cluster.
        lambda p: condition(p, "Ready").get("reason") == "Queued",
        "the largest profile's status (its Jobs wait, suspended, in its Kueue queue)",
    )
    annotations = prof["metadata"].get("annotations") or {}
    assert not any(k.startswith("tunefleet.io/") for k in annotations), annotations
    for over, message in (
        ({"argv_extra": 1}, "workload.command and workload.args must be at most 262144"),
        ({"env_extra": 1}, "workload.env values must be at most 131072"),
    ):
        bigger = {**doc, "metadata": {"name": "over"}, "spec": largest_spec(**over)}
        out = cluster.kubectl(
            "apply",
            "--server-side",
            "-n",
            namespace,
            "-f",
            "-",
            input=json.dumps(bigger),
            check=False,
            timeout=120,
        )
        assert out.returncode != 0 and message in out.stderr, out.stderr[-2000:]


def test_a_profile_stuck_in_errors_still_deletes(
    cluster: Any, operator: Operator, namespace: str
) -> None:
    cluster.kubectl("create", "quota", "no-jobs", "-n", namespace, "--hard=count/jobs.batch=0")
    apply(cluster, namespace, profile_doc("stuck"))
    prof = eventually(
        lambda: get_json(cluster, "tp", "-n", namespace, "stuck"),
        lambda p: condition(p, "Ready").get("reason") == "JobCreateFailed",
        "the quota's refusal in status",
    )
    assert "exceeded quota" in condition(prof, "Ready")["message"]
    assert not prof["metadata"].get("finalizers")
    started = time.monotonic()
    cluster.kubectl("delete", "tp", "-n", namespace, "stuck", "--timeout=30s")
    assert time.monotonic() - started < 30


def test_a_model_no_node_has_is_pending_with_the_schedulers_reason(
    cluster: Any, operator: Operator, namespace: str
) -> None:
    apply(
        cluster,
        namespace,
        profile_doc("nowhere", gpu={"vendor": "nvidia", "models": ["NVIDIA-B200"]}),
        profile_doc("too-many", gpu={"vendor": "nvidia", "models": ["NVIDIA-H200"], "count": 16}),
    )
    nowhere = eventually(
        lambda: get_json(cluster, "tp", "-n", namespace, "nowhere"),
        lambda p: condition(p, "Ready").get("reason") == "Unschedulable",
        "nowhere: Unschedulable",
    )
    assert nowhere["status"]["phase"] == "Pending"
    msg = condition(nowhere, "Ready")["message"]
    assert "no node has nvidia.com/gpu.product=NVIDIA-B200" in msg and "scheduler:" in msg
    too_many = eventually(
        lambda: get_json(cluster, "tp", "-n", namespace, "too-many"),
        lambda p: condition(p, "Ready").get("reason") == "Unschedulable",
        "too-many: Unschedulable",
    )
    assert "has its nvidia.com/gpu in use" in condition(too_many, "Ready")["message"]
    events = get_json(
        cluster,
        "events",
        "-n",
        namespace,
        "--field-selector",
        "involvedObject.name=nowhere,reason=Unschedulable",
    )["items"]
    assert events, "an Unschedulable Event on the profile"


def test_pods_admitted_while_the_webhook_was_down_are_counted_and_listed(
    cluster: Any, operator: Operator, namespace: str
) -> None:
    apply(cluster, namespace, profile_doc("serve"))
    eventually(
        lambda: get_json(cluster, "tp", "-n", namespace, "serve"),
        lambda p: (p.get("status") or {}).get("jobs"),
        "the profile reconciled",
    )
    operator.kill()
    try:
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "missed", "labels": {"tunefleet.io/profile": "serve"}},
            "spec": {"containers": [{"name": "server", "image": "registry.example.com/serve:1"}]},
        }
        cluster.kubectl("create", "-n", namespace, "-f", "-", input=yaml.safe_dump(pod))
    finally:
        operator.start()
    prof = eventually(
        lambda: get_json(cluster, "tp", "-n", namespace, "serve"),
        lambda p: (p.get("status") or {}).get("unadmittedPods") == 1,
        "status.unadmittedPods = 1",
    )
    assert prof["status"]["unadmittedPods"] == 1
    listed = cluster.kubectl(
        "get",
        "pods",
        "-n",
        namespace,
        "-l",
        "tunefleet.io/profile,!tunefleet.io/admission",
        "-o",
        "name",
    ).stdout.split()
    assert listed == ["pod/missed"]
    events = eventually(
        lambda: events_about(cluster, namespace, "serve", reason="PodsNotAdmitted"),
        lambda items: len(items) == 1,
        "a PodsNotAdmitted Event",
    )
    assert "missed" in events[0]["message"]


def _crd_owner(crd: dict[str, Any]) -> dict[str, Any]:
    """What says who owns the CRD: its identity and Helm's ownership marks (none at all when
    it was applied with `kubectl apply -f crds/`)."""
    meta = crd["metadata"]
    annotations = meta.get("annotations") or {}
    labels = meta.get("labels") or {}
    return {
        "uid": meta["uid"],
        "annotations": {k: v for k, v in annotations.items() if k.startswith("meta.helm.sh/")},
        "managed-by": labels.get("app.kubernetes.io/managed-by"),
        "resource-policy": annotations.get("helm.sh/resource-policy"),
    }


def test_the_chart_leaves_a_crd_applied_apart_alone(cluster: Any, no_release: None) -> None:
    # The CRD exists apart from the release about to be installed: the session's release's
    # (kept when no_release uninstalled it), or one from `kubectl apply -f crds/` before any
    # chart (the README allows both); applied here when neither is. Another release must
    # install next to it instead of refusing, say so, and leave it exactly as it was, owner
    # marks included, when uninstalled. No release is installed meanwhile: one watching every
    # namespace would (rightly) refuse a second (tests/e2e/test_two_releases.py).
    name = "tuningprofiles.tunefleet.io"
    if cluster.kubectl("get", "crd", name, check=False).returncode != 0:
        cluster.kubectl("apply", "-f", str(ROOT / "crds" / "tunefleet.io_tuningprofiles.yaml"))
    before = _crd_owner(get_json(cluster, "crd", name))
    assert before["annotations"].get("meta.helm.sh/release-name") != "apart"
    ns = "tunefleet-crd-apart"
    cluster.kubectl("create", "namespace", ns, check=False)
    try:
        out = helm(
            cluster.bin_dir,
            cluster.kubeconfig,
            "install",
            "apart",
            str(ROOT / "charts" / "tunefleet"),
            "-n",
            ns,
            "--set",
            "operator.replicas=0",
            "--set",
            "webhook.enabled=false",
        )
        assert "already existed and is not managed by this release" in out.stdout
        manifest = helm(cluster.bin_dir, cluster.kubeconfig, "get", "manifest", "apart", "-n", ns)
        assert "CustomResourceDefinition" not in manifest.stdout
        assert _crd_owner(get_json(cluster, "crd", name)) == before  # not adopted
    finally:
        helm(cluster.bin_dir, cluster.kubeconfig, "uninstall", "apart", "-n", ns)
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
    # Still there, the same object (not deleted and re-created), owned as before: the session's
    # release still owns one it installed, and one applied apart still has no Helm owner.
    after = _crd_owner(get_json(cluster, "crd", name))
    assert after == before
    if before["annotations"]:
        assert before["annotations"]["meta.helm.sh/release-namespace"] == SYSTEM_NS
