"""Fleet mode's store side against the real S3 server (SeaweedFS from hack/cluster-up.sh
--s3-only; no Kubernetes): the conditional writes claims rest on (If-None-Match, If-Match with
the server's own ETags), claims raced by many holders, and an entry verified and refused as
an adopting operator does (docs/fleet.md)."""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from testbed.builders.wrappers import make_profile
from tests.support.artifacts import KEYED, signing_dir, tuner_output
from tunefleet import naming
from tunefleet.artifacts.publish import sign_manifest, upload_artifact
from tunefleet.contracts import fleet as contract
from tunefleet.contracts.artifact_record import ArtifactRecord
from tunefleet.fleet import adopt
from tunefleet.reconciler import apply
from tunefleet.storage.registry import parse_uri
from tunefleet.storage.s3 import S3Store
from tuner_job.manifest import ImageRef

pytestmark = pytest.mark.e2e

MODEL = "AMD_Instinct_MI300X_OAM"
IMAGE = "registry.example.com/serve@sha256:" + "a" * 64
A = contract.Holder("11111111-aaaa-4aaa-8aaa-111111111111", "ml", "p", "uid-p")


def store_at(s3: Any, prefix: str) -> S3Store:
    return S3Store(parse_uri(f"s3://{s3.bucket}/{prefix}"), client=s3.client(), timeout_s=60)


def race(n: int, act: Any) -> list[int]:
    """Run act(i) for i in 0..n-1 at the same moment; the i that returned true."""
    won: list[int] = []
    barrier = threading.Barrier(n)

    def go(i: int) -> None:
        barrier.wait()
        if act(i):
            won.append(i)

    threads = [threading.Thread(target=go, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return won


def test_the_s3_server_lets_exactly_one_create_and_one_replace_of_a_version_win(
    s3: Any, prefix: str
) -> None:
    stores = [store_at(s3, prefix) for _ in range(6)]
    key = f"{prefix}/_fleet/k/claim.json"
    won = race(6, lambda i: stores[i].create(key, f"{i}".encode(), "text/plain"))
    assert len(won) == 1
    tagged = stores[0].read_tagged(key, 100)
    assert tagged.data == f"{won[0]}".encode() and tagged.tag
    replaced = race(
        6, lambda i: stores[i].replace_if(key, f"r{i}".encode(), "text/plain", tagged.tag)
    )
    assert len(replaced) == 1
    assert stores[0].get(key, 100) == f"r{replaced[0]}".encode()
    assert not stores[0].replace_if(key, b"late", "text/plain", tagged.tag)  # a stale version
    stores[0].delete(key)
    assert not stores[0].replace_if(key, b"gone", "text/plain", tagged.tag)


def test_claims_raced_by_holders_in_many_clusters_have_one_winner_and_expire(
    s3: Any, prefix: str
) -> None:
    ident = "c" * 64
    key = f"{prefix}/_fleet/{MODEL}/{ident}/claim.json"
    holders = [replace(A, cluster=f"{i:08d}-0000-4000-8000-000000000000") for i in range(5)]
    stores = [store_at(s3, prefix) for _ in holders]
    won = race(5, lambda i: apply.swap_claim(stores[i], key, ident, holders[i], 1000.0, 600.0).held)
    assert len(won) == 1
    other = (won[0] + 1) % 5
    waiting = apply.swap_claim(stores[other], key, ident, holders[other], 1300.0, 600.0)
    assert not waiting.held and waiting.claim.holder == holders[won[0]]
    renewed = apply.swap_claim(stores[won[0]], key, ident, holders[won[0]], 1400.0, 600.0)
    assert renewed.held and renewed.claim.expires == 2000.0
    # The holder stops renewing (its cluster died): taken over once expired, by one of many.
    late = race(4, lambda i: apply.swap_claim(stores[i], key, ident, holders[i], 2000.0, 600.0).held
                if i != won[0] else False)  # fmt: skip
    assert len(late) == 1


def test_an_entry_in_s3_is_verified_before_adoption_and_refused_once_tampered(
    s3: Any, prefix: str, tmp_path: Path
) -> None:
    store = store_at(s3, prefix)
    location = store.location
    # Signed with the fleet's key pair, its manifest binding what the spec tunes: fleet
    # adoption takes nothing less (fleet/adopt.py).
    spec = (
        make_profile()
        .image(IMAGE)
        .gpu("amd", MODEL)
        .storage(f"s3://{s3.bucket}/{prefix}", signing=KEYED)
    ).spec_model()
    ident = naming.fleet_identity(spec, MODEL)
    assert ident is not None
    manifest = tuner_output(
        tmp_path / "out",
        gpu_model=MODEL,
        image=ImageRef(reference=IMAGE),
        fleet_identity=naming.identity_document(spec, MODEL),
    )
    pub = upload_artifact(
        store, location, (tmp_path / "out" / "results.csv").read_bytes(), manifest
    )
    pub = sign_manifest(store, location, pub, signing_dir(tmp_path))
    record = ArtifactRecord.from_manifest(
        pub.manifest, uri=pub.uri, manifest_sha256=pub.manifest_sha256
    ).for_job(gpu_model=MODEL, revision=naming.revision(spec), job="tune-1", image_id="")
    key = contract.published_key(location, MODEL, ident)
    entry = adopt.entry_for(record, ident, A, "2026-12-05T00:00:00Z")
    assert apply.publish_entry(store, key, entry, spec, ())
    later = replace(entry, published_at="later")
    assert not apply.publish_entry(store, key, later, spec, ())  # a good entry stays

    found = adopt.read(store_at(s3, prefix), key, ident, MODEL)
    assert found is not None and found.record.sha256 == record.sha256
    adopt.verify(found, spec, (), store_at(s3, prefix))  # passes
    taken = adopt.adopted(found, naming.revision(spec), "2026-12-05T00:01:00Z")
    assert taken.source_cluster == A.cluster and taken.source_profile == "ml/p"

    results_key = location.key("ml", "llama", MODEL, record.sha256, "results.csv")
    body = store.get(results_key, 1 << 20)
    s3.client().put_object(
        Bucket=s3.bucket, Key=results_key, Body=body.replace(b"Default", b"Gemm_X", 1)
    )
    with pytest.raises(adopt.NotAdoptable, match="does not check"):
        adopt.verify(found, spec, (), store_at(s3, prefix))
    with pytest.raises(adopt.NotAdoptable, match="not a fleet entry"):
        s3.client().put_object(Bucket=s3.bucket, Key=key, Body=b'{"version": 1}')
        adopt.read(store_at(s3, prefix), key, ident, MODEL)
