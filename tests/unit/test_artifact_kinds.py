"""The artifact-kind seam (artifacts/kinds/): one table by name, TunableOp results its only kind,
the manifest's kind field (absent: tunableop, never written for it), and every caller that
asks the kind: fetch, publish, merge, the webhook's builders, the artifact ConfigMap, delivery
and placement. The callers are shown to ask by a fake kind put in the table: TunableOp but for
one member, whose answer must come out of the caller."""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.artifacts import tuner_output
from tests.support.manifests import manifest
from tunefleet.artifacts import fetch, fit, kinds, merge, publish
from tunefleet.artifacts.kinds import tunableop
from tunefleet.artifacts.merge import MergeJob
from tunefleet.builders import artifact as artifact_b
from tunefleet.builders import placement as placement_b
from tunefleet.builders import webhook as webhook_b
from tunefleet.serving import delivery
from tuner_job.manifest import (
    ArtifactId,
    ImageRef,
    LibraryInfo,
    Manifest,
    ManifestError,
    ManifestExtra,
    ResumeInfo,
    loads,
)

MODEL = "AMD_Instinct_MI300X_OAM"  # tuner_output's
TODAYS_ENV = {
    "PYTORCH_TUNABLEOP_ENABLED": "1",
    "PYTORCH_TUNABLEOP_TUNING": "0",
    "PYTORCH_TUNABLEOP_RECORD_UNTUNED": "0",
    "PYTORCH_TUNABLEOP_FILENAME": "/tunefleet/results/tunableop_results%d.csv",
}


class FakeKind:
    """TunableOp, but for the members a test gives: what a caller answers with them shows that
    it asked the kind."""

    def __init__(self, **members: Any) -> None:
        self.__dict__.update(members)

    def __getattr__(self, name: str) -> Any:
        return getattr(tunableop, name)


def use_kind(monkeypatch: pytest.MonkeyPatch, **members: Any) -> None:
    """Put the fake in the table under tunableop's name (what every manifest says today)."""
    real = kinds.kind
    fake = FakeKind(**members)

    def kind(name: str = kinds.DEFAULT) -> Any:
        return fake if name == "tunableop" else real(name)

    monkeypatch.setattr(kinds, "kind", kind)


def stored(tmp_path: Path, **manifest_over: Any) -> tuple[str, str]:
    """tuner_output published by hand into a file:// store: (its URI, its SHA-256)."""
    out = tmp_path / "out"
    manifest = tuner_output(out, **manifest_over)
    sha = manifest.results_sha256
    base = tmp_path / "store" / "ml" / "llama" / MODEL / sha
    base.mkdir(parents=True)
    for name in ("results.csv", "manifest.json"):
        (base / name).write_bytes((out / name).read_bytes())
    return f"file://{base}", sha


def full_manifest(**over: Any) -> Manifest:
    """Every field a manifest can carry, image and extra included."""
    extra = ManifestExtra(
        reused=4,
        resumed=1,
        newly_tuned=7,
        library_key="ef" * 32,
        shards=2,
        library=LibraryInfo(3, (("obj", "why"),), 1),
        resume=ResumeInfo("none"),
        wall_seconds=900.0,
    )
    fields: dict[str, Any] = {
        "gpu_model": MODEL,
        "image": ImageRef("serve:1", "sha256:" + "cd" * 32),
        "extra": extra,
    }
    return manifest(**{**fields, **over})


# --- the table --------------------------------------------------------------------------------


def test_the_table_knows_tunableop_and_it_is_the_default() -> None:
    assert kinds.KINDS == ("tunableop", "caches") and kinds.DEFAULT == "tunableop"
    assert kinds.kind() is kinds.kind("tunableop") is tunableop
    assert tunableop.NAME == "tunableop"
    assert (tunableop.PAYLOAD, tunableop.CONTENT_TYPE) == ("results.csv", "text/csv")
    assert tunableop.MOUNT_DIR == "/tunefleet/results"


def test_an_unknown_kind_is_refused_naming_it_and_the_known_ones() -> None:
    with pytest.raises(ValueError) as refused:
        kinds.kind("inductor")
    assert str(refused.value) == "no artifact kind inductor (known: tunableop, caches)"


def test_tunableops_files_and_env_are_what_the_webhook_injected_before_kinds() -> None:
    assert tunableop.device_files(2) == [
        ("results.csv", "tunableop_results0.csv"),
        ("results.csv", "tunableop_results1.csv"),
    ]
    assert tunableop.pod_env(capture=False) == TODAYS_ENV
    assert tunableop.pod_env(capture=True) == {
        **TODAYS_ENV,
        "PYTORCH_TUNABLEOP_RECORD_UNTUNED": "1",
    }
    volume = webhook_b.results_config_map_volume("cm", 2, optional=True)
    assert volume["projected"]["sources"][0]["configMap"]["items"] == [
        {"key": "results.csv", "path": "tunableop_results0.csv"},
        {"key": "results.csv", "path": "tunableop_results1.csv"},
    ]
    assert webhook_b.tunable_env(set()) == [{"name": k, "value": v} for k, v in TODAYS_ENV.items()]
    assert webhook_b.tunable_env({"PYTORCH_TUNABLEOP_TUNING"}, capture=True) == [
        {"name": "PYTORCH_TUNABLEOP_ENABLED", "value": "1"},
        {"name": "PYTORCH_TUNABLEOP_RECORD_UNTUNED", "value": "1"},
        {"name": "PYTORCH_TUNABLEOP_FILENAME", "value": TODAYS_ENV["PYTORCH_TUNABLEOP_FILENAME"]},
    ]
    # The names admission, placement and the plugin import stay what they were.
    assert webhook_b.TUNABLE_ENV == TODAYS_ENV
    assert webhook_b.RESULTS_DIR == "/tunefleet/results"
    assert webhook_b.FILENAME == "/tunefleet/results/tunableop_results%d.csv"
    assert webhook_b.FILE_PATTERN == "tunableop_results{}.csv"


# --- the manifest's kind ----------------------------------------------------------------------


def test_a_manifest_without_kind_reads_as_tunableop_and_keeps_its_bytes() -> None:
    m = full_manifest()
    data = m.to_json()
    # What the manifest code before kinds wrote for this manifest: pinned, so it cannot move.
    pinned = "4e1810b5cbb50a8bffd38dad13b3e5f28cfc04563d3af38561574fc00985ed37"
    assert hashlib.sha256(data).hexdigest() == pinned
    assert "kind" not in json.loads(data)
    read = loads(data)
    assert read.kind == "tunableop" and read == m and read.to_json() == data
    assert kinds.of(read) is tunableop


def test_a_manifest_of_another_kind_round_trips_and_the_operator_refuses_it() -> None:
    m = full_manifest(kind="inductor")
    doc = json.loads(m.to_json())
    assert list(doc)[:2] == ["schema", "kind"] and doc["kind"] == "inductor"
    assert loads(m.to_json()) == m
    with pytest.raises(ValueError) as refused:
        kinds.of(m)
    assert str(refused.value) == "no artifact kind inductor (known: tunableop, caches)"
    for bad in ("", 3, None):
        with pytest.raises(ManifestError, match="manifest field 'kind' must be a non-empty"):
            loads(json.dumps({**doc, "kind": bad}))


# --- fetch --------------------------------------------------------------------------------------


def test_fetch_refuses_an_artifact_of_a_kind_it_does_not_know(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    uri, sha = stored(tmp_path, kind="inductor")
    dest = tmp_path / "dest"
    code = fetch.main(
        ["--uri", uri, "--sha256", sha, "--dest", str(dest), "--devices", "1",
         "--termination-log", str(tmp_path / "log")]
    )  # fmt: skip
    assert code == 0 and not dest.exists()
    assert capsys.readouterr().err == (
        "tunefleet-fetch: starting untuned: no artifact kind inductor (known: tunableop, caches)\n"
    )


def test_fetchs_verification_asks_the_kind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    uri, sha = stored(tmp_path)
    use_kind(monkeypatch, refusals=lambda parsed, manifest, target: ["the fake kind refuses"])
    with pytest.raises(fetch.FetchError) as refused:
        fetch.download_verified(fetch.Pinned(uri, sha))
    assert (
        str(refused.value) == f"the artifact does not fit GPU model {MODEL}: the fake kind refuses"
    )
    use_kind(monkeypatch, disagreements=lambda parsed, manifest: ["the fake disagrees"])
    with pytest.raises(fetch.FetchError, match=r"^the fake disagrees$"):
        fetch.download_verified(fetch.Pinned(uri, sha))


def test_fetch_writes_the_files_the_kind_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    uri, sha = stored(tmp_path)
    use_kind(
        monkeypatch,
        FILES="fake%d.bin",
        device_files=lambda devices: [("results.csv", f"fake{i}.bin") for i in range(devices)],
    )
    dest = tmp_path / "dest"
    code = fetch.main(
        ["--uri", uri, "--sha256", sha, "--dest", str(dest), "--devices", "2",
         "--termination-log", str(tmp_path / "log")]
    )  # fmt: skip
    assert code == 0
    assert sorted(p.name for p in dest.iterdir()) == ["fake0.bin", "fake1.bin"]
    assert capsys.readouterr().out.rstrip().endswith(f"to {dest}/fake%d.bin")


# --- publish and merge ------------------------------------------------------------------------


def test_publish_refuses_output_of_a_kind_it_does_not_know(tmp_path: Path) -> None:
    tuner_output(tmp_path / "out", kind="inductor")
    with pytest.raises(publish.PublishError) as refused:
        publish.load_artifact(tmp_path / "out", publish.Whose("ml", "llama", MODEL))
    assert str(refused.value) == "no artifact kind inductor (known: tunableop, caches)"


def test_publishs_check_asks_the_kind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tuner_output(tmp_path / "out")
    use_kind(monkeypatch, disagreements=lambda parsed, manifest: ["the fake disagrees"])
    with pytest.raises(publish.PublishError, match=r"^the fake disagrees$"):
        publish.load_artifact(tmp_path / "out", publish.Whose("ml", "llama", MODEL))
    use_kind(monkeypatch, noncanonical=lambda parsed, source: f"not canonical: {source}")
    with pytest.raises(publish.PublishError, match=r"^not canonical: .*/out/results\.csv$"):
        publish.load_artifact(tmp_path / "out", publish.Whose("ml", "llama", MODEL))


def test_merges_fit_check_asks_the_kind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    uri = f"file://{tmp_path / 'store'}"
    for shard in range(2):
        out = tmp_path / f"out-{shard}"
        tuner_output(out, extra=ManifestExtra(shards=2, shard=shard))
        publish.publish_shard(publish.Output(out, uri, "ml", "llama", MODEL), shard, 2)
    use_kind(monkeypatch, refusals=lambda parsed, manifest, target: ["the fake kind refuses"])
    target = fit.Target(MODEL, "amd", False)
    with pytest.raises(merge.MergeError) as refused:
        merge.merge(MergeJob(uri, ArtifactId("ml", "llama", "3f2a9c01de", MODEL), 2, target=target))
    assert (
        str(refused.value) == f"the artifact does not fit GPU model {MODEL}: the fake kind refuses"
    )


# --- what serving pods get ----------------------------------------------------------------------


def test_the_webhooks_builders_ask_the_kind(monkeypatch: pytest.MonkeyPatch) -> None:
    use_kind(
        monkeypatch,
        device_files=lambda devices: [("payload", f"file-{i}") for i in range(devices)],
        pod_env=lambda *, capture: {"FAKE_ENV": str(capture)},
    )
    volume = webhook_b.results_config_map_volume("cm", 2, optional=False)
    assert volume["projected"]["sources"][0]["configMap"]["items"] == [
        {"key": "payload", "path": "file-0"},
        {"key": "payload", "path": "file-1"},
    ]
    assert webhook_b.tunable_env(set(), capture=True) == [{"name": "FAKE_ENV", "value": "True"}]
    assert webhook_b.tunable_env({"FAKE_ENV"}) == []


PAYLOAD = b"Validator,PT_VERSION,2.11.0\n"
PAYLOAD_SHA = hashlib.sha256(PAYLOAD).hexdigest()


def config_map() -> dict[str, Any]:
    cm = artifact_b.build_artifact_config_map(
        namespace="ml",
        profile="p",
        uid="puid",
        payload=artifact_b.Payload(
            gpu_model="M", sha256=PAYLOAD_SHA, manifest_sha256="", results=PAYLOAD, manifest=b"{}"
        ),
    )
    assert cm is not None
    return cm


def test_the_artifact_config_map_holds_the_payload_under_the_kinds_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    use_kind(monkeypatch, PAYLOAD="payload.bin")
    cm = config_map()
    assert set(cm["data"]) == {"manifest.json", "payload.bin"} and not artifact_b.is_packed(cm)
    packed = {**cm, "binaryData": {"payload.bin.gz": ""}}
    assert artifact_b.is_packed(packed)


def test_delivery_reads_the_payload_under_the_kinds_name(monkeypatch: pytest.MonkeyPatch) -> None:
    cm = config_map()  # under today's name, results.csv
    use_kind(monkeypatch, PAYLOAD="payload.bin")
    assert "SHA-256" in delivery.content_problem(cm, PAYLOAD_SHA, "", "puid")
    cm["data"] = {"manifest.json": "{}", "payload.bin": PAYLOAD.decode()}
    assert delivery.content_problem(cm, PAYLOAD_SHA, "", "puid") == ""
    cm["data"] = {"manifest.json": "{}"}
    cm["binaryData"] = {"payload.bin.gz": base64.b64encode(gzip.compress(PAYLOAD)).decode()}
    assert delivery.content_problem(cm, PAYLOAD_SHA, "", "puid") == ""


def test_placement_mounts_the_payload_under_the_kinds_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    use_kind(monkeypatch, PAYLOAD="payload.bin")
    mounted = [
        placement_b.Mounted("M", "cm-a", PAYLOAD_SHA, packed=False),
        placement_b.Mounted("N", "cm-b", PAYLOAD_SHA, packed=True),
    ]
    volume = placement_b.candidates_volume("map", ["M", "N"], mounted, "ml", "p")
    keys = [s["configMap"]["items"][0]["key"] for s in volume["projected"]["sources"][1:]]
    assert keys == ["payload.bin", "payload.bin.gz"]
