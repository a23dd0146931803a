"""Real-size bundles through publish and fetch (artifacts/bundle.py, tuner_job/caches.py):
archives streamed through files in bounded memory, verified before the first member is
written, a bundle that cannot fit told and never unpacked, no temporary file left behind.
The GB case runs in the e2e (tests/e2e/test_bundles_large.py); these use tens of MiB, enough
to tell a whole read from a streamed one."""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import tarfile
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
import zstandard

from tests.support.artifacts import tuner_output
from tunefleet.artifacts import bundle, ocibundle
from tunefleet.artifacts import fetch as fetch_mod
from tunefleet.artifacts import publish as publish_mod
from tunefleet.artifacts.publish import Output
from tunefleet.builders.webhook import (
    FETCH_RESOURCES,
    Serve,
    caches_args,
    caches_volume,
    fetch_resources,
    pod_budget,
)
from tuner_job import caches as cc
from tuner_job.manifest import loads

MODEL = "AMD_Instinct_MI300X_OAM"
BIG = 40 << 20  # incompressible: the archive is as big as the cache


def _big_output(tmp: Path, size: int = BIG) -> Path:
    root = tmp / "caches"
    data = root / "blob" / "data"
    data.mkdir(parents=True)
    with open(data / "kernels.bin", "wb") as f:
        for _ in range(size >> 20):
            f.write(os.urandom(1 << 20))
    (data / "small.json").write_bytes(b'{"a": 1}')
    out = tmp / "out"
    packed = cc.pack(cc.spec("cache", "blob", env="BLOB_CACHE_DIR"), root, out)
    assert isinstance(packed, cc.Packed)
    tuner_output(out, caches=(packed,))
    return out


def _publish(out: Path, store: Path) -> publish_mod.Published:
    return publish_mod.publish(Output(out, f"file://{store}", "ml", "llama", MODEL))


def _fetch(pub: publish_mod.Published, dest: Path, room: int = 0) -> fetch_mod.Fetched:
    serving = fetch_mod.Serving(1, dest / "caches", caches_room=room)
    return fetch_mod.fetch(fetch_mod.Pinned(pub.uri, pub.sha256), dest / "results", serving)


def _archive(pub: publish_mod.Published) -> Path:
    base = pub.uri.removeprefix("file://")
    manifest = loads((Path(base) / "manifest.json").read_bytes())
    return Path(bundle.key(base, manifest.caches[0]))


def test_a_40_mib_bundle_is_published_and_fetched_in_a_few_mib(tmp_path: Path) -> None:
    out = _big_output(tmp_path)
    source = (tmp_path / "caches" / "blob" / "data" / "kernels.bin").read_bytes()
    tracemalloc.start()
    try:
        pub = _publish(out, tmp_path / "store")
        got = _fetch(pub, tmp_path / "pod")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert got.caches == ("blob",)
    served = tmp_path / "pod" / "caches" / "blob" / "data" / "kernels.bin"
    assert served.read_bytes() == source
    # A whole read of the archive alone would be 40 MiB; streamed, a few 1 MiB buffers.
    assert peak < 8 << 20, f"peak Python allocations {peak >> 20} MiB"
    # The temporary archive is gone: only the unpacked cache is in the volume.
    assert sorted(p.name for p in (tmp_path / "pod" / "caches").iterdir()) == ["blob"]


def test_a_bundle_larger_than_the_pod_may_hold_is_told_and_never_unpacked(
    tmp_path: Path,
) -> None:
    pub = _publish(_big_output(tmp_path, 8 << 20), tmp_path / "store")
    got = _fetch(pub, tmp_path / "pod", room=4 << 20)
    assert len(got.paths) == 1 and got.caches == ()  # results serve, the stack starts cold
    assert "more than the 4 MiB this pod may hold" in got.caches_failed
    assert "ephemeral-storage" in got.caches_failed
    caches = tmp_path / "pod" / "caches"
    assert not caches.exists() or not any(caches.iterdir())


@pytest.mark.parametrize(
    "damage",
    [
        lambda b: b[: len(b) // 2],  # truncated
        lambda b: b + b"\0" * 1024,  # oversized: more than the manifest's size
        lambda b: b[:100] + bytes([b[100] ^ 1]) + b[101:],  # one bit flipped
    ],
    ids=["truncated", "oversized", "tampered"],
)
def test_a_damaged_archive_writes_no_file_and_leaves_no_temporary(
    tmp_path: Path, damage: object
) -> None:
    pub = _publish(_big_output(tmp_path, 2 << 20), tmp_path / "store")
    archive = _archive(pub)
    archive.chmod(0o644)
    archive.write_bytes(damage(archive.read_bytes()))  # type: ignore[operator]
    got = _fetch(pub, tmp_path / "pod")
    assert got.caches == () and got.caches_failed
    assert list((tmp_path / "pod" / "caches").iterdir()) == []


def test_an_archive_with_a_member_escaping_midway_leaves_nothing_unpacked(tmp_path: Path) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name in ("ok/a", "ok/b", "../escape"):
            info = tarfile.TarInfo(name)
            info.size = 3
            tar.addfile(info, io.BytesIO(b"abc"))
    with pytest.raises(cc.CacheError, match="plain relative path"):
        cc.unpack(buf.getvalue(), tmp_path / "dest")
    assert not (tmp_path / "dest").exists() and not (tmp_path / "escape").exists()


def test_zstd_archives_unpack_as_gzip_ones_do(tmp_path: Path) -> None:
    plain = io.BytesIO()
    with tarfile.open(fileobj=plain, mode="w") as tar:
        info = tarfile.TarInfo("k/kernel.so")
        info.size = 5
        tar.addfile(info, io.BytesIO(b"\x7fELF!"))
    packed = zstandard.ZstdCompressor().compress(plain.getvalue())
    index = cc.unpack(packed, tmp_path / "dest")
    assert index.files == 1 and (tmp_path / "dest" / "k" / "kernel.so").read_bytes() == b"\x7fELF!"


def test_packing_is_the_same_bytes_for_the_same_files(tmp_path: Path) -> None:
    for run in ("a", "b"):
        base = tmp_path / run / "cache"
        (base / "x").mkdir(parents=True)
        (base / "x" / "f").write_bytes(b"same" * 1000)
    first = cc.pack_file(tmp_path / "a" / "cache", tmp_path / "a.tgz")
    second = cc.pack_file(tmp_path / "b" / "cache", tmp_path / "b.tgz")
    assert first.sha256 == second.sha256
    assert (tmp_path / "a.tgz").read_bytes() == (tmp_path / "b.tgz").read_bytes()


def test_the_pod_budget_and_what_fetch_is_given_follow_the_bundle() -> None:
    pod: dict[str, Any] = {
        "spec": {
            "containers": [
                {"name": "a", "resources": {"limits": {"ephemeral-storage": "1Gi"}}},
                {"name": "b", "resources": {"limits": {"ephemeral-storage": "500M"}}},
                {"name": "c"},
            ]
        }
    }
    assert pod_budget(pod) == (1 << 30) + 500_000_000
    assert pod_budget({"spec": {"containers": [{"name": "a"}]}}) == 0
    pod["metadata"] = {"annotations": {"tunefleet.io/caches-limit": "256Mi"}}
    assert pod_budget(pod) == 256 << 20  # the smaller of the two
    assert pod_budget({"metadata": pod["metadata"]}) == 256 << 20
    entry = cc.Packed("cache", "blob", "cache-blob.tar.gz", "0" * 64, 3 << 30, 10, 3 << 30)
    fits = Serve(1, False, True, bundle.needs([entry]), 0)
    resources = fetch_resources(fits)
    assert resources["requests"]["ephemeral-storage"] == str(6 << 30)
    assert "ephemeral-storage" not in resources["limits"]
    args = caches_args(fits)
    seconds = int(args[args.index("--timeout-seconds") + 1])
    assert seconds > 60 + (6 << 30) // (32 << 20)  # grows with the bundle, never a fixed minute
    too_big = Serve(1, False, True, bundle.needs([entry]), 1 << 30)
    assert fetch_resources(too_big) == FETCH_RESOURCES  # nothing to reserve: it won't unpack
    assert caches_args(too_big)[caches_args(too_big).index("--caches-room") + 1] == str(1 << 30)
    limit = int(caches_volume([entry])["emptyDir"]["sizeLimit"])
    assert limit >= bundle.needs([entry]) + entry.bytes


def test_a_big_cache_becomes_a_volume_layer_with_the_bytes_a_plain_gzip_gives(
    tmp_path: Path,
) -> None:
    """Past the writer's cache-dropping interval (2 MiB) the volume layer is still built (the
    hashing writer on the gzip stream's plain side has no file to drop) and is exactly the
    gzip of its tar: no flush marker lands in the stream."""
    out = _big_output(tmp_path, 8 << 20)
    manifest = loads((out / "manifest.json").read_bytes())
    (entry,) = manifest.caches
    layer = tmp_path / "layer.tar.gz"
    diff_id = ocibundle.cache_layer_file("blob", out / f"cache-{entry.name}.tar.gz", layer)
    plain = gzip.decompress(layer.read_bytes())
    assert diff_id == "sha256:" + hashlib.sha256(plain).hexdigest()
    expected = io.BytesIO()
    with gzip.GzipFile(fileobj=expected, mode="wb", compresslevel=6, mtime=0) as gz:
        gz.write(plain)
    assert layer.read_bytes() == expected.getvalue()
    with tarfile.open(fileobj=io.BytesIO(plain)) as tar:
        member = tar.getmember(".tunefleet/caches/blob/data/kernels.bin")
        assert member.size == 8 << 20
