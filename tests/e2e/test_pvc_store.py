"""A cluster without object storage: a pvc:// store, for real on the real node. The tuning Job
(bootstrap, sync, tune in the stand-in image, publish) writes the artifact and its library
entry onto a PersistentVolumeClaim, and a model pod's fetch reads it from the same claim,
mounted read-only, with no credentials anywhere.

The claim is bound to a hostPath PersistentVolume on the real node (one node: ReadWriteOnce
serves every pod there); a real cluster with several nodes needs a ReadWriteMany class.
"""

from __future__ import annotations

import json
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from testbed.builders.wrappers import make_pvc
from testbed.cluster import REAL_NODE_GPU_MODEL, STANDIN_IMAGE, real_node_volume
from testbed.operator import InCluster
from testbed.real_node import SHAPES, model_pod
from tests.support.kube import apply, create, ended, get_json, jobs_of, ready, statuses

pytestmark = pytest.mark.e2e

HOST_ROOT = Path("/var/lib/tunefleet-e2e")  # on this machine, which is the real node


@pytest.fixture
def claim(cluster: Any, namespace: str) -> Iterator[tuple[str, Path]]:
    """A PVC in the test's namespace, bound to a fresh hostPath volume; (name, its directory)."""
    name = f"pv-{uuid.uuid4().hex[:10]}"
    path = HOST_ROOT / name
    path.mkdir(parents=True)
    path.chmod(0o777)  # hostPath ignores fsGroup: tunefleet's user (65532) writes here
    pv = real_node_volume(name, path, namespace, "artifacts", ["ReadWriteOnce"])
    pvc = make_pvc("artifacts", namespace, name).obj()
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all([pv, pvc]))
    try:
        yield "artifacts", path
    finally:
        cluster.kubectl("delete", "pv", name, "--wait=false", check=False)
        shutil.rmtree(path, ignore_errors=True)


def test_a_pvc_store_tunes_publishes_and_serves_without_credentials(
    cluster: Any, in_cluster: InCluster, namespace: str, claim: tuple[str, Path]
) -> None:
    name, root = claim
    profile = {
        "apiVersion": "tunefleet.io/v1alpha1",
        "kind": "TuningProfile",
        "metadata": {"name": "onpvc"},
        "spec": {
            "image": STANDIN_IMAGE,
            "imagePullPolicy": "Never",
            "gpu": {"vendor": "nvidia", "models": [REAL_NODE_GPU_MODEL]},
            "workload": {
                "shapes": SHAPES,
                "env": [{"name": "FAKE_TORCH_BACKEND", "value": "rocm"}],
            },
            "tuning": {"backoffLimit": 0, "budgetSeconds": 300, "activeDeadlineSeconds": 600},
            "storage": {"uri": f"pvc://{name}/artifacts"},
        },
    }
    apply(cluster, namespace, profile)
    prof = ready(cluster, namespace, "onpvc")
    assert prof["status"]["phase"] == "Ready", json.dumps(prof["status"], indent=2)[:4000]
    (art,) = prof["status"]["artifacts"]
    prefix = f"pvc://{name}/artifacts/{namespace}/onpvc/{REAL_NODE_GPU_MODEL}/"
    assert art["uri"] == prefix + art["sha256"] and art["outcomes"]["tuned"] > 0
    # On the claim's volume: the artifact, its manifest, and the library entry it joined.
    where = root / "artifacts" / namespace / "onpvc" / REAL_NODE_GPU_MODEL / art["sha256"]
    manifest = json.loads((where / "manifest.json").read_text())
    assert manifest["resultsSha256"] == art["sha256"]
    assert manifest["validators"]["PT_VERSION"].endswith("+standin")
    library = root / "artifacts" / namespace / "_library" / REAL_NODE_GPU_MODEL / art["libraryKey"]
    assert len(list(library.glob("*.json"))) == 1
    (job,) = jobs_of(cluster, namespace, "onpvc")
    tuning = job["spec"]["template"]["spec"]
    for c in tuning["initContainers"] + tuning["containers"]:
        assert not any(e["name"].startswith("AWS_") for e in c.get("env") or []), c["name"]

    # A model pod gets the artifact from the same claim, read-only, and nothing else.
    create(cluster, namespace, model_pod("model", "onpvc", gpus=2))
    done = ended(cluster, namespace, "model", "the model pod to run")
    assert done["status"]["phase"] == "Succeeded", done["status"]
    fetch = statuses(done)["tunefleet-fetch"]["state"]["terminated"]
    assert fetch["exitCode"] == 0 and "wrote 2 results file(s)" in fetch["message"], fetch
    pod = get_json(cluster, "pod", "-n", namespace, "model")
    (volume,) = [v for v in pod["spec"]["volumes"] if "persistentVolumeClaim" in v]
    assert volume["persistentVolumeClaim"] == {"claimName": name, "readOnly": True}
    (init,) = [c for c in pod["spec"]["initContainers"] if c["name"] == "tunefleet-fetch"]
    assert not init.get("env") and all(
        m["readOnly"] for m in init["volumeMounts"] if m["name"] == volume["name"]
    )
    log = cluster.kubectl("logs", "-n", namespace, "model", "-c", "server").stdout
    assert "tunableop_results0.csv" in log and "tunableop_results1.csv" in log
