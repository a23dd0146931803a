"""The stand-in flows under the torch 2.15 persona, and images without a shell or Python, on
the real node (issue 17).

The stand-in torch (tests/unit/data/fake_torch) plays torch 2.15 with FAKE_TORCH_PERSONA=2.15
in the profile's workload.env: CUBLASLT_VERSION and CUDA_DEVICE validators,
Gemm_Cublaslt_id_... candidates, its formats. It computes nothing and says so.

The no-shell and no-python images are targets of hack/images/standin/Containerfile
(`noshell`, `nopython`), built and imported by hack/images.sh as
tunefleet.local/standin-inference:2.11.0-standin-noshell and ...-nopython.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from testbed.library_pod import JobSpec, Pod, shapes
from testbed.operator import InCluster
from testbed.poll import eventually
from testbed.real_node import model_pod, real_profile
from tests.support.kube import apply, condition, create, ended, get_json, ready, statuses
from tunefleet.artifacts.fetch import Pinned, Serving, fetch
from tunefleet.storage.registry import parse_uri
from tunefleet.storage.s3 import S3Store

pytestmark = pytest.mark.e2e

PERSONA_215 = [{"name": "FAKE_TORCH_PERSONA", "value": "2.15"}]
NOSHELL_IMAGE = "tunefleet.local/standin-inference:2.11.0-standin-noshell"
NOPYTHON_IMAGE = "tunefleet.local/standin-inference:2.11.0-standin-nopython"


def test_the_215_persona_tunes_publishes_and_serves_on_the_real_node(
    cluster: Any, in_cluster: InCluster, s3: Any, namespace: str, s3_secret: str
) -> None:
    workload = {"shapes": real_profile("x", s3, s3_secret)["spec"]["workload"]["shapes"]}
    workload["env"] = PERSONA_215  # on CUDA: its candidates are cuBLASLt's
    # Served from the store: the fetch init container verifies and counts a 2.15 file.
    serving = {"delivery": "Store"}
    apply(
        cluster,
        namespace,
        real_profile("p215", s3, s3_secret, workload=workload, serving=serving),
    )
    prof = ready(cluster, namespace, "p215")
    assert prof["status"]["phase"] == "Ready", json.dumps(prof["status"], indent=2)[:4000]
    (art,) = prof["status"]["artifacts"]
    bucket, key = art["uri"][len("s3://") :].split("/", 1)
    manifest = json.loads(
        s3.client().get_object(Bucket=bucket, Key=f"{key}/manifest.json")["Body"].read()
    )
    assert set(manifest["validators"]) == {"PT_VERSION", "CUBLASLT_VERSION", "CUDA_DEVICE"}
    assert manifest["validators"]["PT_VERSION"] == "2.15.0+standin"
    assert manifest["identity"]["cublasltAlgoCount"] == "8"
    assert manifest["identity"]["partition"] == "whole"
    assert manifest["settings"]["rotatingBufferMB"] == -1
    results = s3.client().get_object(Bucket=bucket, Key=f"{key}/results.csv")["Body"].read()
    assert b",Gemm_Cublaslt_id_" in results and art["outcomes"]["tuned"] > 0

    create(cluster, namespace, model_pod("model215", "p215", gpus=1))
    done = ended(cluster, namespace, "model215", "the model pod to run")
    assert done["status"]["phase"] == "Succeeded", done["status"]
    fetched = statuses(done)["tunefleet-fetch"]["state"]["terminated"]["message"]
    assert f"({art['outcomes']['tuned']} tuned, {art['outcomes']['default']} Default)" in fetched


def test_an_image_without_a_shell_tunes(
    cluster: Any, in_cluster: InCluster, s3: Any, namespace: str, s3_secret: str
) -> None:
    apply(cluster, namespace, real_profile("noshell", s3, s3_secret, image=NOSHELL_IMAGE))
    prof = ready(cluster, namespace, "noshell")
    assert prof["status"]["phase"] == "Ready", json.dumps(prof["status"], indent=2)[:4000]


def test_an_image_without_python_fails_saying_so(
    cluster: Any, in_cluster: InCluster, s3: Any, namespace: str, s3_secret: str
) -> None:
    apply(cluster, namespace, real_profile("nopython", s3, s3_secret, image=NOPYTHON_IMAGE))
    prof = eventually(
        lambda: get_json(cluster, "tp", "-n", namespace, "nopython"),
        lambda p: (
            condition(p, "Failed").get("status") == "True"
            or "python3" in (condition(p, "Ready").get("message") or "")
        ),
        "nopython Failed",
        timeout=180,
        interval=1,
    )
    message = condition(prof, "Failed").get("message") or condition(prof, "Ready")["message"]
    assert f"the image {NOPYTHON_IMAGE} has no python3 on its PATH" in message, message


@pytest.mark.parametrize("persona", ["2.11", "2.15"])
def test_reuse_through_s3_under_both_personas(
    s3: Any, prefix: str, tmp_path: Path, persona: str
) -> None:
    """The library flow of tests/e2e/test_library_s3.py, with each persona's validators and
    candidates (2.15 on CUDA: cuBLASLt; 2.11: the ROCm backend, for non-Default winners)."""
    env = {"FAKE_TORCH_PERSONA": persona}
    env.update({} if persona == "2.15" else {"FAKE_TORCH_BACKEND": "rocm"})

    def job(profile: str, gemms: range) -> JobSpec:
        return JobSpec(
            uri=f"s3://{s3.bucket}/{prefix}",
            profile=profile,
            gemms=shapes(gemms),
            s3_env=s3.env(),
            torch_env=env,
            revision=f"r-{profile}",
        )

    first = Pod(job("first", range(0, 12)), tmp_path / "a").run()
    assert first.publish is not None and first.publish.returncode == 0, first.publish.stderr
    second = Pod(job("second", range(4, 16)), tmp_path / "b").run()
    assert second.tune.returncode == 0, second.tune.stderr
    message = second.message()
    assert (message["recorded"], message["reused"], message["newlyTuned"]) == (12, 8, 4)
    store = S3Store(parse_uri(message["uri"]), client=s3.client(), timeout_s=60)
    got = fetch(
        Pinned(message["uri"], message["sha256"]), tmp_path / "serve", Serving(2), store=store
    )
    assert got.gemms == 12 and got.outcomes is not None
