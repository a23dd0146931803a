"""tunefleet-gc on a store of 10,000 objects: time and objects deleted, then a second run.

The store is filled the way a fleet leaves it (synthetic, in tunefleet's key layout and entry
format): 4 namespaces x 25 profiles, each with 16 artifacts (results.csv + manifest.json), 16
library entries (every entry repeats 30 rows of its namespace's shared pool with its own times,
plus 10 GEMMs of its own, as reuse leaves them), checkpoints of 5 revisions x 4 shards and
shard outputs of 4 revisions x 4 shards: 100 objects per profile. Each profile's status names
its newest artifact and 3 earlier ones (history); its current revision is the newest, published.

gc runs as the CLI's code does (collect, then apply) with --keep 3 and no grace period (every
object is minutes old: with a grace nothing would go), profiles given as the API server would
list them. Then a second run, which must delete nothing; and checks: every referenced artifact
is still there, and each library reads the same rows (read_library) before and after.

    python -m bench.bench_gc --uri file:///tmp/gc-bench   # a directory store
    python -m bench.bench_gc --s3                         # the local S3 server (.tunefleet/s3.env)
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import json
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "operator")]

from tunefleet.artifacts import gc  # noqa: E402
from tunefleet.artifacts.library import (  # noqa: E402
    Library,
    checkpoint_key,
    library_prefix,
    read_library,
    shard_base,
)
from tunefleet.storage.registry import open_store, parse_uri  # noqa: E402
from tunefleet.storage.store import Location, Store, StoreOptions  # noqa: E402
from tuner_job.library import CheckpointId, EntrySource, library_key, make_entry  # noqa: E402
from tuner_job.manifest import ArtifactId  # noqa: E402
from tuner_job.results import ResultRow, ResultsFile, format_results  # noqa: E402

MODEL = "AMD_Instinct_MI300X_OAM"
VALIDATORS = {"PT_VERSION": "2.11.0", "GCN_ARCH_NAME": "gfx942:sramecc+:xnack-"}
IDENTITY = {"gpuName": "synthetic bench data", "arch": "gfx942:sramecc+:xnack-"}
KEY = library_key(MODEL, VALIDATORS, IDENTITY)
NAMESPACES, PROFILES, ARTIFACTS = 4, 25, 16
CHECKPOINT_REVISIONS, SHARD_REVISIONS, SHARDS = 5, 4, 4
KEEP = 3


def revision(p: int, r: int) -> str:
    return f"r{p:03d}x{r:05d}"  # key-safe, distinct per profile and revision


def entry_rows(ns: int, p: int, a: int) -> ResultsFile:
    shared = [
        ResultRow(
            "GemmTunableOp_BFloat16_TN",
            f"tn_{128 + j}_{4096 + ns}_4096_ld_4096_4096_{128 + j}",
            f"Gemm_Hipblaslt_{p}",
            f"0.{(p * 7 + a + j) % 900 + 100:03d}",
        )
        for j in range(30)
    ]
    own = [
        ResultRow(
            "GemmTunableOp_BFloat16_TN",
            f"tn_{64 + j}_{1000 + p * ARTIFACTS + a}_64_ld_64_64_{64 + j}",
            f"Gemm_Rocblas_{a}",
            f"0.{j + 100:03d}",
        )
        for j in range(10)
    ]
    return ResultsFile(dict(VALIDATORS), shared + own)


def fleet_objects(location: Location, ns: str, n: int, p: int) -> tuple[list[Any], dict[str, Any]]:
    """One profile's objects (key, bytes) and the profile as the API server lists it."""
    name = f"profile-{p:02d}"
    objects: list[tuple[str, bytes]] = []
    status: list[dict[str, Any]] = []
    for a in range(ARTIFACTS):
        rows = entry_rows(n, p, a)
        text = format_results(rows).encode()
        sha = hashlib.sha256(text).hexdigest()
        base = location.key(ns, name, MODEL, sha)
        objects += [(f"{base}/results.csv", text), (f"{base}/manifest.json", b"{}\n")]
        entry = make_entry(
            gpu_model=MODEL,
            validators=VALIDATORS,
            identity=IDENTITY,
            source=EntrySource(ns, name, revision(p, a), sha),
            results_text=text.decode(),
        )
        lib = library_prefix(location, "namespace", ns, MODEL, KEY)
        objects.append((f"{lib}/{hashlib.sha256(entry).hexdigest()}.json", entry))
        record = {"uri": location.uri(base), "sha256": sha, "gpuModel": MODEL}
        status.append({**record, "revision": revision(p, a)})
    for r in range(CHECKPOINT_REVISIONS):
        for i in range(SHARDS):
            ident = CheckpointId(ns, name, MODEL, revision(p, ARTIFACTS - 1 - r), i, SHARDS)
            objects.append((checkpoint_key(location, ident), b"{}\n"))
    for r in range(SHARD_REVISIONS):
        for i in range(SHARDS):
            rev = revision(p, ARTIFACTS - 1 - r)
            base = shard_base(location, ArtifactId(ns, name, rev, MODEL), i, SHARDS)
            objects += [(f"{base}/results.csv", b"x\n"), (f"{base}/manifest.json", b"{}\n")]
    newest = status[-1]
    doc = {
        "metadata": {"namespace": ns, "name": name},
        "spec": {"storage": {"uri": location.uri(location.prefix)}},  # no spec revision
        "status": {
            "revision": newest["revision"],
            "artifacts": [newest],
            "history": list(reversed(status[-4:-1])),
        },
    }
    return objects, doc


def fill(store: Store, location: Location) -> list[dict[str, Any]]:
    """Profiles in parallel, each one's objects in order: its artifacts are then newest in the
    order they were "tuned" (on S3, to LastModified's second)."""
    work = [fleet_objects(location, f"bench-ns-{n}", n, p) for n in range(NAMESPACES)
            for p in range(PROFILES)]  # fmt: skip

    def put_all(objects: list[tuple[str, bytes]]) -> None:
        for key, data in objects:
            store.put(key, data, "application/octet-stream")

    with concurrent.futures.ThreadPoolExecutor(max_workers=16) as pool:
        list(pool.map(put_all, [objects for objects, _ in work]))
    return [doc for _, doc in work]


def libraries(store: Store, location: Location) -> dict[str, str]:
    out = {}
    for n in range(NAMESPACES):
        ns = f"bench-ns-{n}"
        view = read_library(store, Library(location, "namespace", ns, MODEL, KEY), dict(VALIDATORS))
        assert view.results is not None and not view.skipped, view.skipped[:3]
        out[ns] = format_results(view.results)
    return out


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    t0 = time.perf_counter()
    got = fn()
    return got, round(time.perf_counter() - t0, 2)


def run_on(store: Store, location: Location) -> dict[str, Any]:
    profiles, fill_s = timed(lambda: fill(store, location))
    listed = len(store.list(location.prefix, 100_000))
    before = libraries(store, location)
    rules = gc.Rules(keep=KEEP, grace_s=0.0)

    def once() -> gc.Plan:
        plan = gc.collect(store, location, profiles, rules)
        gc.apply(plan, store, lambda line: None)
        return plan

    dry, dry_s = timed(lambda: gc.collect(store, location, profiles, rules))
    first, first_s = timed(once)
    second, second_s = timed(once)
    remaining = {o.key for o in store.list(location.prefix, 100_000)}
    referenced = {
        f"{e['uri'].removeprefix(location.uri() + '/')}/{f}"
        for doc in profiles
        for e in [*doc["status"]["artifacts"], *doc["status"]["history"]]
        for f in ("results.csv", "manifest.json")
    }
    assert referenced <= remaining, "a referenced artifact was deleted"
    assert libraries(store, location) == before, "the libraries read otherwise after gc"
    deleted = {k: 0 for k in (gc.ARTIFACT, gc.CHECKPOINTS, gc.SHARDS, gc.ENTRIES)}
    for d in first.deletes:
        deleted[d.kind] += len(d.keys)
    return {
        "objects_listed": listed,
        "profiles": len(profiles),
        "fill_s": fill_s,
        "dry_run_s": dry_s,
        "dry_run_would_delete": sum(len(d.keys) for d in dry.deletes),
        "apply_s": first_s,
        "deleted": sum(deleted.values()),
        "deleted_by_kind": deleted,
        "compacted_entries_written": len(first.writes),
        "objects_left": len(remaining),
        "second_run_s": second_s,
        "second_run_deleted": sum(len(d.keys) for d in second.deletes),
        "second_run_written": len(second.writes),
        "checks": "referenced artifacts all kept; libraries read the same rows before and after",
        "settings": f"--keep {KEEP}, no grace period (every object is minutes old)",
    }


def run(s3: Any) -> dict[str, Any]:
    """For `make bench`: on the local S3 server, under a prefix of its own, removed after."""
    uri = f"s3://{s3.bucket}/bench-gc/{uuid.uuid4().hex[:10]}"
    location = parse_uri(uri)
    store = open_store(location, StoreOptions(client=s3.client(), timeout_s=3600))
    try:
        return {"store": "s3 (local SeaweedFS)", **run_on(store, location)}
    finally:
        s3.delete_prefix(location.prefix + "/")


def run_dir(uri: str | None) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="gc-bench-")) if uri is None else None
    location = parse_uri(uri or f"file://{tmp}")
    if Path(location.bucket).exists() and any(Path(location.bucket).iterdir()):
        raise SystemExit(f"{location.bucket} is not empty: give the bench a directory of its own")
    Path(location.bucket).mkdir(parents=True, exist_ok=True)
    try:
        return {"store": "file://", **run_on(open_store(location), location)}
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--uri", help="an empty file:///dir (default: a temp directory)")
    p.add_argument("--s3", action="store_true", help="the local S3 server instead")
    args = p.parse_args()
    if args.s3:
        from testbed.cluster import ensure_s3

        print(json.dumps(run(ensure_s3()), indent=2))
    else:
        print(json.dumps(run_dir(args.uri), indent=2))


if __name__ == "__main__":
    main()
