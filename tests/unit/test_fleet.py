"""Fleet mode (fleet/, docs/fleet.md): the store's conditional writes, claims, published entries,
and sync_profile adopting, waiting, tuning and publishing across profiles and clusters that
share one store. The store is a real directory store standing where the profiles' s3:// bucket
is (the same keys, create-if-absent and compare-and-swap semantics); the API is FakeKube."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from testbed.builders.wrappers import make_job, make_profile
from tests.support.artifacts import KEYED, signing_dir, tuner_output
from tests.support.fake_kube import RECONCILE_WRITERS, FakeKube
from tunefleet import naming
from tunefleet.api import TuningProfileSpec
from tunefleet.artifacts import signing
from tunefleet.artifacts.publish import sign_manifest, upload_artifact
from tunefleet.config import Config
from tunefleet.contracts import fleet as contract
from tunefleet.contracts.artifact_record import ArtifactRecord
from tunefleet.fleet import claims
from tunefleet.fleet.claims import Step
from tunefleet.reconciler import apply
from tunefleet.reconciler.memory import Memory
from tunefleet.reconciler.reconcile import Around, sync_profile
from tunefleet.storage import s3
from tunefleet.storage.filesystem import DirStore
from tunefleet.storage.registry import parse_uri
from tunefleet.storage.store import Location, NotFoundError, Store, StoreOptions, swappable
from tunefleet.watched.views import profile_view
from tuner_job.gain import Figure, Gain
from tuner_job.manifest import ImageRef

MODEL = "AMD_Instinct_MI300X_OAM"
DIGEST = "sha256:" + "a" * 64
IMAGE = f"registry.example.com/serve@{DIGEST}"
CLUSTER_A = "11111111-aaaa-4aaa-8aaa-111111111111"
CLUSTER_B = "22222222-bbbb-4bbb-8bbb-222222222222"
FLEET_A = Config(image="tunefleet:1", fleet=True, fleet_cluster=CLUSTER_A)
FLEET_B = replace(FLEET_A, fleet_cluster=CLUSTER_B)
# Fleet adoption needs the adopter's key (a signature by it, whatever the policy): every
# profile that shares here signs and verifies with the one pair (KEYED).
UNKEYED = (
    make_profile("p", "ml").uid("uid-p").generation(1)
    .image(IMAGE).gpu("amd", MODEL).storage("s3://bkt/fleet")
)  # fmt: skip
BASE = UNKEYED.storage("s3://bkt/fleet", signing=KEYED)
LOCATION = parse_uri("s3://bkt/fleet")


def dir_store(tmp_path: Path, loc: Location = LOCATION) -> DirStore:
    return DirStore(loc, tmp_path / loc.bucket)


def opener(tmp_path: Path) -> Any:
    """The bucket as a directory: what the fleet step opens instead of S3."""

    def open_store(location: Location, options: StoreOptions) -> Store:
        return dir_store(tmp_path, location)

    return open_store


def sync(
    p: dict[str, Any],
    tmp_path: Path,
    config: Config,
    memory: Memory,
    jobs: Any = (),
    existing: set[str] | None = None,
) -> tuple[dict[str, Any], FakeKube]:
    api = FakeKube(writers=RECONCILE_WRITERS, existing=existing)
    out = sync_profile(p, list(jobs), [], config, memory, Around(api, open_store=opener(tmp_path)))
    return out.status.to_status(), api


signing_secret = signing_dir


def identity(p: dict[str, Any], model: str = MODEL) -> str:
    found = naming.fleet_identity(make_profile().spec_is(p["spec"]).spec_model(), model)
    assert found is not None
    return found


def claim_of(tmp_path: Path, p: dict[str, Any]) -> contract.Claim | None:
    store = dir_store(tmp_path)
    key = contract.claim_key(LOCATION, MODEL, identity(p))
    return contract.Claim.from_bytes(store.get(key, 1 << 14), identity(p))


def spec_of(p: dict[str, Any]) -> TuningProfileSpec:
    return make_profile().spec_is(p["spec"]).spec_model()


SAME: Any = object()  # served_by_p's identity: the document p's own spec makes


def served_by_p(
    tmp_path: Path,
    p: dict[str, Any],
    image: str = IMAGE,
    signing_key: Path | Any | None = SAME,
    identity: dict[str, Any] | Any | None = SAME,
    gain: Gain | None = None,
) -> dict[str, Any]:
    """p's status once its tuning Job published: the artifact uploaded to the bucket (its
    manifest holding `identity`, by default what p's spec makes, as publish writes it from the
    tuning ConfigMap; signed with the key pair in `signing_key`, by default the fleet's
    (None: unsigned)), and served (the record its Job reported, as the operator keeps it)."""
    if identity is SAME:
        identity = naming.identity_document(spec_of(p), MODEL)
    if signing_key is SAME:
        signing_key = signing_secret(tmp_path)
    manifest = tuner_output(
        tmp_path / "out",
        gpu_model=MODEL,
        image=ImageRef(reference=image, id=""),
        fleet_identity=identity,
        gain=gain,
    )
    results = (tmp_path / "out" / "results.csv").read_bytes()
    pub = upload_artifact(dir_store(tmp_path), LOCATION, results, manifest)
    pub = sign_manifest(dir_store(tmp_path), LOCATION, pub, signing_key)
    record = ArtifactRecord.from_manifest(
        pub.manifest, uri=pub.uri, manifest_sha256=pub.manifest_sha256
    ).for_job(gpu_model=MODEL, revision=p["status"]["revision"], job="tune-p-1", image_id="")
    return {**p, "status": {**p["status"], "artifacts": [record.to_status()]}}


# --- the store's conditional writes ---------------------------------------------------------


def test_create_is_won_by_exactly_one_of_many_writers_at_once(tmp_path: Path) -> None:
    store = dir_store(tmp_path)
    wins: list[int] = []
    barrier = threading.Barrier(8)

    def write(i: int) -> None:
        barrier.wait()
        if store.create("fleet/k/claim.json", f"{i}".encode(), "text/plain"):
            wins.append(i)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(wins) == 1
    assert store.get("fleet/k/claim.json", 10) == f"{wins[0]}".encode()


def test_replace_if_takes_only_the_version_read(tmp_path: Path) -> None:
    store = dir_store(tmp_path)
    assert store.create("k", b"one", "text/plain")
    first = store.read_tagged("k", 10)
    assert store.replace_if("k", b"two", "text/plain", first.tag)
    assert not store.replace_if("k", b"three", "text/plain", first.tag)  # stale version
    assert store.get("k", 10) == b"two"
    assert not store.replace_if("gone", b"x", "text/plain", first.tag)  # nothing there
    assert not store.create("k", b"four", "text/plain")
    assert [o.key for o in store.list("", 10)] == ["k"]  # the lock file is not an object


def test_only_stores_that_can_swap_are_used_for_claims(tmp_path: Path) -> None:
    assert swappable(dir_store(tmp_path)) is not None

    class ReadOnly:
        def get(self, key: str, max_bytes: int) -> bytes:
            return b""

    assert swappable(ReadOnly()) is None  # type: ignore[arg-type]


# --- claims ---------------------------------------------------------------------------------

ME = contract.Holder(CLUSTER_A, "ml", "p", "uid-p")
THEM = contract.Holder(CLUSTER_B, "serve", "llama", "uid-q")
IDENT = "c" * 64


@pytest.mark.parametrize(
    ("found", "unreadable", "now", "want"),
    [
        (None, False, 100.0, Step.TAKE),
        (None, True, 100.0, Step.TAKE_OVER),  # garbage is never obeyed
        (contract.Claim(IDENT, ME, 0, 700), False, 100.0, Step.HOLD),
        (contract.Claim(IDENT, ME, 0, 350), False, 100.0, Step.RENEW),  # past half its time
        (contract.Claim(IDENT, THEM, 0, 700), False, 100.0, Step.WAIT),
        (contract.Claim(IDENT, THEM, 0, 100), False, 100.0, Step.TAKE_OVER),  # expired
        # The same profile name made again is another holder: its uid differs.
        (contract.Claim(IDENT, replace(ME, uid="uid-p2"), 0, 700), False, 100.0, Step.WAIT),
    ],
)
def test_what_a_profile_does_about_the_claim_it_finds(
    found: contract.Claim | None, unreadable: bool, now: float, want: Step
) -> None:
    assert claims.step(found, unreadable, ME, now, 600.0) is want


def test_a_claim_is_taken_held_renewed_waited_on_and_taken_over_after_expiry(
    tmp_path: Path,
) -> None:
    store = dir_store(tmp_path)
    key = "fleet/_fleet/M/" + IDENT + "/claim.json"
    taken = apply.swap_claim(store, key, IDENT, ME, 1000.0, 600.0)
    assert taken.held and taken.claim.expires == 1600.0
    assert apply.swap_claim(store, key, IDENT, ME, 1100.0, 600.0).claim.expires == 1600.0  # held
    renewed = apply.swap_claim(store, key, IDENT, ME, 1400.0, 600.0)
    assert renewed.held and renewed.claim.expires == 2000.0 and renewed.claim.taken == 1000.0
    waiting = apply.swap_claim(store, key, IDENT, THEM, 1500.0, 600.0)
    assert not waiting.held and waiting.claim.holder == ME
    assert "ml/p in cluster " + CLUSTER_A in waiting.waiting_words(1500.0)
    over = apply.swap_claim(store, key, IDENT, THEM, 2000.0, 600.0)  # ME died: expired
    assert over.held and over.claim.holder == THEM
    assert not apply.swap_claim(store, key, IDENT, ME, 2001.0, 600.0).held  # ME is back: waits


def test_a_released_claim_is_taken_at_once_and_only_its_holder_releases_it(
    tmp_path: Path,
) -> None:
    store = dir_store(tmp_path)
    key = "k/claim.json"
    apply.swap_claim(store, key, IDENT, ME, 1000.0, 600.0)
    assert not apply.swap_release(store, key, IDENT, THEM, 1010.0)  # not theirs to release
    assert apply.swap_release(store, key, IDENT, ME, 1010.0)
    assert apply.swap_claim(store, key, IDENT, THEM, 1011.0, 600.0).held


def test_of_many_profiles_claiming_at_once_exactly_one_holds(tmp_path: Path) -> None:
    store = dir_store(tmp_path)
    holders = [replace(THEM, uid=f"uid-{i}") for i in range(6)]
    held: list[contract.Holder] = []
    barrier = threading.Barrier(len(holders))

    def go(h: contract.Holder) -> None:
        barrier.wait()
        if apply.swap_claim(store, "k/claim.json", IDENT, h, 1000.0, 600.0).held:
            held.append(h)

    threads = [threading.Thread(target=go, args=(h,)) for h in holders]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(held) == 1


def test_forged_claims_and_entries_are_not_taken_for_what_they_say(tmp_path: Path) -> None:
    good = contract.Claim(IDENT, ME, 1.0, 2.0).to_bytes()
    assert contract.Claim.from_bytes(good, IDENT) == contract.Claim(IDENT, ME, 1.0, 2.0)
    assert contract.Claim.from_bytes(good, "d" * 64) is None  # another identity's
    doc = json.loads(good)
    for bad in (
        {**doc, "expires": "never"},
        {**doc, "expires": True},
        {**doc, "holder": {**doc["holder"], "namespace": "Not A Name"}},
        {**doc, "version": 2},
    ):
        assert contract.Claim.from_bytes(json.dumps(bad).encode(), IDENT) is None
    assert contract.Claim.from_bytes(b"\xff not json", IDENT) is None
    with pytest.raises(ValueError, match="fleet identity"):
        contract.claim_key(LOCATION, MODEL, "../../escape")


# --- identities -----------------------------------------------------------------------------


def test_the_fleet_identity_is_the_image_digest_and_what_shapes_tuning() -> None:
    spec = BASE.spec_model()
    ident = naming.fleet_identity(spec, MODEL)
    assert ident is not None and len(ident) == 64
    mirror = BASE.image(f"mirror.example.org/team/serve@{DIGEST}").spec_model()
    assert naming.fleet_identity(mirror, MODEL) == ident  # the same image, another name
    assert naming.fleet_identity(spec, "AMD_Instinct_MI325X_OAM") != ident
    other = BASE.image("registry.example.com/serve@sha256:" + "b" * 64).spec_model()
    assert naming.fleet_identity(other, MODEL) != ident
    assert naming.fleet_identity(BASE.shapes((16, 16, 16)).spec_model(), MODEL) != ident
    assert (
        naming.fleet_identity(BASE.image("registry.example.com/serve:1").spec_model(), MODEL)
        is None
    )
    # adopt: Never neither retunes nor changes the identity: it only stops adopting.
    never = BASE.tuning(adopt="Never").spec_model()
    assert naming.fleet_identity(never, MODEL) == ident
    assert naming.revision(never) == naming.revision(spec)


# --- sync_profile in fleet mode -------------------------------------------------------------


def test_two_profiles_of_one_identity_make_one_job_the_other_waits_then_adopts(
    tmp_path: Path,
) -> None:
    p = profile_view(BASE.obj())
    q = profile_view(BASE.name("q").namespace("serve").uid("uid-q").obj())
    mem_p, mem_q = Memory(), Memory()
    status_p, api_p = sync(p, tmp_path, FLEET_A, mem_p)
    assert [k for k, _ in api_p.created if k == "Job"] == ["Job"]
    held = claim_of(tmp_path, p)
    assert held is not None and held.holder.profile == "p"

    status_q, api_q = sync(q, tmp_path, FLEET_B, mem_q)  # another cluster, same identity
    assert [k for k, _ in api_q.created if k == "Job"] == []
    assert status_q["phase"] == "Queued"
    ready = next(c for c in status_q["conditions"] if c["type"] == "Ready")
    assert (
        ready["reason"] == "TunedElsewhere" and f"ml/p in cluster {CLUSTER_A}" in ready["message"]
    )

    # p's Job published and p serves the artifact: it is published for the fleet, and p's
    # claim released.
    p_done = served_by_p(tmp_path, {**p, "status": status_p})
    _, api_p = sync(p_done, tmp_path, FLEET_A, mem_p)
    assert any(r == "ArtifactPublishedForFleet" for r, _ in api_p.events)
    released = claim_of(tmp_path, p)
    assert released is not None and released.expires <= time.time()

    status_q, api_q = sync({**q, "status": status_q}, tmp_path, FLEET_B, mem_q)
    assert [k for k, _ in api_q.created if k == "Job"] == []
    assert status_q["phase"] == "Ready"
    art = status_q["artifacts"][0]
    assert art["sha256"] == p_done["status"]["artifacts"][0]["sha256"]
    assert art["source"]["cluster"] == CLUSTER_A and art["source"]["profile"] == "ml/p"
    assert art["job"] == "" and art["revision"] == status_q["revision"]
    assert status_q["source"] == f"{CLUSTER_A[:8]} ml/p"
    assert any(r == "ArtifactAdopted" for r, _ in api_q.events)
    # Settled: q reads nothing more and writes nothing more.
    again, api_q = sync({**q, "status": status_q}, tmp_path, FLEET_B, mem_q)
    assert api_q.created == [] and api_q.patches == [] and again == status_q


def test_a_claim_is_kept_while_the_cache_has_not_seen_the_job_yet_and_released_once_it_ends(
    tmp_path: Path,
) -> None:
    p = profile_view(BASE.obj())
    memory = Memory()
    status, api = sync(p, tmp_path, FLEET_A, memory)
    made = [n for k, n in api.created if k == "Job"]
    # The echo of that status write comes before the Job's own watch event: no Job seen, and
    # making it again finds it there.
    status, _ = sync({**p, "status": status}, tmp_path, FLEET_A, memory, existing=set(made))
    held = claim_of(tmp_path, p)
    assert held is not None and held.expires > time.time() + 500
    job = make_job(made[0]).uid("juid").revision(status["revision"]).gpu_model(MODEL)
    sync({**p, "status": status}, tmp_path, FLEET_A, memory, jobs=[job.active(1).obj()])
    held = claim_of(tmp_path, p)
    assert held is not None and held.expires > time.time() + 500
    failed = job.condition("Failed", reason="BackoffLimitExceeded", message="limit").obj()
    sync({**p, "status": status}, tmp_path, FLEET_A, memory, jobs=[failed])
    released = claim_of(tmp_path, p)
    assert released is not None and released.expires <= time.time()


def test_an_earlier_revisions_artifact_served_meanwhile_neither_releases_nor_is_published(
    tmp_path: Path,
) -> None:
    p = profile_view(BASE.obj())
    memory = Memory()
    status, _ = sync(p, tmp_path, FLEET_A, memory)
    done = served_by_p(tmp_path, {**p, "status": status})
    # The artifact served was tuned under an earlier spec: the current revision tunes now.
    done["status"]["artifacts"][0]["revision"] = "0000000000"
    _, api = sync(done, tmp_path, FLEET_A, memory)
    held = claim_of(tmp_path, p)
    assert held is not None and held.expires > time.time() + 500
    assert not any(r == "ArtifactPublishedForFleet" for r, _ in api.events)
    assert not list(tmp_path.rglob("artifact.json"))


def test_a_replica_that_restarts_while_its_job_runs_reads_its_claim_back_and_renews_it(
    tmp_path: Path,
) -> None:
    p = profile_view(BASE.obj())
    status, api = sync(p, tmp_path, FLEET_A, Memory())
    made = [n for k, n in api.created if k == "Job"]
    job = make_job(made[0]).uid("juid").revision(status["revision"]).gpu_model(MODEL).active(1)
    store = dir_store(tmp_path)
    key = contract.claim_key(LOCATION, MODEL, identity(p))
    tagged = store.read_tagged(key, 1 << 14)
    old = contract.Claim.from_bytes(tagged.data, identity(p))
    assert old is not None  # make it due: past half its time, as after a long outage
    due = replace(old, expires=time.time() + 100)
    assert store.replace_if(key, due.to_bytes(), "", tagged.tag)
    fresh = Memory()  # the replica restarted (or another became leader): nothing remembered
    sync({**p, "status": status}, tmp_path, FLEET_A, fresh, jobs=[job.obj()])
    renewed = claim_of(tmp_path, p)
    assert renewed is not None and renewed.expires > time.time() + 500
    assert renewed.holder == old.holder and renewed.taken == old.taken
    # Someone else's by now (taken over while no replica renewed it): left alone, not fought.
    tagged = store.read_tagged(key, 1 << 14)
    theirs = contract.Claim(identity(p), THEM, time.time(), time.time() + 600)
    assert store.replace_if(key, theirs.to_bytes(), "", tagged.tag)
    other = Memory()
    for _ in range(2):
        sync({**p, "status": status}, tmp_path, FLEET_A, other, jobs=[job.obj()])
    assert claim_of(tmp_path, p) == contract.Claim.from_bytes(theirs.to_bytes(), identity(p))


def test_an_entry_whose_artifact_does_not_check_is_not_adopted_and_the_profile_tunes(
    tmp_path: Path,
) -> None:
    p = profile_view(BASE.obj())
    q = profile_view(BASE.name("q").uid("uid-q").obj())
    mem_p = Memory()
    status_p, _ = sync(p, tmp_path, FLEET_A, mem_p)
    p_done = served_by_p(tmp_path, {**p, "status": status_p})
    sync(p_done, tmp_path, FLEET_A, mem_p)  # published, released
    record = ArtifactRecord.from_status(p_done["status"]["artifacts"][0])
    assert record is not None
    results = next((tmp_path / "bkt").rglob("results.csv"))
    results.chmod(0o644)
    results.write_bytes(results.read_bytes().replace(b"Default", b"Gemm_Rocblas_1", 1))

    status_q, api_q = sync(q, tmp_path, FLEET_A, Memory())
    assert "artifacts" not in status_q or not status_q["artifacts"]
    warned = [m for r, m in api_q.events if r == "ArtifactNotAdopted"]
    assert warned and "does not check" in warned[0]
    assert [k for k, _ in api_q.created if k == "Job"] == ["Job"]  # tunes its own


SIGNED = BASE


@pytest.mark.parametrize("forgery", ["none", "another key", "missing"])
def test_an_entry_is_adopted_only_when_the_adopters_key_verifies_its_signature(
    tmp_path: Path, forgery: str
) -> None:
    p = profile_view(SIGNED.obj())
    q = profile_view(SIGNED.name("q").uid("uid-q").obj())
    mem_p = Memory()
    status_p, _ = sync(p, tmp_path, FLEET_A, mem_p)
    p_done = served_by_p(tmp_path, {**p, "status": status_p}, signing_key=signing_secret(tmp_path))
    sync(p_done, tmp_path, FLEET_A, mem_p)  # published, released
    sig = next((tmp_path / "bkt").rglob(f"*{signing.BLOB_SIGNATURE_SUFFIX}"))
    if forgery == "another key":
        # Someone who can write to the bucket signs what it holds with a key of their own.
        manifest = sig.with_name(sig.name.removesuffix(signing.BLOB_SIGNATURE_SUFFIX))
        sig.chmod(0o644)
        sig.write_bytes(
            signing.sign_blob(manifest.read_bytes(), ec.generate_private_key(ec.SECP256R1()))
        )
    elif forgery == "missing":
        sig.unlink()

    status_q, api_q = sync(q, tmp_path, FLEET_B, Memory())
    warned = [m for r, m in api_q.events if r == "ArtifactNotAdopted"]
    jobs = [k for k, _ in api_q.created if k == "Job"]
    if forgery == "none":
        (taken,) = status_q["artifacts"]
        assert taken["source"]["cluster"] == CLUSTER_A and not warned and not jobs
        return
    assert not status_q.get("artifacts")
    assert warned and "manifest.json.sig" in warned[0], warned
    assert jobs == ["Job"]  # tunes its own


def test_an_entry_from_another_image_or_outside_the_store_is_not_adopted(tmp_path: Path) -> None:
    p = profile_view(BASE.obj())
    q = profile_view(BASE.name("q").uid("uid-q").obj())
    status_p, _ = sync(p, tmp_path, FLEET_A, Memory())
    # Tuned in another image than the one the entry's identity names (a forged entry).
    p_done = served_by_p(
        tmp_path, {**p, "status": status_p}, image="registry.example.com/serve@sha256:" + "b" * 64
    )
    record = ArtifactRecord.from_status(p_done["status"]["artifacts"][0])
    assert record is not None
    store = dir_store(tmp_path)
    key = contract.published_key(LOCATION, MODEL, identity(p))
    entry = contract.Published(identity(p), MODEL, record, ME, "2026-12-05T00:00:00Z")
    assert store.create(key, entry.to_bytes(), "application/json")
    _, api_q = sync(q, tmp_path, FLEET_A, Memory())
    assert any(
        "not in this profile's image" in m for r, m in api_q.events if r == "ArtifactNotAdopted"
    )

    elsewhere = replace(record, uri=record.uri.replace("s3://bkt/fleet/", "s3://bkt/other/"))
    forged = contract.Published(identity(p), MODEL, elsewhere, ME, "2026-12-05T00:00:00Z")
    (tmp_path / "bkt" / key).chmod(0o644)
    (tmp_path / "bkt" / key).write_bytes(forged.to_bytes())
    memory = Memory()
    _, api_q = sync(q, tmp_path, FLEET_A, memory)
    assert any(
        "outside this profile's store" in m for r, m in api_q.events if r == "ArtifactNotAdopted"
    )
    # Said once: the next look (every few seconds while it waits) neither says it again nor
    # checks the artifact again.
    _, api_q = sync(q, tmp_path, FLEET_A, memory)
    assert not [m for r, m in api_q.events if r == "ArtifactNotAdopted"]


def test_a_bad_entry_is_replaced_by_the_next_verified_artifact_published(tmp_path: Path) -> None:
    p = profile_view(BASE.obj())
    store = dir_store(tmp_path)
    key = contract.published_key(LOCATION, MODEL, identity(p))
    assert store.create(key, b'{"version": 1, "forged": true}', "application/json")
    memory = Memory()
    status, _ = sync(p, tmp_path, FLEET_A, memory)
    done = served_by_p(tmp_path, {**p, "status": status})
    _, api = sync(done, tmp_path, FLEET_A, memory)
    assert any(r == "ArtifactPublishedForFleet" for r, _ in api.events)
    entry = contract.Published.from_bytes(store.get(key, 1 << 16), identity(p), MODEL)
    assert entry is not None and entry.record.sha256 == done["status"]["artifacts"][0]["sha256"]
    # A good entry is never replaced: another profile's later artifact leaves it.
    again = replace(entry, published_at="later")
    assert not store.create(key, again.to_bytes(), "")
    q = profile_view(BASE.name("q").uid("uid-q").obj())
    status_q, _ = sync(q, tmp_path, FLEET_B, Memory())
    assert status_q["phase"] == "Ready"


def test_another_image_digest_tunes_its_own_while_the_first_is_claimed(tmp_path: Path) -> None:
    p = profile_view(BASE.obj())
    other = BASE.name("q").uid("uid-q").image("registry.example.com/serve@sha256:" + "b" * 64)
    sync(p, tmp_path, FLEET_A, Memory())
    status_q, api_q = sync(profile_view(other.obj()), tmp_path, FLEET_B, Memory())
    assert [k for k, _ in api_q.created if k == "Job"] == ["Job"]
    assert status_q["phase"] != "Queued"


@pytest.mark.parametrize(
    "q",
    [
        BASE.name("q").uid("uid-q").tuning(adopt="Never"),
        BASE.name("q").uid("uid-q").image("registry.example.com/serve:1"),
    ],
    ids=["adopt-never", "image-by-tag"],
)
def test_profiles_fleet_mode_does_not_apply_to_tune_as_before(tmp_path: Path, q: Any) -> None:
    p = profile_view(BASE.obj())
    sync(p, tmp_path, FLEET_A, Memory())
    _, api_q = sync(profile_view(q.obj()), tmp_path, FLEET_A, Memory())
    assert [k for k, _ in api_q.created if k == "Job"] == ["Job"]


def test_a_dead_holders_claim_is_taken_over_after_it_expires(tmp_path: Path) -> None:
    p = profile_view(BASE.obj())
    q = profile_view(BASE.name("q").uid("uid-q").obj())
    store = dir_store(tmp_path)
    key = contract.claim_key(LOCATION, MODEL, identity(p))
    dead = contract.Holder(CLUSTER_B, "ml", "p", "uid-gone")
    now = time.time()
    store.create(key, contract.Claim(identity(p), dead, now - 700, now + 60).to_bytes(), "")
    status_q, api_q = sync(q, tmp_path, FLEET_A, Memory())
    assert status_q["phase"] == "Queued" and api_q.created == []
    tagged = store.read_tagged(key, 1 << 14)
    expired = contract.Claim(identity(p), dead, now - 700, time.time() - 1)
    assert store.replace_if(key, expired.to_bytes(), "", tagged.tag)
    _, api_q = sync({**q, "status": status_q}, tmp_path, FLEET_A, Memory())
    assert [k for k, _ in api_q.created if k == "Job"] == ["Job"]
    taken = claim_of(tmp_path, q)
    assert taken is not None and taken.holder.profile == "q"


def test_a_profile_that_never_adopts_still_publishes_what_it_tuned(tmp_path: Path) -> None:
    never = profile_view(BASE.tuning(adopt="Never").obj())
    memory = Memory()
    status, _ = sync(never, tmp_path, FLEET_A, memory)
    assert not list(tmp_path.rglob("claim.json"))  # it tunes without claiming
    done = served_by_p(tmp_path, {**never, "status": status})
    _, api = sync(done, tmp_path, FLEET_A, memory)
    assert any(r == "ArtifactPublishedForFleet" for r, _ in api.events)
    q = profile_view(BASE.name("q").uid("uid-q").obj())
    status_q, _ = sync(q, tmp_path, FLEET_B, Memory())
    assert status_q["phase"] == "Ready" and status_q["artifacts"][0]["source"]["profile"] == "ml/p"


def test_fleet_mode_off_reads_and_writes_nothing_in_the_store(tmp_path: Path) -> None:
    p = profile_view(BASE.obj())
    _, api = sync(p, tmp_path, replace(FLEET_A, fleet=False), Memory())
    assert [k for k, _ in api.created if k == "Job"] == ["Job"]
    assert not (tmp_path / "bkt").exists()


def test_a_claim_taken_just_after_its_holder_published_and_released_is_given_back(
    tmp_path: Path,
) -> None:
    """q read the entry (none yet), then p published and released, then q took the claim:
    q reads the entry once more before making a Job, adopts, and gives the claim back."""
    p = profile_view(BASE.obj())
    q = profile_view(BASE.name("q").namespace("serve").uid("uid-q").obj())
    mem_p = Memory()
    status_p, _ = sync(p, tmp_path, FLEET_A, mem_p)
    sync(served_by_p(tmp_path, {**p, "status": status_p}), tmp_path, FLEET_A, mem_p)
    released = claim_of(tmp_path, p)
    assert released is not None and released.expires <= time.time()

    entry_key = contract.published_key(LOCATION, MODEL, identity(q))
    late = {"first": True}

    class LateEntry(DirStore):
        """The bucket, whose first read of the entry comes before p published it."""

        def get(self, key: str, max_bytes: int) -> bytes:
            if key == entry_key and late.pop("first", False):
                raise NotFoundError(key)
            return super().get(key, max_bytes)

    store = LateEntry(LOCATION, tmp_path / LOCATION.bucket)
    api = FakeKube(writers=RECONCILE_WRITERS)
    out = sync_profile(q, [], [], FLEET_B, Memory(), Around(api, open_store=lambda *_: store))
    assert [k for k, _ in api.created if k == "Job"] == []
    assert (
        out.status.to_status()["phase"] == "Ready"
        and out.status.to_status()["artifacts"][0]["source"]
    )
    given_back = claim_of(tmp_path, q)
    assert given_back is not None and given_back.holder.profile == "q"
    assert given_back.expires <= time.time()


# --- odd objects at a claim's or an entry's key (issue 54) ------------------------------------

ODD = 17 << 10  # over contract.MAX_BYTES: no claim or entry is ever this large


def _padded(doc: bytes, size: int) -> bytes:
    """A JSON object that says what `doc` says, padded to `size` bytes."""
    head = doc[:-1] + b',"pad":"'
    return head + b"x" * (size - len(head) - 2) + b'"}'


def test_a_claim_too_large_to_be_one_is_taken_over_within_one_pass(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = dir_store(tmp_path)
    key = "k/claim.json"
    # Even one that says it is live: a claim no cluster could write is never obeyed.
    big = _padded(contract.Claim(IDENT, THEM, 900.0, 1500.0).to_bytes(), ODD)
    assert len(big) == ODD and store.create(key, big, "application/json")
    taken = apply.swap_claim(store, key, IDENT, ME, 1000.0, 600.0)
    assert taken.held and taken.claim.holder == ME
    assert contract.Claim.from_bytes(store.get(key, contract.MAX_BYTES), IDENT) == taken.claim
    assert f"{ODD} bytes" in caplog.text and "taken over" in caplog.text


def test_a_claim_that_is_not_json_is_taken_over_saying_what_was_there(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = dir_store(tmp_path)
    assert store.create("k/claim.json", b"\xff\xfe not json", "application/json")
    assert apply.swap_claim(store, "k/claim.json", IDENT, ME, 1000.0, 600.0).held
    assert "not JSON" in caplog.text and "taken over" in caplog.text


def test_of_two_clusters_taking_over_an_oversized_claim_at_once_exactly_one_wins(
    tmp_path: Path,
) -> None:
    both_read = threading.Barrier(2)

    class Racing(DirStore):
        """The bucket, where each cluster's first read is done before either writes."""

        def read_tagged(self, key: str, max_bytes: int) -> Any:
            got = super().read_tagged(key, max_bytes)
            if not hasattr(local, "read"):  # each racer's first read
                local.read = True
                both_read.wait(timeout=10)
            return got

    local = threading.local()
    store = Racing(LOCATION, tmp_path / "bkt")
    assert store.create("k/claim.json", b"{" + b" " * ODD + b"}", "application/json")
    standings: dict[str, claims.Standing] = {}

    def go(h: contract.Holder) -> None:
        standings[h.uid] = apply.swap_claim(store, "k/claim.json", IDENT, h, 1000.0, 600.0)

    threads = [threading.Thread(target=go, args=(h,)) for h in (ME, THEM)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(s.held for s in standings.values()) == [False, True]
    winner = next(s.claim.holder for s in standings.values() if s.held)
    loser = next(s for s in standings.values() if not s.held)
    assert loser.claim.holder == winner  # the loser read the winner's claim and waits on it
    found = contract.Claim.from_bytes(store.get("k/claim.json", contract.MAX_BYTES), IDENT)
    assert found is not None and found.holder == winner


def test_an_entry_too_large_to_be_one_is_replaced_by_the_next_publisher(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    p = profile_view(BASE.obj())
    store = dir_store(tmp_path)
    key = contract.published_key(LOCATION, MODEL, identity(p))
    assert store.create(key, b"[" + b"0," * (ODD // 2) + b"0]", "application/json")
    memory = Memory()
    status, _ = sync(p, tmp_path, FLEET_A, memory)
    done = served_by_p(tmp_path, {**p, "status": status})
    _, api = sync(done, tmp_path, FLEET_A, memory)
    assert any(r == "ArtifactPublishedForFleet" for r, _ in api.events)
    entry = contract.Published.from_bytes(store.get(key, contract.MAX_BYTES), identity(p), MODEL)
    assert entry is not None and entry.record.sha256 == done["status"]["artifacts"][0]["sha256"]
    assert "bytes" in caplog.text and "replac" in caplog.text
    # Another cluster of the same identity now adopts it instead of tuning its own.
    q = profile_view(BASE.name("q").uid("uid-q").obj())
    status_q, _ = sync(q, tmp_path, FLEET_B, Memory())
    assert status_q["phase"] == "Ready"


def test_s3_gives_an_oversized_objects_etag_from_its_get_without_reading_it() -> None:
    class Body:
        read = False

        def iter_chunks(self, size: int) -> Any:
            Body.read = True
            yield b"x" * ODD

        def close(self) -> None:
            pass

    class Client:
        def get_object(self, **kw: Any) -> dict[str, Any]:
            return {"ContentLength": ODD, "ETag": '"v1"', "Body": Body()}

    store = s3.S3Store(LOCATION, client=Client())
    got = store.read_tagged("fleet/k/claim.json", contract.MAX_BYTES)
    assert (got.data, got.tag, got.oversize) == (b"", '"v1"', ODD)
    assert not Body.read


# --- what an adopter trusts: its own key, its own identity (issue 54) -------------------------


def _forge_entry(tmp_path: Path, p: dict[str, Any], status: dict[str, Any], **served: Any) -> str:
    """What someone with the fleet's credential alone can do: put an artifact in p's folder
    (as served_by_p makes it, with `served`'s changes) and an entry for p's identity naming
    it, under _fleet/. Returns the artifact's SHA-256."""
    done = served_by_p(tmp_path, {**p, "status": status}, **served)
    record = ArtifactRecord.from_status(done["status"]["artifacts"][0])
    assert record is not None
    key = contract.published_key(LOCATION, MODEL, identity(p))
    entry = contract.Published(identity(p), MODEL, record, THEM, "2026-12-05T00:00:00Z")
    assert dir_store(tmp_path).create(key, entry.to_bytes(), "application/json")
    return record.sha256


def _refused(api: FakeKube) -> list[str]:
    return [m for r, m in api.events if r == "ArtifactNotAdopted"]


@pytest.mark.parametrize("policy", ["no signing", "Optional", "Required"])
def test_an_unsigned_artifact_and_entry_forged_under_fleet_are_never_adopted(
    tmp_path: Path, policy: str
) -> None:
    """What the fleet's credential alone can do: an unsigned artifact in the profile's folder
    and an entry naming it. Before, a profile without storage.signing (S3's default) or with
    policy Optional adopted it on the SHA-256s the entry itself gave."""
    if policy == "no signing":
        adopter = UNKEYED
    else:
        adopter = BASE.storage("s3://bkt/fleet", signing={**KEYED, "policy": policy})
    q = profile_view(adopter.obj())
    # Even with the very identity document q's spec makes: only q's key vouches for it.
    _forge_entry(tmp_path, q, {"revision": naming.revision(spec_of(q))}, signing_key=None)
    status, api = sync(q, tmp_path, FLEET_B, Memory())
    assert not status.get("artifacts")
    assert [k for k, _ in api.created if k == "Job"] == ["Job"]  # tunes its own
    if policy == "no signing":  # no key to verify with: it reads no entry at all
        assert not _refused(api)
        assert [c["reason"] for c in status["conditions"] if c["type"] == "FleetAdoption"] == [
            "AdoptionNeedsPublicKey"
        ]
        return
    (said,) = _refused(api)
    assert "manifest.json.sig is missing" in said, said


def test_under_optional_signing_an_entry_whose_signature_was_deleted_is_refused(
    tmp_path: Path,
) -> None:
    optional = BASE.storage("s3://bkt/fleet", signing={**KEYED, "policy": "Optional"})
    p, q = profile_view(optional.obj()), profile_view(optional.name("q").uid("uid-q").obj())
    mem_p = Memory()
    status_p, _ = sync(p, tmp_path, FLEET_A, mem_p)
    sync(served_by_p(tmp_path, {**p, "status": status_p}), tmp_path, FLEET_A, mem_p)
    # Honest and signed: q would adopt it. Then someone deletes the .sig.
    next((tmp_path / "bkt").rglob(f"*{signing.BLOB_SIGNATURE_SUFFIX}")).unlink()
    status_q, api_q = sync(q, tmp_path, FLEET_B, Memory())
    assert not status_q.get("artifacts")
    assert any("manifest.json.sig is missing" in m for m in _refused(api_q)), api_q.events
    assert [k for k, _ in api_q.created if k == "Job"] == ["Job"]


@pytest.mark.parametrize(
    ("theirs", "path", "here", "there"),
    [
        (BASE.tuning(numericalCheck=True), "tuning.numericalCheck", "false", "true"),
        (
            BASE.spec(promotion={"minGain": 0.05}),
            "promotion.minGain",
            "unset (the default)",
            "0.05",
        ),
        (BASE.gpu("amd", MODEL, parallelism=2), "gpu.parallelism", "1", "2"),
        (BASE.shapes((16, 16, 16)), "workload.shapes[0].mnk[0]", "8", "16"),
    ],
    ids=["numericalCheck", "minGain", "parallelism", "shapes"],
)
def test_an_entry_pointed_at_another_specs_signed_artifact_is_refused_naming_the_field(
    tmp_path: Path, theirs: Any, path: str, here: str, there: str
) -> None:
    """A `_fleet/` writer points q's identity at an artifact signed with the fleet's key but
    tuned for another spec: its signed manifest says what for, and q compares."""
    q = profile_view(BASE.name("q").uid("uid-q").obj())
    other = naming.identity_document(theirs.spec_model(), MODEL)
    _forge_entry(tmp_path, q, {"revision": naming.revision(spec_of(q))}, identity=other)
    status, api = sync(q, tmp_path, FLEET_B, Memory())
    assert not status.get("artifacts")
    (said,) = _refused(api)
    assert f"its identity differs at {path}: {here} here, {there} in the artifact" in said, said
    assert [k for k, _ in api.created if k == "Job"] == ["Job"]


def test_an_artifact_whose_manifest_binds_no_identity_is_not_adopted(tmp_path: Path) -> None:
    q = profile_view(BASE.name("q").uid("uid-q").obj())
    _forge_entry(tmp_path, q, {"revision": naming.revision(spec_of(q))}, identity=None)
    _, api = sync(q, tmp_path, FLEET_B, Memory())
    (said,) = _refused(api)
    assert "its manifest names no identity" in said


MEASURED = Gain((Figure("gemms", 2.0, 1.0, 2.0, 1.9, 2.1, 5),))


@pytest.mark.parametrize("gain", [None, Gain(note="no GPU to time on")], ids=["none", "noted"])
def test_an_adopter_that_asks_for_a_gain_never_adopts_an_unmeasured_artifact(
    tmp_path: Path, gain: Gain | None
) -> None:
    picky = BASE.spec(promotion={"minGain": 0.5})
    p, q = profile_view(picky.obj()), profile_view(picky.name("q").uid("uid-q").obj())
    mem_p = Memory()
    status_p, _ = sync(p, tmp_path, FLEET_A, mem_p)
    # p's own gate passed it (unmeasured passes every gate), so p serves and publishes it.
    sync(served_by_p(tmp_path, {**p, "status": status_p}, gain=gain), tmp_path, FLEET_A, mem_p)
    assert list(tmp_path.rglob("artifact.json"))
    status_q, api_q = sync(q, tmp_path, FLEET_B, Memory())
    assert not status_q.get("artifacts")
    (said,) = _refused(api_q)
    assert "was not measured" in said and "minGain 0.5" in said, said
    assert [k for k, _ in api_q.created if k == "Job"] == ["Job"]


def test_a_measured_artifact_is_adopted_with_the_signed_manifests_figures_not_the_entrys(
    tmp_path: Path,
) -> None:
    picky = BASE.spec(promotion={"minGain": 0.5})
    q = profile_view(picky.name("q").uid("uid-q").obj())
    status = {"revision": naming.revision(spec_of(q))}
    done = served_by_p(tmp_path, {**q, "status": status}, gain=MEASURED)
    record = ArtifactRecord.from_status(done["status"]["artifacts"][0])
    assert record is not None and record.gain == MEASURED
    # The entry's copy of the figures says 9x; the signed manifest says 2x.
    boasted = Gain((Figure("gemms", 9.0, 1.0, 9.0, 8.9, 9.1, 5),))
    key = contract.published_key(LOCATION, MODEL, identity(q))
    entry = contract.Published(
        identity(q), MODEL, replace(record, gain=boasted), THEM, "2026-12-05T00:00:00Z"
    )
    assert dir_store(tmp_path).create(key, entry.to_bytes(), "application/json")
    status_q, api_q = sync(q, tmp_path, FLEET_B, Memory())
    (taken,) = status_q["artifacts"]
    assert taken["source"]["cluster"] == CLUSTER_B and not _refused(api_q)
    assert taken["gain"]["figures"][0]["speedup"] == 2.0


def test_an_honest_signed_entry_of_the_same_identity_is_adopted_from_another_cluster(
    tmp_path: Path,
) -> None:
    p = profile_view(BASE.obj())
    q = profile_view(BASE.name("q").namespace("serve").uid("uid-q").obj())
    mem_p = Memory()
    status_p, _ = sync(p, tmp_path, FLEET_A, mem_p)
    sync(served_by_p(tmp_path, {**p, "status": status_p}), tmp_path, FLEET_A, mem_p)
    manifest = json.loads(next((tmp_path / "bkt").rglob("manifest.json")).read_bytes())
    assert manifest["fleetIdentity"] == naming.identity_document(spec_of(q), MODEL)
    status_q, api_q = sync(q, tmp_path, FLEET_B, Memory())
    assert status_q["phase"] == "Ready" and not _refused(api_q)
    assert status_q["artifacts"][0]["source"]["cluster"] == CLUSTER_A


def test_a_fleet_profile_with_no_public_key_tunes_its_own_and_says_why_once(
    tmp_path: Path,
) -> None:
    p = profile_view(BASE.obj())
    mem_p = Memory()
    status_p, _ = sync(p, tmp_path, FLEET_A, mem_p)
    sync(served_by_p(tmp_path, {**p, "status": status_p}), tmp_path, FLEET_A, mem_p)
    # The same identity, and signing asked for, but no key to verify with.
    unkeyed = (
        UNKEYED.name("q")
        .uid("uid-q")
        .storage("s3://bkt/fleet", signing={"secret": {"name": "signing"}, "policy": "Optional"})
    )
    q = profile_view(unkeyed.obj())
    memory = Memory()
    status_q, api_q = sync(q, tmp_path, FLEET_B, memory)
    assert [k for k, _ in api_q.created if k == "Job"] == ["Job"]
    assert not status_q.get("artifacts") and not _refused(api_q)
    held = claim_of(tmp_path, q)  # one identity: p's released claim, not taken by q
    assert held is not None and held.holder.profile == "p"
    (cond,) = [c for c in status_q["conditions"] if c["type"] == "FleetAdoption"]
    assert cond["status"] == "False" and cond["reason"] == "AdoptionNeedsPublicKey"
    assert "spec.storage.signing.publicKey" in cond["message"]
    said = [m for r, m in api_q.events if r == "AdoptionNeedsPublicKey"]
    assert len(said) == 1 and said[0] == cond["message"]
    # Said once: the next pass (its status as written) says nothing again.
    again, api_q = sync({**q, "status": status_q}, tmp_path, FLEET_B, memory)
    assert not [m for r, m in api_q.events if r == "AdoptionNeedsPublicKey"]
    assert [c for c in again["conditions"] if c["type"] == "FleetAdoption"] == [cond]
    # With the key set, the condition is gone.
    keyed = profile_view(BASE.name("q").uid("uid-q").obj())
    fixed, _ = sync({**keyed, "status": again}, tmp_path, FLEET_B, memory)
    assert not [c for c in fixed["conditions"] if c["type"] == "FleetAdoption"]


def test_the_identity_document_is_what_the_identity_hashes_plus_promotion_and_parallelism() -> None:
    spec = BASE.spec_model()
    doc = naming.identity_document(spec, MODEL)
    assert doc is not None
    assert doc["image"] == DIGEST and doc["gpu"]["model"] == MODEL
    assert doc["gpu"]["vendor"] == "amd" and doc["gpu"]["parallelism"] == 1
    # Promotion as set away from its defaults: a later release's new field matches.
    assert doc["tuning"]["numericalCheck"] is False and doc["promotion"] == {}
    # promotion and parallelism are in the document, not in the hash: claims keep their keys.
    for other in (BASE.spec(promotion={"minGain": 0.5}), BASE.gpu("amd", MODEL, parallelism=2)):
        assert naming.fleet_identity(other.spec_model(), MODEL) == naming.fleet_identity(
            spec, MODEL
        )
        assert naming.identity_document(other.spec_model(), MODEL) != doc
    assert (
        naming.identity_document(BASE.image("registry.example.com/serve:1").spec_model(), MODEL)
        is None
    )
    assert naming.identity_difference(doc, doc) is None
    assert naming.identity_difference({"a": False}, {"a": 0}) == ("a", False, 0)  # types count
    assert naming.identity_difference({"a": 0}, {"a": 0.0}) is None
    assert naming.identity_difference({"a": 1}, {}) == ("a", 1, naming.MISSING)
