"""Two clusters on one store (docs/fleet.md): the local cluster and its peer (hack/cluster-up.sh
--peer: another control plane, CA and real node, sharing the S3 server and the registry), each
with its own release and operator in fleet mode. One identity applied in both at the same
moment is tuned once and served in both, on S3 (a conditional write) and on an OCI registry
(bids settled by time); a tuning cluster whose operator dies mid-Job holds the other back
for one claim expiry, no longer; a changed image digest in one cluster tunes its own; an
artifact whose SHA-256 or signature does not check is never adopted (cosign, knowing nothing
of tunefleet, checks the signatures on either side). Adoption needs a signature by the
adopter's key, so every profile that shares signs with the fleet's key pair (`signed`): an
artifact and entry forged with the fleet's credential alone, an entry pointed at another spec's
signed artifact, or an unmeasured artifact for an adopter asking for a gain are never adopted.
One cluster's tunefleet-gc --apply leaves what the other adopted (its refs doc under
_fleet/refs/), and the other's pods are served. Where each operator holds the fleet's key
and the store's publish identity (signing.secret, signing.storeCredentialsSecret), the
tuning pod holds neither: no Secret, only two tokens good for asking its operator."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace
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
from testbed.library_pod import tool_env
from testbed.operator import (
    Operator,
    fleet_mode,
    install,
    leave_fleet_mode,
    operator_signs_mode,
    uninstall_release,
    user_namespace,
)
from testbed.poll import eventually
from testbed.real_node import fleet_profile, model_pod
from testbed.registry import Registry, cosign, cosign_binary, key_pair, signing_secret
from tests.support.artifacts import COSIGN, PUBLIC_KEY
from tests.support.kube import apply, condition, create, ended, get_json, jobs_of, statuses
from tests.support.kube import ready as wait_ready
from tunefleet import naming
from tunefleet.api import TuningProfileSpec
from tunefleet.artifacts import gc
from tunefleet.contracts import fleet as contract
from tunefleet.storage.oci import NOTE_PREFIX, OciStore
from tunefleet.storage.registry import parse_uri
from tunefleet.storage.s3 import S3Store
from tunefleet.storage.store import NotFoundError

pytestmark = pytest.mark.e2e

GC = Path(sys.executable).parent / "tunefleet-gc"

CLAIM_SECONDS = 60
# The fleet's key pair (`cosign generate-key-pair` made it, password "tunefleet-test"): every
# profile that shares across the clusters signs with it and verifies with its public half, as
# fleet adoption requires (docs/trust.md).
FLEET_KEYS = COSIGN
FLEET_KEYS_PASSWORD = "tunefleet-test"
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


@dataclass(frozen=True)
class TwoClusters:
    """One test's two clusters on one store: the first (the local cluster, its operator in fleet
    mode) and the peer (its own release and operator, in fleet mode), the test's namespace in
    each (`peer_namespace`: of the same name, or of another), the S3 server, the name of the
    S3 Secret in `namespace` and the test's prefix of the bucket."""

    first: Any
    peer: Cluster
    peer_operator: Operator
    s3: Any
    namespace: str
    peer_namespace: str
    s3_secret: str
    prefix: str

    def both(self) -> dict[str, Any]:
        return {"first": self.first, "peer": self.peer}

    def profile(self, image: str = STANDIN_IMAGE, **env: str) -> dict[str, Any]:
        """The fleet profile "llama" of `image` (pinned by digest) under the test's prefix."""
        return fleet_profile(self.s3, self.s3_secret, self.prefix, pinned_image(image), **env)

    def signed(self, profile: dict[str, Any], policy: str | None = None) -> dict[str, Any]:
        """`profile` signing with the fleet's key pair and verifying with its public half (fleet
        adoption requires a signature by the adopter's key), under `policy` (None: the
        default, Required); the Secret `signing` in the test's namespace of each cluster."""
        for c, ns in ((self.first, self.namespace), (self.peer, self.peer_namespace)):
            if c.kubectl("get", "secret", "signing", "-n", ns, check=False).returncode != 0:
                signing_secret(c, ns, FLEET_KEYS, FLEET_KEYS_PASSWORD)
        signing: dict[str, Any] = {"secret": {"name": "signing"}, "publicKey": PUBLIC_KEY}
        if policy is not None:
            signing["policy"] = policy
        profile["spec"]["storage"]["signing"] = signing
        return profile

    def phase(self, cluster: Any, phase: str, what: str, timeout: float) -> dict[str, Any]:
        """The profile in `cluster` once its phase is `phase`."""
        return dict(
            eventually(
                lambda: get_json(cluster, "tp", "-n", self.namespace, "llama"),
                lambda p: (p.get("status") or {}).get("phase") == phase,
                what,
                timeout=timeout,
            )
        )

    def served(self, cluster: Any, which: str) -> str:
        """The model pod "server" in `cluster` (the `which` one) once it has ended: Succeeded,
        with the one results file fetched. Its log."""
        ns = self.namespace
        pod = ended(cluster, ns, "server", f"the model pod in the {which} cluster to finish")
        log = cluster.kubectl("logs", "-n", ns, "server", "-c", "server").stdout
        assert pod["status"]["phase"] == "Succeeded", log
        fetch = statuses(pod)["tunefleet-fetch"]["state"]["terminated"]["message"]
        assert "wrote 1 results file(s)" in fetch, fetch
        return log

    def on_registry(
        self, clusters: Any, namespace: str, keys: Path, repository: str
    ) -> dict[str, Any]:
        """The fleet profile on the shared registry's `repository`, signed with `keys`
        (password "fleet-signing"), and its Secrets in `namespace` of each of `clusters`."""
        reg = Registry.from_state()
        for c in clusters:
            signing_secret(c, namespace, keys, "fleet-signing")
            apply(c, namespace, reg.secret("registry-writer", reg.writer))
            apply(c, namespace, reg.secret("registry-reader", reg.reader))
        profile = self.profile()
        profile["spec"]["storage"] = {
            "uri": f"oci://{reg.host}/{repository}",
            "credentialsSecret": {"name": "registry-writer"},
            "signing": {
                "secret": {"name": "signing"},
                "publicKey": (keys / "cosign.pub").read_text(),
            },
        }
        profile["spec"]["serving"] = {"credentialsSecret": {"name": "registry-reader"}}
        return profile


def _ready(cluster: Any, namespace: str, profile: dict[str, Any]) -> dict[str, Any]:
    """The profile applied in `cluster` and Ready (within 400 s)."""
    apply(cluster, namespace, profile)
    done = wait_ready(cluster, namespace, "llama", timeout=400)
    assert done["status"]["phase"] == "Ready", json.dumps(done["status"], indent=2)[:3000]
    return done


@pytest.fixture
def fleet(
    cluster: Any, peer: Cluster, first_operator: Operator, peer_operator: Operator, s3: Any,
    namespace: str, peer_namespace: str, s3_secret: str, prefix: str,
) -> TwoClusters:  # fmt: skip
    """Both clusters, the test's namespace of the same name in each."""
    return TwoClusters(
        cluster, peer, peer_operator, s3, namespace, peer_namespace, s3_secret, prefix
    )


def at_once(*calls: Any) -> None:
    threads = [threading.Thread(target=c) for c in calls]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def _tuned_once(
    fleet: TwoClusters, profile: dict[str, Any]
) -> tuple[str, str, dict[str, Any], dict[str, Any]]:
    """The profile applied in both clusters at once: both Ready, from one tuning Job in all.
    The tuning cluster, the adopting one, and the artifact each serves (the same one)."""
    both, namespace = fleet.both(), fleet.namespace
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
    fleet: TwoClusters,
) -> None:
    namespace = fleet.namespace
    wait_for_real_node_gpus(fleet.first, 1)
    profile = fleet.signed(fleet.profile())
    both = fleet.both()
    tuner, adopter, _, taken = _tuned_once(fleet, profile)
    assert taken["source"]["cluster"] == cluster_uid(both[tuner]) != cluster_uid(both[adopter])
    assert taken["source"]["profile"] == f"{namespace}/llama"
    wide = both[adopter].kubectl("get", "tp", "-n", namespace, "llama", "-o", "wide").stdout
    assert cluster_uid(both[tuner])[:8] in wide, wide

    for c in both.values():  # a model pod in each cluster gets the one artifact
        create(c, namespace, model_pod("server", "llama", gpus=1))
    for k, c in both.items():
        log = fleet.served(c, k)
        assert "PYTORCH_TUNABLEOP_ENABLED=1" in log and "PYTORCH_TUNABLEOP_TUNING=0" in log, log


def test_a_tuning_cluster_killed_mid_job_holds_the_other_back_one_expiry_only(
    fleet: TwoClusters,
) -> None:
    cluster, peer, namespace = fleet.first, fleet.peer, fleet.namespace
    peer_operator = fleet.peer_operator
    wait_for_real_node_gpus(cluster, 1)
    slow = fleet.signed(fleet.profile(FAKE_TORCH_TUNE_SLEEP="4"))
    apply(peer, namespace, slow)  # the peer claims first and tunes, slowly
    fleet.phase(peer, "Tuning", "the peer's Job to run", timeout=120)
    apply(cluster, namespace, slow)
    waiting = fleet.phase(
        cluster, "Queued", "the first cluster to wait for the peer's claim", timeout=60
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


def test_a_changed_image_digest_in_one_cluster_tunes_its_own(fleet: TwoClusters) -> None:
    cluster, peer, namespace = fleet.first, fleet.peer, fleet.namespace
    first = fleet.signed(fleet.profile(FAKE_TORCH_TUNE_SLEEP="2"))
    other = fleet.signed(fleet.profile(STANDIN_NOGPU_IMAGE))
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


@pytest.fixture
def fleet_apart(
    cluster: Any, peer: Cluster, first_operator: Operator, peer_operator: Operator, s3: Any,
    namespace: str, peer_other_namespace: str, s3_secret: str, prefix: str,
) -> TwoClusters:  # fmt: skip
    """Both clusters, the test's namespace in the peer of another name than in the first."""
    peer_ns = peer_other_namespace
    return TwoClusters(cluster, peer, peer_operator, s3, namespace, peer_ns, s3_secret, prefix)


def _retuned(cluster: Any, namespace: str, profile: dict[str, Any], seen: set[str]) -> str:
    """The profile applied (a new revision) and Ready with an artifact not in `seen`: its URI."""
    apply(cluster, namespace, profile)
    done = eventually(
        lambda: get_json(cluster, "tp", "-n", namespace, "llama"),
        lambda p: (
            (p.get("status") or {}).get("phase") == "Ready"
            and (p["status"].get("artifacts") or [{}])[0].get("sha256") not in seen
        ),
        "the retune's artifact served",
        timeout=400,
    )
    art = done["status"]["artifacts"][0]
    seen.add(art["sha256"])
    return str(art["uri"])


def _gc(fleet: TwoClusters, *args: str) -> str:
    """The first cluster's tunefleet-gc over the test's prefix (its kubeconfig, the S3 server's
    keys): its output, once it exited 0 saying nothing on stderr."""
    env = {**tool_env(fleet.s3.env()), "KUBECONFIG": fleet.first.kubeconfig}
    uri = f"s3://{fleet.s3.bucket}/{fleet.prefix}"
    done = subprocess.run(
        # Every Job of the test has ended: nothing is in flight, so no grace is needed.
        [str(GC), "--uri", uri, "--keep", "3", "--grace", "0s", "--no-publish-in-flight", *args],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    print(done.stdout + done.stderr)
    assert (done.returncode, done.stderr) == (0, ""), done.stdout + done.stderr
    return done.stdout


def test_the_first_clusters_gc_after_four_retunes_leaves_what_the_peer_adopted(
    fleet: TwoClusters,
) -> None:
    """Done-when (d) of fleet gc: the first cluster tunes, the peer adopts; the first retunes
    four times and drops the profile, so nothing of its own keeps the adopted artifact. Its
    gc --apply leaves it, for the peer's refs doc alone (without that doc, the same run
    would delete it), and the peer's next model pod is served."""
    cluster, peer, namespace = fleet.first, fleet.peer, fleet.namespace
    wait_for_real_node_gpus(cluster, 1)
    profile = fleet.signed(fleet.profile())
    entry = _tuned_and_published(fleet, profile)  # the peer finds it: it adopts, never tunes
    adopted, store = entry.artifact, entry.store
    taken = _ready(peer, namespace, profile)["status"]["artifacts"][0]
    assert taken["sha256"] == adopted["sha256"] and "source" in taken, taken
    refs = {
        which: contract.refs_key(store.location, cluster_uid(c), ns, "llama")
        for which, c, ns in (("first", cluster, namespace), ("peer", peer, fleet.peer_namespace))
    }

    def peers_doc() -> contract.Refs | None:
        try:
            return contract.Refs.from_bytes(store.get(refs["peer"], contract.MAX_REFS_BYTES))
        except NotFoundError:
            return None

    doc = eventually(
        peers_doc,
        lambda d: d is not None and contract.artifact_id(taken["uri"]) in d.ids(),
        "the peer's refs doc naming the artifact it adopted",
        timeout=60,
    )
    assert doc is not None and doc.expires > time.time() + 86400

    seen = {adopted["sha256"]}
    for i in range(4):  # four retunes in the first cluster: each a new revision, tuned there
        # Another shape each time: the stand-in's results depend on the shapes alone (an env
        # change alone gives the same results, so the same artifact).
        retune = fleet.signed(fleet.profile())
        retune["spec"]["workload"]["shapes"].append({"mnk": [64, 64, 64 * (i + 1)]})
        _retuned(cluster, namespace, retune, seen)
    # The first cluster's profile goes: its status (and history) no longer keeps anything, and
    # the adopted artifact is not among its newest 3. Its published entry goes too (an entry
    # that would keep it: here only the peer's refs doc may).
    cluster.kubectl("delete", "tp", "-n", namespace, "llama", "--wait=true")
    store.delete(entry.key)
    base = parse_uri(adopted["uri"]).prefix
    objects = {o.key for o in store.list(base, 100)}
    assert {f"{base}/results.csv", f"{base}/manifest.json"} <= objects, objects

    # Both refs docs aside (the first cluster's deleted profile left its own, which keeps its
    # artifacts until it expires): a dry run would delete the adopted artifact.
    kept = {which: store.get(key, contract.MAX_REFS_BYTES) for which, key in refs.items()}
    for key in refs.values():
        store.delete(key)
    try:
        dry = _gc(fleet)
        assert f"would delete artifact {adopted['uri']} " in dry, dry
    finally:
        store.put(refs["peer"], kept["peer"], "application/json")

    applied = _gc(fleet, "--apply", "--unused-store-ok")
    assert gc.KEPT_FLEET_REFS in applied, applied
    assert adopted["uri"] not in applied, applied  # neither deleted nor planned
    assert {o.key for o in store.list(base, 100)} == objects

    create(peer, namespace, model_pod("server", "llama", gpus=1))
    log = fleet.served(peer, "peer")
    assert "PYTORCH_TUNABLEOP_ENABLED=1" in log and "PYTORCH_TUNABLEOP_TUNING=0" in log, log


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


def _entry_key(store: S3Store | OciStore, profile: dict[str, Any]) -> tuple[str, str, str]:
    """Where in `store` the profile's identity has its published entry: (key, identity,
    model), for its first GPU model."""
    spec = TuningProfileSpec.model_validate(profile["spec"])
    model = spec.gpu.models[0]
    ident = naming.fleet_identity(spec, model)
    assert ident is not None
    return contract.published_key(store.location, model, ident), ident, model


def _tuned_and_published(fleet: TwoClusters, profile: dict[str, Any]) -> Entry:
    first = _ready(fleet.first, fleet.namespace, profile)
    art = first["status"]["artifacts"][0]
    s3 = fleet.s3
    store = S3Store(parse_uri(f"s3://{s3.bucket}/{fleet.prefix}"), client=s3.client(), timeout_s=60)
    entry = Entry(art, store, *_entry_key(store, profile))
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
    own = _ready(peer, namespace, profile)
    mine = own["status"]["artifacts"][0]
    assert "source" not in mine and len(jobs_of(peer, namespace, "llama")) == 1
    said = peer.kubectl(
        "get", "events", "-n", namespace,
        "--field-selector", "reason=ArtifactNotAdopted", "-o", "json",
    ).stdout  # fmt: skip
    return mine, said


def test_an_artifact_tampered_with_in_the_store_is_not_adopted_and_its_entry_is_replaced(
    fleet_apart: TwoClusters,
) -> None:
    fleet, s3 = fleet_apart, fleet_apart.s3
    wait_for_real_node_gpus(fleet.first, 1)
    profile = fleet.signed(fleet.profile())
    entry = _tuned_and_published(fleet, profile)
    # Someone with write access to the bucket changes the artifact's results under its name.
    results_key = f"{parse_uri(entry.artifact['uri']).prefix}/results.csv"
    body = entry.store.get(results_key, 1 << 22)
    s3.client().put_object(Bucket=s3.bucket, Key=results_key, Body=body + b"\n")

    mine, said = _tunes_its_own(fleet.peer, fleet.peer_namespace, profile)
    assert "does not check" in said, said
    # The bad entry gave way to the peer's verified artifact: the next cluster adopts that.
    now = entry.now()
    assert now is not None and now.record.uri == mine["uri"]
    assert now.holder.cluster == cluster_uid(fleet.peer)


def _cosign_verify_blob(
    keys: Path, blob: Path, signature: Path
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [cosign_binary(), "verify-blob", "--key", str(keys / "cosign.pub"),
         "--insecure-ignore-tlog=true", "--signature", str(signature), str(blob)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def _signed_manifest(store: S3Store, uri: str, manifest: Path, signature: Path) -> str:
    """The manifest of the artifact at `uri` and its signature, from `store` into these files;
    the artifact's prefix."""
    base = parse_uri(uri).prefix
    manifest.write_bytes(store.get(f"{base}/manifest.json", 1 << 20))
    signature.write_bytes(store.get(f"{base}/manifest.json.sig", 4096))
    return base


def test_an_artifact_signed_by_another_key_is_not_adopted_and_cosign_checks_both_signatures(
    fleet_apart: TwoClusters, tmp_path: Path
) -> None:
    fleet, s3 = fleet_apart, fleet_apart.s3
    # Both clusters' profiles sign with one key pair (the fleet's), in their own Secrets.
    password = "fleet-signing"
    keys = key_pair(tmp_path / "fleet", password)
    signing_secret(fleet.first, fleet.namespace, keys, password)
    signing_secret(fleet.peer, fleet.peer_namespace, keys, password)
    wait_for_real_node_gpus(fleet.first, 1)
    profile = fleet.profile()
    profile["spec"]["storage"]["signing"] = {
        "secret": {"name": "signing"}, "publicKey": (keys / "cosign.pub").read_text(),
    }  # fmt: skip
    entry = _tuned_and_published(fleet, profile)
    art, store = entry.artifact, entry.store
    # What the tuning Job signed, cosign (knowing nothing of tunefleet) verifies.
    manifest, signature = tmp_path / "manifest.json", tmp_path / "manifest.json.sig"
    base = _signed_manifest(store, art["uri"], manifest, signature)
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

    mine, said = _tunes_its_own(fleet.peer, fleet.peer_namespace, profile)
    assert "manifest.json.sig" in said and "another key" in said, said
    # The peer's own artifact is signed with the fleet's key, and replaced the forged entry.
    _signed_manifest(store, mine["uri"], manifest, signature)
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


def test_one_identity_on_a_registry_is_tuned_once_through_bids_and_adopted_as_a_signed_bundle(
    fleet: TwoClusters, tmp_path: Path
) -> None:
    """oci:// in both clusters at once: a registry has no conditional write, so each bids
    (a tag of its own) and the earliest bid tunes once it has stood for the settle window; the
    other waits, then adopts the bundle only after its cosign signature verifies."""
    reg = Registry.from_state()
    keys = key_pair(tmp_path / "fleet", "fleet-signing")
    both = fleet.both()
    repository = f"e2e/fleet-{uuid.uuid4().hex[:8]}"
    profile = fleet.on_registry(both.values(), fleet.namespace, keys, repository)
    tuner, adopter, own, taken = _tuned_once(fleet, profile)
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
    create(where, fleet.namespace, model_pod("server", "llama", gpus=1))
    fleet.served(where, adopter)


def test_a_bundle_on_the_registry_signed_by_another_key_is_not_adopted_and_its_entry_replaced(
    fleet_apart: TwoClusters, tmp_path: Path
) -> None:
    """The peer's profile trusts another key (its own Secret and publicKey): the bundle the
    first cluster published does not verify with it, so the peer bids, tunes and signs its own,
    and its entry replaces the one it could not adopt."""
    fleet, peer = fleet_apart, fleet_apart.peer
    reg = Registry.from_state()
    repository = f"e2e/fleet-{uuid.uuid4().hex[:8]}"
    wait_for_real_node_gpus(fleet.first, 1)
    first_keys, peer_keys = (key_pair(tmp_path / k, "fleet-signing") for k in ("a", "b"))
    first = fleet.on_registry([fleet.first], fleet.namespace, first_keys, repository)
    theirs = _ready(fleet.first, fleet.namespace, first)["status"]["artifacts"][0]

    other = fleet.on_registry([peer], fleet.peer_namespace, peer_keys, repository)
    mine, said = _tunes_its_own(peer, fleet.peer_namespace, other)
    assert "does not verify" in said and theirs["bundle"]["digest"] in said, said
    assert mine["bundle"]["digest"] != theirs["bundle"]["digest"]
    store = OciStore(parse_uri(f"oci://{reg.host}/{repository}"), config=reg.writer)
    key, ident, model = _entry_key(store, other)
    entry = eventually(
        lambda: contract.Published.from_bytes(store.get(key, 1 << 16), ident, model),
        lambda e: e is not None and e.record.uri == mine["uri"],
        "the peer's entry to replace the one it could not adopt",
        timeout=60,
    )
    assert entry is not None and entry.holder.cluster == cluster_uid(peer)


# --- what an adopter trusts: its own key, its own identity (issue 54) -------------------------


def _put(fleet: TwoClusters, key: str, body: bytes) -> None:
    """A write with the fleet's credential alone: it may write under `<prefix>/_fleet/` only
    (docs/fleet.md, "Credentials"), which is all these forgeries use."""
    assert key.startswith(f"{fleet.prefix}/{contract.FLEET_DIR}/"), key
    fleet.s3.client().put_object(Bucket=fleet.s3.bucket, Key=key, Body=body)


def _forge_under_fleet(fleet: TwoClusters, entry: Entry) -> str:
    """What the fleet's credential can forge: a copy of the genuine artifact under `_fleet/`,
    its manifest changed (so no signature of the fleet's key covers it) and unsigned, and the
    identity's entry pointed at it. The forged artifact's URI."""
    genuine = parse_uri(entry.artifact["uri"]).prefix  # <prefix>/<ns>/llama/<model>/<sha256>
    forged = (
        f"{fleet.prefix}/{contract.FLEET_DIR}/forged/{genuine.removeprefix(fleet.prefix + '/')}"
    )
    manifest = json.loads(entry.store.get(f"{genuine}/manifest.json", 1 << 20))
    manifest["tuningSeconds"] = 1.0  # any change of the forger's
    body = (json.dumps(manifest, indent=2) + "\n").encode()
    _put(fleet, f"{forged}/results.csv", entry.store.get(f"{genuine}/results.csv", 1 << 22))
    _put(fleet, f"{forged}/manifest.json", body)
    published = entry.now()
    assert published is not None
    uri = f"s3://{fleet.s3.bucket}/{forged}"
    record = replace(published.record, uri=uri, manifest_sha256=hashlib.sha256(body).hexdigest())
    _put(fleet, entry.key, replace(published, record=record).to_bytes())
    return uri


def test_with_only_the_fleet_credential_a_forged_artifact_and_entry_are_never_adopted(
    fleet_apart: TwoClusters,
) -> None:
    """Done when (a): someone who can write under `_fleet/` and nowhere else puts an unsigned
    artifact there and points the identity's entry at it. The peer's profile signs under
    policy Optional, which before adopted an artifact whose .sig was missing: fleet adoption
    requires a signature by its key, whatever the policy."""
    fleet = fleet_apart
    wait_for_real_node_gpus(fleet.first, 1)
    entry = _tuned_and_published(fleet, fleet.signed(fleet.profile()))
    forged = _forge_under_fleet(fleet, entry)

    optional = fleet.signed(fleet.profile(), policy="Optional")
    mine, said = _tunes_its_own(fleet.peer, fleet.peer_namespace, optional)
    assert forged in said and "manifest.json.sig is missing" in said, said
    # The forged entry gave way to the peer's own signed artifact.
    now = entry.now()
    assert now is not None and now.record.uri == mine["uri"], now
    assert now.holder.cluster == cluster_uid(fleet.peer)


def test_an_entry_pointed_at_another_specs_signed_artifact_is_refused_naming_the_field(
    fleet_apart: TwoClusters,
) -> None:
    """Done when (b): the first cluster's artifact is tuned without numericalCheck and signed
    with the fleet's key. A `_fleet/` writer points the identity of a profile that asks for
    numericalCheck at it: the signature verifies, but the identity its signed manifest binds
    differs, and the Event names the field."""
    fleet = fleet_apart
    wait_for_real_node_gpus(fleet.first, 1)
    entry = _tuned_and_published(fleet, fleet.signed(fleet.profile()))
    checked = fleet.signed(fleet.profile())
    checked["spec"]["tuning"]["numericalCheck"] = True
    key, ident, _ = _entry_key(entry.store, checked)
    assert ident != entry.identity  # numericalCheck shapes tuning: another identity
    theirs = entry.now()
    assert theirs is not None
    _put(fleet, key, replace(theirs, identity=ident).to_bytes())

    _, said = _tunes_its_own(fleet.peer, fleet.peer_namespace, checked)
    assert (
        "its identity differs at tuning.numericalCheck: true here, false in the artifact" in said
    ), said


def test_an_adopter_asking_for_a_gain_never_serves_an_unmeasured_artifact(
    fleet_apart: TwoClusters,
) -> None:
    """Done when (c): both profiles ask spec.promotion.minGain 0.5, and the first cluster's
    artifact is not measured (measure: false), which its own gate passes (unmeasured passes
    every gate) and publishes. The peer refuses it, saying so, and serves nothing adopted."""
    fleet = fleet_apart
    wait_for_real_node_gpus(fleet.first, 1)
    picky = fleet.signed(fleet.profile())
    picky["spec"]["promotion"] = {"measure": False, "minGain": 0.5}
    entry = _tuned_and_published(fleet, picky)
    assert not (entry.artifact.get("gain") or {}).get("figures"), entry.artifact

    _, said = _tunes_its_own(fleet.peer, fleet.peer_namespace, picky)
    assert "was not measured" in said and "minGain 0.5" in said, said
    served = get_json(fleet.peer, "tp", "-n", fleet.peer_namespace, "llama")["status"]
    assert all("source" not in a for a in served.get("artifacts") or []), served
    assert all("source" not in a for a in served.get("history") or []), served


@pytest.fixture
def fleet_signing_operators(fleet: TwoClusters, first_operator: Operator) -> Iterator[TwoClusters]:
    """`fleet` with both operators holding the fleet's key pair and the store's publish
    identity, as the chart's signing.secret and signing.storeCredentialsSecret make them."""
    ops = (first_operator, fleet.peer_operator)
    signing = [operator_signs_mode(op, fleet.s3, FLEET_KEYS, FLEET_KEYS_PASSWORD) for op in ops]
    try:
        yield replace(fleet, peer_operator=signing[1])
    finally:
        for signs, op in zip(signing, ops, strict=True):
            signs.stop()
            op.start()


def _secret_refs_and_tokens(pod: dict[str, Any]) -> tuple[list[str], dict[str, list[str]]]:
    """What in `pod` reads a Secret (env, envFrom, volumes, projected sources), and each
    projected ServiceAccount token's audience with the containers that mount it."""
    spec = pod["spec"]
    steps = spec.get("initContainers", []) + spec["containers"]
    refs = [
        f"{c['name']}: env {e['name']}"
        for c in steps
        for e in c.get("env") or []
        if "secretKeyRef" in (e.get("valueFrom") or {})
    ]
    refs += [
        f"{c['name']}: envFrom" for c in steps for e in c.get("envFrom") or [] if "secretRef" in e
    ]
    tokens: dict[str, list[str]] = {}
    for v in spec.get("volumes") or []:
        refs += [f"volume {v['name']}"] if "secret" in v else []
        for src in (v.get("projected") or {}).get("sources") or []:
            refs += [f"volume {v['name']}: projected"] if "secret" in src else []
            if "serviceAccountToken" in src:
                holders = [
                    c["name"]
                    for c in steps
                    if any(m["name"] == v["name"] for m in c.get("volumeMounts") or [])
                ]
                tokens[src["serviceAccountToken"]["audience"]] = holders
    return refs, tokens


def test_tuning_pods_hold_no_key_and_no_store_credential_when_the_operators_do(
    fleet_signing_operators: TwoClusters,
) -> None:
    """Done when (e): one identity applied in both clusters is tuned once; the tuning pod's
    env, volumes and projected tokens hold no private key and no credential of the store (the
    profile names its publish Secret and a signing Secret: neither is mounted), only a signing
    token that publish alone mounts and a store token for sync and publish, good for the
    Job's own keys (tests/unit/test_store_broker.py holds the keys to that). The artifact,
    signed by the tuning cluster's operator, is adopted by the other (it verifies with the
    fleet's public key) and served in both."""
    fleet = fleet_signing_operators
    wait_for_real_node_gpus(fleet.first, 1)
    profile = fleet.signed(fleet.profile())
    both = fleet.both()
    tuner, _, _, _ = _tuned_once(fleet, profile)
    (job,) = jobs_of(both[tuner], fleet.namespace, "llama")
    (pod,) = get_json(
        both[tuner], "pods", "-n", fleet.namespace, "-l",
        f"batch.kubernetes.io/job-name={job['metadata']['name']}",
    )["items"]  # fmt: skip
    refs, tokens = _secret_refs_and_tokens(pod)
    assert refs == [], refs
    assert tokens == {
        "tunefleet.io/sign": ["publish"],
        "tunefleet.io/store": ["sync", "publish"],
    }, tokens
    assert pod["spec"]["automountServiceAccountToken"] is False
    assert fleet.s3_secret in json.dumps(profile) and '"signing"' in json.dumps(profile)
    for c in both.values():
        create(c, fleet.namespace, model_pod("server", "llama", gpus=1))
    for k, c in both.items():
        fleet.served(c, k)
