"""Reuse, sharding and resume through the real programs, as a tuning pod runs them, against a
file:// store: tunefleet-sync (the sidecar), `python -m tuner_job run` with the stand-in torch
(it computes nothing; FAKE_TORCH_TUNE_SLEEP gives each GEMM a cost), tunefleet-publish and
tunefleet-merge. The same flows against the real S3 server: tests/e2e/test_library_s3.py.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testbed.builders.wrappers import make_tuner_run
from testbed.library_pod import (
    Pod,
    all_tuned,
    merge,
    run_job,
    tool_env,
    tuned_keys,
    wait_until,
)
from tunefleet.artifacts.fetch import Pinned, Serving, fetch
from tunefleet.artifacts.library import checkpoint_key
from tunefleet.storage.filesystem import DirStore
from tunefleet.storage.registry import parse_uri
from tuner_job.library import CheckpointId, make_checkpoint, parse_checkpoint
from tuner_job.results import ResultRow, format_results, parse_results, read_results

ROCM = {"FAKE_TORCH_BACKEND": "rocm"}  # the stand-in then picks non-Default winners too
FAST = {**ROCM, "FAKE_TORCH_TUNE_SLEEP": "0.01"}  # a tuner run's stand-in torch, unless told


def test_a_second_profile_reuses_the_library_and_tunes_only_its_misses(tmp_path: Path) -> None:
    first = Pod(
        make_tuner_run(tmp_path / "store", "first", range(0, 30)).env(**FAST).obj(), tmp_path / "a"
    ).run()
    assert first.tune.returncode == 0, first.tune.stderr
    assert first.publish is not None and first.publish.returncode == 0, first.publish.stderr
    assert len(first.tuned) == 30 and first.message()["reused"] == 0
    assert "added to the GEMM library" in first.publish.stderr

    second = Pod(
        make_tuner_run(tmp_path / "store", "second", range(10, 40)).env(**FAST).obj(),
        tmp_path / "b",
    ).run()
    assert second.tune.returncode == 0, second.tune.stderr
    a = read_results(first.out / "results.csv")
    b = read_results(second.out / "results.csv")
    shared = a.keys() & b.keys()
    assert len(shared) == 20 and b.gemms == 30
    assert set(second.tuned) == b.keys() - shared  # only the misses were tuned
    assert len(second.tuned) == 10

    # The reused rows are the library's, byte for byte.
    def same(rows: list[ResultRow]) -> set[tuple[str, str, str, str | None]]:
        return {(r.op, r.params, r.solution, r.ms_text) for r in rows if r.key in shared}

    assert same(b.rows) == same(a.rows)
    m = second.manifest()
    assert (m["recorded"], m["reused"], m["resumed"], m["newlyTuned"], m["gemms"]) == (
        30, 20, 0, 10, 30,
    )  # fmt: skip
    assert m["library"] == {"entries": 1, "skipped": [], "skippedCount": 0}
    assert m["libraryKey"] == first.manifest()["libraryKey"]
    message = second.message()
    assert (message["reused"], message["newlyTuned"], message["librarySkipped"]) == (20, 10, 0)
    assert "30 GEMM(s): 20 reused from the library, 0 resumed" in second.tune.stderr

    # A third profile inside the first's GEMMs tunes nothing at all and still publishes.
    third = Pod(
        make_tuner_run(tmp_path / "store", "third", range(5, 25)).env(**FAST).obj(), tmp_path / "c"
    ).run()
    assert third.tune.returncode == 0, third.tune.stderr
    assert third.tuned == [] and third.manifest()["reused"] == 20
    assert third.manifest()["tuningSeconds"] == 0
    assert third.publish is not None and third.publish.returncode == 0


def test_a_bad_library_entry_is_skipped_reported_and_the_rest_reused(tmp_path: Path) -> None:
    first = Pod(
        make_tuner_run(tmp_path / "store", "first", range(0, 10)).env(**FAST).obj(), tmp_path / "a"
    ).run()
    entry = Path(first.publish.stderr.split("library: file://")[1].split()[0])  # type: ignore[union-attr]
    # A second entry, corrupted after it was written: its bytes no longer hash to its name.
    doc = json.loads(entry.read_text())
    doc["results"] = doc["results"].replace("Gemm_", "Gemm_X", 1)
    bad = entry.with_name("f" * 64 + ".json")
    bad.write_text(json.dumps(doc))
    second = Pod(
        make_tuner_run(tmp_path / "store", "second", range(0, 12)).env(**FAST).obj(), tmp_path / "b"
    ).run()
    assert second.tune.returncode == 0, second.tune.stderr
    m = second.manifest()
    assert (m["reused"], m["newlyTuned"]) == (10, 2)
    assert m["library"]["skippedCount"] == 1
    assert m["library"]["skipped"][0]["object"].endswith("f" * 64 + ".json")
    assert "not its name" in m["library"]["skipped"][0]["reason"]
    message = second.message()
    assert message["librarySkipped"] == 1 and "not its name" in message["librarySkippedReason"]
    assert "library entry skipped" in second.sync_log


def test_shards_tune_disjoint_shares_and_the_merge_is_their_union(tmp_path: Path) -> None:
    alone = Pod(
        make_tuner_run(tmp_path / "alone" / "store", "llama", range(40)).env(**FAST).obj(),
        tmp_path / "alone" / "pod",
    ).run()
    assert alone.tune.returncode == 0, alone.tune.stderr

    spec = make_tuner_run(tmp_path / "store", "llama", range(40)).env(**FAST).fields(shards=3).obj()
    runs = run_job(spec, tmp_path / "job")
    for r in runs:
        assert r.tune.returncode == 0, r.tune.stderr
        assert r.publish is not None and r.publish.returncode == 0, r.publish.stderr
        msg = r.message()
        assert (msg["shard"], msg["shards"]) == (r.index, 3)
        assert msg["uri"].endswith(f"/_shards/{spec.revision}/{r.index}-of-3")
    tuned = all_tuned(runs)
    assert len(tuned) == len(set(tuned)) == 40  # disjoint, and together every GEMM
    assert sorted(len(r.tuned) for r in runs) == [13, 13, 14]
    store = tmp_path / "store"
    assert not list(store.glob("ml/_library/**/*.json"))  # shards publish no artifact

    done = merge(spec, tmp_path / "merge")
    assert done.returncode == 0, done.stderr
    message = json.loads(done.stdout)
    assert json.loads((tmp_path / "merge" / "merge-tl").read_text()) == message
    # One artifact, equal to what one pod tuning everything publishes.
    assert message["sha256"] == alone.message()["sha256"]
    assert (message["gemms"], message["recorded"], message["newlyTuned"], message["shards"]) == (
        40, 40, 40, 3,
    )  # fmt: skip
    assert message["manifestSha256"] and message["outcomes"]["tuned"] > 0
    assert message["image"]["reference"] == "tunefleet.local/standin-inference:2.11.0-standin"
    manifest = json.loads(Path(message["uri"][len("file://") :], "manifest.json").read_text())
    assert manifest["tuningSeconds"] == pytest.approx(
        sum(r.manifest()["tuningSeconds"] for r in runs), abs=0.01
    )
    assert manifest["wallSeconds"] == max(r.manifest()["wallSeconds"] for r in runs)
    assert "added to the GEMM library" in done.stderr
    got = fetch(Pinned(message["uri"], message["sha256"]), tmp_path / "serve", Serving(2))
    assert got.gemms == 40  # fetch verifies the merged artifact like any other

    # A second Job of the same profile at parallelism 2 finds everything in the library.
    again = run_job(
        make_tuner_run(tmp_path / "store", "llama", range(40))
        .env(**FAST)
        .fields(shards=2, revision="ffff000011")
        .obj(),
        tmp_path / "j2",
    )
    assert all_tuned(again) == []
    assert sum(r.manifest()["reused"] for r in again) == 40


def test_a_shard_is_not_published_as_the_profiles_artifact(tmp_path: Path) -> None:
    sharded = make_tuner_run(tmp_path / "store", "llama", range(6)).env(**FAST).fields(shards=2)
    spec = sharded.obj()
    pod = Pod(spec, tmp_path / "pod", 1)
    pod.start_sync()
    pod.start_tune()
    assert pod.wait_tune().returncode == 0
    pod.stop_sync()
    pod.job = sharded.fields(shards=1).obj()  # publish without --shards
    done = pod.publish()
    assert done.returncode == 1
    assert "the tuner's output is shard 1 of 2: publish it with --shards 2" in done.stderr
    model_dir = tmp_path / "store" / "ml" / "llama" / spec.model
    assert [p.name for p in model_dir.iterdir()] == ["_checkpoints"]  # no artifact


def test_the_merge_refuses_a_missing_or_inconsistent_shard(tmp_path: Path) -> None:
    sharded = make_tuner_run(tmp_path / "store", "llama", range(12)).env(**FAST).fields(shards=2)
    spec = sharded.obj()
    runs = run_job(spec, tmp_path / "job")
    assert all(r.publish is not None and r.publish.returncode == 0 for r in runs)
    base = tmp_path / "store" / "ml" / "llama" / spec.model / "_shards" / spec.revision

    missing = merge(sharded.fields(shards=3).obj(), tmp_path / "m3")
    assert missing.returncode == 1
    assert (
        missing.stderr.strip()
        .splitlines()[-1]
        .startswith("tunefleet-merge: error: shard 0 of 3 has no output at file://")
    )

    other = json.loads((base / "1-of-2" / "manifest.json").read_text())
    other["revision"] = "0123456789"
    (base / "1-of-2" / "manifest.json").write_text(json.dumps(other))
    done = merge(spec, tmp_path / "m")
    assert done.returncode == 1
    assert "shard 1 of 2 at file://" in done.stderr and "revision '0123456789'" in done.stderr
    tl = (tmp_path / "m" / "merge-tl").read_text()
    assert tl.startswith("tunefleet-merge: error: shard 1 of 2") and tl.count("\n") <= 1

    (base / "1-of-2" / "results.csv").write_text("Validator,PT_VERSION,other\n")
    other["revision"] = spec.revision
    (base / "1-of-2" / "manifest.json").write_text(json.dumps(other))
    done = merge(spec, tmp_path / "m2")
    assert done.returncode == 1 and "is not the SHA-256 of results.csv" in done.stderr


def test_a_pod_lost_mid_tuning_resumes_from_its_checkpoint(tmp_path: Path) -> None:
    every = 4
    spec = (
        make_tuner_run(tmp_path / "store", "llama", range(20))
        .env(**ROCM, FAKE_TORCH_TUNE_SLEEP="0.3")
        .fields(every_gemms=every)
        .obj()
    )
    pod = Pod(spec, tmp_path / "try-1")
    pod.start_sync()
    pod.start_tune()
    wait_until(lambda: pod.progress_gemms() >= 10, 120, "half of the GEMMs tuned")
    # The node is gone: the tuning process group and the sidecar die at once, no final upload.
    pod.kill(sidecar_too=True)
    first = pod.wait_tune()
    pod.stop_sync()
    assert first.returncode == 1
    tuned_first = set(tuned_keys(first.stderr))
    assert 10 <= len(tuned_first) < 20

    retry = Pod(spec, tmp_path / "try-2").run()
    assert retry.tune.returncode == 0, retry.tune.stderr
    twice = tuned_first & set(retry.tuned)
    assert len(twice) <= every  # at most one checkpoint interval is tuned again
    m = retry.manifest()
    assert m["resumed"] == len(tuned_first) - len(twice)
    assert m["resumed"] + m["newlyTuned"] == m["gemms"] == 20
    assert m["resume"]["status"] == "resumed"
    assert retry.message()["resumed"] == m["resumed"]
    # The same artifact as a run that was never interrupted.
    alone = Pod(
        make_tuner_run(tmp_path / "alone" / "store", "llama", range(20)).env(**FAST).obj(),
        tmp_path / "alone" / "pod",
    ).run()
    assert retry.message()["sha256"] == alone.message()["sha256"]


def test_a_killed_tuning_process_loses_nothing_while_the_sidecar_lives(tmp_path: Path) -> None:
    spec = (
        make_tuner_run(tmp_path / "store", "llama", range(16))
        .env(**ROCM, FAKE_TORCH_TUNE_SLEEP="0.2")
        .fields(every_gemms=100)
        .obj()
    )
    pod = Pod(spec, tmp_path / "try-1")
    pod.start_sync()
    pod.start_tune()
    wait_until(lambda: pod.progress_gemms() >= 6, 120, "some GEMMs tuned")
    pod.kill(sidecar_too=False)  # K=100 was never reached: only the final upload saves them
    first = pod.wait_tune()
    assert first.returncode == 1
    done = json.loads((pod.exchange / "tune.done").read_text())
    assert done == {"ok": False, "newlyTuned": 0}
    wait_until(lambda: "tuning ended" in pod.sync_log(), 30, "the sidecar's final upload")
    assert pod.stop_sync() == 0
    retry = Pod(spec, tmp_path / "try-2").run()
    assert retry.tune.returncode == 0, retry.tune.stderr
    assert not set(tuned_keys(first.stderr)) & set(retry.tuned)  # nothing tuned twice


def test_a_checkpoint_of_another_revision_is_ignored_and_replaced(tmp_path: Path) -> None:
    spec = make_tuner_run(tmp_path / "store", "llama", range(8)).env(**FAST).obj()
    store = DirStore(parse_uri(spec.uri))
    ident = CheckpointId("ml", "llama", spec.model, spec.revision, 0, 1)
    stale = make_checkpoint(
        CheckpointId("ml", "llama", spec.model, "0000000000", 0, 1),
        "Validator,PT_VERSION,2.11.0+standin\nGemmTunableOp_BFloat16_TN,tn_8_8_8_ld_8_8_8,Default,0\n",
        "2026-01-01T00:00:00Z",
    )
    key = checkpoint_key(store.location, ident)
    store.put(key, stale, "application/json")  # hand-placed at this Job's key
    run = Pod(spec, tmp_path / "pod").run()
    assert run.tune.returncode == 0, run.tune.stderr
    status = json.loads((tmp_path / "pod" / "exchange" / "checkpoint.json").read_text())
    reason = "checkpoint is for revision '0000000000', this Job tunes '3f2a9c01de'"
    assert status == {"status": "ignored", "reason": reason, "gemms": 0}
    assert run.manifest()["resume"] == {"status": "ignored", "reason": reason}
    assert len(run.tuned) == 8
    # Replaced by this run's progress: nothing of this run is lost to the stale object.
    replaced = parse_checkpoint(store.get(key, 1 << 20), ident)
    assert replaced.keys() == read_results(run.out / "results.csv").keys()


def test_a_checkpoint_under_other_validators_is_not_resumed(tmp_path: Path) -> None:
    cuda = (
        make_tuner_run(tmp_path / "store", "llama", range(6))
        .env(FAKE_TORCH_TUNE_SLEEP="0.01")
        .obj()
    )
    first = Pod(cuda, tmp_path / "cuda").run()  # the CUDA stand-in: other validators
    assert first.tune.returncode == 0, first.tune.stderr
    # The same Job (same revision) on a ROCm node: the checkpoint is there but not usable;
    # the library key differs too, so nothing is reused either.
    second = Pod(
        make_tuner_run(tmp_path / "store", "llama", range(6)).env(**FAST).obj(), tmp_path / "rocm"
    ).run()
    assert second.tune.returncode == 0, second.tune.stderr
    m = second.manifest()
    assert m["resume"]["status"] == "ignored"
    assert "other validators" in m["resume"]["reason"] and "PT_VERSION" not in m["resume"]["reason"]
    assert (m["resumed"], m["reused"], m["newlyTuned"]) == (0, 0, 6)
    assert "checkpoint was tuned under other validators: replaced" in second.sync_log


def test_without_a_sidecar_the_tuner_waits_bounded_then_tunes_everything(tmp_path: Path) -> None:
    spec = (
        make_tuner_run(tmp_path / "store", "llama", range(4)).env(**FAST).fields(wait_s=1.0).obj()
    )
    pod = Pod(spec, tmp_path / "pod")
    pod.start_tune()  # no sync
    started = time.monotonic()
    done = pod.wait_tune()
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - started < 30
    m = json.loads((pod.out / "manifest.json").read_text())
    assert m["resume"] == {
        "status": "none",
        "reason": "the sync sidecar gave no checkpoint within 1s",
    }
    assert m["library"]["error"] == "the sync sidecar gave no library within 1s"
    assert m["newlyTuned"] == 4
    assert "library not used, tuning without it" in done.stderr
    assert json.loads((pod.exchange / "tune.done").read_text()) == {"ok": True, "newlyTuned": 4}


def test_the_sidecar_with_bad_arguments_unblocks_the_tuner_and_idles(tmp_path: Path) -> None:
    exchange = tmp_path / "exchange"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tunefleet.artifacts.sync",
            "--exchange",
            str(exchange),
            "--uri",
            "ftp://x",
        ],
        env=tool_env(None),
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_until(lambda: (exchange / "library.done").exists(), 30, "markers")
    assert json.loads((exchange / "checkpoint.json").read_text())["status"] == "none"
    assert "bad arguments" in json.loads((exchange / "library.json").read_text())["error"]
    time.sleep(0.5)
    assert proc.poll() is None  # a native sidecar that exits is restarted: it idles instead
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err


def test_the_sidecar_refuses_an_identity_whose_key_does_not_add_up(tmp_path: Path) -> None:
    spec = make_tuner_run(tmp_path / "store", "llama", range(2)).env(**FAST).obj()
    pod = Pod(spec, tmp_path / "pod")
    pod.start_sync()
    ex = pod.exchange
    wait_until(lambda: (ex / "checkpoint.done").exists(), 30, "checkpoint.done")
    (ex / "identity.json").write_text(
        json.dumps(
            {
                "gpuModel": spec.model,
                "validators": {"PT_VERSION": "x"},
                "identity": {},
                "libraryKey": "0" * 64,
            }
        )
    )
    wait_until(lambda: (ex / "library.done").exists(), 30, "library.done")
    doc = json.loads((ex / "library.json").read_text())
    assert "libraryKey is not its identity's key" in doc["error"]
    assert not (ex / "library.csv").exists()
    assert pod.stop_sync() == 0


def test_progress_is_what_torch_tuned_so_far_in_results_format(tmp_path: Path) -> None:
    spec = (
        make_tuner_run(tmp_path / "store", "llama", range(12))
        .env(**ROCM, FAKE_TORCH_TUNE_SLEEP="0.05")
        .obj()
    )
    run = Pod(spec, tmp_path / "pod").run()
    progress = (tmp_path / "pod" / "exchange" / "progress.csv").read_text()
    parsed = parse_results(progress, "progress.csv", require_rows=True)
    final = read_results(run.out / "results.csv")
    assert format_results(parsed) == format_results(final)  # everything was new: same rows


def test_an_unreadable_checkpoint_is_never_overwritten_before_it_is_read(tmp_path: Path) -> None:
    from tunefleet.artifacts.sync import Settings, Sync
    from tunefleet.storage.store import StoreError

    ident = CheckpointId("ml", "llama", "M", "3f2a9c01de", 0, 1)
    old_rows = "Validator,PT_VERSION,2.11.0+standin\nGemmTunableOp_BFloat16_TN,tn_8_8_8_ld_8_8_8,Default,0.5\n"

    class Flaky(DirStore):
        failing = True

        def get(self, key: str, max_bytes: int) -> bytes:
            if self.failing:
                raise StoreError("downloading ... failed: InternalError (HTTP 500)")
            return super().get(key, max_bytes)

    store = Flaky(parse_uri(f"file://{tmp_path / 'store'}"))
    settings = Settings(
        exchange=tmp_path / "exchange",
        location=store.location,
        ident=ident,
        scope="namespace",
        every_gemms=1,
        every_seconds=60,
        min_interval_s=0,
    )
    key = checkpoint_key(store.location, ident)
    store.put(key, make_checkpoint(ident, old_rows, "t0"), "application/json")
    logs: list[str] = []
    sync = Sync(settings, store=lambda: store, log=logs.append)
    settings.exchange.mkdir()
    sync.start()
    status = json.loads((settings.exchange / "checkpoint.json").read_text())
    assert status["status"] == "none" and "could not read the checkpoint" in status["reason"]
    (settings.exchange / "progress.csv").write_text(
        "Validator,PT_VERSION,2.11.0+standin\nGemmTunableOp_BFloat16_TN,tn_16_8_8_ld_8_8_16,Default,0.25\n"
    )
    sync.step()  # due, but the stored checkpoint is still unreadable: not replaced
    assert "checkpoint not uploaded: the stored one cannot be read (retrying)" in logs
    store.failing = False
    intact = parse_checkpoint(store.get(key, 1 << 20), ident)
    assert intact.keys() == {("GemmTunableOp_BFloat16_TN", "tn_8_8_8_ld_8_8_8")}  # the old one
    sync.step()
    merged = parse_checkpoint(store.get(key, 1 << 20), ident)
    assert merged.keys() == {
        ("GemmTunableOp_BFloat16_TN", "tn_8_8_8_ld_8_8_8"),
        ("GemmTunableOp_BFloat16_TN", "tn_16_8_8_ld_8_8_16"),
    }  # the earlier attempt's rows kept, this run's added


def test_a_job_stopped_midway_keeps_what_it_tuned_for_the_next_revision(tmp_path: Path) -> None:
    """A new revision stops the Jobs of the old one (the operator deletes them): the kubelet
    SIGTERMs the sidecar while tuning still runs, and what was tuned joins the library."""
    slow = {**ROCM, "FAKE_TORCH_TUNE_SLEEP": "0.2"}
    old = (
        make_tuner_run(tmp_path / "store", "llama", range(16))
        .env(**slow)
        .fields(every_gemms=100)
        .obj()
    )
    pod = Pod(old, tmp_path / "old")
    pod.start_sync()
    pod.start_tune()
    wait_until(lambda: pod.progress_gemms() >= 6, 120, "some GEMMs tuned")
    # What was tuned before the SIGTERM: the sidecar's final checkpoint has at least these.
    # (Read after it, the log also has GEMMs tuned once the checkpoint was taken, which the
    # next revision rightly tunes again: under load that made this test fail.)
    stopped = [k for k in tuned_keys(pod.tune_log())]
    assert pod.stop_sync() == 0  # the Job is deleted: SIGTERM, tuning not done
    pod.kill(sidecar_too=False)
    pod.wait_tune()
    assert "kept in the library" in pod.sync_log(), pod.sync_log()
    newer = Pod(
        make_tuner_run(tmp_path / "store", "llama", range(16))
        .env(**FAST)
        .fields(revision="9c0ffee123")
        .obj(),
        tmp_path / "new",
    ).run()
    assert newer.tune.returncode == 0, newer.tune.stderr
    assert newer.message()["reused"] >= 6
    assert not set(stopped) & set(newer.tuned)  # nothing tuned twice across the revisions
