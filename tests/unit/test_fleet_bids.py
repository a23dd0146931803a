"""Claims on a store with no conditional write (fleet/bids.py: oci://), made from time.

The decision is pure and tested as a table; the protocol is tested by simulation: contenders
with skewed clocks and slow writes bid on one board, whose notes show only once written, and
at no moment do two of them hold the claim. The same simulation with skew beyond the window
does let two hold: the window is what keeps them apart (a test that can fail). The simulator is
testbed/bids_sim.py, which the `bids` benchmark runs too (the docs quote its figures)."""

from __future__ import annotations

import json
import random
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from testbed.bids_sim import GROUP, IDENTITY, SETTLE, TTL, Board, bid, holder
from testbed.bids_sim import simulate as _simulate
from testbed.builders.wrappers import make_profile
from tests.support.artifacts import KEYED, signing_dir, tuner_output
from tests.support.fake_kube import RECONCILE_WRITERS, FakeKube
from tunefleet import naming
from tunefleet.artifacts.publish import sign_manifest, upload_artifact
from tunefleet.config import Config
from tunefleet.contracts.artifact_record import ArtifactRecord
from tunefleet.contracts.fleet import (
    DEFAULT_SETTLE_SECONDS,
    MAX_CLAIM_SECONDS,
    Claim,
    Holder,
    published_key,
)
from tunefleet.fleet import adopt, bids, coordinate
from tunefleet.fleet.bids import Move
from tunefleet.reconciler import apply
from tunefleet.reconciler.memory import Memory
from tunefleet.reconciler.reconcile import Around, sync_profile
from tunefleet.storage import oci
from tunefleet.storage.filesystem import DirStore
from tunefleet.storage.registry import parse_uri
from tunefleet.storage.store import Listed, StoreError, swappable
from tunefleet.watched.views import profile_view
from tuner_job.manifest import ImageRef

A, B, C = holder("a"), holder("b"), holder("c", "c2")


@pytest.mark.parametrize(
    ("found", "now", "move", "about"),
    [
        ([], 100.0, Move.BID, None),
        ([bid(A, 10.0, 50.0)], 100.0, Move.BID, None),  # ours, expired: bid afresh
        ([bid(B, 10.0, 50.0)], 100.0, Move.BID, None),  # another's, expired
        ([bid(A, 98.0)], 100.0, Move.SETTLE, A),
        ([bid(A, 90.0)], 100.0, Move.HOLD, A),
        ([bid(A, 90.0, 200.0)], 100.0, Move.RENEW, A),  # under half its life left
        ([bid(A, 90.0), bid(B, 80.0)], 100.0, Move.WAIT, B),
        ([bid(A, 90.0), bid(B, 95.0)], 100.0, Move.HOLD, A),
        ([bid(A, 99.0), bid(B, 99.5)], 100.0, Move.SETTLE, A),
        ([bid(B, 99.0)], 100.0, Move.WAIT, B),  # unsettled bids are waited on too
        ([bid(B, 80.0, 99.0), bid(A, 90.0)], 100.0, Move.HOLD, A),
        # One no cluster could set (expiring past MAX_CLAIM_SECONDS) is not obeyed.
        ([bid(B, 1.0, 100.0 + MAX_CLAIM_SECONDS + 1)], 100.0, Move.BID, None),
    ],
)
def test_the_earliest_live_bid_holds_once_it_has_stood_for_the_window(
    found: list[Claim], now: float, move: Move, about: Holder | None
) -> None:
    got, which = bids.decide(found, A, now, TTL, SETTLE)
    assert got is move
    assert (which.holder if which else None) == about


def test_a_tie_in_time_goes_to_the_same_holder_whoever_reads() -> None:
    found = [bid(A, 90.0), bid(C, 90.0)]
    first = min((A, C), key=bids.member)
    other = C if first == A else A
    assert bids.decide(found, first, 100.0, TTL, SETTLE)[0] is Move.HOLD
    assert bids.decide(found, other, 100.0, TTL, SETTLE) == (
        Move.WAIT,
        found[0 if first == A else 1],
    )


def test_no_two_contenders_ever_hold_when_skew_and_writes_fit_the_window() -> None:
    rng = random.Random(42)
    # Skew up to a third of the window, writes up to its half (slower ones are taken down).
    assert max(_simulate(rng, SETTLE / 3, SETTLE * 0.8)[0] for _ in range(400)) == 1


def test_skew_beyond_the_window_lets_two_hold() -> None:
    rng = random.Random(7)
    # A slow listing then posts a bid that, by its clock, was taken before one that settled.
    assert max(_simulate(rng, SETTLE * 4, 0.1, reads=10.0)[0] for _ in range(400)) >= 2


def test_clusters_with_windows_of_60s_and_1s_never_both_hold() -> None:
    rng = random.Random(54)
    # At zero skew, writes up to 0.8 of each one's window (a 60 s cluster's over 30 s are
    # taken down): slow 60 s bids may keep one another off for the whole run, never two hold.
    assert max(_simulate(rng, 0.0, 0.0, windows=(60.0, 1.0))[0] for _ in range(400)) == 1


def test_a_ghost_bid_taken_at_0_makes_nobody_wait_and_no_two_hold() -> None:
    rng = random.Random(5)
    runs = [_simulate(rng, SETTLE / 3, SETTLE * 0.8, ghost=True) for _ in range(400)]
    assert max(most for most, _ in runs) == 1
    assert all(held for _, held in runs)  # none waits on the ghost till it expires, a day on


def test_a_ghost_there_before_anyone_looked_stands_minutes_not_its_day() -> None:
    """`taken: 0`, a day's expiry, and a `renewed` as fresh as the first look: obeyed at
    first (it might be a holder), but never renewed, so every contender stops waiting on it
    LIVE_SECONDS after that post, and still no two hold, with windows of 60 s and 1 s too
    (slow 60 s bids may keep one another off for a whole run there, so only `most` counts)."""
    rng = random.Random(11)
    runs = [_simulate(rng, SETTLE / 3, SETTLE * 0.8, ghost_first=True) for _ in range(400)]
    assert max(most for most, _ in runs) == 1
    assert all(held for _, held in runs)
    mixed = [_simulate(rng, 0.0, 0.0, windows=(60.0, 1.0), ghost_first=True) for _ in range(400)]
    assert max(most for most, _ in mixed) == 1


def test_a_bid_not_posted_again_within_the_liveness_bound_is_no_claim() -> None:
    # Renewed at 1000 with a day to run: stands until 1000 + LIVE_SECONDS, then not.
    stale = replace(bid(B, 0.0, 86400.0), renewed=1000.0)
    assert bids.decide([stale], A, 1000.0 + bids.LIVE_SECONDS - 1, TTL, SETTLE)[0] is Move.WAIT
    assert bids.decide([stale], A, 1000.0 + bids.LIVE_SECONDS, TTL, SETTLE)[0] is Move.BID
    # A bid of an earlier release (no `renewed`) counts from its `taken`.
    assert bids.decide([bid(B, 0.0, 86400.0)], A, bids.LIVE_SECONDS, TTL, SETTLE)[0] is Move.BID
    # A holder renews at least every RENEW_EVERY_SECONDS, whatever its claim's life.
    day = 86400.0
    mine = replace(bid(A, 0.0, day), renewed=0.0)
    assert bids.decide([mine], A, 299.0, day, SETTLE)[0] is Move.HOLD
    assert bids.decide([mine], A, 300.0, day, SETTLE)[0] is Move.RENEW


def test_a_renewed_that_is_not_between_taken_and_expires_is_no_bid() -> None:
    for renewed in (-1.0, 5.0, 700.0, "x"):
        doc = json.loads(replace(bid(A, 10.0), renewed=20.0).to_bytes())
        doc["renewed"] = renewed
        assert Claim.from_bytes(json.dumps(doc).encode(), IDENTITY) is None
    assert Claim.from_bytes(replace(bid(A, 10.0), renewed=20.0).to_bytes(), IDENTITY) == replace(
        bid(A, 10.0), renewed=20.0
    )


def test_a_60s_bid_written_slowly_does_not_take_the_claim_a_1s_bid_settled() -> None:
    """At zero skew: the 60 s cluster's bid, taken at 0, takes 10 s to write (under its 30 s
    bound); the 1 s cluster's, taken at 2, settles at 3 before it shows. Queued by `taken`
    alone the 60 s bid is first and holds at 60: two hold."""
    board = Board(now=0.0, latency=10.0)
    slow = bids.Sightings()
    ticks = iter((0.0, 10.0))
    assert apply.bid(
        board, GROUP, IDENTITY, A, (0.0, TTL, 60.0), bids.Reader(ticks.__next__, slow)
    ).settling
    board.now, board.latency = 2.0, 0.1
    fast = bids.Sightings()
    ticks = iter((2.0, 2.1))
    assert apply.bid(
        board, GROUP, IDENTITY, C, (2.0, TTL, 1.0), bids.Reader(ticks.__next__, fast)
    ).settling
    board.now = 3.1  # A's bid shows at 10 (written then), not yet
    assert apply.bid(board, GROUP, IDENTITY, C, (3.1, TTL, 1.0), bids.Reader(seen=fast)).held
    board.now = 61.0
    waits = apply.bid(board, GROUP, IDENTITY, A, (61.0, TTL, 60.0), bids.Reader(seen=slow))
    assert not waits.held and waits.claim.holder == C


def test_a_bid_already_standing_at_the_first_look_is_obeyed_but_jumps_no_later_bid() -> None:
    board = Board(now=0.0)
    held = replace(bid(B, 0.0, 7300.0), renewed=7000.0)  # held two hours, renewed since
    board.post(GROUP, bids.member(B), held.to_bytes())
    board.now = 7200.0
    seen = bids.Sightings()
    waits = apply.bid(board, GROUP, IDENTITY, A, (7200.0, TTL, SETTLE), bids.Reader(seen=seen))
    assert not waits.held and waits.claim.holder == B
    # Seen first at 7200 with `taken` 0: it queues no earlier than 7200 - the bound, behind
    # a bid taken since (here C's, 10 s before our look).
    found = [held, bid(C, 7190.0)]
    _, floor = seen.place(GROUP, found, 7200.0)
    assert floor[bids.member(B)] == 7200.0 - bids.SKEW_BOUND_SECONDS
    assert bids.decide(found, C, 7200.0, TTL, SETTLE, floor)[0] is Move.WAIT  # B: 7140
    # C's, seen since we watched, taken before B's floor: C's is first.
    late = [held, bid(C, 7100.0)]
    only_b = {bids.member(B): floor[bids.member(B)]}
    assert bids.decide(late, C, 7200.0, TTL, SETTLE, only_b)[0] is Move.HOLD


def test_a_bid_that_shows_with_an_old_taken_while_we_watch_is_a_ghost() -> None:
    seen = bids.Sightings()
    assert seen.place(GROUP, [], 100.0) == ([], {})
    ghost, fresh = bid(B, 0.0, 5000.0), bid(C, 150.0)
    kept, _ = seen.place(GROUP, [ghost, fresh], 200.0)
    assert kept == [fresh]
    kept, _ = seen.place(GROUP, [ghost, fresh], 300.0)  # renewed or not, still a ghost
    assert kept == [fresh]


def test_a_bid_carries_its_window_and_one_of_the_last_release_stood_for_the_default() -> None:
    mine = Claim(IDENTITY, A, 1.0, 2.0, 60.0)
    assert json.loads(mine.to_bytes())["settle"] == 60.0
    assert Claim.from_bytes(mine.to_bytes(), IDENTITY) == mine
    old = json.loads(mine.to_bytes())
    del old["settle"]
    read = Claim.from_bytes(json.dumps(old).encode(), IDENTITY)
    assert read is not None and read.settle is None and read.window == DEFAULT_SETTLE_SECONDS
    for odd in (0, -1, 61, "5", True):
        assert Claim.from_bytes(json.dumps({**old, "settle": odd}).encode(), IDENTITY) is None
    # A claim swapped in place (s3://) carries none, as before.
    assert "settle" not in json.loads(Claim(IDENTITY, A, 1.0, 2.0).to_bytes())


def test_a_waiting_bidder_takes_its_bid_down_and_a_release_ends_the_claim() -> None:
    board = Board(now=0.0, latency=1.0)  # A's bid shows at 1.0: B, at 0.5, bids too
    clock = iter((0.0, 1.0))
    first = apply.bid(
        board, GROUP, IDENTITY, A, (0.0, TTL, SETTLE), bids.Reader(lambda: next(clock))
    )
    assert not first.held and first.settling == SETTLE
    board.now, board.latency = 0.5, 0.0
    clock = iter((0.5, 0.5))
    assert apply.bid(
        board, GROUP, IDENTITY, B, (0.5, TTL, SETTLE), bids.Reader(lambda: next(clock))
    ).settling
    board.now = 6.0
    assert apply.bid(board, GROUP, IDENTITY, A, (6.0, TTL, SETTLE)).held
    waits = apply.bid(board, GROUP, IDENTITY, B, (6.5, TTL, SETTLE))
    assert not waits.held and waits.claim.holder == A and waits.settling == 0
    assert "TuningProfile ml/a" in waits.waiting_words(6.5)
    board.now = 7.0
    notes = [Claim.from_bytes(n, IDENTITY) for n in board.notes(GROUP, 1 << 14)]
    assert notes == [replace(bid(A, 0.0), settle=SETTLE, renewed=0.0)]
    apply.give_back(board, GROUP, IDENTITY, A, 8.0)  # type: ignore[arg-type]
    board.now = 9.0
    assert board.notes(GROUP, 1 << 14) == []


def test_a_bid_whose_write_was_slow_is_taken_down() -> None:
    board = Board(now=0.0, latency=3.0)
    clock = iter((0.0, 3.0))
    with pytest.raises(StoreError, match="over half"):
        apply.bid(board, GROUP, IDENTITY, A, (0.0, TTL, SETTLE), bids.Reader(lambda: next(clock)))
    board.now = 10.0
    assert board.notes(GROUP, 1 << 14) == []


def test_notes_that_are_not_bids_on_the_identity_are_not_obeyed() -> None:
    board = Board(now=0.0)
    board.post(GROUP, "x", b"not json")
    board.post(GROUP, "y", Claim("b" * 64, B, 0.0, TTL).to_bytes())
    board.now = 1.0
    assert apply.bid(board, GROUP, IDENTITY, A, (1.0, TTL, SETTLE)).settling == SETTLE


# --- the reconcile on a store that has a board and no swap (oci://'s contract) ---------------

MODEL = "AMD_Instinct_MI300X_OAM"
IMAGE = "registry.example.com/serve@sha256:" + "a" * 64
LOCATION = parse_uri("s3://bkt/fleet")


class BoardDir:
    """A directory store without the swap (as a registry): Store by delegation, a board of
    files beside it."""

    def __init__(self, root: Path) -> None:
        self.objects = DirStore(LOCATION, root / "objects")
        self.root = root / "board"

    def _path(self, group: str, member: str) -> Path:
        return self.root / group.replace("/", "_") / member.replace("/", "_")

    def post(self, group: str, member: str, data: bytes) -> None:
        self._path(group, member).parent.mkdir(parents=True, exist_ok=True)
        self._path(group, member).write_bytes(data)

    def notes(self, group: str, max_bytes: int) -> list[bytes]:
        where = self.root / group.replace("/", "_")
        return [p.read_bytes() for p in sorted(where.glob("*"))] if where.is_dir() else []

    def unpost(self, group: str, member: str) -> None:
        self._path(group, member).unlink(missing_ok=True)

    def put_if_absent(self, key: str, data: bytes, content_type: str) -> bool:
        return self.objects.put_if_absent(key, data, content_type)

    def put(self, key: str, data: bytes, content_type: str) -> None:
        self.objects.put(key, data, content_type)

    def get(self, key: str, max_bytes: int) -> bytes:
        return self.objects.get(key, max_bytes)

    def list(self, prefix: str, limit: int) -> list[Listed]:
        return self.objects.list(prefix, limit)

    def delete(self, key: str) -> None:
        self.objects.delete(key)

    def uri(self, key: str) -> str:
        return self.objects.uri(key)


def test_on_a_board_one_profile_bids_settles_and_tunes_the_other_waits_then_adopts(
    tmp_path: Path,
) -> None:
    board = BoardDir(tmp_path)
    assert swappable(board) is None and coordinate.coordinates(board)  # type: ignore[arg-type]
    fleet = Config(image="tunefleet:1", fleet=True, fleet_settle_seconds=0.2)
    base = (
        make_profile("p", "ml").uid("uid-p").generation(1)
        .image(IMAGE).gpu("amd", MODEL).storage("s3://bkt/fleet", signing=KEYED)
    )  # fmt: skip
    p = profile_view(base.obj())
    q = profile_view(base.name("q").namespace("serve").uid("uid-q").obj())
    mem_p, mem_q = Memory(), Memory()

    def sync(prof: dict[str, Any], cluster: str, memory: Memory) -> tuple[Any, FakeKube]:
        api = FakeKube(writers=RECONCILE_WRITERS)
        config = replace(fleet, fleet_cluster=cluster)
        around = Around(api, open_store=lambda location, options: board)
        out = sync_profile(prof, [], [], config, memory, around)
        return out, api

    first, api = sync(p, "cluster-a", mem_p)  # p bids: no Job while its bid stands
    assert [k for k, _ in api.created if k == "Job"] == [] and first.status.to_status()[
        "phase"
    ] == "Queued"
    assert "bids to tune this identity" in json.dumps(first.status.to_status()["conditions"])
    assert first.requeue_after is not None and first.requeue_after <= 0.2
    waiting, api = sync(q, "cluster-b", mem_q)  # q sees p's bid: waits, bids nothing
    assert [k for k, _ in api.created if k == "Job"] == [] and waiting.status.to_status()[
        "phase"
    ] == "Queued"
    assert "ml/p in cluster cluster-a" in json.dumps(waiting.status.to_status()["conditions"])
    assert len(board.notes(next(iter(_groups(board))), 1 << 14)) == 1

    time.sleep(0.25)
    tuned, api = sync(
        {**p, "status": first.status.to_status()}, "cluster-a", mem_p
    )  # settled: tunes
    assert [k for k, _ in api.created if k == "Job"] == ["Job"]
    assert MODEL in mem_p.of("uid-p").claims

    # p's artifact served: published as the identity's entry, and p's bid taken down.
    done = _served({**p, "status": tuned.status.to_status()}, board, tmp_path)
    sync(done, "cluster-a", mem_p)
    assert all(not board.notes(g, 1 << 14) for g in _groups(board))
    adopted, api = sync({**q, "status": waiting.status.to_status()}, "cluster-b", mem_q)
    assert [k for k, _ in api.created if k == "Job"] == [] and adopted.status.to_status()[
        "phase"
    ] == "Ready"
    art = adopted.status.to_status()["artifacts"][0]
    assert art["sha256"] == done["status"]["artifacts"][0]["sha256"]
    assert art["source"]["cluster"] == "cluster-a"


def _groups(board: BoardDir) -> list[str]:
    return [d.name for d in board.root.iterdir()] if board.root.is_dir() else []


def _served(p: dict[str, Any], board: BoardDir, tmp_path: Path) -> dict[str, Any]:
    """p once its Job published: the artifact in the store (its manifest binding p's identity,
    signed with the fleet's key), and served."""
    spec = make_profile().spec_is(p["spec"]).spec_model()
    manifest = tuner_output(
        tmp_path / "out",
        gpu_model=MODEL,
        image=ImageRef(reference=IMAGE, id=""),
        fleet_identity=naming.identity_document(spec, MODEL),
    )
    results = (tmp_path / "out" / "results.csv").read_bytes()
    pub = upload_artifact(board.objects, LOCATION, results, manifest)
    pub = sign_manifest(board.objects, LOCATION, pub, signing_dir(tmp_path))
    record = ArtifactRecord.from_manifest(
        pub.manifest, uri=pub.uri, manifest_sha256=pub.manifest_sha256
    ).for_job(gpu_model=MODEL, revision=p["status"]["revision"], job="tune-p-1", image_id="")
    return {**p, "status": {**p["status"], "artifacts": [record.to_status()]}}


def test_a_bid_standing_when_the_entry_is_published_is_taken_down_as_the_profile_adopts(
    tmp_path: Path,
) -> None:
    """The holder published and released just after this profile found no entry: it bid.
    On its next pass the entry is there: it adopts, and its bid does not stand on."""
    board = BoardDir(tmp_path)
    config = Config(image="tunefleet:1", fleet=True, fleet_cluster="cluster-b")
    prof = make_profile("q", "serve").uid("uid-q").generation(1).image(IMAGE)
    q = profile_view(prof.gpu("amd", MODEL).storage("s3://bkt/fleet", signing=KEYED).obj())
    memory = Memory()
    around = Around(FakeKube(writers=RECONCILE_WRITERS), open_store=lambda loc, opts: board)
    first = sync_profile(q, [], [], config, memory, around)
    assert first.status.to_status()["phase"] == "Queued" and any(
        board.notes(g, 1 << 14) for g in _groups(board)
    )

    served = _served({**q, "status": first.status.to_status()}, board, tmp_path)
    record = ArtifactRecord.from_status(served["status"]["artifacts"][0])
    assert record is not None
    spec = make_profile().spec_is(q["spec"]).spec_model()
    ident = naming.fleet_identity(spec, MODEL)
    assert ident is not None
    them = Holder("cluster-a", "ml", "p", "uid-p")
    entry = adopt.entry_for(record, ident, them, "2026-12-06T00:00:00Z")
    assert apply.publish_entry(board, published_key(LOCATION, MODEL, ident), entry, spec, ())  # type: ignore[arg-type]

    around = Around(FakeKube(writers=RECONCILE_WRITERS), open_store=lambda loc, opts: board)
    again = sync_profile({**q, "status": first.status.to_status()}, [], [], config, memory, around)
    assert again.status.to_status()["phase"] == "Ready", again.status
    assert all(not board.notes(g, 1 << 14) for g in _groups(board))


# --- odd notes and endless listings on a registry (issue 54) ----------------------------------


class _Resp:
    """What OciStore reads of a registry's answer: a body streamed in chunks, or JSON."""

    def __init__(self, body: bytes = b"", doc: Any = None, link: str = "") -> None:
        self.status_code, self.body, self.doc = 200, body, doc
        self.headers = {"Link": link} if link else {}

    def iter_content(self, size: int) -> Any:
        for i in range(0, len(self.body), size):
            yield self.body[i : i + size]

    def json(self) -> Any:
        return self.doc

    def close(self) -> None:
        pass


class NoteRegistry(oci.OciStore):
    """Notes' manifests in memory; their blobs served through the real OciStore.blob, as the
    registry streams them, whatever size the manifest gave."""

    def __init__(self) -> None:
        self.location = parse_uri("oci://registry.example.com/team/tf")
        self.host, self.repository = "registry.example.com", "team/tf"
        self.docs: dict[str, Any] = {}
        self.blobs: dict[str, bytes] = {}
        self.client = self

    def put_note(self, member: str, data: bytes, size: int | None = None) -> None:
        digest = oci.digest_of(data)
        self.blobs[digest] = data
        layer = {"digest": digest, "size": len(data) if size is None else size}
        annotations = {oci.KEY_ANNOTATION: GROUP, oci.NOTE_MEMBER_ANNOTATION: member}
        self.docs[oci.note_tag(GROUP, member)] = {"annotations": annotations, "layers": [layer]}

    def tags(self, prefix: str = "") -> list[str]:
        return sorted(t for t in self.docs if t.startswith(prefix))

    def manifest(self, reference: str) -> tuple[dict[str, Any], str] | None:
        doc = self.docs.get(reference)
        return (doc, "sha256:" + "0" * 64) if doc is not None else None

    def do_request(self, url: str, method: str, **kw: Any) -> _Resp:
        return _Resp(self.blobs[url.rsplit("/", 1)[-1]])


def test_a_note_that_understates_its_size_is_skipped_and_the_other_bids_are_read(
    caplog: pytest.LogCaptureFixture,
) -> None:
    reg = NoteRegistry()
    good = bid(A, 90.0)
    reg.put_note(bids.member(A), good.to_bytes())
    # Its manifest says 300 bytes; its blob is 17 KiB (over MAX_BYTES), or just over 300.
    reg.put_note(bids.member(B), b"{" + b" " * (17 << 10) + b"}", size=300)
    reg.put_note(bids.member(C), bid(C, 80.0).to_bytes() + b" " * 400, size=300)
    assert bids.read(reg, GROUP, IDENTITY) == [good]
    assert caplog.text.count("larger than its manifest says") == 2


class EndlessTags(oci.OciStore):
    """A registry whose tag listing links back to itself forever (a loop, or a huge one)."""

    def __init__(self) -> None:
        self.location = parse_uri("oci://registry.example.com/team/tf")
        self.host, self.repository = "registry.example.com", "team/tf"
        self.client = self
        self.pages = 0

    def do_request(self, url: str, method: str, **kw: Any) -> _Resp:
        self.pages += 1
        assert self.pages < 100_000, "the listing never ends"
        tags = [f"n-{self.pages:08d}-{i:04d}" for i in range(self.page_size)]
        return _Resp(doc={"tags": tags}, link="</v2/team/tf/tags/list?n=1000&last=x>")


def test_a_tag_listing_that_never_ends_is_cut_at_the_cap_and_says_so() -> None:
    reg = EndlessTags()
    with pytest.raises(StoreError, match=r"listing .* was cut"):
        reg.tags()
    assert reg.pages <= oci.MAX_TAGS // reg.page_size + 1
    # A claim read through it waits, saying why, rather than deciding on half the bids.
    with pytest.raises(StoreError, match="was cut"):
        bids.read(reg, GROUP, IDENTITY)
