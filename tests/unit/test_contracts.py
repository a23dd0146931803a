"""Each contract between processes, written and read by its one owner: what one side writes
the other reads back whole, and every field the CRD declares is carried."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from testbed.builders.wrappers import make_pod, make_profile
from tunefleet import naming
from tunefleet.api import TuningLimits, TuningProfileSpec
from tunefleet.contracts.admission_record import (
    ADMISSION_LABEL,
    INJECTED,
    STATUS_ANNOTATION,
    UNTUNED,
    Admission,
    Code,
)
from tunefleet.contracts.artifact_record import ArtifactRecord, ShardRecord, status_fields
from tunefleet.contracts.fetch_outcome import LOADED, REFUSED, FetchOutcome
from tunefleet.contracts.fetch_outcome import UNTUNED as FETCH_UNTUNED
from tunefleet.plugin.why_cmd import FIXES
from tuner_job import caches as cc
from tuner_job import exchange as ex
from tuner_job.gain import Gain, paired

ROOT = Path(__file__).resolve().parents[2]
SHA = "ab" * 32


def crd_artifact_fields() -> dict[str, Any]:
    crd = yaml.safe_load((ROOT / "crds" / "tunefleet.io_tuningprofiles.yaml").read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    props: dict[str, Any] = schema["properties"]["status"]["properties"]["artifacts"]["items"][
        "properties"
    ]
    return props


# A record with a value in every field, none at its default (made field by field, not read
# from a status entry: the test below checks that reading).
FULL_RECORD = ArtifactRecord(
    uri=f"s3://b/p/ml/llm/M/{SHA}",
    sha256=SHA,
    gemms=12,
    tuned_at="2026-12-01T10:00:00Z",
    tuning_seconds=3.5,
    revision="0123456789",
    manifest_sha256="cd" * 32,
    identity={"gpuName": "MI300X", "torch": "2.11.0"},
    outcomes=(9, 3),
    image_reference="registry.example.com/serve:1",
    image_id="registry.example.com/serve@sha256:" + "e" * 64,
    counts={"recorded": 14, "reused": 4, "resumed": 1, "newlyTuned": 7, "shards": 2},
    library_key="f" * 64,
    library_skipped=2,
    library_skipped_reason="tuned under other validators",
    gpu_model="M",
    job="tune-llm-m-1234",
    config_map="tunefleet-artifact-" + SHA,
    config_map_uid="cm-uid-1",
    delivery="ConfigMap",
    kind="caches",
    caches=(cc.Packed("torchCompile", "tc", "cache-tc.tar.gz", "ab" * 32, 10, 2, 30),),
    caches_skipped=(cc.Skipped("vllm", "vllm", "empty: the workload wrote nothing"),),
    bundle="sha256:" + "ef" * 32,
    signed=True,
    gain=Gain((paired("workload", [2.0] * 5, [1.0] * 5),), stand_in=True, note="n"),
    verdict="Pinned",
    verdict_message="pinned (bad day); the gate said: passed",
    pinned_reason="bad day",
    pinned_at="2026-12-02T10:00:00Z",
    source_cluster="0b6c1d2e-1111-4222-8333-944455556666",
    source_profile="ml/llama",
    adopted_at="2026-12-03T10:00:00Z",
)


def test_every_artifact_field_the_crd_declares_survives_message_and_status() -> None:
    declared = crd_artifact_fields()
    assert set(declared) == status_fields()
    record = FULL_RECORD
    # The pod writes its termination message; the operator reads it and adds the Job's part.
    read = ArtifactRecord.from_message(record.to_message())
    assert read is not None
    read = read.for_job(gpu_model="M", revision=record.revision, job=record.job, image_id="")
    # What only the operator adds, after the fact: the ConfigMap it delivered the artifact in.
    assert read.config_map == "" and "configMap" not in json.loads(record.to_message())
    # ... and the gate's verdict and the pin (promotion.py): the pod's message has neither.
    assert read.verdict == "" and "promotion" not in json.loads(record.to_message())
    # ... nor where an adopted artifact came from (fleet/): the adopting operator says so.
    assert read.source_cluster == "" and "source" not in json.loads(record.to_message())
    assert read.gain == record.gain  # the figures come from the pod
    read = replace(
        read,
        config_map=record.config_map,
        config_map_uid="cm-uid-1",
        delivery="ConfigMap",
        verdict=record.verdict,
        verdict_message=record.verdict_message,
        pinned_reason=record.pinned_reason,
        pinned_at=record.pinned_at,
        source_cluster=record.source_cluster,
        source_profile=record.source_profile,
        adopted_at=record.adopted_at,
    )
    status = read.to_status()
    assert set(status) == set(declared)  # libraryKey included: it was never written before
    assert status["libraryKey"] == "f" * 64
    assert ArtifactRecord.from_status(status) == record
    for name, schema in declared.items():  # each value has the type the CRD gives it
        kind = {"string": str, "integer": int, "number": float, "object": dict, "array": list}[
            schema["type"]
        ]
        assert isinstance(status[name], kind), name


def test_the_message_fits_the_kubelets_4096_bytes_by_trimming_identity() -> None:
    big = ArtifactRecord(uri="s3://b/x", sha256=SHA, identity={"a": "x" * 3000, "b": "y" * 2000})
    message = big.to_message()
    assert len(message.encode()) <= 4096 and json.loads(message)["identity"] == {"b": "y" * 2000}


def test_a_shard_message_is_not_an_artifact_record() -> None:
    shard = ShardRecord(1, 3, "s3://b/x/_shards/r/1-of-3", SHA, 5, 9, 2, 0, 3)
    assert ArtifactRecord.from_message(shard.to_message()) is None
    assert ShardRecord.from_message(shard.to_message()) == shard


def test_records_of_the_wrong_shape_are_not_trusted() -> None:
    assert ArtifactRecord.from_message("not json") is None
    assert ArtifactRecord.from_message(json.dumps({"uri": 5, "sha256": SHA})) is None
    odd = ArtifactRecord.from_message(json.dumps({"uri": "s3://b", "sha256": SHA, "gemms": "12"}))
    assert odd is not None and odd.gemms is None


@pytest.mark.parametrize("code", list(Code))
def test_the_admission_marks_read_back_as_written(code: Code) -> None:
    outcome = INJECTED if code in (Code.NONE, Code.IMAGE_MISMATCH) else UNTUNED
    mark = Admission(outcome, code, "" if outcome == INJECTED else "why", SHA[:8], SHA, "M", "w")
    pod = make_pod().obj()
    mark.write(pod)
    assert pod["metadata"]["labels"][ADMISSION_LABEL] == outcome
    assert Admission.read(pod) == mark


def test_every_untuned_code_has_a_fix() -> None:
    # ALREADY_ADMITTED: a later webhook entry's count (the pod keeps the first entry's code).
    # STORE_FALLBACK: injected, from the store while the artifact's ConfigMap is made again.
    not_untuned = {
        Code.NONE, Code.IMAGE_MISMATCH, Code.ERROR, Code.UNKNOWN, Code.ALREADY_ADMITTED,
        Code.STORE_FALLBACK,
    }  # fmt: skip
    untuned = set(Code) - not_untuned
    assert untuned == set(FIXES)


def test_a_pod_of_an_older_version_reads_as_unknown_with_its_reason() -> None:
    pod = (
        make_pod()
        .labels({ADMISSION_LABEL: "untuned"})
        .annotations({STATUS_ANNOTATION: "untuned: something"})
        .obj()
    )
    read = Admission.read(pod)
    assert read is not None and (read.code, read.reason) == (Code.UNKNOWN, "something")
    assert Admission.read(make_pod().labels({}).obj()) is None


@pytest.mark.parametrize(
    "outcome",
    [
        FetchOutcome(LOADED, files=2, gemms=12, sha256=SHA, dest="/r/%d.csv", tuned=10, default=2),
        FetchOutcome(FETCH_UNTUNED, "results.csv has SHA-256 x, expected y"),
        FetchOutcome(REFUSED, "no object at s3://b/k"),
    ],
)
def test_the_fetch_outcome_line_reads_back(outcome: FetchOutcome) -> None:
    assert FetchOutcome.parse(outcome.line()) == outcome


def test_fetch_counts_tuned_and_default_rows_and_reads_its_older_line() -> None:
    line = FetchOutcome(LOADED, files=1, gemms=3, sha256=SHA, dest="/d", tuned=1, default=2).line()
    assert "with 3 GEMMs (1 tuned, 2 Default)" in line and "tuned GEMMs" not in line
    old = f"tunefleet-fetch: wrote 2 results file(s) with 412 tuned GEMMs (sha256 {SHA}) to /d"
    parsed = FetchOutcome.parse(old)
    assert parsed is not None and (parsed.gemms, parsed.tuned) == (412, None)


def test_the_sidecars_answers_read_back_as_written(tmp_path: Path) -> None:
    ex.CheckpointAnswer("resumed", "3 GEMM(s) tuned earlier", 3).write(tmp_path)
    assert ex.CheckpointAnswer.read(tmp_path) == ex.CheckpointAnswer(
        "resumed", "3 GEMM(s) tuned earlier", 3
    )
    answer = ex.LibraryAnswer("k" * 64, 2, 10, (("o1", "bad"),), None)
    answer.write(tmp_path)
    assert ex.LibraryAnswer.read(tmp_path) == answer
    ex.answer_without(tmp_path / "x", "bad arguments")
    assert ex.LibraryAnswer.read(tmp_path / "x").error == "bad arguments"
    assert (tmp_path / "x" / ex.CHECKPOINT_DONE).exists() and (
        tmp_path / "x" / ex.LIBRARY_DONE
    ).exists()


# --- the revision --------------------------------------------------------------------------

BASE = (
    make_profile()
    .image("registry.example.com/serve:1")
    .gpu("amd", "AMD_Instinct_MI300X_OAM")
    .shapes((64, 64, 64))
)


class FutureTuning(TuningLimits):
    """What a later version adds: a new tuning option, with a default."""

    future_knob: int = 7


class FutureSpec(TuningProfileSpec):
    tuning: FutureTuning = FutureTuning()


def test_a_new_option_at_its_default_keeps_every_revision() -> None:
    today = naming.revision(BASE.spec_model())
    assert naming.revision(FutureSpec.model_validate(BASE.spec_dict())) == today
    set_explicitly = FutureSpec.model_validate(BASE.tuning(futureKnob=7).spec_dict())
    assert naming.revision(set_explicitly) == today
    changed = FutureSpec.model_validate(BASE.tuning(futureKnob=8).spec_dict())
    assert naming.revision(changed) != today


def test_settings_that_do_not_shape_results_are_one_set_for_revision_and_tuner() -> None:
    from tunefleet.builders.job import tuning_config

    spec = BASE.spec_model()
    config = tuning_config(spec, "ml", "p", "M", naming.revision(spec))
    excluded = {
        f.alias or n for n, f in TuningLimits.model_fields.items() if n in naming.TUNING_NOT_SHAPING
    }
    assert excluded and not excluded & set(config["tuning"])
    other = BASE.tuning(backoffLimit=3).spec_model()
    assert naming.revision(other) == naming.revision(spec)


def test_the_admission_says_how_the_pod_gets_its_artifact() -> None:
    mark = Admission(INJECTED, Code.NONE, "", SHA[:8], SHA, "M", "w")
    assert mark.delivery == "Store"
    assert replace(mark, config_map="cm").delivery == "ConfigMap"
    assert replace(mark, image_volume="r@sha256:" + "a" * 64).delivery == "ImageVolume"
