"""The storage seam: URIs by scheme, what each backend gives a pod, and a pvc:// profile's
Jobs and model pods (a volume, no credentials)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from testbed.builders.wrappers import make_artifact, make_model_pod, make_profile
from tunefleet.builders.job import Child, build_merge_job, build_tuning_job
from tunefleet.config import Config
from tunefleet.storage import registry
from tunefleet.storage.filesystem import MOUNT_PATH, DirStore
from tunefleet.storage.store import Location, StoreOptions
from tunefleet.webhook.admission import admit

SHA = "ab" * 32
CFG = Config(image="tunefleet:1", default_credentials_secret="operator-default")


BASE = make_profile("llm").gpu("nvidia", "NVIDIA-H200", parallelism=2)
PVC = BASE.storage("pvc://artifacts/team")


def test_uris_by_scheme() -> None:
    assert registry.parse_uri("pvc://artifacts/team-a") == Location("pvc", "artifacts", "team-a")
    assert registry.parse_uri("pvc://artifacts").uri("x/y") == "pvc://artifacts/x/y"
    assert registry.parse_uri("s3://bkt/p").key("k") == "p/k"
    assert registry.parse_uri("file:///srv/a").uri("k") == "file:///srv/a/k"
    for bad in ("pvc://Bad_Claim/x", "pvc://c/../x", "gs://b/p", "pvc:///x"):
        with pytest.raises(ValueError):
            registry.parse_uri(bad)


def test_a_pvc_store_is_a_directory_under_the_claims_mount(tmp_path: Path) -> None:
    location = registry.parse_uri("pvc://artifacts/pre")
    store = registry.open_store(location, StoreOptions(pvc_root=str(tmp_path)))
    assert isinstance(store, DirStore)
    key = location.key("ml", "x.json")
    assert store.put_if_absent(key, b"1", "application/json")
    assert (tmp_path / "pre" / "ml" / "x.json").read_bytes() == b"1"
    assert store.uri(key) == "pvc://artifacts/pre/ml/x.json"
    store.delete(key)
    store.delete(key)  # already gone: fine
    assert not (tmp_path / "pre" / "ml" / "x.json").exists()


def test_s3_pods_get_the_secret_by_reference_and_pvc_pods_the_volume() -> None:
    s3 = registry.pod_storage("s3://bkt/p", secret="s3", endpoint="http://e:8333", region="r1")
    assert {e["name"] for e in s3.env} == {
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_REGION",
    }
    assert s3.args == ["--endpoint-url", "http://e:8333", "--region", "r1"] and not s3.volumes
    pvc = registry.pod_storage("pvc://artifacts/p", secret="ignored", endpoint="x", region="y")
    assert pvc.env == [] and pvc.credentials_secret == ""
    (vol,) = pvc.volumes
    assert vol["persistentVolumeClaim"] == {"claimName": "artifacts", "readOnly": False}
    assert pvc.mounts == [{"name": vol["name"], "mountPath": MOUNT_PATH, "readOnly": False}]
    ro = registry.pod_storage("pvc://artifacts/p", read_only=True)
    assert ro.mounts[0]["readOnly"] and ro.volumes[0]["persistentVolumeClaim"]["readOnly"]
    with pytest.raises(ValueError, match="not reachable from a pod"):
        registry.pod_storage("file:///srv/a")


def _containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return [*(pod.get("initContainers") or []), *pod["containers"]]


def test_a_pvc_profiles_jobs_mount_the_claim_and_carry_no_credentials() -> None:
    child = Child(PVC.spec_model(), "ml", "llm", "uid-1", "NVIDIA-H200", CFG)
    for job in (
        build_tuning_job(child),
        build_merge_job(child),
    ):
        pod = job["spec"]["template"]["spec"]
        claims = [v for v in pod["volumes"] if "persistentVolumeClaim" in v]
        assert [v["persistentVolumeClaim"]["claimName"] for v in claims] == ["artifacts"]
        assert pod["securityContext"]["fsGroup"] == 65532  # the claim is written as tunefleet
        for c in _containers(pod):
            assert not any(e["name"].startswith("AWS_") for e in c.get("env") or []), c["name"]
            if c["image"] == "tunefleet:1" and c["name"] != "bootstrap":
                assert {"name": claims[0]["name"], "mountPath": MOUNT_PATH, "readOnly": False} in c[
                    "volumeMounts"
                ]
                assert c["command"][c["command"].index("--pvc-root") + 1] == MOUNT_PATH
            else:
                assert all(m["mountPath"] != MOUNT_PATH for m in c.get("volumeMounts") or [])


def test_a_pvc_profiles_model_pods_mount_the_claim_read_only_in_fetch_only() -> None:
    artifact = make_artifact("NVIDIA-H200", SHA, "llm", base="pvc://artifacts/team")
    profile = PVC.artifacts(artifact).obj()
    pod = make_model_pod("llm").obj()
    d = admit(pod, "llm", profile, CFG)
    assert d.injected
    spec_ = d.pod["spec"]
    (claim,) = [v for v in spec_["volumes"] if "persistentVolumeClaim" in v]
    assert claim["persistentVolumeClaim"]["readOnly"] is True
    fetch = spec_["initContainers"][0]
    assert not any(e["name"].startswith("AWS_") for e in fetch.get("env") or [])
    assert {"name": claim["name"], "mountPath": MOUNT_PATH, "readOnly": True} in fetch[
        "volumeMounts"
    ]
    (server,) = spec_["containers"]
    assert all(m["mountPath"] != MOUNT_PATH for m in server["volumeMounts"])


def test_a_shared_session_makes_one_s3_client_per_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fleet step opens the profile's store on every reconcile: a boto3 client each time
    cost more CPU than the rest of the reconcile."""
    from tunefleet.storage import registry, s3

    made: list[str | None] = []
    monkeypatch.setattr(
        s3, "make_client", lambda e=None, r=None, t=60.0: made.append(e) or object()
    )
    registry._shared_session.cache_clear()
    here = registry.parse_uri("s3://bucket/p")
    a = StoreOptions(endpoint_url="http://a:9000", timeout_s=10)
    first = registry.shared_session(here, a)
    again = registry.shared_session(
        registry.parse_uri("s3://other/q"), StoreOptions("http://a:9000", timeout_s=10)
    )
    other = registry.shared_session(here, StoreOptions(endpoint_url="http://b:9000", timeout_s=10))
    assert first.client is again.client and other.client is not first.client
    assert made == ["http://a:9000", "http://b:9000"]
    registry._shared_session.cache_clear()
