"""Every real results-file size is served on the real node (issue 19): the largest real file
seen (13,243 GEMMs, 1.24 MB) through a gzipped ConfigMap that a local init container unpacks,
and a file too big for a ConfigMap even gzipped through the documented fallback, the fetch
init container with read-only credentials.

The artifacts are published here with tunefleet's own publish code (the stand-in inference
image cannot record 13,243 GEMMs in a test's time), and named in the profile's status as a
finished tuning Job would; the operator then delivers them (or says why not) and the webhook
mounts them, for real. The profile asks for more GPUs than the real node has, so its own
tuning Job never runs and never replaces them.
"""

from __future__ import annotations

import json
import secrets
import tempfile
from pathlib import Path
from typing import Any

import pytest

from testbed.cluster import REAL_NODE_GPU_MODEL
from testbed.operator import InCluster
from testbed.poll import eventually
from testbed.real_node import model_pod, real_profile
from tests.support.kube import apply, create, ended, get_json, statuses
from tunefleet import naming
from tunefleet.api import TuningProfileSpec
from tunefleet.artifacts.publish import Output, publish
from tunefleet.builders.artifact import CONFIG_MAP_BYTES
from tunefleet.storage.registry import parse_uri
from tunefleet.storage.s3 import S3Store
from tuner_job.manifest import ArtifactId
from tuner_job.output import RunFacts, write_output
from tuner_job.results import parse_results

pytestmark = pytest.mark.e2e

# A ROCm identity (hipBLASLt solutions are ROCm's; CUDA 2.11 registers only Default).
VALIDATORS = (
    "Validator,PT_VERSION,2.11.0\n"
    "Validator,ROCM_VERSION,6.4.0\n"
    "Validator,HIPBLASLT_VERSION,0.12.0\n"
    "Validator,GCN_ARCH_NAME,gfx942:sramecc+:xnack-\n"
)


def largest_real_file() -> str:
    """As big as the largest real file seen: 13,243 GEMMs, 1.24 MB (it compresses well)."""
    row = "GemmTunableOp_BFloat16_TN,tn_{}_4096_4096_ld_4096_4096_4096,Gemm_Hipblaslt_1234,0.0123\n"
    return VALIDATORS + "".join(row.format(i + 1) for i in range(13_243))


def too_big_file() -> str:
    """Bigger than a ConfigMap even gzipped: solutions that do not compress."""
    rows = (
        f"GemmTunableOp_BFloat16_TN,tn_{i + 1}_4096_4096_ld_4096_4096_4096,"
        f"Gemm_Hipblaslt_{secrets.token_hex(24)},0.{secrets.randbelow(10**6):06d}\n"
        for i in range(40_000)
    )
    return VALIDATORS + "".join(rows)


def publish_here(s3: Any, namespace: str, profile: str, spec: dict[str, Any], text: str) -> Any:
    results = parse_results(text)
    out = Path(tempfile.mkdtemp(prefix="tunefleet-sizes-"))
    write_output(
        out,
        results,
        ArtifactId(
            namespace=namespace,
            profile=profile,
            revision=naming.revision(TuningProfileSpec.model_validate(spec)),
            gpu_model=REAL_NODE_GPU_MODEL,
        ),
        RunFacts(
            recorded=results.gemms,
            identity={"gpuName": "stand-in (no GPU in this test)"},
            seconds=1.0,
            tool_version="tunefleet-e2e-sizes",
        ),
    )
    uri = spec["storage"]["uri"]
    store = S3Store(parse_uri(uri), client=s3.client())
    return publish(Output(out, uri, namespace, profile, REAL_NODE_GPU_MODEL), store=store)


@pytest.mark.parametrize("size", ["largest-real", "too-big"])
def test_every_real_size_is_served_and_a_bigger_file_takes_the_store_path(
    cluster: Any, in_cluster: InCluster, s3: Any, namespace: str, s3_secret: str, size: str
) -> None:
    text = largest_real_file() if size == "largest-real" else too_big_file()
    doc = real_profile("sizes", s3, s3_secret)
    # More GPUs than the real node has: the profile's own Job stays Pending.
    doc["spec"]["gpu"]["count"] = 16
    apply(cluster, namespace, doc)
    pub = publish_here(s3, namespace, "sizes", doc["spec"], text)
    entry = {
        "gpuModel": REAL_NODE_GPU_MODEL, "uri": pub.uri, "sha256": pub.sha256,
        "manifestSha256": pub.manifest_sha256,
        "revision": naming.revision(TuningProfileSpec.model_validate(doc["spec"])),
        "gemms": text.count("\n") - VALIDATORS.count("\n"), "job": "published-by-the-test",
    }  # fmt: skip
    cluster.kubectl(
        "patch", "tuningprofile", "sizes", "-n", namespace, "--subresource=status",
        "--type=merge", "-p", json.dumps({"status": {"artifacts": [entry]}}),
    )  # fmt: skip
    prof = eventually(
        lambda: get_json(cluster, "tp", "-n", namespace, "sizes"),
        lambda p: any(a.get("delivery") for a in (p.get("status") or {}).get("artifacts") or []),
        "the operator's word on delivery",
        timeout=120,
        interval=1,
    )
    (art,) = prof["status"]["artifacts"]
    if size == "largest-real":
        assert len(text) > 1_000_000 and art["delivery"] == "ConfigMap gzip", art
    else:
        assert len(text) > 3 * CONFIG_MAP_BYTES, len(text)
        assert art["delivery"].startswith("Store: delivery as a ConfigMap failed"), art
        assert "do not fit a ConfigMap, even gzipped" in art["delivery"]

    create(cluster, namespace, model_pod("served", "sizes", gpus=1))
    done = ended(cluster, namespace, "served", "the model pod to report its files")
    assert done["status"]["phase"] == "Succeeded", done["status"]
    fetched = statuses(done)["tunefleet-fetch"]["state"]["terminated"]
    assert fetched["exitCode"] == 0 and "refusing" not in (fetched.get("message") or "")
    (init,) = done["spec"]["initContainers"]
    if size == "largest-real":
        # Unpacked from the mounted ConfigMap: no store, no credentials.
        assert init["command"][init["command"].index("--uri") + 1].startswith("file:///")
        assert not [e for e in init.get("env") or [] if "valueFrom" in e], init.get("env")
    else:
        assert init["command"][init["command"].index("--uri") + 1] == pub.uri
    logs = cluster.kubectl("logs", "-n", namespace, "served", "-c", "server").stdout
    assert "results ordinal 0: " in logs and f"({len(text.encode())} bytes)" in logs, logs
