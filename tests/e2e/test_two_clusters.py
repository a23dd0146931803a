"""Two clusters on one store (docs/fleet.md): the local cluster and its peer (hack/cluster-up.sh
--peer: another control plane, CA and real node, sharing the S3 server and the registry), each
with its own release and operator in fleet mode. One identity applied in both at the same
moment is tuned once and served in both, on S3 (a conditional write) and on an OCI registry
(bids settled by time); a tuning cluster whose operator dies mid-Job holds the other back
for one claim expiry, no longer; a changed image digest in one cluster tunes its own; an
artifact whose SHA-256 or signature does not check is never adopted (cosign, knowing nothing
of tunefleet, checks the signatures on either side)."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from testbed.cluster import (
    STANDIN_IMAGE,
    STANDIN_NOGPU_IMAGE,
    Cluster,
    cluster_uid,
    ensure_peer_cluster,
    pinned_image,
    wait_for_real_node_gpus,
)
from testbed.operator import (
    Operator,
    fleet_mode,
    install,
    leave_fleet_mode,
    uninstall_release,
    user_namespace,
)
from testbed.poll import eventually
from testbed.real_node import fleet_profile, model_pod
from testbed.registry import Registry, cosign, cosign_binary, key_pair, signing_secret
from tests.support.kube import apply, condition, create, ended, get_json, jobs_of, statuses
from tests.support.kube import ready as wait_ready
from tunefleet import naming
from tunefleet.api import TuningProfileSpec
from tunefleet.contracts import fleet as contract
from tunefleet.storage.oci import NOTE_PREFIX, OciStore
from tunefleet.storage.registry import parse_uri
from tunefleet.storage.s3 import S3Store

pytestmark = pytest.mark.e2e

CLAIM_SECONDS = 60
SLOW_TUNING = {"name": "FAKE_TORCH_TUNE_SLEEP", "value": "4"}  # each GEMM's cost, seconds


@pytest.fixture(scope="module")
def peer() -> Cluster:
    return ensure_peer_cluster()


@pytest.fixture(scope="module")
def peer_operator(peer: Cluster, s3: Any) -> Iterator[Operator]:
    """The peer's release and operator, in fleet mode (installed as the first cluster's)."""
    plain = install(peer, s3.endpoint)
    fleet = fleet_mode(peer, plain, s3, CLAIM_SECONDS)
    try:
        yield fleet
    finally:
        fleet.stop()
        uninstall_release(peer)


@pytest.fixture
def first_operator(cluster: Any, s3: Any, operator: Operator) -> Iterator[Operator]:
    fleet = fleet_mode(cluster, operator, s3, CLAIM_SECONDS)
    try:
        yield fleet
    finally:
        leave_fleet_mode(cluster, fleet, operator)


@pytest.fixture
def peer_namespace(peer: Cluster, s3: Any, namespace: str) -> Iterator[str]:
    """The test's namespace, of the same name, in the peer, with the same Secrets."""
    with user_namespace(peer, s3, namespace) as name:
        yield name


def at_once(*calls: Any) -> None:
    threads = [threading.Thread(target=c) for c in calls]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def _tuned_once(
    both: dict[str, Any], namespace: str, profile: dict[str, Any]
) -> tuple[str, str, dict[str, Any], dict[str, Any]]:
    """The profile applied in both clusters at once: both Ready, from one tuning Job in all.
    The tuning cluster, the adopting one, and the artifact each serves (the same one)."""
    at_once(*(lambda c=c: apply(c, namespace, profile) for c in both.values()))
    done = {k: wait_ready(c, namespace, "llama", timeout=400) for k, c in both.items()}
    for prof in done.values():
        assert prof["status"]["phase"] == "Ready", json.dumps(prof["status"], indent=2)[:3000]
    jobs = {k: jobs_of(c, namespace, "llama") for k, c in both.items()}
    assert sum(len(j) for j in jobs.values()) == 1, {k: len(j) for k, j in jobs.items()}
    tuner = next(k for k, j in jobs.items() if j)
    adopter = next(k for k in both if k != tuner)
    own = done[tuner]["status"]["artifacts"][0]
    taken = done[adopter]["status"]["artifacts"][0]
    assert taken["sha256"] == own["sha256"] and "source" not in own
    return tuner, adopter, own, taken


def test_one_identity_applied_in_two_clusters_at_once_is_tuned_once_and_served_in_both(
    cluster: Any,
    peer: Cluster,
    first_operator: Operator,
    peer_operator: Operator,
    s3: Any,
    namespace: str,
    peer_namespace: str,
    s3_secret: str,
    prefix: str,
) -> None:
    wait_for_real_node_gpus(cluster, 1)
    profile = fleet_profile(s3, s3_secret, prefix, pinned_image(STANDIN_IMAGE))
    both = {"first": cluster, "peer": peer}
    tuner, adopter, _, taken = _tuned_once(both, namespace, profile)
    assert taken["source"]["cluster"] == cluster_uid(both[tuner]) != cluster_uid(both[adopter])
    assert taken["source"]["profile"] == f"{namespace}/llama"
    wide = both[adopter].kubectl("get", "tp", "-n", namespace, "llama", "-o", "wide").stdout
    assert cluster_uid(both[tuner])[:8] in wide, wide

    for c in both.values():  # a model pod in each cluster gets the one artifact
        create(c, namespace, model_pod("server", "llama", gpus=1))
    for k, c in both.items():
        pod = ended(c, namespace, "server", f"the model pod in the {k} cluster to finish")
        log = c.kubectl("logs", "-n", namespace, "server", "-c", "server").stdout
        assert pod["status"]["phase"] == "Succeeded", log
        fetch = statuses(pod)["tunefleet-fetch"]["state"]["terminated"]["message"]
        assert "wrote 1 results file(s)" in fetch, fetch
        assert "PYTORCH_TUNABLEOP_ENABLED=1" in log and "PYTORCH_TUNABLEOP_TUNING=0" in log, log


def test_a_tuning_cluster_killed_mid_job_holds_the_other_back_one_expiry_only(
    cluster: Any,
    peer: Cluster,
    first_operator: Operator,
    peer_operator: Operator,
    s3: Any,
    namespace: str,
    peer_namespace: str,
    s3_secret: str,
    prefix: str,
) -> None:
    wait_for_real_node_gpus(cluster, 1)
    image = pinned_image(STANDIN_IMAGE)
    slow = fleet_profile(s3, s3_secret, prefix, image, FAKE_TORCH_TUNE_SLEEP="4")
    apply(peer, namespace, slow)  # the peer claims first and tunes, slowly
    eventually(
        lambda: get_json(peer, "tp", "-n", namespace, "llama"),
        lambda p: (p.get("status") or {}).get("phase") == "Tuning",
        "the peer's Job to run",
        timeout=120,
    )
    apply(cluster, namespace, slow)
    waiting = eventually(
        lambda: get_json(cluster, "tp", "-n", namespace, "llama"),
        lambda p: (p.get("status") or {}).get("phase") == "Queued",
        "the first cluster to wait for the peer's claim",
        timeout=60,
    )
    said = condition(waiting, "Ready")
    assert said["reason"] == "TunedElsewhere" and cluster_uid(peer) in said["message"], said
    peer_operator.kill()  # the tuning cluster dies mid-Job: nothing renews its claim
    killed = time.monotonic()
    try:
        prof = wait_ready(cluster, namespace, "llama", timeout=CLAIM_SECONDS + 400)
        waited = time.monotonic() - killed
        assert prof["status"]["phase"] == "Ready", json.dumps(prof["status"], indent=2)[:3000]
        assert len(jobs_of(cluster, namespace, "llama")) == 1  # it took over and tuned
        assert "source" not in prof["status"]["artifacts"][0]
        assert waited < CLAIM_SECONDS + 300  # one expiry and one tuning, no more
    finally:
        peer_operator.start()


def test_a_changed_image_digest_in_one_cluster_tunes_its_own(
    cluster: Any,
    peer: Cluster,
    first_operator: Operator,
    peer_operator: Operator,
    s3: Any,
    namespace: str,
    peer_namespace: str,
    s3_secret: str,
    prefix: str,
) -> None:
    first = fleet_profile(
        s3, s3_secret, prefix, pinned_image(STANDIN_IMAGE), FAKE_TORCH_TUNE_SLEEP="2"
    )
    other = fleet_profile(s3, s3_secret, prefix, pinned_image(STANDIN_NOGPU_IMAGE))
    at_once(lambda: apply(cluster, namespace, first), lambda: apply(peer, namespace, other))
    for c, what in ((cluster, "the first cluster's"), (peer, "the peer's")):
        eventually(
            lambda c=c: jobs_of(c, namespace, "llama"),
            lambda jobs: len(jobs) == 1,
            f"{what} own tuning Job",
            timeout=90,
        )
    for c in (cluster, peer):
        phase = (get_json(c, "tp", "-n", namespace, "llama").get("status") or {}).get("phase")
        assert phase != "Queued", phase


@pytest.fixture
def peer_other_namespace(peer: Cluster, s3: Any, namespace: str) -> Iterator[str]:
    """A namespace of another name in the peer: its profile's artifact path is its own."""
    with user_namespace(peer, s3, f"{namespace}-b"[:63]) as name:
        yield name


@dataclass(frozen=True)
class Entry:
    """A profile's artifact, Ready in the cluster that tuned it, as its identity's published
    entry in the store."""

    artifact: dict[str, Any]
    store: S3Store
    key: str
    identity: str
    model: str

    def now(self) -> contract.Published | None:
        return contract.Published.from_bytes(
            self.store.get(self.key, 1 << 16), self.identity, self.model
        )


def _tuned_and_published(
    cluster: Any, namespace: str, profile: dict[str, Any], s3: Any, prefix: str
) -> Entry:
    apply(cluster, namespace, profile)
    first = wait_ready(cluster, namespace, "llama", timeout=400)
    assert first["status"]["phase"] == "Ready", json.dumps(first["status"], indent=2)[:3000]
    art = first["status"]["artifacts"][0]
    spec = TuningProfileSpec.model_validate(profile["spec"])
    model = spec.gpu.models[0]
    ident = naming.fleet_identity(spec, model)
    assert ident is not None
    store = S3Store(parse_uri(f"s3://{s3.bucket}/{prefix}"), client=s3.client(), timeout_s=60)
    entry = Entry(art, store, contract.published_key(store.location, model, ident), ident, model)
    eventually(
        entry.now,
        lambda e: e is not None and e.record.sha256 == art["sha256"],
        "the first cluster's entry",
        timeout=60,
    )
    return entry


def _tunes_its_own(
    peer: Cluster, namespace: str, profile: dict[str, Any]
) -> tuple[dict[str, Any], str]:
    """The profile applied in the peer is Ready from a Job of its own, not adopted: its
    artifact, and what the ArtifactNotAdopted Events said."""
    apply(peer, namespace, profile)
    own = wait_ready(peer, namespace, "llama", timeout=400)
    assert own["status"]["phase"] == "Ready", json.dumps(own["status"], indent=2)[:3000]
    mine = own["status"]["artifacts"][0]
    assert "source" not in mine and len(jobs_of(peer, namespace, "llama")) == 1
    said = peer.kubectl(
        "get", "events", "-n", namespace,
        "--field-selector", "reason=ArtifactNotAdopted", "-o", "json",
    ).stdout  # fmt: skip
    return mine, said


def test_an_artifact_tampered_with_in_the_store_is_not_adopted_and_its_entry_is_replaced(
    cluster: Any,
    peer: Cluster,
    first_operator: Operator,
    peer_operator: Operator,
    s3: Any,
    namespace: str,
    peer_other_namespace: str,
    s3_secret: str,
    prefix: str,
) -> None:
    wait_for_real_node_gpus(cluster, 1)
    profile = fleet_profile(s3, s3_secret, prefix, pinned_image(STANDIN_IMAGE))
    entry = _tuned_and_published(cluster, namespace, profile, s3, prefix)
    # Someone with write access to the bucket changes the artifact's results under its name.
    results_key = f"{parse_uri(entry.artifact['uri']).prefix}/results.csv"
    body = entry.store.get(results_key, 1 << 22)
    s3.client().put_object(Bucket=s3.bucket, Key=results_key, Body=body + b"\n")

    mine, said = _tunes_its_own(peer, peer_other_namespace, profile)
    assert "does not check" in said, said
    # The bad entry gave way to the peer's verified artifact: the next cluster adopts that.
    now = entry.now()
    assert now is not None and now.record.uri == mine["uri"]
    assert now.holder.cluster == cluster_uid(peer)


def _cosign_verify_blob(
    keys: Path, blob: Path, signature: Path
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [cosign_binary(), "verify-blob", "--key", str(keys / "cosign.pub"),
         "--insecure-ignore-tlog=true", "--signature", str(signature), str(blob)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_an_artifact_signed_by_another_key_is_not_adopted_and_cosign_checks_both_signatures(
    cluster: Any,
    peer: Cluster,
    first_operator: Operator,
    peer_operator: Operator,
    s3: Any,
    namespace: str,
    peer_other_namespace: str,
    s3_secret: str,
    prefix: str,
    tmp_path: Path,
) -> None:
    # Both clusters' profiles sign with one key pair (the fleet's), in their own Secrets.
    password = "fleet-signing"
    keys = key_pair(tmp_path / "fleet", password)
    signing_secret(cluster, namespace, keys, password)
    signing_secret(peer, peer_other_namespace, keys, password)
    wait_for_real_node_gpus(cluster, 1)
    profile = fleet_profile(s3, s3_secret, prefix, pinned_image(STANDIN_IMAGE))
    profile["spec"]["storage"]["signing"] = {
        "secret": {"name": "signing"}, "publicKey": (keys / "cosign.pub").read_text(),
    }  # fmt: skip
    entry = _tuned_and_published(cluster, namespace, profile, s3, prefix)
    art, store = entry.artifact, entry.store
    # What the tuning Job signed, cosign (knowing nothing of tunefleet) verifies.
    base = parse_uri(art["uri"]).prefix
    manifest, signature = tmp_path / "manifest.json", tmp_path / "manifest.json.sig"
    manifest.write_bytes(store.get(f"{base}/manifest.json", 1 << 20))
    signature.write_bytes(store.get(f"{base}/manifest.json.sig", 4096))
    checked = _cosign_verify_blob(keys, manifest, signature)
    assert checked.returncode == 0, checked.stderr

    # Someone who can write to the bucket re-signs the artifact with a key of their own.
    other = key_pair(tmp_path / "other", "other")
    forged = subprocess.run(
        [cosign_binary(), "sign-blob", "--key", str(other / "cosign.key"), "--yes",
         "--tlog-upload=false", "--new-bundle-format=false", "--use-signing-config=false",
         "--output-signature", str(signature), str(manifest)],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "COSIGN_PASSWORD": "other"},
    )  # fmt: skip
    assert forged.returncode == 0, forged.stderr
    assert _cosign_verify_blob(keys, manifest, signature).returncode != 0
    s3.client().put_object(
        Bucket=s3.bucket, Key=f"{base}/manifest.json.sig", Body=signature.read_bytes()
    )

    mine, said = _tunes_its_own(peer, peer_other_namespace, profile)
    assert "manifest.json.sig" in said and "another key" in said, said
    # The peer's own artifact is signed with the fleet's key, and replaced the forged entry.
    base = parse_uri(mine["uri"]).prefix
    manifest.write_bytes(store.get(f"{base}/manifest.json", 1 << 20))
    signature.write_bytes(store.get(f"{base}/manifest.json.sig", 4096))
    assert _cosign_verify_blob(keys, manifest, signature).returncode == 0
    now = entry.now()
    assert now is not None and now.record.uri == mine["uri"]


def _bids(reg: Registry, repository: str) -> list[str]:
    """The bids on the registry's repository, as they read (a store per look: each has its
    own deadline)."""
    store = OciStore(parse_uri(f"oci://{reg.host}/{repository}"), config=reg.writer)
    out = []
    for tag in store.tags(NOTE_PREFIX):
        found = store.manifest(tag)
        if found is not None:
            layer = found[0]["layers"][0]
            out.append(store.blob(layer["digest"], 1 << 14, tag).decode())
    return out


def _on_registry(
    clusters: Any, namespace: str, keys: Path, repository: str, *s3_args: Any
) -> dict[str, Any]:
    """The fleet profile on the shared registry's `repository`, signed with `keys` (password
    "fleet-signing"), and its Secrets in `namespace` of each of `clusters`."""
    reg = Registry.from_state()
    for c in clusters:
        signing_secret(c, namespace, keys, "fleet-signing")
        apply(c, namespace, reg.secret("registry-writer", reg.writer))
        apply(c, namespace, reg.secret("registry-reader", reg.reader))
    s3, s3_secret, prefix = s3_args
    profile = fleet_profile(s3, s3_secret, prefix, pinned_image(STANDIN_IMAGE))
    profile["spec"]["storage"] = {
        "uri": f"oci://{reg.host}/{repository}",
        "credentialsSecret": {"name": "registry-writer"},
        "signing": {"secret": {"name": "signing"}, "publicKey": (keys / "cosign.pub").read_text()},
    }
    profile["spec"]["serving"] = {"credentialsSecret": {"name": "registry-reader"}}
    return profile


def test_one_identity_on_a_registry_is_tuned_once_through_bids_and_adopted_as_a_signed_bundle(
    cluster: Any,
    peer: Cluster,
    first_operator: Operator,
    peer_operator: Operator,
    s3: Any,
    namespace: str,
    peer_namespace: str,
    s3_secret: str,
    prefix: str,
    tmp_path: Path,
) -> None:
    """oci:// in both clusters at once: a registry has no conditional write, so each bids
    (a tag of its own) and the earliest bid tunes once it has stood for the settle window; the
    other waits, then adopts the bundle only after its cosign signature verifies."""
    reg = Registry.from_state()
    keys = key_pair(tmp_path / "fleet", "fleet-signing")
    both = {"first": cluster, "peer": peer}
    repository = f"e2e/fleet-{uuid.uuid4().hex[:8]}"
    profile = _on_registry(both.values(), namespace, keys, repository, s3, s3_secret, prefix)
    tuner, adopter, own, taken = _tuned_once(both, namespace, profile)
    assert taken["bundle"]["digest"] == own["bundle"]["digest"], (own, taken)
    assert taken["source"]["cluster"] == cluster_uid(both[tuner]) != cluster_uid(both[adopter])

    # Both bids are down: the waiter's when it waited, the holder's when its Job ended.
    eventually(
        lambda: _bids(reg, repository),
        lambda bids: bids == [],
        "the bids to be taken down",
        timeout=60,
    )
    # cosign, knowing nothing of tunefleet, verifies the bundle the adopter serves.
    reference = f"{reg.host}/{repository}@{taken['bundle']['digest']}"
    check = ["verify", "--key", str(keys / "cosign.pub"), "--insecure-ignore-tlog=true", reference]
    verified = cosign(check, reg.tool_env(reg.reader))
    assert verified.returncode == 0, verified.stderr

    # The adopter's model pod fetches the bundle, checks its signature, and is served.
    where = both[adopter]
    create(where, namespace, model_pod("server", "llama", gpus=1))
    pod = ended(where, namespace, "server", f"the model pod in the {adopter} cluster to finish")
    log = where.kubectl("logs", "-n", namespace, "server", "-c", "server").stdout
    assert pod["status"]["phase"] == "Succeeded", log
    fetch = statuses(pod)["tunefleet-fetch"]["state"]["terminated"]["message"]
    assert "wrote 1 results file(s)" in fetch, fetch


def test_a_bundle_on_the_registry_signed_by_another_key_is_not_adopted_and_its_entry_replaced(
    cluster: Any,
    peer: Cluster,
    first_operator: Operator,
    peer_operator: Operator,
    s3: Any,
    namespace: str,
    peer_other_namespace: str,
    s3_secret: str,
    prefix: str,
    tmp_path: Path,
) -> None:
    """The peer's profile trusts another key (its own Secret and publicKey): the bundle the
    first cluster published does not verify with it, so the peer bids, tunes and signs its own,
    and its entry replaces the one it could not adopt."""
    reg = Registry.from_state()
    repository = f"e2e/fleet-{uuid.uuid4().hex[:8]}"
    wait_for_real_node_gpus(cluster, 1)
    first_keys, peer_keys = (key_pair(tmp_path / k, "fleet-signing") for k in ("a", "b"))
    first = _on_registry([cluster], namespace, first_keys, repository, s3, s3_secret, prefix)
    apply(cluster, namespace, first)
    done = wait_ready(cluster, namespace, "llama", timeout=400)
    assert done["status"]["phase"] == "Ready", json.dumps(done["status"], indent=2)[:3000]
    theirs = done["status"]["artifacts"][0]

    other = _on_registry([peer], peer_other_namespace, peer_keys, repository, s3, s3_secret, prefix)
    mine, said = _tunes_its_own(peer, peer_other_namespace, other)
    assert "does not verify" in said and theirs["bundle"]["digest"] in said, said
    assert mine["bundle"]["digest"] != theirs["bundle"]["digest"]
    store = OciStore(parse_uri(f"oci://{reg.host}/{repository}"), config=reg.writer)
    spec = TuningProfileSpec.model_validate(other["spec"])
    model = spec.gpu.models[0]
    ident = naming.fleet_identity(spec, model)
    assert ident is not None
    key = contract.published_key(store.location, model, ident)
    entry = eventually(
        lambda: contract.Published.from_bytes(store.get(key, 1 << 16), ident, model),
        lambda e: e is not None and e.record.uri == mine["uri"],
        "the peer's entry to replace the one it could not adopt",
        timeout=60,
    )
    assert entry is not None and entry.holder.cluster == cluster_uid(peer)
