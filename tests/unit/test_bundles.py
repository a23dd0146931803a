"""Bundles through publish and fetch (artifacts/bundle.py over the directory store): caches
beside TunableOp results and caches alone; every archive checked before anything is
unpacked, one that fails never unpacked; what the status record and fetch's line say.
Admission's side (env, volumes) is in test_webhook_inject.py."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import tarfile
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from testbed.builders.wrappers import make_profile
from tests.support.artifacts import tuner_output
from tunefleet import naming
from tunefleet.artifacts import bundle
from tunefleet.artifacts import fetch as fetch_mod
from tunefleet.artifacts import publish as publish_mod
from tunefleet.artifacts.publish import Output
from tunefleet.builders.job import tuning_config
from tunefleet.contracts.artifact_record import ArtifactRecord
from tunefleet.contracts.fetch_outcome import FetchOutcome
from tunefleet.storage.registry import open_store, parse_uri
from tuner_job import caches as cc
from tuner_job.config import from_dict as config_from_dict
from tuner_job.manifest import ArtifactId, loads
from tuner_job.output import RunFacts, write_caches_output

MODEL = "AMD_Instinct_MI300X_OAM"
FILES = {"inductor/fxgraph/a/entry": b"graph" * 50, "triton/K/kernel.so": b"\x7fELF"}


def _cache(tmp: Path, out: Path, name: str = "torchcompile") -> cc.Packed:
    root = tmp / "caches"
    for rel, data in FILES.items():
        path = root / name / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    got = cc.pack(cc.spec("torchCompile", name), root, out)
    assert isinstance(got, cc.Packed)
    return got


def _with_caches(tmp: Path) -> Path:
    """Results and a torchCompile cache, as tuner_job run leaves them."""
    out = tmp / "out"
    packed = _cache(tmp, out)
    skipped = cc.Skipped("cache", "fi", "empty: the workload wrote nothing under X")
    tuner_output(out, caches=(packed,), caches_skipped=(skipped,))
    return out


def _caches_only(tmp: Path) -> Path:
    out = tmp / "out"
    packed = _cache(tmp, out)
    write_caches_output(
        out,
        [packed],
        [],
        ArtifactId(namespace="ml", profile="llama", revision="r1", gpu_model=MODEL),
        RunFacts(identity={"torch": "2.11.0+cu130", "cuda": "13.0"}, seconds=3.0),
    )
    return out


def _publish(out: Path, store: Path) -> publish_mod.Published:
    return publish_mod.publish(Output(out, f"file://{store}", "ml", "llama", MODEL))


def _fetch(pub: publish_mod.Published, tmp: Path, fail_closed: bool = False) -> fetch_mod.Fetched:
    serving = fetch_mod.Serving(2, tmp / "caches-dest", fail_closed)
    return fetch_mod.fetch(fetch_mod.Pinned(pub.uri, pub.sha256), tmp / "results", serving)


def test_results_and_caches_publish_then_fetch_unpacks_a_writable_copy(tmp_path: Path) -> None:
    pub = _publish(_with_caches(tmp_path), tmp_path / "store")
    record = ArtifactRecord.from_message(publish_mod.termination_message(pub))
    assert record is not None and record.kinds == ["tunableop", "torchcompile"]
    assert [s.name for s in record.caches_skipped] == ["fi"]
    assert ArtifactRecord.from_status(record.to_status()) == record
    got = _fetch(pub, tmp_path)
    assert len(got.paths) == 2 and got.caches == ("torchcompile",)
    for rel, data in FILES.items():
        assert (tmp_path / "caches-dest" / "torchcompile" / rel).read_bytes() == data
    line = FetchOutcome(
        "loaded", files=2, sha256=pub.sha256, dest="d", caches=got.caches, caches_dest="/c"
    ).line()
    parsed = FetchOutcome.parse(line)
    assert parsed is not None and parsed.caches == ("torchcompile",) and parsed.caches_dest == "/c"


def test_a_caches_only_artifact_is_its_index_and_writes_no_results(tmp_path: Path) -> None:
    out = _caches_only(tmp_path)
    pub = _publish(out, tmp_path / "store")
    assert pub.sha256 == loads((out / "manifest.json").read_bytes()).results_sha256
    assert pub.library is None  # the GEMM library holds TunableOp rows only
    got = _fetch(pub, tmp_path)
    assert got.paths == [] and got.kind == "caches" and got.caches == ("torchcompile",)
    record = ArtifactRecord.from_message(publish_mod.termination_message(pub))
    assert record is not None and record.kind == "caches" and record.kinds == ["torchcompile"]


def _archive_key(pub: publish_mod.Published, store: Path) -> Path:
    manifest = loads((Path(pub.uri.removeprefix("file://")) / "manifest.json").read_bytes())
    return Path(bundle.key(pub.uri.removeprefix("file://"), manifest.caches[0]))


def test_a_tampered_archive_is_never_unpacked_results_still_serve(tmp_path: Path) -> None:
    pub = _publish(_with_caches(tmp_path), tmp_path / "store")
    key = _archive_key(pub, tmp_path / "store")
    key.write_bytes(key.read_bytes()[:-8] + b"\0" * 8)
    got = _fetch(pub, tmp_path)
    assert len(got.paths) == 2 and got.caches == ()
    assert "SHA-256" in got.caches_failed
    assert not (tmp_path / "caches-dest" / "torchcompile").exists()
    with pytest.raises(fetch_mod.FetchError, match="caches not served"):
        _fetch(pub, tmp_path / "closed", fail_closed=True)


def test_a_missing_archive_fails_a_caches_only_artifact_whole(tmp_path: Path) -> None:
    pub = _publish(_caches_only(tmp_path), tmp_path / "store")
    _archive_key(pub, tmp_path / "store").unlink()
    with pytest.raises(fetch_mod.FetchError, match="caches not served: cache torchcompile"):
        _fetch(pub, tmp_path)
    assert not (tmp_path / "results").exists() or not any((tmp_path / "results").iterdir())


def test_publish_refuses_an_archive_its_manifest_does_not_describe(tmp_path: Path) -> None:
    out = _with_caches(tmp_path)
    m = loads((out / "manifest.json").read_bytes())
    (out / m.caches[0].payload).write_bytes(b"not a tar")
    with pytest.raises(publish_mod.PublishError, match="the manifest pins"):
        _publish(out, tmp_path / "store")
    # Described by a forged manifest entry, it is still refused: not an archive at all.
    forged = dataclasses.replace(
        m.caches[0], sha256=hashlib.sha256(b"not a tar").hexdigest(), size=9
    )
    (out / "manifest.json").write_bytes(dataclasses.replace(m, caches=(forged,)).to_json())
    with pytest.raises(publish_mod.PublishError, match="not a gzipped tar"):
        _publish(out, tmp_path / "store")
    assert not (tmp_path / "store").exists()


def test_a_forged_archive_with_an_escaping_path_is_refused_by_publish(tmp_path: Path) -> None:
    out = _with_caches(tmp_path)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        info = tarfile.TarInfo("../../etc/evil")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    data = buf.getvalue()
    m = loads((out / "manifest.json").read_bytes())
    forged = dataclasses.replace(
        m.caches[0], sha256=hashlib.sha256(data).hexdigest(), size=len(data)
    )
    (out / m.caches[0].payload).write_bytes(data)
    (out / "manifest.json").write_bytes(dataclasses.replace(m, caches=(forged,)).to_json())
    with pytest.raises(publish_mod.PublishError, match="plain relative path"):
        _publish(out, tmp_path / "store")


def test_a_status_entry_with_a_malformed_cache_lists_none(tmp_path: Path) -> None:
    pub = _publish(_with_caches(tmp_path), tmp_path / "store")
    record = ArtifactRecord.from_message(publish_mod.termination_message(pub))
    assert record is not None
    doc = record.to_status()
    doc["caches"][0]["sha256"] = "../../x"
    back = ArtifactRecord.from_status(doc)
    assert back is not None and back.caches == ()
    assert json.loads(json.dumps(doc))["cachesSkipped"][0]["name"] == "fi"


def test_archives_live_by_digest_so_a_republish_is_idempotent(tmp_path: Path) -> None:
    out = _with_caches(tmp_path)
    first = _publish(out, tmp_path / "store")
    second = _publish(out, tmp_path / "store")
    assert (first.sha256, first.manifest_sha256) == (second.sha256, second.manifest_sha256)
    store = open_store(parse_uri(f"file://{tmp_path / 'store'}"))
    listed = store.list("ml/llama", 100)
    assert sum("/caches/" in o.key for o in listed) == 1


# --- the spec: spec.artifacts ----------------------------------------------------------------


BASE = make_profile().gpu("nvidia", "NVIDIA-H200").command("python3", "serve.py")


def test_profiles_without_caches_keep_their_revision_and_caches_make_a_new_one() -> None:
    before = naming.revision(BASE.spec_model())
    assert naming.revision(BASE.spec(artifacts={}).spec_model()) == before
    assert naming.revision(BASE.spec(artifacts={"tunableop": True}).spec_model()) == before
    cached = BASE.spec(artifacts={"caches": [{"kind": "torchCompile"}]}).spec_model()
    assert naming.revision(cached) != before
    assert naming.revision(
        BASE.spec(artifacts={"tunableop": False, "caches": [{"kind": "torchCompile"}]}).spec_model()
    ) not in (before, naming.revision(cached))


@pytest.mark.parametrize(
    ("artifacts", "fragment"),
    [
        ({"tunableop": False}, "nothing to tune"),
        ({"caches": [{"kind": "cache", "name": "x", "env": "LD_PRELOAD"}]}, "not a cache location"),
        ({"caches": [{"kind": "cache", "name": "x"}]}, "env must name the variable"),
        ({"caches": [{"kind": "vllm"}, {"kind": "vllm"}]}, "unique"),
        ({"caches": [{"kind": "torchCompile", "env": "X"}]}, "for kind cache only"),
    ],
)
def test_a_bad_artifacts_spec_says_what_to_fix(artifacts: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ValidationError, match=fragment):
        BASE.spec(artifacts=artifacts).spec_model()


def test_caches_are_not_sharded() -> None:
    with pytest.raises(ValidationError, match="parallelism 1"):
        BASE.gpu("nvidia", "NVIDIA-H200", parallelism=2).spec(
            artifacts={"caches": [{"kind": "torchCompile"}]}
        ).spec_model()


def test_the_tune_step_gets_the_caches_in_its_config_only_when_asked() -> None:
    plain = tuning_config(BASE.spec_model(), "ml", "p", "NVIDIA-H200", "r1")
    assert "artifacts" not in plain  # unchanged for every profile from before caches
    doc = tuning_config(
        BASE.spec(artifacts={"tunableop": False, "caches": [{"kind": "torchCompile"},
                  {"kind": "cache", "name": "fi", "env": "FI_DIR", "file": "a.json"}]}
                  ).spec_model(),
        "ml", "p", "NVIDIA-H200", "r1",
    )  # fmt: skip
    cfg = config_from_dict({**doc, "workload": {"command": ["python3", "serve.py"]}})
    assert not cfg.tunableop
    assert [(c.kind, c.name) for c in cfg.caches] == [
        ("torchCompile", "torchcompile"),
        ("cache", "fi"),
    ]
    assert cc.environment(cfg.caches[1:], "/r") == {"FI_DIR": "/r/fi/data/a.json"}


def test_capture_counts_no_gemm_in_a_caches_only_artifact_and_never_reads_it() -> None:
    """A reconcile's capture step asks which GEMMs the artifact has: caches alone have none,
    and the payload (an index, not results) is never parsed as TunableOp's CSV."""
    from tests.support.fake_kube import FakeKube
    from tunefleet.capture.keys import ArtifactKeys
    from tunefleet.config import Config

    record = ArtifactRecord(uri="s3://b/p/ml/llama/M/" + "ab" * 32, sha256="ab" * 32, kind="caches")
    api = FakeKube()
    assert ArtifactKeys(api, Config()).get(record, "ml") == frozenset()
    assert not api.calls  # nothing read: caches alone have no GEMM


def test_capture_refuses_a_gzip_bomb_in_a_config_map_as_it_unpacks(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The ConfigMap capture reads an artifact's GEMMs from is named by status (name and uid),
    and status is anyone's who can write it: packed results that unpack past the bound are
    refused as they unpack, never held whole, and the artifact counts as unread."""
    import base64
    import tracemalloc
    import zlib

    from testbed.builders.wrappers import make_config_map
    from tests.support.fake_kube import FakeKube
    from tunefleet.builders.artifact import PACKED_NAME
    from tunefleet.capture import keys
    from tunefleet.config import Config

    monkeypatch.setattr(keys, "MAX_RESULTS_BYTES", 1 << 20)
    z = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zero = bytes(1 << 20)
    bomb = b"".join(z.compress(zero) for _ in range(64)) + z.flush()  # 64 MiB unpacked
    assert len(bomb) < 128 << 10
    cm = make_config_map("art").uid("u1").binary(**{PACKED_NAME: base64.b64encode(bomb).decode()})
    api = FakeKube(intercept={"read": lambda *_: cm.obj()})
    record = ArtifactRecord(
        uri="s3://b/p/ml/llama/M/" + "ab" * 32, sha256="ab" * 32, config_map="art",
        config_map_uid="u1",
    )  # fmt: skip
    caplog.set_level("INFO", logger=keys.__name__)
    tracemalloc.start()
    try:
        assert keys.ArtifactKeys(api, Config()).get(record, "ml") is None
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, peak  # never the 64 MiB
    assert "unpacks to more than 1048576 bytes" in caplog.text


def test_a_vllm_bundle_packed_before_tmpdir_was_its_gets_the_directory_its_variable_names(
    tmp_path: Path,
) -> None:
    """A vllm bundle made before the kind set TMPDIR has no tmp/: fetch makes it, writable,
    so the pod's TMPDIR never names a missing directory."""
    import stat

    out, root = tmp_path / "out", tmp_path / "caches"
    (root / "vllm" / "vllm" / "modelinfos").mkdir(parents=True)
    (root / "vllm" / "vllm" / "modelinfos" / "m.json").write_text("{}")
    packed = cc.pack(cc.spec("vllm"), root, out)
    assert isinstance(packed, cc.Packed)
    write_caches_output(
        out, [packed], [],
        ArtifactId(namespace="ml", profile="llama", revision="r1", gpu_model=MODEL),
        RunFacts(identity={"torch": "2.13.0"}, seconds=3.0),
    )  # fmt: skip
    got = _fetch(_publish(out, tmp_path / "store"), tmp_path)
    assert got.caches == ("vllm",)
    served = tmp_path / "caches-dest" / "vllm"
    assert (served / "vllm" / "modelinfos" / "m.json").read_text() == "{}"
    tmpdir = served / "tmp"
    assert tmpdir.is_dir() and stat.S_IMODE(tmpdir.stat().st_mode) == 0o777
