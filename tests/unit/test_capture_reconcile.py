"""The loop through sync_profile (the API stubbed by tests/support/fake_api.py): a threshold makes
the retune set, a Job of the retune's revision with the set mounted, removes the Job it
supersedes, and writes status.capture; the next reconcile (and a restarted operator) sees the
same revision and makes nothing more; the published retune serves new pods; admission gives
model pods the capture sidecar, the hook and record-untuned."""

from __future__ import annotations

import json
from typing import Any

import pytest

from testbed.builders.profiles import CFG, jobs_for, profile
from testbed.builders.wrappers import make_artifact, make_pod, make_profile
from tests.support.fake_kube import RECONCILE_WRITERS, FakeKube
from tunefleet import naming
from tunefleet.api import TuningProfileSpec
from tunefleet.builders import capture as capture_b
from tunefleet.builders.job import CAPTURED_DIR
from tunefleet.capture.retune_sets import Batch, StoreKey, StoreView, build_store_config_map, merge
from tunefleet.capture.retune_sets_cache import CaptureCache
from tunefleet.capture.step import CaptureSource
from tunefleet.config import Config
from tunefleet.contracts.artifact_record import ArtifactRecord
from tunefleet.reconciler.memory import Memory
from tunefleet.reconciler.reconcile import Around, sync_profile
from tunefleet.webhook.admission import admit
from tuner_job import caches as cc
from tuner_job.config import from_dict

MODEL = "AMD_Instinct_MI300X_OAM"
S2 = [f"GemmTunableOp_BFloat16_TN,tn_{n}_96_96_ld_96_96_{n}" for n in (8, 16)]
S1 = ["GemmTunableOp_BFloat16_NN,nn_8_8_8_ld_8_8_8"]


class Keys:
    def __init__(self, keys: dict[str, frozenset[str]]) -> None:
        self.keys = keys

    def get(self, record: ArtifactRecord, ns: str, endpoint: str = "", region: str = "") -> Any:
        return self.keys.get(record.sha256)


def source(rows: list[str], client: FakeKube) -> CaptureSource:
    cache = CaptureCache()
    view, _ = merge(StoreView(StoreKey("ml", "p", "uid-1", MODEL, "lib-1")), Batch(rows), 100, 64)
    cm = build_store_config_map(view)
    cache.follow("ADDED", cm)
    keys = Keys({"a" * 64: frozenset(S1), "b" * 64: frozenset(S1 + S2)})
    return CaptureSource(cache, keys)  # type: ignore[arg-type]


CAPTURING = (
    make_profile()
    .uid("uid-1")
    .generation(1)
    .image("registry.example.com/serve:1")
    .gpu("amd", MODEL)
    .spec(capture={"enabled": True, "retune": {"misses": 2}})
)
SERVED = make_artifact(MODEL, "a" * 64).library_key("lib-1").fields(job="tune-x", identity={})
# Serving the artifact tuned for its spec's revision.
CAPTURE_PROFILE = CAPTURING.artifacts(SERVED.revision(naming.revision(CAPTURING.spec_model())))


def test_a_threshold_starts_one_retune_job_and_later_reconciles_keep_its_revision(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    p = CAPTURE_PROFILE.obj()
    spec = TuningProfileSpec.model_validate(p["spec"])
    base = naming.revision(spec)
    old_jobs = jobs_for(p, [MODEL])  # the first tuning's Job, kept after it published
    api = FakeKube(writers=RECONCILE_WRITERS)
    memory = Memory()
    status = sync_profile(
        p, old_jobs, [], CFG, memory, Around(api, captures=source(S2, api))
    ).status.to_status()
    (entry,) = status["capture"]
    retune = entry["retune"]
    rev = retune["revision"]
    assert rev != base and retune["state"] == "Tuning" and retune["shapes"] == 2
    kinds = [(k, n.split("-")[0] + "-" + n.split("-")[1]) for k, n in api.created]
    assert ("ConfigMap", "tunefleet-retune") in kinds  # the frozen set, first
    jobs = [n for k, n in api.created if k == "Job"]
    assert jobs == [naming.job_name("p", MODEL, rev, "uid-1")]
    assert ("Job", old_jobs[0]["metadata"]["name"]) in api.deleted  # superseded
    assert status["artifacts"][0]["sha256"] == "a" * 64  # still served while it tunes
    assert any(r == "RetuneStarted" for r, _ in api.events)
    # The next reconcile, from what was written (a restart reads the same): nothing more.
    p["status"] = status
    api2 = FakeKube(writers=RECONCILE_WRITERS, existing={n for _, n in api.created})
    again = sync_profile(
        p, [], [], CFG, Memory(), Around(api2, captures=source(S2, api2))
    ).status.to_status()
    assert again["capture"][0]["retune"]["revision"] == rev
    assert api2.created == [] and not [r for r, _ in api2.events if r == "RetuneStarted"]


def test_the_retune_job_mounts_its_set_and_the_tuner_reads_it() -> None:
    from tunefleet.builders.job import Child, build_tuning_config_map, build_tuning_job

    p = CAPTURE_PROFILE.obj()
    spec = TuningProfileSpec.model_validate(p["spec"])
    child = Child(spec, "ml", "p", "uid-1", MODEL, CFG, revision_override="r2", captured="cm-x")
    job = build_tuning_job(child)
    pod = job["spec"]["template"]["spec"]
    assert {"name": "captured", "configMap": {"name": "cm-x"}} in pod["volumes"]
    tune = next(c for c in pod["initContainers"] if c["name"] == "tune")
    assert any(m["mountPath"] == CAPTURED_DIR for m in tune["volumeMounts"])
    assert job["metadata"]["labels"][naming.REVISION_LABEL] == "r2"
    config = json.loads(build_tuning_config_map(child)["data"]["config.json"])
    assert config["revision"] == "r2"
    assert from_dict(config).untuned_files == (f"{CAPTURED_DIR}/untuned.csv",)
    plain = json.loads(
        build_tuning_config_map(Child(spec, "ml", "p", "uid-1", MODEL, CFG))["data"]["config.json"]
    )
    assert "untunedFiles" not in plain["workload"]  # no capture: the config is as before


def test_the_published_retune_is_current_and_counts_as_full_coverage(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    p = CAPTURE_PROFILE.obj()
    api = FakeKube(writers=RECONCILE_WRITERS)
    first = sync_profile(
        p, jobs_for(p, [MODEL]), [], CFG, Memory(), Around(api, captures=source(S2, api))
    ).status.to_status()
    rev = first["capture"][0]["retune"]["revision"]
    p["status"] = {
        **first,
        "artifacts": [
            make_artifact(MODEL, "b" * 64)
            .library_key("lib-1")
            .fields(job="tune-x", identity={})
            .revision(rev)
            .obj()
        ],
    }
    api = FakeKube(writers=RECONCILE_WRITERS)
    status = sync_profile(
        p, [], [], CFG, Memory(), Around(api, captures=source(S2, api))
    ).status.to_status()
    (entry,) = status["capture"]
    assert (entry["seen"], entry["tuned"], entry["coverage"]) == (2, 2, 100)
    assert entry["retune"]["state"] == "Published"
    assert status["phase"] == "Ready" and status["coverage"] == "2/2 100%"
    assert not [n for k, n in api.created if k == "Job"]  # its artifact is there: no Job


def test_a_profile_without_capture_shows_none_and_keeps_its_spec_revision(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    p = profile(gpu={"vendor": "amd", "models": [MODEL]})
    api = FakeKube(writers=RECONCILE_WRITERS)
    empty = CaptureSource(CaptureCache(), Keys({}))  # type: ignore[arg-type]
    status = sync_profile(p, [], [], CFG, Memory(), Around(api, captures=empty)).status.to_status()
    assert "capture" not in status and "coverage" not in status
    assert status["revision"] == naming.revision(TuningProfileSpec.model_validate(p["spec"]))


CAPTURE_CFG = Config(
    image="tunefleet:1", capture_url="https://tf-webhook.sys.svc:8443",
    capture_address="10.96.0.9", capture_ca="-----BEGIN CERTIFICATE-----",
)  # fmt: skip


SERVE_IMAGE = "registry.example.com/serve:1"
UNSERVED = make_pod("serve").profile("p")
SERVE_POD = UNSERVED.container("server", SERVE_IMAGE, env=[]).container("proxy", "envoy:1")


def test_admission_adds_the_sidecar_hook_and_record_untuned_to_the_serving_containers() -> None:
    p = CAPTURE_PROFILE.obj()
    d = admit(
        UNSERVED.container("server", SERVE_IMAGE, env=[{"name": "PYTHONPATH", "value": "/app"}])
        .container("proxy", "envoy:1")
        .obj(),
        "p",
        p,
        CAPTURE_CFG,
        {},
    )
    assert d.injected, d.reason
    spec = d.pod["spec"]
    inits = [c["name"] for c in spec["initContainers"]]
    assert inits[-2:] == [capture_b.HOOK_INIT, capture_b.SIDECAR]
    sidecar = spec["initContainers"][-1]
    assert sidecar["restartPolicy"] == "Always"
    assert "--address" in sidecar["command"] and "10.96.0.9" in sidecar["command"]
    assert {m["name"] for m in sidecar["volumeMounts"]} == {
        capture_b.VOLUME,
        capture_b.TOKEN_VOLUME,
        "tunefleet-results",
    }
    server, proxy = spec["containers"]
    env = {e["name"]: e["value"] for e in server["env"]}
    assert env["PYTORCH_TUNABLEOP_RECORD_UNTUNED"] == "1"
    assert env["PYTORCH_TUNABLEOP_UNTUNED_FILENAME"] == capture_b.UNTUNED_FILENAME
    assert env["PYTHONPATH"] == f"{capture_b.HOOK_DIR}:/app"  # theirs kept, after the hook
    # The token is mounted in the sidecar alone; nothing of capture reaches other containers.
    assert all(m["name"] != capture_b.TOKEN_VOLUME for m in server["volumeMounts"])
    assert "env" not in proxy and "volumeMounts" not in proxy
    (token,) = [v for v in spec["volumes"] if v["name"] == capture_b.TOKEN_VOLUME]
    assert token["projected"]["sources"][0]["serviceAccountToken"]["audience"] == (
        "tunefleet.io/capture"
    )
    # Idempotent: admitted again, nothing more is added.
    twice = admit(d.pod, "p", p, CAPTURE_CFG, {})
    assert twice.pod["spec"]["initContainers"] == spec["initContainers"]


def test_a_containers_own_record_untuned_setting_wins() -> None:
    p = CAPTURE_PROFILE.obj()
    d = admit(
        UNSERVED.container(
            "server", SERVE_IMAGE, env=[{"name": "PYTORCH_TUNABLEOP_RECORD_UNTUNED", "value": "0"}]
        )
        .container("proxy", "envoy:1")
        .obj(),
        "p",
        p,
        CAPTURE_CFG,
        {},
    )
    env = {e["name"]: e["value"] for e in d.pod["spec"]["containers"][0]["env"]}
    assert env["PYTORCH_TUNABLEOP_RECORD_UNTUNED"] == "0"


def test_capture_without_an_endpoint_is_said_and_changes_nothing() -> None:
    p = CAPTURE_PROFILE.obj()
    d = admit(SERVE_POD.obj(), "p", p, Config(image="tunefleet:1"), {})
    assert d.injected and any("no capture endpoint" in n for n in d.notes)
    names = [c["name"] for c in d.pod["spec"].get("initContainers") or []]
    assert capture_b.SIDECAR not in names
    env = {e["name"]: e["value"] for e in d.pod["spec"]["containers"][0]["env"]}
    assert env["PYTORCH_TUNABLEOP_RECORD_UNTUNED"] == "0"
    pp = CAPTURE_PROFILE.obj()
    env_from = [{"name": "PYTHONPATH", "valueFrom": {"configMapKeyRef": {"name": "x", "key": "y"}}}]
    d = admit(
        UNSERVED.container("server", SERVE_IMAGE, env=env_from).container("proxy", "envoy:1").obj(),
        "p", pp, CAPTURE_CFG, {},
    )  # fmt: skip
    assert any("valueFrom" in n for n in d.notes)


def test_retune_sets_no_status_names_are_removed(monkeypatch: pytest.MonkeyPatch) -> None:
    from tunefleet.capture.retune_sets import RetuneSet, build_retune_config_map

    p = CAPTURE_PROFILE.obj()
    api = FakeKube(writers=RECONCILE_WRITERS)
    src = source(S2, api)
    old = build_retune_config_map(RetuneSet("ml", "p", "uid-1", MODEL, "oldrev0000", (S2[0],)))
    old["metadata"]["uid"] = "old-set-uid"
    src.cache.follow("ADDED", old)
    status = sync_profile(p, [], [], CFG, Memory(), Around(api, captures=src)).status.to_status()
    kept = status["capture"][0]["retune"]["configMap"]
    assert ("ConfigMap", old["metadata"]["name"]) in api.deleted
    assert ("ConfigMap", kept) not in api.deleted


def test_a_served_vllm_cache_gets_the_hooks_cache_log_and_tunableop_pods_do_not() -> None:
    p = profile(
        gpu={"vendor": "amd", "models": [MODEL]},
        capture={"enabled": True},
        artifacts={"tunableop": False, "caches": [{"kind": "vllm"}]},
    )
    base = naming.revision(TuningProfileSpec.model_validate(p["spec"]))
    packed = cc.Packed("vllm", "vllm", "cache-vllm.tar.gz", "c" * 64, 10, 1, 5, ("5f1c" * 16,))
    rec = ArtifactRecord(
        uri=f"s3://bkt/p/ml/p/{MODEL}/{'a' * 64}", sha256="a" * 64, revision=base,
        gpu_model=MODEL, kind=cc.INDEX_KIND, caches=(packed,), job="tune-x",
    )  # fmt: skip
    p["status"] = {"artifacts": [rec.to_status()]}
    d = admit(SERVE_POD.obj(), "p", p, CAPTURE_CFG, {})
    assert d.injected, d.reason
    server = d.pod["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in server["env"]}
    assert env["TUNEFLEET_CACHE_LOG"] == capture_b.CACHE_LOG
    assert capture_b.CACHE_LOG.startswith(capture_b.CAPTURE_DIR + "/")  # the sidecar reads it
    assert env["VLLM_CACHE_ROOT"].startswith("/tunefleet/caches/")
    assert "PYTORCH_TUNABLEOP_RECORD_UNTUNED" not in env  # caches alone: no TunableOp
    tunable = admit(SERVE_POD.obj(), "p", CAPTURE_PROFILE.obj(), CAPTURE_CFG, {})
    plain = {e["name"] for e in tunable.pod["spec"]["containers"][0]["env"]}
    assert "TUNEFLEET_CACHE_LOG" not in plain
