"""tuner_job/caches.py: cache specs, deterministic packing, the archive checks fetch relies on,
the manifest's caches lists and the caches-only index; and the generic kind end to end in the
tuner with a stack-shaped fixture (a process that writes its cache where a variable says, and a
later process that reads it from a copy elsewhere)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests.support.manifests import manifest
from tuner_job import caches as cc
from tuner_job.config import ConfigError, from_dict
from tuner_job.files import sha256_hex
from tuner_job.manifest import ManifestError, loads

REPO = Path(__file__).resolve().parents[2]


def _fill(root: Path, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


FILES = {
    "inductor/fxgraph/ab/fabc/entry": b"graph" * 100,
    "inductor/aotautograd/x/entry": b"aot",
    "triton/KEY/kernel.so": b"\x7fELF...",
}


def test_builtin_kinds_point_their_variables_under_the_root(tmp_path: Path) -> None:
    spec = cc.spec("torchCompile")
    env = cc.prepare([spec], tmp_path / "caches")
    assert env == {
        "TORCHINDUCTOR_CACHE_DIR": f"{tmp_path}/caches/torchcompile/inductor",
        "TRITON_CACHE_DIR": f"{tmp_path}/caches/torchcompile/triton",
    }
    assert all(Path(v).is_dir() and not any(Path(v).iterdir()) for v in env.values())


def test_a_generic_file_cache_gets_its_directory_and_the_file_path(tmp_path: Path) -> None:
    spec = cc.spec("cache", "trtllm", env="TLLM_AUTOTUNER_CACHE_PATH", file="autotune.json")
    env = cc.prepare([spec], tmp_path)
    assert env == {"TLLM_AUTOTUNER_CACHE_PATH": f"{tmp_path}/trtllm/data/autotune.json"}
    assert (tmp_path / "trtllm" / "data").is_dir()
    assert cc.spec(**{"kind": "cache", "name": "trtllm", **spec.to_dict()}).env == spec.env


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"kind": "triton"}, "is not one of"),
        ({"kind": "cache", "name": "x"}, "env must name the variable"),
        ({"kind": "cache", "name": "x", "env": "LD_PRELOAD"}, "not a cache location"),
        ({"kind": "cache", "name": "x", "env": "PYTORCH_TUNABLEOP_FILENAME"}, "not a cache"),
        ({"kind": "cache", "name": "Bad_Name", "env": "X"}, "lowercase"),
        ({"kind": "cache", "name": "x", "env": "X", "file": "../etc"}, "plain file name"),
        ({"kind": "torchCompile", "env": "X"}, "for kind cache only"),
    ],
)
def test_bad_specs_say_what_to_fix(kwargs: dict[str, str], fragment: str) -> None:
    with pytest.raises(cc.CacheError, match=fragment):
        cc.spec(**kwargs)  # type: ignore[arg-type]


def test_names_and_variables_are_unique() -> None:
    with pytest.raises(cc.CacheError, match="unique"):
        cc.from_config([{"kind": "torchCompile"}, {"kind": "torchCompile"}])
    with pytest.raises(cc.CacheError, match="TORCHINDUCTOR_CACHE_DIR"):
        cc.from_config(
            [
                {"kind": "torchCompile"},
                {"kind": "cache", "name": "i", "env": "TORCHINDUCTOR_CACHE_DIR"},
            ]
        )


def test_packing_is_deterministic_whatever_the_times_owners_and_order(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    _fill(a / "c", FILES)
    _fill(b / "c", dict(reversed(list(FILES.items()))))
    os.utime(b / "c" / "triton/KEY/kernel.so", (1, 1))
    first = cc.pack(cc.spec("torchCompile", "c"), a, tmp_path / "out-a")
    second = cc.pack(cc.spec("torchCompile", "c"), b, tmp_path / "out-b")
    assert isinstance(first, cc.Packed) and isinstance(second, cc.Packed)
    assert first.sha256 == second.sha256
    assert (first.files, first.bytes) == (3, sum(len(v) for v in FILES.values()))
    data = (tmp_path / "out-a" / first.payload).read_bytes()
    assert sha256_hex(data) == first.sha256 and len(data) == first.size
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        names = tar.getnames()
        assert names == sorted(names)
        assert {m.mtime for m in tar} == {0} and {m.uid for m in tar} == {0}


def test_a_changed_file_changes_the_digest(tmp_path: Path) -> None:
    _fill(tmp_path / "c", FILES)
    one = cc.pack(cc.spec("torchCompile", "c"), tmp_path, tmp_path / "o1")
    (tmp_path / "c" / "triton/KEY/kernel.so").write_bytes(b"other")
    two = cc.pack(cc.spec("torchCompile", "c"), tmp_path, tmp_path / "o2")
    assert isinstance(one, cc.Packed) and isinstance(two, cc.Packed)
    assert one.sha256 != two.sha256


def test_an_empty_cache_is_skipped_with_the_usual_cause(tmp_path: Path) -> None:
    spec = cc.spec("torchCompile")
    cc.prepare([spec], tmp_path)
    got = cc.pack(spec, tmp_path, tmp_path / "out")
    assert isinstance(got, cc.Skipped)
    assert "TORCHINDUCTOR_CACHE_DIR" in got.reason and "read it" in got.reason
    assert not (tmp_path / "out").exists()


def test_a_cache_over_its_bound_is_skipped_not_fatal(tmp_path: Path) -> None:
    _fill(tmp_path / "c", FILES)
    got = cc.pack(cc.spec("torchCompile", "c", max_bytes=10), tmp_path, tmp_path / "out")
    assert isinstance(got, cc.Skipped) and "maxBytes" in got.reason


def test_links_are_left_out(tmp_path: Path) -> None:
    _fill(tmp_path / "c", FILES)
    (tmp_path / "c" / "link").symlink_to("/etc/passwd")
    got = cc.pack(cc.spec("torchCompile", "c"), tmp_path, tmp_path / "out")
    assert isinstance(got, cc.Packed) and got.files == 3
    cc.check_archive((tmp_path / "out" / got.payload).read_bytes())


def _archive(*members: tarfile.TarInfo, data: bytes = b"x") -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for m in members:
            if m.isreg():
                m.size = len(data)
                tar.addfile(m, io.BytesIO(data))
            else:
                tar.addfile(m)
    return buf.getvalue()


def _member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = link
    return info


@pytest.mark.parametrize(
    ("member", "fragment"),
    [
        (_member("../escape"), "plain relative path"),
        (_member("/etc/cron.d/x"), "plain relative path"),
        (_member("a/../../b"), "plain relative path"),
        (_member("l", tarfile.SYMTYPE, "/etc/passwd"), "link or special"),
        (_member("h", tarfile.LNKTYPE, "/etc/passwd"), "link or special"),
        (_member("d", tarfile.CHRTYPE), "link or special"),
    ],
)
def test_archives_that_could_write_outside_are_refused(
    tmp_path: Path, member: tarfile.TarInfo, fragment: str
) -> None:
    data = _archive(member)
    with pytest.raises(cc.CacheError, match=fragment):
        cc.unpack(data, tmp_path / "dest")
    assert not (tmp_path / "dest").exists()
    assert not (tmp_path / "escape").exists()


def test_not_a_tar_and_over_the_bound_are_refused(tmp_path: Path) -> None:
    with pytest.raises(cc.CacheError, match="not a gzipped tar"):
        cc.check_archive(b"hello")
    with pytest.raises(cc.CacheError, match="more than 0 bytes"):
        cc.check_archive(_archive(_member("a")), max_bytes=0)


def _pax_archive(comment_bytes: int) -> bytes:
    """A gzipped tar of one small file whose pax header carries a comment this long: small
    compressed (the comment is one repeated byte), read whole by tarfile as a header."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("a")
        info.size = 1
        info.pax_headers = {"comment": "x" * comment_bytes}
        tar.addfile(info, io.BytesIO(b"a"))
    return raw.getvalue()


def test_a_huge_tar_header_is_refused_before_it_is_read_whole(tmp_path: Path) -> None:
    """tarfile reads a pax header into memory in one piece: one bigger than any path or
    attribute needs is refused by its size, as the header is met."""
    bomb = _pax_archive(cc.MAX_HEADER_BYTES + 1)
    assert len(bomb) < 64 << 10
    with pytest.raises(cc.CacheError, match="tar header"):
        cc.check_archive(bomb)
    with pytest.raises(cc.CacheError, match="tar header"):
        cc.unpack(bomb, tmp_path / "dest")
    assert cc.check_archive(_pax_archive(1000)).files == 1


def test_the_decompressed_stream_as_a_whole_stops_at_its_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Headers are not members' bytes (_checked counts those): the stream itself has a bound,
    max_bytes and room per member, so headers cannot grow it past that either."""
    monkeypatch.setattr(cc, "HEADER_ROOM", 0)  # the bound: max_bytes and the end blocks
    with pytest.raises(cc.CacheError, match=r"unpacks to more than \d+ bytes: refused"):
        cc.check_archive(_pax_archive(200_000), max_bytes=1000)
    assert cc.check_archive(_pax_archive(200_000), max_bytes=300_000).files == 1


def test_unpack_writes_a_writable_copy_and_refuses_a_non_empty_dest(tmp_path: Path) -> None:
    _fill(tmp_path / "c", FILES)
    got = cc.pack(cc.spec("torchCompile", "c"), tmp_path, tmp_path / "out")
    assert isinstance(got, cc.Packed)
    data = (tmp_path / "out" / got.payload).read_bytes()
    index = cc.unpack(data, tmp_path / "copy")
    assert index.files == 3
    for rel, content in FILES.items():
        path = tmp_path / "copy" / rel
        assert path.read_bytes() == content and os.access(path, os.W_OK)
    with pytest.raises(cc.CacheError, match="not empty"):
        cc.unpack(data, tmp_path / "copy")
    assert cc.disagreement(got, data, index) is None
    forged = cc.Packed(**{**got.to_dict(), "files": 4})
    assert "the manifest says 4" in (cc.disagreement(forged, data, index) or "")


def test_manifest_round_trips_its_caches_and_refuses_bad_entries(tmp_path: Path) -> None:
    _fill(tmp_path / "c", FILES)
    got = cc.pack(cc.spec("torchCompile", "c"), tmp_path, tmp_path / "out")
    assert isinstance(got, cc.Packed)
    skipped = cc.Skipped("cache", "fi", "empty: ...")
    m = manifest(caches=(got,), caches_skipped=(skipped,))
    back = loads(m.to_json())
    assert back.caches == (got,) and back.caches_skipped == (skipped,)
    assert "caches" not in manifest().to_dict()  # manifests without caches keep their bytes
    doc = json.loads(m.to_json())
    doc["caches"][0]["payload"] = "../x.tar.gz"
    with pytest.raises(ManifestError, match="payload"):
        loads(json.dumps(doc))
    doc["caches"][0] = {**got.to_dict(), "kind": "nope"}
    with pytest.raises(ManifestError, match="is not one of"):
        loads(json.dumps(doc))


def test_the_index_is_canonical_and_lists_something() -> None:
    p = cc.Packed("torchCompile", "tc", "cache-tc.tar.gz", "a" * 64, 10, 1, 5)
    data = cc.index_bytes([p])
    assert cc.parse_index(data) == [p]
    with pytest.raises(cc.CacheError, match="canonical"):
        cc.parse_index(json.dumps({"caches": [p.to_dict()]}, indent=1).encode())
    with pytest.raises(cc.CacheError, match="lists no cache"):
        cc.parse_index(b'{"caches":[]}\n')


def test_tuning_config_reads_artifacts() -> None:
    base = {"workload": {"command": ["python3", "w.py"]}}
    cfg = from_dict({**base, "artifacts": {"tunableop": False, "caches": [{"kind": "vllm"}]}})
    assert not cfg.tunableop and cfg.caches[0].env == (
        ("VLLM_CACHE_ROOT", "vllm"),
        ("TMPDIR", "tmp"),
    )
    assert from_dict(base).tunableop and from_dict(base).caches == ()
    with pytest.raises(ConfigError, match="nothing to produce"):
        from_dict({**base, "artifacts": {"tunableop": False}})
    with pytest.raises(ConfigError, match="is not one of"):
        from_dict({**base, "artifacts": {"caches": [{"kind": "x"}]}})
    cfg = from_dict(
        {
            "workload": {"shapes": [{"m": 8, "n": 8, "k": 8}]},
            "artifacts": {"tunableop": False, "caches": [{"kind": "vllm"}]},
        }
    )
    with pytest.raises(ConfigError, match=r"need workload\.command"):
        cfg.require_workload()


# A stack that keeps an autotuner's findings in a file its variable names: the first run
# computes and writes it, a later run (another process, the cache copied elsewhere) reads it.
STACK = """
import json, os, sys
path = os.environ["FAKESTACK_AUTOTUNE_FILE"]
if os.path.exists(path):
    print("HIT", json.load(open(path))["best"])
else:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    json.dump({"best": "tile-128x64"}, open(path, "w"))
    print("MISS")
"""


def test_the_tuner_produces_a_generic_cache_a_later_process_reads(tmp_path: Path) -> None:
    stack = tmp_path / "stack.py"
    stack.write_text(STACK)
    config = {
        "namespace": "ns",
        "profile": "p",
        "gpuModel": "m",
        "revision": "r1",
        "workload": {"command": [sys.executable, str(stack)]},
        "artifacts": {
            "tunableop": False,
            "caches": [
                {
                    "kind": "cache",
                    "name": "fake",
                    "env": "FAKESTACK_AUTOTUNE_FILE",
                    "file": "at.json",
                },
                {"kind": "torchCompile"},  # this workload never compiles: skipped, not fatal
            ],
        },
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    out = tmp_path / "out"
    run = subprocess.run(
        [sys.executable, "-m", "tuner_job", "--termination-log", str(tmp_path / "term"), "run",
         "--config", str(tmp_path / "config.json"), "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "MISS" in run.stderr and "cache torchcompile (torchCompile) not served" in run.stderr
    m = loads((out / "manifest.json").read_bytes())
    assert m.kind == cc.INDEX_KIND and [c.name for c in m.caches] == ["fake"]
    assert [s.name for s in m.caches_skipped] == ["torchcompile"]
    index = (out / cc.INDEX_NAME).read_bytes()
    assert sha256_hex(index) == m.results_sha256 and cc.parse_index(index) == list(m.caches)
    payload = (out / m.caches[0].payload).read_bytes()
    served = tmp_path / "pod" / "caches"
    cc.unpack(payload, served / "fake")
    env = {
        **os.environ,
        **cc.environment(cc.from_config(config["artifacts"]["caches"][:1]), served),
    }  # type: ignore[index]
    again = subprocess.run([sys.executable, str(stack)], env=env, capture_output=True, text=True)
    assert again.stdout.strip() == "HIT tile-128x64"


def test_a_caches_only_run_with_nothing_filled_fails_saying_why(tmp_path: Path) -> None:
    config = {
        "namespace": "ns", "profile": "p", "gpuModel": "m", "revision": "r1",
        "workload": {"command": [sys.executable, "-c", "pass"]},
        "artifacts": {"tunableop": False, "caches": [{"kind": "torchCompile"}]},
    }  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    run = subprocess.run(
        [sys.executable, "-m", "tuner_job", "--termination-log", str(tmp_path / "term"), "run",
         "--config", str(tmp_path / "config.json"), "--out", str(tmp_path / "out")],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode != 0
    assert "no cache to publish: torchcompile: empty" in (tmp_path / "term").read_text()


def test_a_vllm_cache_packs_inductors_default_cache_from_its_tmpdir_and_nothing_else(
    tmp_path: Path,
) -> None:
    """On vLLM's CPU platform Inductor's default cache dir, $TMPDIR/torchinductor_<user>, holds
    what spares a pod the compile (FX graphs, built kernels, the C++ precompiled header):
    the vllm kind points TMPDIR into the cache and packs that directory of it alone, never
    the other temporary files a server leaves there."""
    import socket

    s = cc.spec("vllm")
    env = cc.prepare([s], tmp_path / "caches")
    assert env == {
        "VLLM_CACHE_ROOT": f"{tmp_path}/caches/vllm/vllm",
        "TMPDIR": f"{tmp_path}/caches/vllm/tmp",
    }
    tmp = Path(env["TMPDIR"])
    pch = tmp / "torchinductor_root" / "precompiled_headers" / "ab"
    pch.mkdir(parents=True)
    (pch / "cpp_prefix.h.gch").write_bytes(b"\0gch" * 1000)
    (tmp / "torchinductor_root" / "fxgraph").mkdir()
    (tmp / "torchinductor_root" / "fxgraph" / "entry").write_text("graph")
    (tmp / "vllm_dist_48656891d54e48ed").write_text("a distributed init file")
    (tmp / "pymp-x").mkdir()
    (tmp / "pymp-x" / "junk").write_text("junk")
    (Path(env["VLLM_CACHE_ROOT"]) / "modelinfos").mkdir()
    (Path(env["VLLM_CACHE_ROOT"]) / "modelinfos" / "m.json").write_text("{}")
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(tmp / "zmq-ipc"))
        packed = cc.pack(s, tmp_path / "caches", tmp_path / "out")
    assert isinstance(packed, cc.Packed), packed
    index = cc.check_archive((tmp_path / "out" / packed.payload).read_bytes())
    assert packed.files == index.files == 3
    assert {
        "tmp/torchinductor_root/fxgraph/entry",
        "tmp/torchinductor_root/precompiled_headers/ab/cpp_prefix.h.gch",
        "vllm/modelinfos/m.json",
    } <= set(index.members)
    assert not [m for m in index.members if "pymp" in m or "vllm_dist" in m or "zmq" in m]
