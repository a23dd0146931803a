"""kubectl tunefleet rollback and unpin without a cluster: which artifact a rollback picks and
what it refuses (plugin/rollback_cmd.py's pure choice), and that the CLI writes exactly
contracts/pin.py's merge patch through a fake API."""

from __future__ import annotations

import json
from typing import Any

import pytest

from testbed.builders.wrappers import make_artifact, make_profile
from tests.support.fake_cluster import FencedCluster
from tunefleet.contracts import pin as pins
from tunefleet.plugin import cluster as cluster_mod
from tunefleet.plugin import main as main_mod
from tunefleet.plugin.errors import PluginError
from tunefleet.plugin.rollback_cmd import choose, format_unpin, sha_prefix, unpin_request

H100, H200 = "NVIDIA-H100-80GB-HBM3", "NVIDIA-H200"
SERVED, OLDER, OLDEST, REJ, OTHER_REV = "a1" * 32, "b2" * 32, "c3" * 32, "d4" * 32, "e5" * 32
AT = "2026-11-30T12:00:00Z"
GAIN = {
    "mode": "Eager",
    "figures": [
        {
            "name": "workload",
            "baselineSeconds": 12.0,
            "tunedSeconds": 10.0,
            "speedup": 1.2,
            "low": 1.15,
            "high": 1.25,
            "repetitions": 9,
        }
    ],
}


TUNED = "2026-11-30T11:00:00Z"
TWIN = "b2" * 31 + "00"  # shares its first 62 hex digits with OLDER
# An artifact of H200 that rev2 tuned and the gate passed, by its SHA-256.
PASSED = {
    sha: make_artifact(H200, sha, profile="llm")
    .revision("rev2")
    .tuned_at(TUNED)
    .verdict("Passed", "passed: figures")
    for sha in (SERVED, OLDER, OLDEST, REJ, OTHER_REV, TWIN)
}
REJECTED = PASSED[REJ].verdict("Rejected", "rejected: figures")
OF_REV1 = PASSED[OTHER_REV].revision("rev1")
# A served artifact of rev2 and, newest first: a rejected one, an older that passed, one of
# another revision, and the oldest of rev2.
LLM = (
    make_profile("llm")
    .annotations({})
    .spec_is({"gpu": {"models": [H200]}})
    .revision("rev2")
    .artifacts(PASSED[SERVED].fields(gain=GAIN))
    .history(
        REJECTED,
        PASSED[OLDER].fields(gain=GAIN),
        OF_REV1,
        PASSED[OLDEST].verdict("Unmeasured", "unmeasured: figures"),
    )
)


def refused(match: str, *args: Any, **kwargs: Any) -> str:
    with pytest.raises(PluginError, match=match) as e:
        choose(*args, **kwargs)
    return str(e.value)


# --- the choice --------------------------------------------------------------------------------


def test_rollback_picks_the_newest_same_revision_artifact_the_gate_did_not_reject() -> None:
    report = choose(LLM.obj())
    assert (report["gpuModel"], report["target"]["sha256"]) == (H200, OLDER)
    assert report["served"]["sha256"] == SERVED and not report["forced"]
    # The served artifact kept in history too is not a rollback target; Unmeasured is fine.
    p = LLM.history(PASSED[SERVED], OF_REV1, PASSED[OLDEST]).obj()
    assert choose(p)["target"]["sha256"] == OLDEST


def test_rollback_to_a_prefix_an_ambiguous_one_and_an_unknown_one() -> None:
    assert choose(LLM.obj(), to=OLDEST[:7])["target"]["sha256"] == OLDEST
    assert choose(LLM.obj(), to=OLDEST)["target"]["sha256"] == OLDEST
    twins = LLM.history(PASSED[TWIN], PASSED[OLDER]).obj()
    message = refused("matches 2 artifacts", twins, to="b2b2b2b")
    assert "give more of the SHA-256" in message
    refused("starting 0000000: `kubectl tunefleet status` lists them", LLM.obj(), to="0000000")
    with pytest.raises(ValueError, match="7\\+ hex digits"):
        sha_prefix("b2b2")
    assert sha_prefix(" B2B2B2B2 ") == "b2b2b2b2"


def test_rollback_refuses_another_revision_and_says_why() -> None:
    message = refused("is of revision rev1, not of revision rev2", LLM.obj(), to=OTHER_REV[:8])
    assert "an artifact tuned for another spec may not fit the image now served" in message
    # Nothing of the same revision left: said, with what history holds.
    only_other = LLM.history(OF_REV1).obj()
    assert "1 of another revision, 0 rejected" in refused("nothing to roll back to", only_other)


def test_rollback_to_a_rejected_artifact_needs_force() -> None:
    message = refused("failed the promotion gate", LLM.obj(), to=REJ[:7])
    assert "rejected: figures" in message and "pass --force to serve it anyway" in message
    report = choose(LLM.obj(), to=REJ[:7], force=True)
    assert report["target"]["sha256"] == REJ and report["forced"]
    only_rejected = LLM.history(REJECTED).obj()
    assert "--to SHA --force" in refused("1 rejected", only_rejected)


def test_rollback_refuses_the_artifact_already_served() -> None:
    message = refused("already served for NVIDIA-H200", LLM.obj(), to=SERVED[:10])
    assert "unpin" in message
    pinned = LLM.artifacts(PASSED[SERVED].fields(pinned={"reason": "x", "at": AT})).obj()
    assert "(pinned)" in refused("already served", pinned, to=SERVED)


def test_rollback_needs_a_gpu_model_when_several_are_served_and_a_known_one() -> None:
    two = LLM.artifacts(PASSED[SERVED], PASSED[SERVED].fields(gpuModel=H100)).obj()
    refused(f"several GPU models: name one with --gpu-model \\({H100}, {H200}\\)", two)
    assert choose(two, gpu_model=H200)["target"]["sha256"] == OLDER
    refused("no artifact for GPU model 'Other'", LLM.obj(), gpu_model="Other")
    refused("serves no artifact yet", LLM.artifacts().obj())


def test_rollback_offers_only_artifacts_of_the_revision_the_model_tunes_now() -> None:
    # The operator honours a pin only of the revision the model tunes now (or the spec's):
    # while revision rev3 tunes, rev2's artifacts are of another spec.
    refused("of revision rev3 that passed the gate", LLM.revision("rev3").obj())


# --- the CLI: the patch written ------------------------------------------------------------------


def run(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], fake: Any, *args: str
) -> tuple[int, str, str]:
    monkeypatch.setattr(pins, "now", lambda: AT)
    code = main_mod.main(list(args), connect=lambda *a: fake)
    out, err = capsys.readouterr()
    return code, out, err


def test_rollback_writes_exactly_the_pin_contract_patch_and_says_how_to_undo(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    other = pins.Pin(H100, OLDEST, "kept", AT)
    p = LLM.annotations({pins.ANNOTATION: pins.value({H100: other}) or ""}).obj()
    fake = FencedCluster(p)
    code, out, err = run(monkeypatch, capsys, fake, "rollback", "llm", "-n", "ml")
    assert (code, err) == (0, "")
    want = pins.Pin(H200, OLDER, "rollback by kubectl tunefleet", AT)
    assert fake.patches == [pins.patch({H100: other, H200: want})]
    assert f"Pinned {H200} of TuningProfile ml/llm to artifact {OLDER[:12]}" in out
    assert f"instead of {SERVED[:12]}" in out
    assert "gain:   workload 1.20x (1.15-1.25, 9 pairs): 12s -> 10s, saves 2s" in out
    assert "`kubectl tunefleet unpin llm -n ml` returns to the newest artifact that passed" in out
    # -o json: the choice and the pin written.
    fake.patches.clear()
    code, out, _ = run(
        monkeypatch, capsys, fake, "rollback", "llm", "--to", REJ[:9], "--force",
        "--reason", "p99 regressed", "-o", "json",
    )  # fmt: skip
    data = json.loads(out)
    assert code == 0 and data["forced"] and data["pin"]["reason"] == "p99 regressed"
    assert fake.patches == [
        pins.patch({H100: other, H200: pins.Pin(H200, REJ, "p99 regressed", AT)})
    ]


def test_rollback_errors_are_one_line_and_write_nothing(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = FencedCluster(LLM.obj())
    code, _, err = run(monkeypatch, capsys, fake, "rollback", "llm", "--to", REJ[:7])
    assert code == 1 and len(err.splitlines()) == 1 and "--force" in err
    code, _, err = run(monkeypatch, capsys, fake, "rollback", "nope")
    assert code == 1 and "'nope' not found in namespace 'ml'" in err
    code, _, err = run(monkeypatch, capsys, fake, "rollback", "llm", "--to", "xyz")
    assert code == 2 and "7+ hex digits" in err
    code, _, err = run(monkeypatch, capsys, fake, "rollback", "llm", "--reason", "x" * 201)
    assert code == 2 and "at most 200 characters" in err
    assert fake.patches == []


# --- unpin ---------------------------------------------------------------------------------------


PINNED = LLM.annotations(
    {
        pins.ANNOTATION: pins.value(
            {H200: pins.Pin(H200, OLDER, "slow", AT), H100: pins.Pin(H100, OLDEST, "", AT)}
        )
        or ""
    }
)


def test_unpin_one_model_keeps_the_other_pins(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = FencedCluster(PINNED.obj())
    code, out, _ = run(monkeypatch, capsys, fake, "unpin", "llm", "--gpu-model", H200)
    assert code == 0
    assert fake.patches == [pins.patch({H100: pins.Pin(H100, OLDEST, "", AT)})]
    assert f"Unpinned {H200} of TuningProfile ml/llm (was {OLDER[:12]}: slow, since {AT})." in out
    assert f"Still pinned: {H100}." in out and "newest artifact that passed the gate" in out


def test_unpin_all_removes_the_annotation(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = FencedCluster(PINNED.obj())
    code, out, _ = run(monkeypatch, capsys, fake, "unpin", "llm")
    assert code == 0 and fake.patches == [pins.patch({})]
    assert fake.patches[0]["metadata"]["annotations"][pins.ANNOTATION] is None
    assert out.count("Unpinned ") == 2 and "Still pinned" not in out


def test_unpin_with_nothing_pinned_says_so_and_writes_nothing(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = FencedCluster(LLM.obj())
    code, out, _ = run(monkeypatch, capsys, fake, "unpin", "llm")
    assert (code, fake.patches) == (0, [])
    assert out == "Nothing is pinned on TuningProfile ml/llm: nothing to do.\n"
    report, patch = unpin_request(PINNED.obj(), "Other")
    assert patch is None
    assert (
        format_unpin(report)
        == "Nothing is pinned for Other on TuningProfile ml/llm: nothing to do.\n"
    )
    # An annotation that pins nothing readable goes when every pin is removed.
    report, patch = unpin_request(LLM.annotations({pins.ANNOTATION: "not json"}).obj())
    assert patch == pins.patch({}) and "pinned nothing readable" in format_unpin(report)


def test_a_pin_written_between_read_and_write_is_read_again_not_overwritten(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two on-call engineers at once: one pins H100 while the other's rollback of H200 is
    between its read and its write. The second write, fenced by the resourceVersion it read,
    is refused; it reads again and writes both pins (before, it wrote H200's alone)."""
    theirs = pins.Pin(H100, OLDEST, "theirs", AT)

    def other_engineer(fake: FencedCluster) -> None:
        fake.patch_profile("ml", "llm", pins.patch({H100: theirs}))

    fake = FencedCluster(LLM.obj(), race=other_engineer)
    code, _, err = run(monkeypatch, capsys, fake, "rollback", "llm", "-n", "ml")
    assert (code, err, fake.conflicts) == (0, "", 1)
    mine = pins.Pin(H200, OLDER, "rollback by kubectl tunefleet", AT)
    assert pins.read(fake.prof["metadata"]["annotations"]) == {H100: theirs, H200: mine}


def test_an_unpin_racing_a_rollback_removes_only_its_own_model(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def rollback_lands_first(fake: FencedCluster) -> None:
        current = pins.read(fake.prof["metadata"].get("annotations"))
        fake.patch_profile(
            "ml", "llm", pins.patch({**current, H100: pins.Pin(H100, OLDEST, "new", AT)})
        )

    fake = FencedCluster(PINNED.obj(), race=rollback_lands_first)
    code, _, _ = run(monkeypatch, capsys, fake, "unpin", "llm", "--gpu-model", H200)
    assert (code, fake.conflicts) == (0, 1)
    assert pins.read(fake.prof["metadata"]["annotations"]) == {
        H100: pins.Pin(H100, OLDEST, "new", AT)
    }


def test_a_profile_that_never_stops_changing_is_an_error_not_a_lost_write(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = FencedCluster(LLM.obj())

    def always_stale(namespace: str, name: str, patch: dict[str, Any]) -> Any:
        fake.conflicts += 1
        raise cluster_mod._Conflict(name)

    monkeypatch.setattr(fake, "patch_profile", always_stale)
    monkeypatch.setattr(cluster_mod.time, "sleep", lambda s: None)
    code, _, err = run(monkeypatch, capsys, fake, "rollback", "llm")
    assert code == 1 and fake.conflicts == cluster_mod.UPDATE_ATTEMPTS
    assert f"changed {cluster_mod.UPDATE_ATTEMPTS} times while this command tried to" in err
