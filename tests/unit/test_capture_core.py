"""The production loop's pure core (capture/loop.py) and its stores (capture/retune_sets.py):
aggregation, the thresholds and interval, no retune loop, manual requests, revision
stability; the store's bounds and what a forged ConfigMap is worth."""

from __future__ import annotations

from typing import Any

import pytest

from testbed.builders.wrappers import ArtifactWrapper, make_artifact, make_profile
from tests.support.fake_kube import OneConfigMap
from tunefleet import naming
from tunefleet.api import CaptureSpec, CaptureStatus
from tunefleet.capture import loop
from tunefleet.capture.retune_sets import (
    MAX_BYTES,
    Batch,
    RetuneSet,
    StoreKey,
    StoreView,
    build_retune_config_map,
    build_store_config_map,
    digest_of,
    merge,
    parse_retune,
    parse_store,
)
from tunefleet.contracts.retune import ANNOTATION, RetuneRequest, Retunes

BASE = "base000001"
MODEL = "NVIDIA-H100"
S1 = [f"GemmTunableOp_BFloat16_TN,tn_{n}_64_64_ld_64_64_{n}" for n in (64, 128, 256)]
S2 = [f"GemmTunableOp_BFloat16_TN,tn_{n}_96_96_ld_96_96_{n}" for n in (8, 16)]
NOW = 1_800_000_000.0
KEY = StoreKey("ml", "p", "uid-1", MODEL, "lib-key-1")


SERVED = make_artifact(MODEL, "a" * 64).revision(BASE).library_key("lib-key-1")
PUBLISHED = make_artifact(MODEL, "b" * 64).library_key("lib-key-1")
CAPTURING = make_profile().spec(capture={"enabled": True})
ON = CAPTURING.spec_model().capture
RETUNE_ON_A_MISS = (
    make_profile().spec(capture={"enabled": True, "retune": {"misses": 1}}).spec_model().capture
)


def status(art: ArtifactWrapper | None, capture: list[dict[str, Any]] | None = None) -> Any:
    out: dict[str, Any] = {"artifacts": [art.obj()] if art else []}
    if capture is not None:
        out["capture"] = capture
    return out


def store(rows: list[str], key: StoreKey = KEY, at: int = 100) -> StoreView:
    view, _ = merge(StoreView(key), Batch(rows), at, 1024)
    return view


def run(
    cap: CaptureSpec,
    st: dict[str, Any],
    stores: list[StoreView],
    keys: frozenset[str] | None = frozenset(S1),
    retunes: list[RetuneSet] | None = None,
    request: Retunes | None = None,
    now: float = NOW,
    base: str = BASE,
) -> loop.Plan:
    return loop.plan(
        cap,
        loop.Subject("ml", "p", "uid-1", base),
        [MODEL],
        st,
        loop.Seen(stores, retunes or [], lambda r: keys),
        loop.Moment(now, request),
    )


def test_seen_tuned_and_coverage_count_the_current_identitys_misses_against_the_artifact() -> None:
    plan = run(ON, status(SERVED), [store(S2 + S1[:1])])
    (entry,) = plan.entries
    assert (entry["seen"], entry["tuned"], entry["untuned"], entry["coverage"]) == (3, 1, 2, 33)
    assert plan.coverage == "1/3 33%"
    assert plan.revisions == {MODEL: BASE}  # no retune configured: nothing frozen
    assert not plan.freezes


def test_captures_of_another_identity_or_image_are_kept_apart_never_counted_or_tuned() -> None:
    other = store(S2, StoreKey("ml", "p", "uid-1", MODEL, "lib-key-OTHER"))
    image = store(S2, StoreKey("ml", "p", "uid-1", MODEL, "lib-key-1", apart="another image"))
    plan = run(RETUNE_ON_A_MISS, status(SERVED), [other, image])
    (entry,) = plan.entries
    assert entry["seen"] == 0 and entry["apart"] == {"stores": 2, "seen": 2}
    assert not plan.freezes


def test_the_misses_threshold_freezes_every_untuned_shape_under_a_stable_revision() -> None:
    cap = (
        make_profile()
        .spec(capture={"enabled": True, "retune": {"misses": 2, "minIntervalSeconds": 600}})
        .spec_model()
        .capture
    )
    assert not run(cap, status(SERVED), [store(S2[:1])]).freezes  # one is below it
    plan = run(cap, status(SERVED), [store(S2)])
    (frozen,) = plan.freezes
    assert sorted(frozen.rows) == sorted(S2) and frozen.base_revision == BASE
    rev = naming.retune_revision(BASE, digest_of(S2))
    assert plan.revisions == {MODEL: rev} and rev != BASE
    (entry,) = plan.entries
    assert entry["retune"]["revision"] == rev and entry["retune"]["state"] == "Tuning"
    assert entry["retune"]["reason"] == "Threshold"
    assert any(e[1] == "RetuneStarted" for e in plan.events)
    CaptureStatus.model_validate(entry)  # what the CRD's status.capture[] declares
    # Stable: the status this wrote gives the same revision on every later reconcile (and a
    # restarted operator, which reads it back), and freezes nothing more while it tunes.
    again = run(cap, status(SERVED, plan.entries), [store(S2)], now=NOW + 5)
    assert again.revisions == {MODEL: rev} and not again.freezes
    assert loop.revisions(BASE, status(SERVED, plan.entries), [MODEL]) == {MODEL: rev}


def test_the_interval_holds_the_next_retune_back() -> None:
    cap = (
        make_profile()
        .spec(capture={"enabled": True, "retune": {"misses": 1, "minIntervalSeconds": 600}})
        .spec_model()
        .capture
    )
    first = run(cap, status(SERVED), [store(S2[:1])])
    (frozen,) = first.freezes
    # Its artifact is out: the model is settled again; a new miss comes 60 s later.
    published = PUBLISHED.revision(first.revisions[MODEL])
    later = run(
        cap, status(published, first.entries), [store(S2)], keys=frozenset(S1 + S2[:1]),
        retunes=[frozen], now=NOW + 60,
    )  # fmt: skip
    assert not later.freezes
    assert "next retune may start at" in later.entries[0]["message"]
    due = run(
        cap, status(published, first.entries), [store(S2)], keys=frozenset(S1 + S2[:1]),
        retunes=[frozen], now=NOW + 601,
    )  # fmt: skip
    assert [sorted(f.rows) for f in due.freezes] == [[S2[1]]]


def test_a_shape_torch_rejects_does_not_retune_forever() -> None:
    cap = (
        make_profile()
        .spec(capture={"enabled": True, "retune": {"misses": 1, "minIntervalSeconds": 60}})
        .spec_model()
        .capture
    )
    first = run(cap, status(SERVED), [store(S2)])
    (frozen,) = first.freezes
    # The retune published, but without S2[1] (torch rejected it): it stays untuned...
    published = PUBLISHED.revision(first.revisions[MODEL])
    keys = frozenset(S1 + S2[:1])
    for minutes in (2, 60, 6000):
        plan = run(
            cap, status(published, first.entries), [store(S2)], keys=keys, retunes=[frozen],
            now=NOW + 60 * minutes,
        )  # fmt: skip
        (entry,) = plan.entries
        assert entry["untuned"] == 1 and entry["retune"]["state"] == "Published"
        assert not plan.freezes, minutes  # ...and never triggers a retune by itself
    # A new shape does; the rejected one goes along (it may tune this time).
    new = "GemmTunableOp_Half_NT,nt_32_32_32_ld_32_32_32"
    plan = run(
        cap, status(published, first.entries), [store([*S2, new])], keys=keys,
        retunes=[frozen], now=NOW + 120,
    )  # fmt: skip
    assert [sorted(f.rows) for f in plan.freezes] == [sorted([S2[1], new])]


def test_coverage_threshold_needs_a_new_shape_too() -> None:
    cap = (
        make_profile()
        .spec(capture={"enabled": True, "retune": {"coverage": 90}})
        .spec_model()
        .capture
    )
    plan = run(cap, status(SERVED), [store(S1 + S2[:1])])  # 2/3 covered, one new
    assert len(plan.freezes) == 1
    enough = run(
        make_profile()
        .spec(capture={"enabled": True, "retune": {"coverage": 50}})
        .spec_model()
        .capture,
        status(SERVED),
        [store(S1 + S2[:1])],
    )
    assert not enough.freezes


def test_nothing_is_frozen_while_the_model_tunes() -> None:
    cap = RETUNE_ON_A_MISS
    tuning = run(cap, status(SERVED.revision("older")), [store(S2)])  # not this revision's
    assert not tuning.freezes
    assert "tuning in progress" in tuning.entries[0]["message"]
    assert not run(cap, status(None), [store(S2)]).freezes


def test_a_manual_request_retunes_once_whatever_the_thresholds() -> None:
    request = Retunes((RetuneRequest("n1"),))
    plan = run(ON, status(SERVED), [store(S2[:1])], request=request)
    (frozen,) = plan.freezes
    (entry,) = plan.entries
    assert entry["retune"]["reason"] == "Manual" and entry["handledNonce"] == "n1"
    published = PUBLISHED.revision(plan.revisions[MODEL])
    again = run(
        ON, status(published, plan.entries), [store(S2)], keys=frozenset(S1 + S2[:1]),
        retunes=[frozen], request=request,
    )  # fmt: skip
    assert not again.freezes  # the same nonce: acted on already
    other = run(
        ON, status(published, plan.entries), [store(S2)], keys=frozenset(S1 + S2[:1]),
        retunes=[frozen], request=Retunes((RetuneRequest("n2", "another-model"),)),
    )  # fmt: skip
    assert not other.freezes  # for another model
    nothing = run(ON, status(SERVED), [store([])], request=Retunes((RetuneRequest("n3"),)))
    assert not nothing.freezes
    assert "every captured shape is in the artifact" in nothing.entries[0]["message"]


def test_a_manual_request_waits_for_the_running_tuning() -> None:
    plan = run(
        ON, status(SERVED.revision("older")), [store(S2)], request=Retunes((RetuneRequest("n"),))
    )
    assert not plan.freezes and "handledNonce" not in plan.entries[0]
    assert "waits for the current tuning" in plan.entries[0]["message"]


def test_a_spec_change_supersedes_the_retune_and_tunes_the_spec_again() -> None:
    cap = RETUNE_ON_A_MISS
    first = run(cap, status(SERVED), [store(S2)])
    plan = run(cap, status(SERVED, first.entries), [store(S2)], base="base000002")
    assert plan.revisions == {MODEL: "base000002"}  # the new spec's own revision
    assert plan.entries[0]["retune"]["state"] == "Superseded"


def test_without_a_read_path_the_retunes_set_counts_as_tuned() -> None:
    cap = RETUNE_ON_A_MISS
    first = run(cap, status(SERVED), [store(S2)])
    (frozen,) = first.freezes
    published = PUBLISHED.revision(first.revisions[MODEL])
    plan = run(cap, status(published, first.entries), [store(S2)], keys=None, retunes=[frozen])
    assert plan.entries[0]["tuned"] == 2 and not plan.freezes


def test_no_capture_and_nothing_captured_shows_nothing() -> None:
    plan = run(CaptureSpec(), status(SERVED), [])
    assert plan.entries == [] and plan.coverage == ""


def test_a_frozen_set_that_cannot_be_made_leaves_the_model_as_it_was() -> None:
    plan = run(RETUNE_ON_A_MISS, status(SERVED), [store(S2)])
    plan.revert(MODEL, None, BASE, "ConfigMap ml/x exists but is not controlled by it")
    assert plan.revisions == {MODEL: BASE} and not plan.freezes
    assert "retune not started" in plan.entries[0]["message"]
    assert [e[1] for e in plan.events] == ["RetuneNotStarted"]


# --- the store ---------------------------------------------------------------------------------


def test_merging_adds_new_rows_first_seen_kept_and_bounds_what_is_kept() -> None:
    view, added = merge(StoreView(KEY), Batch(S2), 100, 3)
    assert added == 2 and view.rows == {S2[0]: 100, S2[1]: 100}
    view, added = merge(view, Batch([*S2, *S1], pod="pod-a", not_loaded=4), 200, 3)
    assert added == 1 and len(view.rows) == 3 and view.dropped == 2
    assert view.rows[S2[0]] == 100  # first seen stays
    assert view.not_loaded == {"pod-a": 4}
    big = [f"GemmTunableOp_BFloat16_TN,tn_{i}_" + "9" * 900 for i in range(2000)]
    huge, _ = merge(StoreView(KEY), Batch(big), 1, 4096)
    assert len("".join(f"{at} {r}\n" for r, at in huge.rows.items())) < MAX_BYTES
    assert huge.dropped > 0


def test_the_store_round_trips_through_its_configmap_and_a_forged_one_is_nothing() -> None:
    view, _ = merge(StoreView(KEY), Batch(S2, pod="x", not_loaded=1), 100, 10)
    cm = build_store_config_map(view)
    cm["metadata"]["uid"] = "cm-1"
    back = parse_store(cm)
    assert back is not None and back.rows == view.rows and back.key == KEY
    assert back.not_loaded == {"x": 1}
    forged = build_store_config_map(view)
    forged["metadata"]["ownerReferences"] = []  # our labels, nobody's ownership
    assert parse_store(forged) is None
    other = build_store_config_map(view)
    other["metadata"]["labels"][naming.PROFILE_UID_LABEL] = "uid-2"  # claims another profile
    assert parse_store(other) is None


def test_a_retune_set_is_named_by_its_rows_and_refused_once_changed() -> None:
    r = RetuneSet("ml", "p", "uid-1", MODEL, BASE, tuple(sorted(S2)))
    cm = build_retune_config_map(r)
    assert cm["immutable"] is True
    back = parse_retune(cm)
    assert back is not None and back.digest == r.digest == digest_of(list(reversed(S2)))
    tampered = build_retune_config_map(r)
    tampered["data"]["untuned.csv"] += S1[0] + "\n"
    assert parse_retune(tampered) is None
    other = RetuneSet("ml", "p", "uid-1", MODEL, "base000002", r.rows)
    assert other.config_map_name != r.config_map_name


def test_the_retune_request_contract_reads_what_it_writes() -> None:
    asked = Retunes().asking("n1", ["NVIDIA-H100"], ["NVIDIA-H100", "NVIDIA-H200"])
    assert asked == Retunes((RetuneRequest("n1", "NVIDIA-H100"),))
    assert Retunes.read(asked.patch()) == asked
    assert asked.nonce_for("NVIDIA-H100") == "n1" and asked.nonce_for("NVIDIA-H200") == ""
    for bad in ("bad nonce!", "{not json", "[]", '{"M": 3, "": "n"}'):
        assert Retunes.read({"metadata": {"annotations": {ANNOTATION: bad}}}) == Retunes()
    assert Retunes.read({"metadata": {}}) == Retunes()
    assert RetuneRequest("n").applies_to("any") and not RetuneRequest("n", "M").applies_to("o")
    # Entry by entry: a malformed one is dropped, the others kept.
    mixed = {"metadata": {"annotations": {ANNOTATION: '{"A": "n1", "B": "bad nonce!"}'}}}
    assert Retunes.read(mixed) == Retunes((RetuneRequest("n1", "A"),))


def test_two_retunes_of_different_models_are_both_kept() -> None:
    """Each writer adds its model's nonce to what it read: the second, reading after the
    first landed (the plugin's write is fenced by resourceVersion), keeps the first's."""
    models = ["A", "B"]
    first = Retunes.read({}).asking("n1", ["A"], models)
    second = Retunes.read(first.patch()).asking("n2", ["B"], models)
    assert (second.nonce_for("A"), second.nonce_for("B")) == ("n1", "n2")
    again = Retunes.read(second.patch()).asking("n3", ["A"], models)
    assert (again.nonce_for("A"), again.nonce_for("B")) == ("n3", "n2")
    every = Retunes.read(again.patch()).asking("n4", models, models)
    assert (every.nonce_for("A"), every.nonce_for("B")) == ("n4", "n4")
    assert Retunes.read(every.patch()).asking("n5", ["A"], ["A"]).nonce_for("B") == ""


def test_the_value_before_one_request_is_still_honoured() -> None:
    """``<nonce>[;<gpu model>]``, as a plugin before per-model entries wrote it."""

    def of(value: str) -> Retunes:
        return Retunes.read({"metadata": {"annotations": {ANNOTATION: value}}})

    assert (of("n1").nonce_for("A"), of("n1").nonce_for("B")) == ("n1", "n1")
    assert (of("n1;A").nonce_for("A"), of("n1;A").nonce_for("B")) == ("n1", "")
    # A retune of one model written over it keeps the other models' request of all.
    merged = of("n1").asking("n2", ["A"], ["A", "B"])
    assert (merged.nonce_for("A"), merged.nonce_for("B")) == ("n2", "n1")
    assert merged.value() == '{"A":"n2","B":"n1"}'


@pytest.mark.parametrize("bad", [{}, {"minIntervalSeconds": 60}])
def test_a_retune_without_a_threshold_is_refused(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="needs misses"):
        CaptureSpec.model_validate({"enabled": True, "retune": bad})


# --- the write from any replica: compare-and-swap --------------------------------------------


def rival_rows(rows: list[str]) -> Any:
    """Another replica's write of these rows into the store (made if missing)."""

    def write(cm: dict[str, Any] | None) -> dict[str, Any]:
        view = parse_store(cm) if cm is not None else StoreView(KEY)
        assert view is not None
        merged, _ = merge(view, Batch(rows), 50, 100)
        return build_store_config_map(merged)

    return write


def writer(core: OneConfigMap) -> Any:
    from tests.support.fake_kube import FakeKube
    from tunefleet.capture.retune_sets import Writer

    return Writer(FakeKube(generated={"core": core}))


def test_concurrent_replicas_lose_no_rows_and_a_known_row_costs_no_write() -> None:
    core = OneConfigMap()
    w = writer(core)
    core.rival = rival_rows([S1[0]])  # the other replica creates the store as we try to
    assert w.add(KEY, Batch((S2[0],)), max_shapes=100, now=NOW) == (1, 2)
    core.rival = rival_rows([S1[1]])  # and writes between our read and our write
    assert w.add(KEY, Batch((S2[1],)), max_shapes=100, now=NOW) == (1, 4)
    view = parse_store(core.cm or {})
    assert view is not None and set(view.rows) == {S1[0], S1[1], S2[0], S2[1]}
    before = core.writes
    assert w.add(KEY, Batch((S2[0],)), max_shapes=100, now=NOW) == (0, 4)
    assert core.writes == before


def test_a_configmap_under_the_stores_name_that_is_not_the_profiles_is_never_written() -> None:
    from tunefleet import kube

    core = OneConfigMap()
    forged = build_store_config_map(StoreView(KEY))
    forged["metadata"]["ownerReferences"] = []
    core.put(forged)
    with pytest.raises(kube.NotOurs, match="not a capture store"):
        writer(core).add(KEY, Batch((S2[0],)), max_shapes=100, now=NOW)


# --- the upload contract (contracts/capture_upload.py) -----------------------------------------


def test_the_upload_contract_reads_what_it_writes_and_refuses_what_it_bounds() -> None:
    from tunefleet.contracts.capture_upload import (
        MAX_ROW_CHARS,
        MAX_ROWS,
        BodyError,
        Reply,
        Upload,
        row_problem,
    )

    up = Upload((S2[0], S2[1]), not_loaded=2, dropped=1)
    assert Upload.decode(up.encode()) == up
    assert Upload.decode(
        b'{"version":1,"rows":["%s","%s"]}' % (S2[0].encode(), S2[0].encode())
    ).rows == (S2[0],)  # a repeat counts once
    for bad, words in [
        (b'{"version":2,"rows":[]}', "version must be 1"),
        (b'{"version":1,"rows":"x"}', "rows must be a list"),
        (b'{"version":1,"rows":[],"dropped":-1}', "non-negative"),
        (b'{"version":1,"rows":[],"notLoaded":true}', "non-negative"),
        (b"[1]", "JSON object"),
    ]:
        with pytest.raises(BodyError, match=words):
            Upload.decode(bad)
    with pytest.raises(BodyError, match=f"at most {MAX_ROWS} rows"):
        Upload(tuple(S2[:1]) * (MAX_ROWS + 1)).encode()
    assert row_problem("GemmTunableOp_BFloat16_TN,tn_*_64_64_ld_64_64_*") is None  # wildcards
    assert row_problem("a b,c") and row_problem("onlyone") and row_problem(3)
    assert row_problem("G," + "1" * MAX_ROW_CHARS)
    reply = Reply(accepted=3, new=1, message="ok", retry_after=2.5)
    assert Reply.decode(reply.encode()) == reply
    assert Reply.decode(b"<html>bad gateway</html>").message.startswith("<html>")
