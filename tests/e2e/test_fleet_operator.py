"""Fleet mode with the real operator, API server, S3 server and node (docs/fleet.md): profiles
in two namespaces with one identity (the same image digest and tuning settings) make one
tuning Job between them, and both serve its artifact; a claim its holder stopped renewing (a
cluster that died mid-tuning leaves exactly that in the store) is taken over once it expires;
another image digest tunes its own."""

from __future__ import annotations

import calendar
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from testbed.cluster import (
    STANDIN_IMAGE,
    STANDIN_NOGPU_IMAGE,
    cluster_uid,
    pinned_image,
    wait_for_real_node_gpus,
)
from testbed.operator import (
    Operator,
    fleet_mode,
    leave_fleet_mode,
    user_namespace,
)
from testbed.poll import eventually
from testbed.real_node import fleet_profile, model_pod
from testbed.registry import signing_secret
from tests.support.artifacts import COSIGN, PUBLIC_KEY
from tests.support.kube import (
    apply,
    condition,
    create,
    ended,
    get_json,
    jobs_of,
    statuses,
)
from tests.support.kube import ready as wait_ready
from tunefleet import naming
from tunefleet.api import TuningProfileSpec
from tunefleet.contracts import fleet as contract
from tunefleet.storage.registry import parse_uri
from tunefleet.storage.s3 import S3Store

pytestmark = pytest.mark.e2e

# The fleet's key pair (`cosign generate-key-pair` made it, password "tunefleet-test").
FLEET_KEYS_PASSWORD = "tunefleet-test"


def _signed(cluster: Any, namespace: str, profile: dict[str, Any]) -> dict[str, Any]:
    """`profile` signing with the fleet's key pair and verifying with its public half, its
    Secret `signing` in `namespace`: fleet mode adopts, claims and publishes only for a profile
    with a key to verify another's signature with (docs/fleet.md)."""
    if cluster.kubectl("get", "secret", "signing", "-n", namespace, check=False).returncode:
        signing_secret(cluster, namespace, COSIGN, FLEET_KEYS_PASSWORD)
    profile["spec"]["storage"]["signing"] = {"secret": {"name": "signing"}, "publicKey": PUBLIC_KEY}
    return profile


@pytest.fixture
def fleet_operator(cluster: Any, s3: Any, operator: Operator) -> Iterator[Operator]:
    """The e2e operator process in fleet mode, claims of 60 s; the plain one afterwards."""
    fleet = fleet_mode(cluster, operator, s3)
    try:
        yield fleet
    finally:
        leave_fleet_mode(cluster, fleet, operator)


@pytest.fixture
def other_namespace(cluster: Any, s3: Any, namespace: str) -> Iterator[str]:
    with user_namespace(cluster, s3, f"{namespace}-b"[:63]) as name:
        yield name


def test_two_profiles_of_one_identity_tune_once_and_both_serve_it(
    cluster: Any,
    fleet_operator: Operator,
    s3: Any,
    namespace: str,
    other_namespace: str,
    s3_secret: str,
    prefix: str,
) -> None:
    wait_for_real_node_gpus(cluster, 2)
    image = pinned_image(STANDIN_IMAGE)
    where = {namespace: "llama", other_namespace: "llama"}
    profiles = {
        ns: _signed(cluster, ns, fleet_profile(s3, s3_secret, prefix, image, name))
        for ns, name in where.items()
    }
    applied = [
        threading.Thread(target=apply, args=(cluster, ns, profile))
        for ns, profile in profiles.items()
    ]  # the same moment, as near as two kubectl calls get
    for t in applied:
        t.start()
    for t in applied:
        t.join()
    done = {ns: wait_ready(cluster, ns, name, timeout=400) for ns, name in where.items()}
    for prof in done.values():
        assert prof["status"]["phase"] == "Ready", json.dumps(prof["status"], indent=2)[:3000]
    jobs = {ns: jobs_of(cluster, ns, "llama") for ns in where}
    assert sum(len(j) for j in jobs.values()) == 1, {ns: len(j) for ns, j in jobs.items()}
    tuner = next(ns for ns, j in jobs.items() if j)
    adopter = next(ns for ns in where if ns != tuner)
    own = done[tuner]["status"]["artifacts"][0]
    taken = done[adopter]["status"]["artifacts"][0]
    assert taken["sha256"] == own["sha256"] and taken["uri"] == own["uri"]
    assert "source" not in own and own["job"] == jobs[tuner][0]["metadata"]["name"]
    assert taken["source"]["cluster"] == cluster_uid(cluster)
    assert taken["source"]["profile"] == f"{tuner}/llama" and taken["job"] == ""
    assert done[adopter]["status"]["source"].endswith(f"{tuner}/llama")
    wide = cluster.kubectl("get", "tp", "-n", adopter, "llama", "-o", "wide").stdout
    assert "SOURCE" in wide and f"{tuner}/llama" in wide, wide

    for ns in where:  # a model pod in each namespace gets the one artifact
        create(cluster, ns, model_pod("server", "llama", gpus=1))
    for ns in where:
        pod = ended(cluster, ns, "server", f"the model pod in {ns} to finish")
        log = cluster.kubectl("logs", "-n", ns, "server", "-c", "server").stdout
        assert pod["status"]["phase"] == "Succeeded", log
        fetch = statuses(pod)["tunefleet-fetch"]["state"]["terminated"]
        assert (
            own["sha256"][:12] in fetch["message"] or "wrote 1 results file(s)" in fetch["message"]
        )
        assert "PYTORCH_TUNABLEOP_ENABLED=1" in log and "PYTORCH_TUNABLEOP_TUNING=0" in log, log


def test_a_claim_left_by_a_dead_cluster_is_taken_over_once_it_expires(
    cluster: Any, fleet_operator: Operator, s3: Any, namespace: str, s3_secret: str, prefix: str
) -> None:
    wait_for_real_node_gpus(cluster, 1)
    image = pinned_image(STANDIN_IMAGE)
    profile = _signed(cluster, namespace, fleet_profile(s3, s3_secret, prefix, image))
    spec = TuningProfileSpec.model_validate(profile["spec"])
    model = spec.gpu.models[0]
    ident = naming.fleet_identity(spec, model)
    assert ident is not None
    # What a cluster that died mid-tuning leaves: its claim, no longer renewed.
    store = S3Store(parse_uri(f"s3://{s3.bucket}/{prefix}"), client=s3.client(), timeout_s=60)
    dead = contract.Holder("0dead000-0000-4000-8000-000000000000", "ml", "llama", "uid-gone")
    expires = time.time() + 25
    claim = contract.Claim(ident, dead, time.time() - 300, expires)
    key = contract.claim_key(store.location, model, ident)
    assert store.create(key, claim.to_bytes(), "application/json")

    apply(cluster, namespace, profile)
    waiting = eventually(
        lambda: get_json(cluster, "tp", "-n", namespace, "llama"),
        lambda p: (p.get("status") or {}).get("phase") == "Queued",
        "the profile to wait for the dead cluster's claim",
        timeout=60,
    )
    ready_cond = condition(waiting, "Ready")
    assert ready_cond["reason"] == "TunedElsewhere" and dead.cluster in ready_cond["message"]
    assert jobs_of(cluster, namespace, "llama") == []
    prof = wait_ready(cluster, namespace, "llama", timeout=400)
    assert prof["status"]["phase"] == "Ready", json.dumps(prof["status"], indent=2)[:3000]
    (job,) = jobs_of(cluster, namespace, "llama")
    started = job["metadata"]["creationTimestamp"]
    assert calendar.timegm(time.strptime(started, "%Y-%m-%dT%H:%M:%SZ")) >= expires - 2
    now = contract.Claim.from_bytes(store.get(key, 1 << 14), ident)
    assert now is not None and now.holder.cluster == cluster_uid(cluster)  # taken over
    published = contract.Published.from_bytes(
        store.get(contract.published_key(store.location, model, ident), 1 << 16), ident, model
    )
    assert (
        published is not None
        and published.record.sha256 == prof["status"]["artifacts"][0]["sha256"]
    )


def test_another_image_digest_tunes_its_own_while_the_first_is_claimed(
    cluster: Any,
    fleet_operator: Operator,
    s3: Any,
    namespace: str,
    other_namespace: str,
    s3_secret: str,
    prefix: str,
) -> None:
    first = _signed(
        cluster, namespace, fleet_profile(s3, s3_secret, prefix, pinned_image(STANDIN_IMAGE))
    )
    spec = TuningProfileSpec.model_validate(first["spec"])
    model = spec.gpu.models[0]
    ident = naming.fleet_identity(spec, model)
    assert ident is not None
    store = S3Store(parse_uri(f"s3://{s3.bucket}/{prefix}"), client=s3.client(), timeout_s=60)
    alive = contract.Holder("0a11fe00-0000-4000-8000-000000000000", "ml", "llama", "uid-1")
    claim = contract.Claim(ident, alive, time.time(), time.time() + 3600)
    assert store.create(contract.claim_key(store.location, model, ident), claim.to_bytes(), "")
    apply(cluster, namespace, first)
    other = fleet_profile(s3, s3_secret, prefix, pinned_image(STANDIN_NOGPU_IMAGE))
    apply(cluster, other_namespace, _signed(cluster, other_namespace, other))
    eventually(
        lambda: jobs_of(cluster, other_namespace, "llama"),
        lambda jobs: len(jobs) == 1,
        "the other digest's own tuning Job",
        timeout=60,
    )
    waiting = get_json(cluster, "tp", "-n", namespace, "llama")
    assert waiting["status"]["phase"] == "Queued" and jobs_of(cluster, namespace, "llama") == []
