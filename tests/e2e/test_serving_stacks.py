"""What users deploy, on the real node: the manifests of examples/serving/, each run with the
stand-in image in place of the serving image (and the stand-in GPU model, GPU resources scaled
to the node, CPU and memory requests dropped, probes dropped: the stand-in serves no HTTP).
Everything else is the example's own: labels, init containers, volumes, affinity, env.

- a vLLM-style Deployment: tensor parallel 2 (one worker process per GPU), a memory-backed
  /dev/shm, a model PVC, required node affinity `In` the GPU model;
- a KServe predictor pod (the Deployment KServe makes): KServe's storage-initializer still runs,
  after tunefleet's fetch;
- a LeaderWorkerSet group (the pods LWS makes): each pod is injected, with its own ordinals;
- TGI: its ROCm warmup's TunableOp calls (the stand-in server replays them in TGI's order):
  tunefleet's file is loaded and its tuning-off holds against TGI's Python API calls.

In each: the serving container's log shows TunableOp on, tuning off and, per GPU ordinal, the
results loaded (the stand-in torch holds exactly the artifact's GEMMs after running them), and
no model pod names a Secret that can write to the store.
"""

from __future__ import annotations

import copy
import json
import shutil
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from testbed.builders.wrappers import make_pvc
from testbed.cluster import (
    REAL_NODE,
    REAL_NODE_GPU_MODEL,
    ROOT,
    STANDIN_IMAGE,
    real_node_volume,
    wait_for_real_node_gpus,
)
from testbed.operator import SERVING_SECRET, InCluster
from testbed.poll import eventually
from testbed.real_node import KEY, SHAPES, real_profile
from tests.support.kube import apply, create, get_json, pod_of, ready, statuses
from tunefleet.contracts.admission_record import Admission
from tunefleet.contracts.fetch_outcome import CONTAINER as FETCH_CONTAINER
from tuner_job.output import RESULTS_NAME

pytestmark = pytest.mark.e2e

EXAMPLES = ROOT / "examples" / "serving"
HOST_ROOT = Path("/var/lib/tunefleet-e2e")  # on this machine, which is the real node
GPU_KEYS = ("nvidia.com/gpu.product", "amd.com/gpu.product-name")
GPU_RESOURCES = ("nvidia.com/gpu", "amd.com/gpu")
# The profile tunes with the stand-in on a "ROCm" backend; the serving process must run the
# same backend, or TunableOp rejects the file (its validators differ) and serves untuned.
SERVE_ENV = [
    {"name": "FAKE_TORCH_BACKEND", "value": "rocm"},
    {"name": "STANDIN_GEMMS", "value": json.dumps(SHAPES)},
    {"name": "STANDIN_GEMMS_EVERY", "value": "30"},
]


@pytest.fixture(autouse=True)
def _real_node_gpus(cluster: Any) -> None:
    """The tuning Job's pod (1) and the LeaderWorkerSet group (2 pods of 2), at most."""
    wait_for_real_node_gpus(cluster, 5)


@pytest.fixture
def hf_token(cluster: Any, namespace: str) -> str:
    """The examples' Hugging Face token Secret (a dummy: nothing is downloaded)."""
    cluster.kubectl(
        "create", "secret", "generic", "hf-token", "-n", namespace, "--from-literal=HF_TOKEN=x"
    )
    return "hf-token"


@pytest.fixture
def claims(cluster: Any, namespace: str) -> Iterator[Callable[[str], Path]]:
    """make(name): a PVC `name` in the test's namespace bound to a fresh hostPath volume on
    the real node; returns its directory here (this machine is the real node)."""
    made: list[tuple[str, Path]] = []

    def make(claim: str) -> Path:
        pv = f"pv-{uuid.uuid4().hex[:10]}"
        path = HOST_ROOT / pv
        path.mkdir(parents=True)
        path.chmod(0o777)
        made.append((pv, path))
        docs = [
            real_node_volume(pv, path, namespace, claim, ["ReadWriteOnce", "ReadOnlyMany"]),
            make_pvc(claim, namespace, pv).obj(),
        ]
        cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))
        return path

    try:
        yield make
    finally:
        for pv, path in made:
            cluster.kubectl("delete", "pv", pv, "--wait=false", check=False)
            shutil.rmtree(path, ignore_errors=True)


# --- the examples, for the stand-in ----------------------------------------------------------


def example(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((EXAMPLES / name).read_text()) if d]


def pod_spec(doc: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = doc["spec"]["template"]["spec"] if doc["kind"] != "Pod" else doc["spec"]
    return spec


def profile_of(doc: dict[str, Any]) -> str:
    meta = doc["spec"]["template"]["metadata"] if doc["kind"] != "Pod" else doc["metadata"]
    return str(meta["labels"]["tunefleet.io/profile"])


def _on_the_real_node(spec: dict[str, Any]) -> None:
    """The example's GPU model (by selector or required affinity) becomes the real node's."""
    for key in GPU_KEYS:
        if key in (spec.get("nodeSelector") or {}):
            del spec["nodeSelector"][key]
            spec["nodeSelector"][KEY] = REAL_NODE_GPU_MODEL
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    for term in required.get("nodeSelectorTerms") or []:
        for expr in term.get("matchExpressions") or []:
            if expr["key"] in GPU_KEYS:
                expr["key"], expr["values"] = KEY, [REAL_NODE_GPU_MODEL]


def standin(doc: dict[str, Any], command: list[str], gpus: int) -> dict[str, Any]:
    """The example for the real node: the stand-in image runs `command` in every container
    (init containers keep their role: the caller gives them theirs)."""
    out = copy.deepcopy(doc)
    spec = pod_spec(out)
    _on_the_real_node(spec)
    spec["terminationGracePeriodSeconds"] = 5
    for c in spec["containers"]:
        c.update(image=STANDIN_IMAGE, imagePullPolicy="Never", command=command)
        c.pop("args", None)
        for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
            c.pop(probe, None)
        c["env"] = [*(c.get("env") or []), *SERVE_ENV]
        c["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}  # no CPU/memory: 2 cores
    return out


# --- what a served pod shows ---------------------------------------------------------------


def artifact(cluster: Any, namespace: str, profile: str) -> dict[str, Any]:
    prof = ready(cluster, namespace, profile)
    assert prof["status"]["phase"] == "Ready", json.dumps(prof["status"])[:3000]
    (art,) = prof["status"]["artifacts"]
    assert art["gemms"] > 0
    return dict(art)


def running(cluster: Any, namespace: str, selector: str, count: int) -> list[dict[str, Any]]:
    pods: list[dict[str, Any]] = eventually(
        lambda: get_json(cluster, "pods", "-n", namespace, "-l", selector)["items"],
        lambda ps: len(ps) == count and all(p["status"].get("phase") == "Running" for p in ps),
        f"{count} pod(s) {selector} running",
        timeout=150,
        interval=1,
    )
    return pods


def served_log(
    cluster: Any, namespace: str, pod: str, container: str, ordinals: int, gemms: int
) -> str:
    """The container's log once every ordinal's worker ran its GEMMs; asserts each of them
    holds exactly the artifact's results (loaded from its ordinal's file, none tuned)."""

    def log() -> str:
        return str(
            cluster.kubectl("logs", "-n", namespace, pod, "-c", container, check=False).stdout
        )

    text = eventually(
        log,
        lambda t: all(f"GEMM(s) on device {i};" in t for i in range(ordinals)),
        f"{pod}'s {ordinals} worker(s) to run their GEMMs",
        timeout=90,
        interval=1,
    )
    assert "env PYTORCH_TUNABLEOP_ENABLED=1" in text and "env PYTORCH_TUNABLEOP_TUNING=0" in text
    for i in range(ordinals):
        assert f"results ordinal {i}: /tunefleet/results/tunableop_results{i}.csv" in text, text
        assert f"on device {i}; TunableOp holds {gemms} result(s)" in text, text
    assert f"results ordinal {ordinals}:" not in text  # one file per GPU the pod has
    assert "+standin" in text
    return text


def no_write_credentials(pod: dict[str, Any], publish_secret: str) -> None:
    """The publish Secret appears nowhere; tunefleet's containers name the read-only one only."""
    assert publish_secret not in yaml.safe_dump(pod["spec"]), pod["metadata"]["name"]
    for c in pod["spec"].get("initContainers") or []:
        if not c["name"].startswith("tunefleet-"):
            continue
        for e in c.get("env") or []:
            ref = (e.get("valueFrom") or {}).get("secretKeyRef") or {}
            assert ref.get("name") in (None, SERVING_SECRET), (c["name"], e)


def results_items(pod: dict[str, Any]) -> list[str]:
    """The per-ordinal files of the artifact's ConfigMap volume."""
    (vol,) = [v for v in pod["spec"]["volumes"] if v["name"] == "tunefleet-results"]
    (source,) = vol["projected"]["sources"]
    return [i["path"] for i in source["configMap"]["items"]]


# --- the stacks ------------------------------------------------------------------------------


def test_a_vllm_tensor_parallel_deployment_loads_one_file_per_worker(
    cluster: Any,
    in_cluster: InCluster,
    s3: Any,
    namespace: str,
    s3_secret: str,
    hf_token: str,
    claims: Callable[[str], Path],
) -> None:
    (doc,) = example("vllm-deployment.yaml")
    profile = profile_of(doc)
    apply(cluster, namespace, real_profile(profile, s3, s3_secret))
    weights = claims("llama-3-1-8b-weights") / "llama-3.1-8b-instruct"
    weights.mkdir()
    (weights / "config.json").write_text("{}\n")
    # The model from the PVC, then one worker process per GPU (vLLM's tensor parallel 2).
    command = [
        "sh", "-c",
        "test -s /models/llama-3.1-8b-instruct/config.json && exec standin-server --tp 2",
    ]  # fmt: skip
    dep = standin(doc, command, gpus=2)
    dep["spec"]["replicas"] = 1
    art = artifact(cluster, namespace, profile)
    create(cluster, namespace, dep)
    (pod,) = running(cluster, namespace, "app=llama-3-1-8b", 1)
    name, spec = pod["metadata"]["name"], pod["spec"]
    a = Admission.read(pod)
    assert a is not None and a.sha256 == art["sha256"] and a.gpu_model == REAL_NODE_GPU_MODEL
    assert spec["nodeName"] == REAL_NODE
    assert KEY not in (spec.get("nodeSelector") or {})  # the affinity is read, nothing added
    assert spec["affinity"] == pod_spec(dep)["affinity"]
    assert results_items(pod) == ["tunableop_results0.csv", "tunableop_results1.csv"]
    assert not spec.get("initContainers")  # a ConfigMap: nothing to fetch, no credentials
    (vllm,) = spec["containers"]
    mounts = {m["mountPath"]: m for m in vllm["volumeMounts"]}
    assert mounts["/models"]["readOnly"] is True and "/dev/shm" in mounts
    vols = {v["name"]: v for v in spec["volumes"]}
    assert vols["dshm"]["emptyDir"]["medium"] == "Memory"
    assert vols["weights"]["persistentVolumeClaim"]["claimName"] == "llama-3-1-8b-weights"
    served_log(cluster, namespace, name, "vllm", ordinals=2, gemms=art["gemms"])
    shm = cluster.kubectl(
        "exec", "-n", namespace, name, "-c", "vllm", "--", "sh", "-c", "grep ' /dev/shm ' /proc/mounts"
    ).stdout  # fmt: skip
    # The volume over the runtime's own 64 MiB /dev/shm: memory-backed, sized by its limit.
    last = shm.strip().splitlines()[-1]
    assert last.split()[2] == "tmpfs" and "size=65536k" not in last, shm
    no_write_credentials(pod, s3_secret)


def test_a_kserve_predictor_pod_runs_storage_initializer_after_tunefleets_fetch(
    cluster: Any, in_cluster: InCluster, s3: Any, namespace: str, s3_secret: str
) -> None:
    (doc,) = example("kserve-predictor-pod.yaml")
    profile = profile_of(doc)
    # From the store: tunefleet adds its fetch init container, and its place among KServe's
    # init containers shows.
    apply(cluster, namespace, real_profile(profile, s3, s3_secret, serving={"delivery": "Store"}))
    command = ["sh", "-c", "test -s /mnt/models/config.json && exec standin-server"]
    dep = standin(doc, command, gpus=1)
    (init,) = pod_spec(dep)["initContainers"]
    assert init["name"] == "storage-initializer"
    # KServe's storage-initializer, played: it "downloads" the model into /mnt/models.
    init.update(
        image=STANDIN_IMAGE,
        imagePullPolicy="Never",
        command=["sh", "-c", "sleep 1; echo '{}' > /mnt/models/config.json"],
        resources={},
    )
    init.pop("args")
    art = artifact(cluster, namespace, profile)
    create(cluster, namespace, dep)
    (pod,) = running(cluster, namespace, "serving.kserve.io/inferenceservice=mistral-7b", 1)
    name, spec = pod["metadata"]["name"], pod["spec"]
    labels = pod["metadata"]["labels"]
    assert labels["component"] == "predictor" and labels["app"] == "isvc.mistral-7b-predictor"
    assert [c["name"] for c in spec["initContainers"]] == [FETCH_CONTAINER, "storage-initializer"]
    # KServe's init container as it was given (the API server adds its defaults and the
    # ServiceAccount token's mount; tunefleet adds nothing).
    kserve_init = copy.deepcopy(spec["initContainers"][1])
    kserve_init["volumeMounts"] = [
        m for m in kserve_init["volumeMounts"] if not m["name"].startswith("kube-api-access")
    ]
    assert kserve_init == {**init, **{k: kserve_init[k] for k in kserve_init if k not in init}}
    assert not any(e["name"].startswith("PYTORCH_TUNABLEOP_") for e in kserve_init.get("env") or [])
    st = statuses(pod)
    fetched = st[FETCH_CONTAINER]["state"]["terminated"]
    downloaded = st["storage-initializer"]["state"]["terminated"]
    assert fetched["exitCode"] == 0 and "wrote 1 results file(s)" in fetched["message"], fetched
    assert downloaded["exitCode"] == 0
    assert fetched["finishedAt"] <= downloaded["startedAt"]  # in order, one after the other
    served_log(cluster, namespace, name, "kserve-container", ordinals=1, gemms=art["gemms"])
    refs = {
        e["valueFrom"]["secretKeyRef"]["name"]
        for e in spec["initContainers"][0].get("env") or []
        if "valueFrom" in e
    }
    assert refs == {SERVING_SECRET}
    no_write_credentials(pod, s3_secret)


def test_every_pod_of_a_leaderworkerset_group_gets_its_own_ordinals(
    cluster: Any, in_cluster: InCluster, s3: Any, namespace: str, s3_secret: str
) -> None:
    leader_doc, worker_doc = example("leaderworkerset-pods.yaml")
    profile = profile_of(leader_doc)
    assert profile_of(worker_doc) == profile
    apply(cluster, namespace, real_profile(profile, s3, s3_secret))
    art = artifact(cluster, namespace, profile)
    # Each pod: 2 GPUs (8 in the example), one worker process per GPU (Ray's, in the example).
    for doc in (leader_doc, worker_doc):
        create(cluster, namespace, standin(doc, ["standin-server", "--tp", "2"], gpus=2))
    pods = running(cluster, namespace, "leaderworkerset.sigs.k8s.io/name=llama-405b", 2)
    by_index = {
        p["metadata"]["labels"]["leaderworkerset.sigs.k8s.io/worker-index"]: p for p in pods
    }
    assert set(by_index) == {"0", "1"}
    for index, pod in by_index.items():
        name = pod["metadata"]["name"]
        a = Admission.read(pod)
        assert a is not None and a.sha256 == art["sha256"], name
        assert results_items(pod) == ["tunableop_results0.csv", "tunableop_results1.csv"]
        (vllm,) = pod["spec"]["containers"]
        env = {e["name"]: e.get("value") for e in vllm["env"]}
        assert env["LWS_WORKER_INDEX"] == index and env["LWS_GROUP_SIZE"] == "2"
        assert env["PYTORCH_TUNABLEOP_TUNING"] == "0"
        served_log(cluster, namespace, name, "vllm", ordinals=2, gemms=art["gemms"])
        no_write_credentials(pod, s3_secret)
    assert (
        by_index["1"]["metadata"]["annotations"]["leaderworkerset.sigs.k8s.io/leader-name"]
        == (by_index["0"]["metadata"]["name"])
    )


def test_tgi_warmup_loads_tunefleets_file_and_does_not_tune(
    cluster: Any,
    in_cluster: InCluster,
    s3: Any,
    namespace: str,
    s3_secret: str,
    hf_token: str,
    claims: Callable[[str], Path],
) -> None:
    (doc,) = example("tgi-deployment.yaml")
    profile = profile_of(doc)
    apply(cluster, namespace, real_profile(profile, s3, s3_secret))
    art = artifact(cluster, namespace, profile)
    model = "meta-llama-Llama-3.1-8B-Instruct"
    cache = claims("llama-3-1-8b-tgi-cache")
    # An earlier TGI pod left its own file for rank 0 (same torch: same validators) with one
    # GEMM the artifact lacks: TGI reads it after tunefleet's; both are held.
    cm = get_json(cluster, "configmap", "-n", namespace, art["configMap"]["name"])
    validators = [ln for ln in cm["data"][RESULTS_NAME].splitlines() if ln.startswith("Validator,")]
    extra = "GemmTunableOp_BFloat16_TN,tn_7_7_7_ld_7_7_7,Default,0.01"
    (cache / f"tunableop_{model}_tp2_rank0.csv").write_text("\n".join([*validators, extra]) + "\n")
    dep = standin(doc, ["standin-server", "--tp", "2", "--tgi-warmup"], gpus=2)
    (tgi,) = pod_spec(dep)["containers"]
    tgi["env"].append({"name": "MODEL_ID", "value": "meta-llama/Llama-3.1-8B-Instruct"})
    create(cluster, namespace, dep)
    (pod,) = running(cluster, namespace, "app=llama-3-1-8b-tgi", 1)
    name = pod["metadata"]["name"]
    text = served_log(cluster, namespace, name, "tgi", ordinals=2, gemms=art["gemms"])
    warmed = eventually(
        lambda: cluster.kubectl("logs", "-n", namespace, name, "-c", "tgi").stdout,
        lambda t: t.count("tgi warmup rank") == 2,
        "both ranks' TGI warmup",
        timeout=60,
        interval=1,
    )
    for rank, reused, held in ((0, True, art["gemms"] + 1), (1, False, art["gemms"])):
        line = next(ln for ln in warmed.splitlines() if f"tgi warmup rank {rank}:" in ln)
        # TGI's set_filename took over the name, after tunefleet's file was loaded; its own
        # file adds to it; TunableOp's environment kept tuning off through TGI's calls.
        assert f"filename /data/tunableop_{model}_tp2_rank{rank}.csv (reused: {reused}," in line
        assert f"TunableOp holds {held} result(s)" in line, line
        assert "tuning during warmup: False, after: False" in line, line
    assert "GEMM(s) on device 0; TunableOp holds" in text
    no_write_credentials(pod_of(cluster, namespace, name), s3_secret)
