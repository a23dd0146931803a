"""A torchCompile bundle for real: real torch (PyPI's 2.11 wheel, hack/images.sh --torch), real
Inductor compiling for the real node's CPU, no stand-in anywhere.

The tuning Job runs the workload (examples/torch-compile/serve.py: a model built in code under
torch.compile, max-autotune) in the torch image with Inductor's and Triton's caches pointed at
empty directories, packs what Inductor wrote and publishes it alone (no TunableOp: no GPU).
A model pod that references the profile gets a writable copy from the fetch init container
and its first inference hits the caches (Inductor's own counters, printed by the pod) with
outputs equal, bit for bit, to a pod that compiled cold without tunefleet. A tampered archive
in the store is never unpacked: the next pod says why and compiles cold, with the same
outputs.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from testbed.cluster import ensure_torch_image, wait_for_real_node_gpus
from testbed.compile import compile_pod, compile_profile, result_of, workload_config_map
from testbed.operator import InCluster
from testbed.poll import eventually
from tests.support.kube import apply, create, get_json, pod_of, ready, statuses

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def torch_image(cluster: Any) -> str:
    return ensure_torch_image()


def _finished(cluster: Any, namespace: str, name: str) -> dict[str, Any]:
    pod = eventually(
        lambda: pod_of(cluster, namespace, name),
        lambda p: p["status"].get("phase") in ("Succeeded", "Failed"),
        f"pod {name} to finish",
        timeout=600,
        interval=2,
    )
    log = cluster.kubectl("logs", "-n", namespace, name, "-c", "server").stdout
    assert pod["status"]["phase"] == "Succeeded", log[-4000:]
    result = result_of(log)
    assert result is not None, log[-4000:]
    return {"pod": pod, "result": result, "log": log}


def _answered(cluster: Any, namespace: str, name: str) -> dict[str, Any]:
    """A serving pod once its workload answered its first request (it stays up)."""

    def logged() -> str:
        done = cluster.kubectl("logs", "-n", namespace, name, "-c", "server", check=False)
        return str(done.stdout or "")

    log = eventually(logged, lambda text: result_of(text) is not None, f"{name} to answer",
                     timeout=600, interval=2)  # fmt: skip
    result = result_of(log)
    assert result is not None
    return {"pod": pod_of(cluster, namespace, name), "result": result, "log": log}


def test_a_torch_compile_bundle_is_tuned_once_and_served_warm_bit_for_bit(
    cluster: Any,
    in_cluster: InCluster,
    s3: Any,
    namespace: str,
    s3_secret: str,
    torch_image: str,
) -> None:
    wait_for_real_node_gpus(cluster, 2)
    apply(cluster, namespace, workload_config_map())
    apply(cluster, namespace, compile_profile("compiled", torch_image, s3, s3_secret))
    # The reference: the same workload compiled cold in the same image, no tunefleet.
    create(cluster, namespace, compile_pod("cold", torch_image, None))
    cold = _finished(cluster, namespace, "cold")["result"]
    assert (
        cold["counters"]["fxgraph_cache_miss"] >= 1 and cold["counters"]["fxgraph_cache_hit"] == 0
    )

    prof = ready(cluster, namespace, "compiled", timeout=1200)
    st = prof["status"]
    assert st["phase"] == "Ready", json.dumps(st, indent=2)[:4000]
    (art,) = st["artifacts"]
    assert art["kind"] == "caches" and art["gemms"] == 0
    (cache,) = art["caches"]
    assert cache["kind"] == "torchCompile" and cache["name"] == "torchcompile"
    assert cache["files"] > 0 and cache["size"] > 0
    assert art["identity"]["torch"].startswith("2.11.0")
    assert st["kinds"] == "torchcompile" and st["tunedGemms"] == "-"
    assert art["delivery"].startswith("Store: the artifact carries caches")
    wide = cluster.kubectl("get", "tp", "-n", namespace, "compiled", "-o", "wide").stdout
    assert "KINDS" in wide and "torchcompile" in wide
    # Measured in the Job, for real (real torch, real Inductor): the workload's first inference
    # with the bundle against without, cold directories every run; no stand-in anywhere.
    gain = art["gain"]
    assert not gain.get("standIn"), gain
    (fig,) = [f for f in gain["figures"] if f["name"] == "workload"]
    assert fig["speedup"] > 1.0 and fig["tunedSeconds"] < fig["baselineSeconds"], fig
    assert fig["repetitions"] >= 2, fig
    assert art["promotion"]["verdict"] == "Passed", art["promotion"]
    assert "GAIN" in wide and f"{fig['speedup']:.2f}x" in wide, wide
    print(f"torchCompile bundle, measured in the tuning Job: {fig}")

    create(cluster, namespace, compile_pod("warm", torch_image, "compiled"))
    warm = _finished(cluster, namespace, "warm")
    fetch = statuses(warm["pod"])["tunefleet-fetch"]["state"]["terminated"]
    assert fetch["exitCode"] == 0
    assert "caches torchcompile unpacked to /tunefleet/caches" in fetch["message"], fetch
    got = warm["result"]
    assert got["caches"]["TORCHINDUCTOR_CACHE_DIR"] == "/tunefleet/caches/torchcompile/inductor"
    # The first inference compiled nothing: Inductor found every graph in the bundle.
    assert got["counters"]["fxgraph_cache_hit"] >= 1, got
    assert got["counters"]["fxgraph_cache_miss"] == 0, got
    assert got["output_sha256"] == cold["output_sha256"]
    assert got["first_call_s"] < cold["first_call_s"]

    # Tampered in the store: the archive is never unpacked, the pod compiles cold, same outputs.
    key = f"bundles/{namespace}/compiled/{art['gpuModel']}/{art['sha256']}/caches/{cache['sha256']}.tar.gz"
    client = s3.client()
    body = client.get_object(Bucket=s3.bucket, Key=key)["Body"].read()
    client.put_object(Bucket=s3.bucket, Key=key, Body=body[:-64] + b"\0" * 64)
    # Serving (it stays up): a pod of ours running without what was tuned is what Degraded
    # counts.
    create(cluster, namespace, compile_pod("tampered", torch_image, "compiled", serve=True))
    bad = _answered(cluster, namespace, "tampered")
    fetch = statuses(bad["pod"])["tunefleet-fetch"]["state"]["terminated"]
    assert "starting untuned: caches not served" in fetch["message"], fetch
    assert "SHA-256" in fetch["message"]
    assert bad["result"]["counters"]["fxgraph_cache_miss"] >= 1
    assert bad["result"]["output_sha256"] == cold["output_sha256"]
    # A pod of ours started without what was tuned: the profile says so.
    degraded = eventually(
        lambda: get_json(cluster, "tp", "-n", namespace, "compiled"),
        lambda p: any(
            c["type"] == "Degraded" and c["status"] == "True"
            for c in (p.get("status") or {}).get("conditions") or []
        ),
        "the profile's Degraded condition",
        timeout=120,
        interval=2,
    )
    assert degraded["status"]["phase"] == "Degraded"
