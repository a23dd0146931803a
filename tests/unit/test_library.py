"""The GEMM library's pieces: identity key, partition, entries and their verification, the
directory store's list/put, concurrent publishes, checkpoints, manifest fields.

The flows through the real CLIs (sync, tuner with the stand-in torch, publish, merge) are in
test_library_flow.py; against the real S3 server in tests/e2e/test_library_s3.py.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random
import threading
from pathlib import Path
from typing import Any

import pytest

from tunefleet.artifacts import publish as publish_mod
from tunefleet.artifacts.library import (
    MAX_ENTRIES,
    Library,
    checkpoint_key,
    library_prefix,
    read_library,
)
from tunefleet.artifacts.publish import Output
from tunefleet.storage.filesystem import DirStore
from tunefleet.storage.registry import parse_uri
from tunefleet.storage.store import Location, NotFoundError, StoreError
from tuner_job.library import (
    COST_CAP,
    COST_FLOOR,
    IDENTITY_FIELDS,
    CheckpointError,
    CheckpointId,
    EntrySource,
    gemm_cost,
    library_key,
    make_checkpoint,
    make_entry,
    parse_checkpoint,
    partition,
    share_cost,
)
from tuner_job.manifest import ArtifactId, LibraryInfo, ManifestExtra, ResumeInfo, loads
from tuner_job.output import RunFacts, write_output
from tuner_job.results import (
    ResultRow,
    ResultsFile,
    UntunedRow,
    format_results,
    merge_results,
    read_results,
)

DATA = Path(__file__).parent / "data"
MODEL = "AMD_Instinct_MI300X_OAM"
ROCM = read_results(DATA / "rocm_results.csv")
IDENTITY = {
    "gpuName": "AMD Instinct MI300X",
    "gpuCount": "8",
    "gpuMemoryMiB": "196592",
    "driver": "amdgpu 6.10.5",
    "torch": "2.11.0",
    "arch": "gfx942:sramecc+:xnack-",
    "hip": "6.4.43483",
    "hipVersion": "60443483",
    "hipblaslt": "100000-43e8d0cd1e",
    "rocblas": "5.0.0.8f5c8c3b-dirty",
}
KEY = library_key(MODEL, ROCM.validators, IDENTITY)


# --- the identity key ------------------------------------------------------------------------


def test_library_key_is_stable_and_independent_of_order() -> None:
    shuffled_validators = dict(reversed(list(ROCM.validators.items())))
    shuffled_identity = dict(reversed(list(IDENTITY.items())))
    assert library_key(MODEL, shuffled_validators, shuffled_identity) == KEY
    # The exact definition: sha256 of canonical JSON of {gpuModel, validators, identity subset}.
    doc = {
        "gpuModel": MODEL,
        "validators": ROCM.validators,
        "identity": {k: IDENTITY[k] for k in IDENTITY_FIELDS if k in IDENTITY},
    }
    blob = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()
    assert hashlib.sha256(blob).hexdigest() == KEY


@pytest.mark.parametrize("field", ["gpuName", "gpuCount", "gpuMemoryMiB", "driver", "torch"])
def test_fields_the_key_leaves_out_do_not_change_it(field: str) -> None:
    assert library_key(MODEL, ROCM.validators, {**IDENTITY, field: "other"}) == KEY
    assert (
        library_key(MODEL, ROCM.validators, {k: v for k, v in IDENTITY.items() if k != field})
        == KEY
    )


@pytest.mark.parametrize("field", IDENTITY_FIELDS)
def test_every_identity_field_of_the_key_changes_it(field: str) -> None:
    assert library_key(MODEL, ROCM.validators, {**IDENTITY, field: "other"}) != KEY


def test_every_validator_and_the_model_change_the_key() -> None:
    for name in ROCM.validators:
        assert library_key(MODEL, {**ROCM.validators, name: "x"}, IDENTITY) != KEY
    assert library_key(MODEL, {**ROCM.validators, "NEW_ONE": "x"}, IDENTITY) != KEY
    assert library_key("AMD_Instinct_MI325X", ROCM.validators, IDENTITY) != KEY


# --- partition -------------------------------------------------------------------------------


def llm_gemms(count: int, seed: int = 7) -> list[UntunedRow]:
    """A realistic mix: decode (m = batch) and prefill (m = tokens) GEMMs of a few model widths,
    with and without bias, plus batched attention GEMMs."""
    rng = random.Random(seed)
    widths = [(4096, 4096), (4096, 11008), (11008, 4096), (12288, 4096), (4096, 14336)]
    rows: dict[tuple[str, str], UntunedRow] = {}
    while len(rows) < count:
        m = rng.choice(
            [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192]
        ) + rng.randrange(64)
        if rng.random() < 0.15:
            b, d = rng.choice([8, 16, 32, 64]), rng.choice([64, 128])
            op, params = (
                "GemmStridedBatchedTunableOp_BFloat16_NT",
                f"nt_{m}_{m}_{d}_B_{b}_ld_{m}_{m}_{m}",
            )
        else:
            n, k = rng.choice(widths)
            op = rng.choice(["GemmTunableOp_BFloat16_TN", "GemmAndBiasTunableOp_BFloat16_TN"])
            params = f"tn_{n}_{m}_{k}_ld_{k}_{k}_{n}"
        rows[(op, params)] = UntunedRow(op, params)
    return list(rows.values())


def test_cost_is_mnk_times_batch_within_bounds_and_wildcards_count_as_one() -> None:
    mid = UntunedRow("GemmTunableOp_BFloat16_TN", "tn_2048_2048_1024_ld_1024_1024_2048")
    assert gemm_cost(mid) == 2048 * 2048 * 1024
    batched = UntunedRow(
        "GemmStridedBatchedTunableOp_Half_NN", "nn_1024_1024_512_B_8_ld_1024_512_1024"
    )
    assert gemm_cost(batched) == 1024 * 1024 * 512 * 8
    tiny = UntunedRow("GemmTunableOp_BFloat16_TN", "tn_4096_1_4096_ld_4096_4096_4096")
    huge = UntunedRow("GemmTunableOp_BFloat16_TN", "tn_8192_8192_8192_ld_8192_8192_8192")
    assert (gemm_cost(tiny), gemm_cost(huge)) == (COST_FLOOR, COST_CAP)
    wild = UntunedRow("GemmTunableOp_BFloat16_TN", "tn_*_65536_65536")
    assert gemm_cost(wild) == 65536 * 65536


def test_partition_is_deterministic_under_permutation_disjoint_and_covering() -> None:
    rows = llm_gemms(600)
    expected = partition(rows, 4)
    for seed in range(5):
        shuffled = rows[:]
        random.Random(seed).shuffle(shuffled)
        assert partition(shuffled + shuffled[:50], 4) == expected  # duplicates count once
    keys = [r.key for share in expected for r in share]
    assert len(keys) == len(set(keys)) == len(rows)  # disjoint and covering
    assert set(keys) == {r.key for r in rows}


@pytest.mark.parametrize("count", [2, 3, 4, 8])
def test_partition_balances_the_estimated_cost(count: int) -> None:
    rows = llm_gemms(2000)
    loads = [share_cost(s) for s in partition(rows, count)]
    # LPT: the spread between shares is at most the costliest single GEMM, here <= 1% of one.
    assert max(loads) - min(loads) <= COST_CAP
    assert max(loads) / min(loads) < 1.01
    counts = [len(s) for s in partition(rows, count)]
    assert max(counts) / min(counts) < 1.25  # and so, with this mix, the GEMM counts too


def test_partition_of_fewer_gemms_than_shares_leaves_some_empty() -> None:
    rows = llm_gemms(3)
    shares = partition(rows, 5)
    assert sorted(len(s) for s in shares) == [0, 0, 1, 1, 1]
    assert partition(rows, 1) == [sorted(rows, key=lambda r: (-gemm_cost(r), r.key))]
    with pytest.raises(ValueError):
        partition(rows, 0)


# --- entries and reading a library -----------------------------------------------------------


def entry_bytes(
    results: ResultsFile = ROCM,
    *,
    identity: dict[str, str] = IDENTITY,
    model: str = MODEL,
    profile: str = "llama",
    text: str | None = None,
) -> bytes:
    return make_entry(
        gpu_model=model,
        validators=results.validators,
        identity=identity,
        source=EntrySource("ml", profile, "3f2a9c01de", "ab" * 32),
        results_text=format_results(results) if text is None else text,
    )


def place(store: DirStore, data: bytes, name: str | None = None, key: str = KEY) -> str:
    prefix = library_prefix(store.location, "namespace", "ml", MODEL, key)
    object_key = f"{prefix}/{name or hashlib.sha256(data).hexdigest()}.json"
    store.put(object_key, data, "application/json")
    return object_key


def read(store: DirStore, validators: dict[str, str] | None = None) -> Any:
    return read_library(
        store, Library(store.location, "namespace", "ml", MODEL, KEY), validators or ROCM.validators
    )


def rows(results: ResultsFile, keep: slice) -> ResultsFile:
    return ResultsFile(dict(results.validators), results.rows[keep])


def test_a_library_merges_its_good_entries(tmp_path: Path) -> None:
    store = DirStore(parse_uri(f"file://{tmp_path}"))
    place(store, entry_bytes(rows(ROCM, slice(0, 5)), profile="a"))
    place(store, entry_bytes(rows(ROCM, slice(3, None)), profile="b"))
    view = read(store)
    assert (view.entries, view.skipped) == (2, [])
    assert format_results(view.results) == format_results(ROCM)


def test_corrupted_entries_are_skipped_and_reported_never_merged(tmp_path: Path) -> None:
    store = DirStore(parse_uri(f"file://{tmp_path}"))
    good = place(store, entry_bytes(rows(ROCM, slice(0, 3))))
    poison = ResultRow(
        "GemmTunableOp_BFloat16_TN", "tn_7_7_7_ld_7_7_7", "Gemm_Hipblaslt_666", "0.001"
    )
    bad_rows = ResultsFile(dict(ROCM.validators), [*ROCM.rows[3:6], poison])
    # 1. bytes that are not what the name says (a flipped bit, or a hand edit)
    tampered = entry_bytes(bad_rows).replace(b"Gemm_Hipblaslt_", b"Gemm_Hipblaslx_")
    bad_hash = place(store, tampered, name=hashlib.sha256(entry_bytes(bad_rows)).hexdigest())
    # 2. results TunableOp would misread (CRLF), in a well-formed, well-named entry
    crlf = place(store, entry_bytes(bad_rows, text=format_results(bad_rows).replace("\n", "\r\n")))
    # 3. another identity's entry (other hipBLASLt build) put under this key
    other_identity = {**IDENTITY, "cuda": "12.8"}
    wrong_key = place(store, entry_bytes(bad_rows, identity=other_identity))
    # 4. other validators (tuned by another torch)
    other = ResultsFile({**ROCM.validators, "PT_VERSION": "2.10.0"}, bad_rows.rows)
    other_validators = place(store, entry_bytes(other))
    # 5. not even JSON, under its own hash
    garbage = place(store, b"\x00not json")

    view = read(store)
    assert view.entries == 1
    assert format_results(view.results) == format_results(rows(ROCM, slice(0, 3)))
    assert poison.key not in view.results.keys()  # noqa: SIM118  # nothing of a bad entry got in
    reasons = dict(view.skipped)
    assert good not in reasons
    assert "not its name" in reasons[bad_hash]
    assert "results do not parse" in reasons[crlf] and "CRLF" in reasons[crlf]
    assert "belongs to library key" in reasons[wrong_key]
    assert (
        "other validators" in reasons[other_validators]
        and "PT_VERSION" in reasons[other_validators]
    )
    assert "not JSON" in reasons[garbage]
    assert len(view.skipped) == 5


def test_an_entry_whose_key_field_lies_is_skipped(tmp_path: Path) -> None:
    store = DirStore(parse_uri(f"file://{tmp_path}"))
    doc = json.loads(entry_bytes())
    doc["identity"]["rocblas"] = "9.9.9"  # the fields no longer give the key it claims
    data = json.dumps(doc).encode()
    obj = place(store, data)
    assert (
        dict(read(store).skipped)[obj]
        == "its key does not match its own gpuModel/validators/identity"
    )


def test_an_entry_the_store_fails_to_give_is_skipped_and_the_rest_read(tmp_path: Path) -> None:
    class Flaky(DirStore):
        def get(self, key: str, max_bytes: int) -> bytes:
            if key == broken:
                raise StoreError(f"downloading {key} failed: SlowDown (HTTP 503)")
            return super().get(key, max_bytes)

    store = Flaky(parse_uri(f"file://{tmp_path}"))
    place(store, entry_bytes(rows(ROCM, slice(0, 3)), profile="a"))
    broken = place(store, entry_bytes(rows(ROCM, slice(3, 6)), profile="b"))
    view = read(store)
    assert view.entries == 1 and view.gemms == 3
    assert view.skipped == [(broken, f"not read: downloading {broken} failed: SlowDown (HTTP 503)")]


def test_reading_an_empty_library_gives_nothing(tmp_path: Path) -> None:
    view = read(DirStore(parse_uri(f"file://{tmp_path}")))
    assert (view.entries, view.results, view.skipped) == (0, None, [])


def test_past_the_entry_limit_the_newest_are_read_and_the_rest_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tunefleet.artifacts.library as lib

    monkeypatch.setattr(lib, "MAX_ENTRIES", 2)
    store = DirStore(parse_uri(f"file://{tmp_path}"))
    objs = []
    for i in range(4):
        obj = place(store, entry_bytes(rows(ROCM, slice(i, i + 1)), profile=f"p{i}"))
        mtime = 1_700_000_000 + i
        os.utime(tmp_path / obj, (mtime, mtime))
        objs.append(obj)
    view = read(store)
    assert view.entries == 2
    assert view.results.keys() == {ROCM.rows[2].key, ROCM.rows[3].key}  # the two newest
    assert sorted(o for o, _ in view.skipped) == sorted(objs[:2])
    assert all("over the limit of 2 entries" in r for _, r in view.skipped)
    assert MAX_ENTRIES == 500  # the real bound, documented in docs/tuner.md


def test_an_entry_that_would_pass_the_gemm_bound_is_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tunefleet.artifacts.library as lib

    monkeypatch.setattr(lib, "MAX_GEMMS", 5)
    store = DirStore(parse_uri(f"file://{tmp_path}"))
    one = place(store, entry_bytes(rows(ROCM, slice(0, 4)), profile="a"))
    other = place(store, entry_bytes(rows(ROCM, slice(4, 8)), profile="b"))
    view = read(store)  # whichever comes first fits; the other would make 8 GEMMs
    assert (view.gemms, view.entries) == (4, 1)
    ((skipped, reason),) = view.skipped
    assert skipped in (one, other) and reason == "over the 5 GEMMs kept per library"


# --- publishing adds entries; concurrent publishes lose nothing ------------------------------


def artifact(out: Path, results: ResultsFile, profile: str) -> None:
    write_output(
        out,
        results,
        ArtifactId(namespace="ml", profile=profile, revision="3f2a9c01de", gpu_model=MODEL),
        RunFacts(
            recorded=results.gemms,
            identity=IDENTITY,
            seconds=1.0,
            extra=ManifestExtra(library_key=KEY, shards=1),
        ),
    )


def synthetic(i: int, n: int = 40) -> ResultsFile:
    """n rows of their own per publisher, plus 10 shared by all (in TunableOp's format)."""
    own = [
        ResultRow(
            "GemmTunableOp_BFloat16_TN",
            f"tn_{64 + j}_{1000 + i}_64_ld_64_64_{64 + j}",
            f"Gemm_Hipblaslt_{i}",
            f"0.{j + 1:03d}",
        )
        for j in range(n)
    ]
    shared = [
        ResultRow(
            "GemmTunableOp_BFloat16_TN",
            f"tn_{64 + j}_77_64_ld_64_64_{64 + j}",
            f"Gemm_Rocblas_{i}",
            f"0.{i + 1:03d}",
        )
        for j in range(10)
    ]
    return ResultsFile(dict(ROCM.validators), own + shared)


def test_concurrent_publishes_of_one_identity_lose_nothing(tmp_path: Path) -> None:
    store_uri = f"file://{tmp_path / 'store'}"
    publishers = 8
    for i in range(publishers):
        artifact(tmp_path / f"out{i}", synthetic(i), f"profile-{i}")
    barrier = threading.Barrier(publishers)
    errors: list[BaseException] = []

    def one(i: int) -> None:
        barrier.wait()
        try:
            pub = publish_mod.publish(
                Output(tmp_path / f"out{i}", store_uri, "ml", f"profile-{i}", MODEL)
            )
            assert pub.library is not None and pub.library.created, pub.library_error
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(publishers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    store = DirStore(parse_uri(store_uri))
    view = read_library(
        store, Library(store.location, "namespace", "ml", MODEL, KEY), ROCM.validators
    )
    assert (view.entries, view.skipped) == (publishers, [])
    expected = merge_results([synthetic(i) for i in range(publishers)])
    assert format_results(view.results) == format_results(expected)  # every row, best wins
    assert view.gemms == publishers * 40 + 10
    shared = [r for r in view.results.rows if r.params.split("_")[2] == "77"]
    assert {r.solution for r in shared} == {"Gemm_Rocblas_0"}  # the fastest of the shared rows


def test_publishing_the_same_artifact_twice_adds_one_entry(tmp_path: Path) -> None:
    store_uri = f"file://{tmp_path / 'store'}"
    artifact(tmp_path / "out", synthetic(1), "llama")
    first = publish_mod.publish(Output(tmp_path / "out", store_uri, "ml", "llama", MODEL))
    again = publish_mod.publish(Output(tmp_path / "out", store_uri, "ml", "llama", MODEL))
    assert first.library is not None and first.library.created
    assert again.library is not None and not again.library.created
    assert again.library.uri == first.library.uri
    assert first.library.uri.startswith(f"{store_uri}/ml/_library/{MODEL}/{KEY}/")


def test_cluster_scope_puts_the_library_beside_the_namespaces(tmp_path: Path) -> None:
    store_uri = f"file://{tmp_path / 'store'}"
    artifact(tmp_path / "out", synthetic(1), "llama")
    pub = publish_mod.publish(
        Output(tmp_path / "out", store_uri, "ml", "llama", MODEL), library_scope="cluster"
    )
    assert pub.library is not None
    assert pub.library.uri.startswith(f"{store_uri}/_library/{MODEL}/{KEY}/")


def test_a_library_that_refuses_the_entry_does_not_fail_the_publish(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store_uri = f"file://{tmp_path / 'store'}"
    artifact(tmp_path / "out", synthetic(1), "llama")
    (tmp_path / "store" / "ml").mkdir(parents=True)
    (tmp_path / "store" / "ml" / "_library").write_text("a file where a directory belongs")
    pub = publish_mod.publish(Output(tmp_path / "out", store_uri, "ml", "llama", MODEL))
    assert pub.library is None and "cannot write" in pub.library_error
    assert "warning: not added to the GEMM library" in capsys.readouterr().err
    message = json.loads(publish_mod.termination_message(pub))
    assert message["sha256"] == pub.sha256  # the artifact itself is published


# --- the directory store's list and put ------------------------------------------------------


def test_dir_store_lists_by_key_skips_temp_files_and_replaces_on_put(tmp_path: Path) -> None:
    store = DirStore(Location("file", str(tmp_path), ""))
    for key in ("a/b/2.json", "a/b/1.json", "a/c/3.json", "ab/x.json"):
        store.put(key, key.encode(), "application/json")
    (tmp_path / "a" / "b" / ".1.json.tmp123").write_text("partial")
    assert [o.key for o in store.list("a", 10)] == ["a/b/1.json", "a/b/2.json", "a/c/3.json"]
    assert [o.key for o in store.list("a", 2)] == ["a/b/1.json", "a/b/2.json"]
    assert store.list("missing", 10) == []
    store.put("a/b/1.json", b"new", "application/json")
    assert store.get("a/b/1.json", 10) == b"new"
    with pytest.raises(NotFoundError):
        store.get("a/b/9.json", 10)


# --- checkpoints -----------------------------------------------------------------------------


IDENT = CheckpointId("ml", "llama", MODEL, "3f2a9c01de", 1, 4)


def test_a_checkpoint_round_trips_for_its_own_job() -> None:
    data = make_checkpoint(IDENT, format_results(ROCM), "2026-11-30T00:00:00Z")
    assert format_results(parse_checkpoint(data, IDENT)) == format_results(ROCM)
    assert checkpoint_key(parse_uri("s3://b/pre"), IDENT) == (
        f"pre/ml/llama/{MODEL}/_checkpoints/3f2a9c01de/1-of-4.json"
    )


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (
            {"revision": "0000000000"},
            "checkpoint is for revision '0000000000', this Job tunes '3f2a9c01de'",
        ),
        ({"shard": 2}, "checkpoint is for shard 2 of 4, this pod is shard 1 of 4"),
        ({"shards": 2}, "checkpoint is for shard 1 of 2, this pod is shard 1 of 4"),
        ({"gpu_model": "NVIDIA-H100"}, "checkpoint is for GPU model 'NVIDIA-H100', this Job tunes"),
        ({"profile": "other"}, "checkpoint is for profile 'other', this Job tunes 'llama'"),
    ],
)
def test_a_checkpoint_of_another_job_is_refused_with_the_reason(
    change: dict[str, Any], reason: str
) -> None:
    data = make_checkpoint(dataclasses.replace(IDENT, **change), format_results(ROCM), "t")
    with pytest.raises(CheckpointError) as err:
        parse_checkpoint(data, IDENT)
    assert str(err.value).startswith(reason)


# --- manifest fields -------------------------------------------------------------------------


def test_manifest_reuse_fields_round_trip_and_stay_optional(tmp_path: Path) -> None:
    extra = ManifestExtra(
        reused=5,
        resumed=2,
        newly_tuned=2,
        library_key=KEY,
        shards=4,
        shard=3,
        library=LibraryInfo(3, (("obj", "why"),), 12, None),
        resume=ResumeInfo("resumed", "2 GEMM(s) tuned by an earlier attempt"),
        wall_seconds=12.25,
    )
    artifact(tmp_path / "old", ROCM, "llama")
    m = write_output(
        tmp_path / "out",
        ROCM,
        ArtifactId(namespace="ml", profile="llama", revision="3f2a9c01de", gpu_model=MODEL),
        RunFacts(recorded=ROCM.gemms, identity=IDENTITY, seconds=3.0, extra=extra),
    )
    doc = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert {k: doc[k] for k in ("reused", "resumed", "newlyTuned", "libraryKey", "shards", "shard", "wallSeconds")} == {
        "reused": 5, "resumed": 2, "newlyTuned": 2, "libraryKey": KEY, "shards": 4, "shard": 3, "wallSeconds": 12.25,
    }  # fmt: skip
    assert doc["library"] == {
        "entries": 3,
        "skipped": [{"object": "obj", "reason": "why"}],
        "skippedCount": 12,
    }
    assert doc["resume"] == {"status": "resumed", "reason": "2 GEMM(s) tuned by an earlier attempt"}
    assert loads(m.to_json()) == m
    # A manifest from before these fields still reads, with none of them.
    old = json.loads((tmp_path / "old" / "manifest.json").read_text())
    for field in (
        "reused",
        "resumed",
        "newlyTuned",
        "shards",
        "shard",
        "library",
        "resume",
        "wallSeconds",
        "libraryKey",
    ):
        old.pop(field, None)
    assert loads(json.dumps(old)).extra == ManifestExtra()


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("reused", -1),
        ("newlyTuned", "3"),
        ("shards", 0),
        ("libraryKey", "nothex"),
        ("wallSeconds", -2),
        ("resume", {"status": "maybe"}),
        ("library", {"entries": 1, "skipped": [{"object": 1}]}),
    ],
)
def test_malformed_reuse_fields_are_refused(tmp_path: Path, field: str, value: Any) -> None:
    from tuner_job.manifest import ManifestError

    artifact(tmp_path / "out", ROCM, "llama")
    doc = json.loads((tmp_path / "out" / "manifest.json").read_text())
    doc[field] = value
    with pytest.raises(ManifestError):
        loads(json.dumps(doc))


def test_the_termination_message_carries_the_reuse_counts(tmp_path: Path) -> None:
    artifact(tmp_path / "out", ROCM, "llama")
    manifest = loads((tmp_path / "out" / "manifest.json").read_bytes())
    long_reason = "x" * 5000
    manifest = dataclasses.replace(
        manifest,
        recorded=ROCM.gemms + 2,
        identity={**IDENTITY, "notes": "y" * 4000},
        extra=ManifestExtra(
            reused=4,
            resumed=1,
            newly_tuned=ROCM.gemms - 5,
            shards=2,
            library=LibraryInfo(7, tuple((f"o{i}", long_reason) for i in range(10)), 31),
        ),
    )
    pub = publish_mod.Published("s3://b/p/x", manifest.results_sha256, manifest, True, False)
    message = publish_mod.termination_message(pub)
    assert len(message.encode()) <= 4096
    doc = json.loads(message)
    assert {k: doc[k] for k in ("recorded", "reused", "resumed", "newlyTuned", "shards", "librarySkipped")} == {
        "recorded": ROCM.gemms + 2, "reused": 4, "resumed": 1, "newlyTuned": ROCM.gemms - 5,
        "shards": 2, "librarySkipped": 31,
    }  # fmt: skip
    assert doc["librarySkippedReason"] == "x" * 197 + "..."
    assert "notes" not in doc["identity"]  # trimmed first, as before
