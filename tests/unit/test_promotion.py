"""The promotion gate and pins, through compute_status (status.py, promotion.py): a loss is
never served and the previous artifact keeps serving; Ready says which figure failed and by how
much; a pin serves an earlier artifact of the same revision; unpin returns to the newest that
passed; the verdict in status is shown, never trusted."""

from __future__ import annotations

import json
from typing import Any

from testbed.builders.wrappers import make_artifact, make_observation, make_profile
from tunefleet import naming
from tunefleet.api import TuningProfileSpec
from tunefleet.contracts.pin import Pin
from tunefleet.reconciler.observe import JobObservation
from tunefleet.reconciler.status import Observed, compute_status
from tuner_job.gain import Failure, Gain, paired

MODEL = "AMD_Instinct_MI300X_OAM"
BASE = make_profile().image("img:1").gpu("amd", MODEL)
SPEC = BASE.spec_model()
REV = naming.revision(SPEC)
SPEC2 = BASE.image("img:2").spec_model()
REV2 = naming.revision(SPEC2)


# Succeeded tuning Jobs of MODEL (j1 of REV, j2 of REV2), and the records their publish step
# writes of each artifact: its termination message names no GPU model (the operator adds the
# Job's); a test adds when it was tuned and what it gains.
J1 = make_observation("j1", MODEL, REV, "Succeeded")
J2 = make_observation("j2", MODEL, REV2, "Succeeded")
A, B, C = (make_artifact("m", x * 64, "x", "ns").without("gpuModel").fields(gemms=3) for x in "abc")
GOOD = Gain((paired("workload", [2.0] * 5, [1.0] * 5),))
BAD = Gain((paired("workload", [1.0] * 5, [1.25] * 5),))
# The first artifact, a passing one, of the first Job.
FIRST = J1.record(A.fields(tunedAt="2026-12-01T10:00:00Z", gain=GOOD.to_dict()))


def status(
    spec: TuningProfileSpec, jobs: list[JobObservation], previous: dict[str, Any], **kw: Any
) -> dict[str, Any]:
    return compute_status(Observed(1, spec, jobs=jobs, previous=previous, **kw), "now").to_status()


def ready(st: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in st["conditions"] if c["type"] == "Ready")


def test_a_measured_gain_is_served_with_its_verdict_and_gain_column() -> None:
    st = status(SPEC, [FIRST.obj()], {})
    (art,) = st["artifacts"]
    assert art["sha256"] == "a" * 64 and art["promotion"]["verdict"] == "Passed"
    assert art["gain"]["figures"][0]["speedup"] == 2.0
    assert st["phase"] == "Ready" and st["gain"] == "2.00x"


def test_a_loss_is_kept_for_the_record_never_served_and_the_previous_one_keeps_serving() -> None:
    first = status(SPEC, [FIRST.obj()], {})
    jobs = [J2.record(B.fields(tunedAt="2026-12-02T10:00:00Z", gain=BAD.to_dict())).obj()]
    st = status(SPEC2, jobs, first)
    assert [a["sha256"] for a in st["artifacts"]] == ["a" * 64]
    (rejected,) = st["history"]
    assert rejected["sha256"] == "b" * 64 and rejected["promotion"]["verdict"] == "Rejected"
    r = ready(st)
    assert r["status"] == "True" and r["reason"] == "PromotionRejected"
    assert "workload 0.80x" in r["message"] and "20.0% below" in r["message"]
    assert "aaaaaaaaaaaa keeps serving" in r["message"]
    assert st["phase"] == "Rejected"
    # Level-based: computing again from what was written changes nothing, adds nothing.
    again = status(SPEC2, jobs, st)
    assert again["artifacts"] == st["artifacts"] and again["history"] == st["history"]


def test_an_artifact_that_crashed_its_workload_is_rejected_and_the_previous_keeps_serving() -> None:
    """Fails closed: before, a crash with the artifact made it "not measured", and promoted."""
    crashed = Gain(
        (), failed=Failure("workload", "the workload was killed by SIGSEGV with the artifact")
    )
    first = status(SPEC, [FIRST.obj()], {})
    st = status(
        SPEC2,
        [J2.record(C.fields(tunedAt="2026-12-02T10:00:00Z", gain=crashed.to_dict())).obj()],
        first,
    )
    assert [a["sha256"] for a in st["artifacts"]] == ["a" * 64]
    (rejected,) = st["history"]
    assert rejected["promotion"]["verdict"] == "Rejected"
    assert rejected["gain"]["failed"]["figure"] == "workload"
    r = ready(st)
    assert r["reason"] == "PromotionRejected" and st["phase"] == "Rejected"
    assert "workload failed with the artifact: the workload was killed by SIGSEGV" in r["message"]


def test_a_loss_with_nothing_before_it_leaves_the_model_unserved_and_says_what_to_do() -> None:
    st = status(
        SPEC, [J1.record(B.fields(tunedAt="2026-12-02T10:00:00Z", gain=BAD.to_dict())).obj()], {}
    )
    assert st["artifacts"] == []
    r = ready(st)
    assert r["status"] == "False" and r["reason"] == "PromotionRejected"
    assert "nothing earlier to serve" in r["message"] and "spec.promotion.minGain" in r["message"]


def test_a_raised_min_gain_rejudges_and_noise_alone_never_rejects() -> None:
    flat = Gain((paired("workload", [1.0, 1.02, 0.99, 1.0, 1.01], [1.0, 1.0, 1.01, 0.99, 1.0]),))
    st = status(SPEC, [J1.record(A.fields(tunedAt="t1", gain=flat.to_dict())).obj()], {})
    assert st["artifacts"] and st["artifacts"][0]["promotion"]["verdict"] == "Passed"
    strict = BASE.spec(promotion={"minGain": 0.5}).spec_model()
    assert naming.revision(strict) == REV  # the gate retunes nothing
    st2 = status(strict, [J1.record(A.fields(tunedAt="t1", gain=flat.to_dict())).obj()], st)
    # Nothing else passes: what serves keeps serving, and says it fails the gate now.
    (art,) = st2["artifacts"]
    assert art["promotion"]["verdict"] == "Rejected" and st2["phase"] == "Rejected"
    assert "fails the promotion gate now" in ready(st2)["message"]


def _two_of_one_revision() -> dict[str, Any]:
    """A then B, both of REV and both passing: B serves, A is in history."""
    a = status(SPEC, [FIRST.obj()], {})
    return status(
        SPEC,
        [
            J2.fields(revision=REV)
            .record(B.fields(tunedAt="2026-12-02T10:00:00Z", gain=GOOD.to_dict()))
            .obj()
        ],
        a,
    )


def test_a_pin_serves_an_earlier_artifact_of_the_revision_and_unpin_returns_to_the_newest() -> None:
    st = _two_of_one_revision()
    assert st["artifacts"][0]["sha256"] == "b" * 64
    pins = {MODEL: Pin(MODEL, "a" * 64, "b regressed p99", "2026-12-03T10:00:00Z")}
    pinned = status(SPEC, [], st, pins=pins)
    (art,) = pinned["artifacts"]
    assert art["sha256"] == "a" * 64 and art["pinned"]["reason"] == "b regressed p99"
    assert art["promotion"]["verdict"] == "Pinned"
    assert [h["sha256"] for h in pinned["history"]] == ["b" * 64]
    assert "is pinned (b regressed p99)" in ready(pinned)["message"]
    assert pinned["gain"] == "2.00x pinned"
    # While the Job that made B is still there, the pin holds.
    held = status(
        SPEC,
        [
            J2.fields(revision=REV)
            .record(B.fields(tunedAt="2026-12-02T10:00:00Z", gain=GOOD.to_dict()))
            .obj()
        ],
        pinned,
        pins=pins,
    )
    assert held["artifacts"][0]["sha256"] == "a" * 64
    back = status(SPEC, [], held)
    assert back["artifacts"][0]["sha256"] == "b" * 64 and "pinned" not in back["artifacts"][0]
    assert [h["sha256"] for h in back["history"]] == ["a" * 64]


def test_a_pin_of_another_revision_or_an_unknown_artifact_is_ignored_and_said() -> None:
    first = status(SPEC, [J1.record(A.fields(tunedAt="t1", gain=GOOD.to_dict())).obj()], {})
    st = status(SPEC2, [J2.record(B.fields(tunedAt="t2", gain=GOOD.to_dict())).obj()], first)
    other = status(SPEC2, [], st, pins={MODEL: Pin(MODEL, "a" * 64, "x")})
    assert other["artifacts"][0]["sha256"] == "b" * 64
    assert f"tuned for revision {REV}" in ready(other)["message"]
    unknown = status(SPEC2, [], st, pins={MODEL: Pin(MODEL, "c" * 64, "x")})
    assert unknown["artifacts"][0]["sha256"] == "b" * 64
    assert "no artifact of this model has it" in ready(unknown)["message"]


def test_a_forged_verdict_in_status_is_not_trusted() -> None:
    st = _two_of_one_revision()
    # Someone writes "Passed" over a history entry whose figures show a loss, and newer.
    forged = json.loads(json.dumps(st))
    entry = forged["history"][0]
    entry.update(
        sha256="c" * 64,
        uri="s3://bkt/p/ns/x/m/" + "c" * 64,
        tunedAt="2026-12-09T10:00:00Z",
        gain=BAD.to_dict(),
        promotion={"verdict": "Passed", "message": "trust me"},
    )
    again = status(SPEC, [], forged)
    assert again["artifacts"][0]["sha256"] == "b" * 64
    judged = next(h for h in again["history"] if h["sha256"] == "c" * 64)
    assert judged["promotion"]["verdict"] == "Rejected"


def test_artifacts_from_before_the_gate_are_served_as_they_were() -> None:
    st = status(SPEC, [J1.record(A.fields(tunedAt="t1")).obj()], {})
    (art,) = st["artifacts"]
    assert "promotion" not in art and "gain" not in art and "gain" not in st


def test_a_forced_pin_of_a_rejected_artifact_serves_it_and_unpin_returns_to_the_passing() -> None:
    first = status(SPEC, [J1.record(A.fields(tunedAt="t1", gain=GOOD.to_dict())).obj()], {})
    jobs = [J2.record(B.fields(tunedAt="t2", gain=BAD.to_dict())).obj()]
    st = status(SPEC2, jobs, first)
    pins = {MODEL: Pin(MODEL, "b" * 64, "forced", "t3")}
    pinned = status(SPEC2, jobs, st, pins=pins)
    assert pinned["artifacts"][0]["sha256"] == "b" * 64
    assert pinned["artifacts"][0]["pinned"]["reason"] == "forced"
    back = status(SPEC2, jobs, pinned)
    assert back["artifacts"][0]["sha256"] == "a" * 64
    assert [h["sha256"] for h in back["history"]] == ["b" * 64]
    assert back["history"][0]["promotion"]["verdict"] == "Rejected"


def test_the_same_bytes_tuned_again_under_a_new_spec_are_judged_for_that_spec() -> None:
    # The library gave every row back: the second revision's results are byte for byte the
    # first's, but measured under the new spec they lose. The first record keeps serving.
    first = status(SPEC, [J1.record(A.fields(tunedAt="t1", gain=GOOD.to_dict())).obj()], {})
    st = status(SPEC2, [J2.record(A.fields(tunedAt="t2", gain=BAD.to_dict())).obj()], first)
    (art,) = st["artifacts"]
    assert art["revision"] == REV and art["promotion"]["verdict"] == "Passed"
    (h,) = st["history"]
    assert h["revision"] == REV2 and h["promotion"]["verdict"] == "Rejected"
    assert st["phase"] == "Rejected"
    # A forced pin of the rejected one names the record of the revision tuned now.
    pinned = status(SPEC2, [], st, pins={MODEL: Pin(MODEL, "a" * 64, "forced")})
    assert pinned["artifacts"][0]["revision"] == REV2


def test_the_cached_view_of_a_profile_keeps_its_pins_for_the_reconcile() -> None:
    from tunefleet.contracts import pin
    from tunefleet.watched.views import profile_view

    pins = {MODEL: Pin(MODEL, "a" * 64, "why", "t")}
    raw = (
        make_profile("p", "n")
        .spec_is({})
        .annotations({pin.ANNOTATION: pin.value(pins), "other": "dropped"})
        .obj()
    )
    view = profile_view(raw)
    assert pin.read(view["metadata"]["annotations"]) == pins
    assert "other" not in view["metadata"]["annotations"]
