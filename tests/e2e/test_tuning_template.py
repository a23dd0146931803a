"""spec.template for real: a tuning pod with what a real model's record run needs, on the real
node. Its weights come from a PersistentVolumeClaim (bound to a hostPath PersistentVolume on
the real node: this cluster has no provisioner; the profile policy governs a profile's own
volumes, not an administrator's PersistentVolumes), the node carries a taint of its pool that
only the template tolerates, the pod runs under a RuntimeClass (handler runc, the real node's
containerd runtime: hack/lib/node.sh), with a memory-backed /dev/shm of the size asked for,
envFrom, resources, a ServiceAccount, a PriorityClass and supplemental groups. The workload
(run under the stand-in torch, which computes nothing) checks each from inside the container
and multiplies the matrices whose sizes the claim holds: the artifact's one GEMM is theirs.

Then what the API server and the operator refuse, and what does not make a new revision.
"""

from __future__ import annotations

import json
import shutil
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from testbed.builders.largest import largest_template
from testbed.builders.wrappers import make_object, make_pvc
from testbed.cluster import (
    REAL_NODE,
    STANDIN_IMAGE,
    real_node_volume,
    wait_for_real_node_gpus,
)
from testbed.operator import InCluster
from testbed.poll import eventually
from testbed.real_node import real_profile
from tests.support.kube import apply, condition, get_json, jobs_of, statuses

pytestmark = pytest.mark.e2e

HOST_ROOT = Path("/var/lib/tunefleet-e2e")  # on this machine, which is the real node
TAINT_KEY = "tunefleet.io/e2e-template"
SHM_BYTES = 256 * 1024 * 1024
GROUP = 4242
M, N, K = 48, 1536, 768  # the "model" on the claim: one GEMM no other test records

# The record run's workload, in the stand-in image: everything it checks fails it (and so the
# Job) when it is not so.
WORKLOAD = textwrap.dedent(
    f"""
    import json, os, sys
    import torch  # the stand-in torch of the stand-in image
    say = lambda *a: print("[e2e]", *a, file=sys.stderr, flush=True)
    st = os.statvfs("/dev/shm")
    shm = st.f_blocks * st.f_frsize
    say("/dev/shm bytes", shm)
    assert shm == int(os.environ["E2E_SHM_BYTES"]), shm
    with open("/weights/model.json") as f:
        model = json.load(f)
    say("weights", json.dumps(model))
    say("groups", os.getgroups())
    assert {GROUP} in os.getgroups(), os.getgroups()
    a = torch.rand(model["m"], model["k"], dtype=torch.bfloat16, device="cuda")
    b = torch.rand(model["k"], model["n"], dtype=torch.bfloat16, device="cuda")
    torch.mm(a, b)
    say("recorded", model)
    """
)


def _pv(name: str, path: Path, namespace: str, claim: str) -> dict[str, Any]:
    return real_node_volume(name, path, namespace, claim, ["ReadOnlyMany"])


@pytest.fixture
def weights(cluster: Any, namespace: str) -> Iterator[str]:
    """A PVC "weights" with the model's sizes in model.json; its PersistentVolume a hostPath
    directory on the real node (no provisioner here)."""
    name = f"weights-{uuid.uuid4().hex[:10]}"
    path = HOST_ROOT / name
    path.mkdir(parents=True)
    (path / "model.json").write_text(json.dumps({"m": M, "n": N, "k": K}))
    path.chmod(0o755)
    pvc = make_pvc("weights", namespace, name, access=("ReadOnlyMany",)).obj()
    pv = _pv(name, path, namespace, "weights")
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all([pv, pvc]))
    try:
        yield "weights"
    finally:
        cluster.kubectl("delete", "pv", name, "--wait=false", check=False)
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def cluster_objects(cluster: Any) -> Iterator[tuple[str, str]]:
    """A RuntimeClass with handler runc and a PriorityClass, this test's own; (their names)."""
    suffix = uuid.uuid4().hex[:8]
    runtime, priority = f"e2e-runc-{suffix}", f"e2e-low-{suffix}"
    docs = [
        # handler: hack/lib/node.sh's containerd runtimes.runc
        make_object("node.k8s.io/v1", "RuntimeClass", runtime).fields(handler="runc").obj(),
        make_object("scheduling.k8s.io/v1", "PriorityClass", priority)
        .fields(
            value=10,
            preemptionPolicy="Never",
            description="tunefleet e2e: tests/e2e/test_tuning_template.py",
        )
        .obj(),
    ]
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))
    try:
        yield runtime, priority
    finally:
        cluster.kubectl("delete", "runtimeclass", runtime, "--wait=false", check=False)
        cluster.kubectl("delete", "priorityclass", priority, "--wait=false", check=False)


def _untaint(cluster: Any) -> None:
    cluster.kubectl("taint", "node", REAL_NODE, f"{TAINT_KEY}-", check=False)


@pytest.fixture
def pool_taint(cluster: Any) -> Iterator[dict[str, str]]:
    """The real node tainted as a dedicated inference pool is, for this test only (a taint an
    earlier run left behind is removed first). Pods already running there stay."""
    _untaint(cluster)
    value = uuid.uuid4().hex[:8]
    cluster.kubectl("taint", "node", REAL_NODE, f"{TAINT_KEY}={value}:NoSchedule")
    try:
        yield {"key": TAINT_KEY, "operator": "Equal", "value": value, "effect": "NoSchedule"}
    finally:
        _untaint(cluster)


def test_a_tuning_pod_with_a_pvc_tolerations_a_runtime_class_and_shm_records_on_the_real_node(
    cluster: Any,
    in_cluster: InCluster,
    s3: Any,
    namespace: str,
    s3_secret: str,
    weights: str,
    cluster_objects: tuple[str, str],
    pool_taint: dict[str, str],
) -> None:
    wait_for_real_node_gpus(cluster, 1)
    runtime, priority = cluster_objects
    cluster.kubectl("create", "serviceaccount", "weights-reader", "-n", namespace)
    cluster.kubectl(
        "create", "configmap", "record-settings", "-n", namespace,
        f"--from-literal=E2E_SHM_BYTES={SHM_BYTES}",
    )  # fmt: skip
    # The taint is in force: a pod that tolerates only the GPU's does not land there.
    probe = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "probe"},
        "spec": {
            "restartPolicy": "Never",
            "nodeSelector": {"kubernetes.io/hostname": REAL_NODE},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
            "containers": [
                {
                    "name": "c",
                    "image": STANDIN_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["true"],
                }
            ],
        },
    }
    apply(cluster, namespace, probe)
    eventually(
        lambda: get_json(cluster, "pod", "-n", namespace, "probe"),
        # It tolerates the real node's other taint: "untolerated taint(s)" is the pool's.
        lambda p: (
            "untolerated taint" in json.dumps((p.get("status") or {}).get("conditions") or [])
        ),
        "the probe pod Unschedulable for the pool's taint",
        timeout=30,
    )

    workload = {
        "command": ["python3", "-c", WORKLOAD],
        "env": [{"name": "FAKE_TORCH_BACKEND", "value": "rocm"}],
    }
    template = {
        "metadata": {"labels": {"team": "inference"}, "annotations": {"e2e/why": "template"}},
        "spec": {
            "volumes": [
                {
                    "name": "weights",
                    "persistentVolumeClaim": {"claimName": weights, "readOnly": True},
                }
            ],
            "tolerations": [pool_taint],
            "runtimeClassName": runtime,
            "serviceAccountName": "weights-reader",
            "priorityClassName": priority,
            "securityContext": {"supplementalGroups": [GROUP]},
        },
        "tune": {
            "volumeMounts": [{"name": "weights", "mountPath": "/weights", "readOnly": True}],
            "envFrom": [{"configMapRef": {"name": "record-settings"}}],
            "resources": {
                "requests": {"cpu": "100m", "memory": "128Mi"},
                "limits": {"memory": "1Gi"},
            },
        },
        "shmSize": "256Mi",
    }
    doc = real_profile("withtemplate", s3, s3_secret, workload=workload, template=template)
    apply(cluster, namespace, doc)
    prof = eventually(
        lambda: get_json(cluster, "tp", "-n", namespace, "withtemplate"),
        lambda p: (p.get("status") or {}).get("phase") in ("Ready", "Failed"),
        "withtemplate Ready",
        timeout=240,
        interval=1,
    )
    (job,) = jobs_of(cluster, namespace, "withtemplate")
    (pod,) = get_json(
        cluster, "pods", "-n", namespace,
        "-l", f"batch.kubernetes.io/job-name={job['metadata']['name']}",
    )["items"]  # fmt: skip
    tune_log = cluster.kubectl(
        "logs", "-n", namespace, pod["metadata"]["name"], "-c", "tune"
    ).stdout
    assert prof["status"]["phase"] == "Ready", (
        json.dumps(prof["status"], indent=2)[:3000] + tune_log
    )
    # The record step saw the claim's contents, the sized /dev/shm and the groups.
    assert f"[e2e] /dev/shm bytes {SHM_BYTES}" in tune_log, tune_log
    assert f'[e2e] weights {{"m": {M}, "n": {N}, "k": {K}}}' in tune_log, tune_log
    assert "[e2e] recorded" in tune_log
    # The pod ran on the tainted real node with what the template gave it.
    spec = pod["spec"]
    assert spec["nodeName"] == REAL_NODE
    assert spec["runtimeClassName"] == runtime
    assert (
        spec["serviceAccountName"] == "weights-reader"
        and spec["automountServiceAccountToken"] is False
    )
    assert spec["priorityClassName"] == priority and spec["priority"] == 10
    assert pool_taint in spec["tolerations"]
    assert spec["nodeSelector"]["nvidia.com/gpu.product"] == "STANDIN-NO-GPU"
    assert pod["metadata"]["labels"]["team"] == "inference"
    assert pod["metadata"]["labels"]["tunefleet.io/tuning-profile"] == "withtemplate"
    assert pod["metadata"]["annotations"]["e2e/why"] == "template"
    shm = next(v for v in spec["volumes"] if v["name"] == "tunefleet-shm")
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "256Mi"}
    containers = {c["name"]: c for c in spec["initContainers"] + spec["containers"]}
    assert containers["tune"]["resources"]["requests"]["cpu"] == "100m"
    for name, c in containers.items():
        user_mounts = {m["name"] for m in c["volumeMounts"]} & {"weights", "tunefleet-shm"}
        assert bool(user_mounts) == (name == "tune"), (name, c["volumeMounts"])
        assert ("envFrom" in c) == (name == "tune"), name
    for step in ("bootstrap", "tune", "publish"):
        term = statuses(pod)[step]["state"].get("terminated") or {}
        assert term.get("exitCode") == 0, (step, statuses(pod)[step])
    # The artifact holds the one GEMM the claim's sizes made: nn_<n>_<m>_<k> (column-major).
    (art,) = prof["status"]["artifacts"]
    assert art["recorded"] == 1 and art["gemms"] == 1, art
    bucket, key = art["uri"][len("s3://") :].split("/", 1)
    results = s3.client().get_object(Bucket=bucket, Key=f"{key}/results.csv")["Body"].read()
    assert f"nn_{N}_{M}_{K}_".encode() in results, results[-600:]

    # Placement and labels do not shape tuning: no new revision, the same Job, still Ready.
    revision = prof["status"]["revision"]
    doc["spec"]["template"]["metadata"]["labels"]["team"] = "serving"
    doc["spec"]["template"]["spec"]["tolerations"].append({"key": "spot", "operator": "Exists"})
    apply(cluster, namespace, doc)
    generation = get_json(cluster, "tp", "-n", namespace, "withtemplate")["metadata"]["generation"]
    after = eventually(
        lambda: get_json(cluster, "tp", "-n", namespace, "withtemplate"),
        lambda p: (p.get("status") or {}).get("observedGeneration") == generation,
        "the edit observed",
        timeout=60,
    )
    assert after["status"]["revision"] == revision and after["status"]["phase"] == "Ready"
    assert [j["metadata"]["uid"] for j in jobs_of(cluster, namespace, "withtemplate")] == [
        job["metadata"]["uid"]
    ]


def test_a_host_path_is_refused_by_the_default_policy_with_the_value_that_allows_it(
    cluster: Any, in_cluster: InCluster, s3: Any, namespace: str, s3_secret: str
) -> None:
    tpl = {
        "spec": {"volumes": [{"name": "nvme", "hostPath": {"path": "/mnt/nvme"}}]},
        "tune": {"volumeMounts": [{"name": "nvme", "mountPath": "/cache"}]},
    }
    apply(cluster, namespace, real_profile("hostpath", s3, s3_secret, template=tpl))
    prof = eventually(
        lambda: get_json(cluster, "tp", "-n", namespace, "hostpath"),
        lambda p: condition(p, "Ready").get("reason") == "TemplateRefused",
        "hostpath refused",
        timeout=60,
    )
    message = condition(prof, "Ready")["message"]
    assert "spec.template.spec.volumes[nvme]: hostPath" in message
    assert "profilePolicy.allowedVolumeTypes" in message
    assert prof["status"]["phase"] == "Invalid" and jobs_of(cluster, namespace, "hostpath") == []


@pytest.mark.parametrize(
    ("tpl", "message"),
    [
        ({"spec": {"volumes": [{"name": "tools", "emptyDir": {}}]}}, "tunefleet's own volumes"),
        ({"spec": {"volumes": [{"name": "w"}]}}, "a volume needs exactly one of"),
        (
            {
                "spec": {"volumes": [{"name": "w", "emptyDir": {}}]},
                "tune": {"volumeMounts": [{"name": "w", "mountPath": "/tunefleet/tools"}]},
            },
            "mount paths under /tunefleet/",
        ),
        (
            {"tune": {"volumeMounts": [{"name": "x", "mountPath": "/x"}]}},
            "must name a volume of spec.volumes",
        ),
        ({"metadata": {"labels": {"tunefleet.io/profile": "x"}}}, "label keys under tunefleet.io/"),
        (
            {"tune": {"resources": {"limits": {"nvidia.com/gpu": 2}}}},
            "may not name the GPU resource",
        ),
        ({"spec": {"nodeSelector": {"nvidia.com/gpu.product": "x"}}}, "may not name the GPU-model"),
        ({"spec": {"tolerations": [{"effect": "Sometimes"}]}}, "Unsupported value"),
        ({"spec": {"hostNetwork": True}}, 'unknown field "spec.template.spec.hostNetwork"'),
    ],
)
def test_the_api_server_refuses_what_the_schema_can_judge(
    cluster: Any, in_cluster: InCluster, s3: Any, namespace: str, tpl: dict[str, Any], message: str
) -> None:
    doc = real_profile("refused", s3, "s3", template=tpl)
    out = apply(cluster, namespace, doc, check=False)
    assert out.returncode != 0 and message in out.stderr, out.stderr[-1500:]


def test_the_largest_template_is_accepted_and_documented(
    cluster: Any, in_cluster: InCluster, s3: Any, namespace: str
) -> None:
    doc = real_profile("largest", s3, "s3")
    doc["spec"]["template"] = largest_template()
    server = ["apply", "--server-side", "--dry-run=server", "-n", namespace, "-f", "-"]
    cluster.kubectl(*server, input=json.dumps(doc), timeout=120)
    doc["spec"]["template"]["spec"]["volumes"].append({"name": "one-more", "emptyDir": {}})
    out = cluster.kubectl(*server, input=json.dumps(doc), timeout=120, check=False)
    assert out.returncode != 0 and "must have at most 12 items" in out.stderr, out.stderr[-1500:]

    # kubectl explain documents the template in Kubernetes' words (once the API server has
    # published the CRD's schema, which follows an update by a few seconds).
    def explain(field: str) -> str:
        out = cluster.kubectl("explain", f"tuningprofile.{field}", check=False)
        return str(out.stdout)

    pvc = "spec.template.spec.volumes.persistentVolumeClaim"
    text = eventually(lambda: explain(pvc), lambda t: "claimName" in t, f"kubectl explain {pvc}")
    assert "PersistentVolumeClaim" in text
    text = explain("spec.template")
    assert "record run" in text and "revision" in text, text
