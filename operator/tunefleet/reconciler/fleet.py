"""The reconcile's fleet step (docs/fleet.md), in fleet mode only: before a GPU model gets a
tuning Job, adopt the identity's published artifact, or claim the identity (tune) or wait for
its holder; while the Job runs, renew the claim; once the profile serves its own artifact,
publish it for the fleet and release the claim.

What it reads and writes is the profile's own store (spec.storage), with the operator's store
identity; it writes no API object. A model is left to tune as before (no adoption, no claim)
where fleet mode cannot apply: spec.tuning.adopt Never, an image not pinned by digest, a retune
of captured misses (its shapes are this profile's), or a store the operator does not reach
(pvc://). Claims are swaps on s3:// and bids settled by time on oci:// (fleet/coordinate.py).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass

from tunefleet import naming
from tunefleet.api.conditions import EventReason, truncate
from tunefleet.contracts import fleet as contract
from tunefleet.contracts.artifact import ArtifactRecord
from tunefleet.fleet import adopt, coordinate
from tunefleet.reconciler.observe import JobObservation
from tunefleet.reconciler.state import Sync
from tunefleet.serving import delivery
from tunefleet.storage.registry import parse_uri, shared_session
from tunefleet.storage.store import Location, Store, StoreError, StoreOptions

log = logging.getLogger(__name__)

WAIT_POLL_S = 5.0  # how soon a waiting profile reads the claim and the entry again (2 GETs)


@dataclass(frozen=True)
class _Where:
    identity: str
    store: Store
    location: Location
    holder: contract.Holder


def _where(s: Sync, model: str, publishing: bool = False) -> _Where | None:
    """Where the fleet's objects for this model's identity are, or None when fleet mode does
    not apply to it (a profile with adopt: Never still publishes what it tuned)."""
    spec, config = s.spec, s.config
    if not config.fleet or not config.fleet_cluster or spec is None:
        return None
    if (spec.tuning.adopt == "Never" and not publishing) or s.rev(model) != naming.revision(spec):
        return None
    identity = naming.fleet_identity(spec, model)
    if identity is None:
        return None
    storage = spec.storage
    try:
        location = parse_uri(storage.uri)
        # Not pvc://: the operator mounts no PersistentVolumeClaim.
        if location.scheme == "oci":
            # The registry identity that may push claims (fleet.ociCredentialsSecret), else
            # delivery's: one per reconcile, as a registry token expires.
            options = StoreOptions(
                timeout_s=config.delivery_timeout_s,
                oci_config=config.fleet_oci_config or config.oci_config or None,
            )
        elif location.scheme == "s3":
            options = delivery.store_options(
                storage.endpoint or config.default_s3_endpoint, storage.region or "", config
            )
        else:
            return None
        store = s.open_store(location, shared_session(location, options))
    except (ValueError, StoreError):
        return None
    if not coordinate.coordinates(store):
        return None
    m = s.meta
    holder = contract.Holder(config.fleet_cluster, m["namespace"], m["name"], m["uid"])
    return _Where(identity, store, location, holder)


def to_tune(s: Sync, wanted: list[str]) -> list[str]:
    """Of the models that need a tuning Job (decide.models_to_tune), those this profile tunes
    itself; the others are adopted (s.adopted) or wait (s.waiting) this pass."""
    out = []
    for model in wanted:
        where = _where(s, model)
        if where is None:
            out.append(model)
            continue
        adopted = _adopt(s, model, where)
        if not adopted and _claim(s, model, where) and not _published_meanwhile(s, model, where):
            out.append(model)
    return out


def _published_meanwhile(s: Sync, model: str, w: _Where) -> bool:
    """The claim is ours: the entry is read once more before a Job is made. Its last holder
    may have published and released between our read of the entry and of the claim; then
    this profile adopts and gives the claim back, instead of tuning the identity again."""
    if not _adopt(s, model, w):
        return False
    _give_back(s, model, w, "giving back the fleet's claim")
    s.memory.claims.pop(model, None)
    return True


def _give_back(s: Sync, model: str, w: _Where, doing: str) -> bool:
    """Take our claim (or bid) on the model's identity down; False, logged, when the store
    fails."""
    key = contract.claim_key(w.location, model, w.identity)
    try:
        coordinate.give_back(w.store, key, w.identity, w.holder, time.time())
    except StoreError as e:
        log.warning(f"{_name(s)} {model}: {doing}: {e}")
        return False
    return True


def _adopt(s: Sync, model: str, w: _Where) -> bool:
    """Adopt the identity's published artifact when there is one and it checks out. One that
    failed a check is said once (an Event) and not downloaded again by this profile: a waiting
    profile looks every few seconds."""
    assert s.spec is not None
    key = contract.published_key(w.location, model, w.identity)
    seen = key
    try:
        entry = adopt.read(w.store, key, w.identity, model)
        if entry is None:
            return False
        seen = f"{key}#{entry.record.sha256}/{entry.record.manifest_sha256}/{entry.record.uri}"
        if seen in s.memory.refused_entries:
            return False
        adopt.verify(entry, s.spec, s.config.stand_in_models, w.store)
    except adopt.NotAdoptable as e:
        if seen not in s.memory.refused_entries:
            s.memory.refused_entries.add(seen)
            s.events.append(
                ("Warning", EventReason.NOT_ADOPTED, truncate(
                    f"{model}: not adopted: {e}; this profile claims the identity and tunes its "
                    "own (or waits for whoever tunes it now)"))
            )  # fmt: skip
        return False
    except StoreError as e:
        s.waiting[model] = truncate(
            f"the fleet's entry could not be read ({e}); reading again", 500
        )
        _again(s, WAIT_POLL_S)
        return True
    # Our bid stood while the entry was published (its holder released just before we
    # looked): taken down now, or it would hold the identity until it expires.
    if model in s.memory.bidding and _give_back(s, model, w, "taking down our bid"):
        s.memory.bidding.discard(model)
    record = adopt.adopted(entry, s.rev(model), _iso(time.time()))
    s.adopted[model] = record
    s.events.append(
        ("Normal", EventReason.ADOPTED, truncate(
            f"{model}: adopted artifact {record.sha256[:12]}, tuned by "
            f"{entry.holder.describe()} at {record.tuned_at or entry.published_at}, after "
            "checking its SHA-256s, manifest, image digest and fit; no tuning Job"))
    )  # fmt: skip
    return True


def _claim(s: Sync, model: str, w: _Where) -> bool:
    """Claim the identity: True when this profile holds it (and tunes)."""
    now = time.time()
    ttl = s.config.fleet_claim_seconds
    key = contract.claim_key(w.location, model, w.identity)
    try:
        standing = coordinate.take(
            w.store, key, w.identity, w.holder, (now, ttl, s.config.fleet_settle_seconds)
        )
    except StoreError as e:
        s.waiting[model] = truncate(
            f"the fleet's claim could not be taken ({e}); trying again", 500
        )
        _again(s, WAIT_POLL_S)
        return False
    if standing.settling > 0:
        s.memory.bidding.add(model)
    else:
        s.memory.bidding.discard(model)  # held, or waiting: our bid is taken down
    if standing.held:
        s.memory.claims[model] = standing.claim.expires
        _again(s, ttl / 2)
        return True
    s.waiting[model] = standing.waiting_words(now)
    if standing.settling > 0:
        _again(s, standing.settling)
    else:
        _again(s, min(WAIT_POLL_S, max(1.0, standing.claim.expires - now)))
    return False


def renew(s: Sync, observations: list[JobObservation]) -> None:
    """Renew each claim this profile holds past half its time (its Job runs: `settle` drops
    the claims of Jobs that ended). A Job running that this replica holds no claim for (it
    restarted, or took over from the leader before) has its claim read back first: ours, it
    is held and renewed from here on; else the holder is logged and both tune."""
    now = time.time()
    ttl = s.config.fleet_claim_seconds
    if s.config.fleet:
        for model in _running(s, observations) - set(s.memory.claims):
            s.memory.claims[model] = now - ttl  # read (and renewed) below
    for model, expires in list(s.memory.claims.items()):
        if expires - now >= ttl / 2:
            _again(s, expires - now - ttl / 2)
            continue
        where = _where(s, model)
        if where is None:
            s.memory.claims.pop(model, None)
            continue
        key = contract.claim_key(where.location, model, where.identity)
        times = (now, ttl, s.config.fleet_settle_seconds)
        try:
            standing = coordinate.take(where.store, key, where.identity, where.holder, times)
        except StoreError as e:
            log.warning(f"{_name(s)} {model}: renewing the fleet's claim: {e}")
            _again(s, WAIT_POLL_S)
            continue
        if not standing.held and standing.settling > 0:
            # On a board, our bid had lapsed (this replica stalled, or restarted after it
            # expired) and no one else bid: bid again, held once it settles.
            s.memory.claims[model] = now - ttl
            _again(s, standing.settling)
            continue
        if not standing.held:
            # Expired before we renewed it (this replica stalled, or the leader changed): both
            # tune now, and the first to publish is the identity's entry. Not read again for
            # this Job (inf: never due); `settle` forgets it when the Job ends.
            log.warning(
                f"{_name(s)} {model}: the fleet's claim was taken over by "
                f"{standing.claim.holder.describe()} while our Job runs"
            )
            s.memory.claims[model] = math.inf
            continue
        s.memory.claims[model] = standing.claim.expires
        _again(s, ttl / 2)


def settle(s: Sync, observations: list[JobObservation], served: list[ArtifactRecord]) -> None:
    """After the status write: publish each artifact this profile tuned and serves (never an
    adopted one) for the fleet, once (the first of an identity stays, whoever wrote it); then
    release the claims of models whose Job ended, so that a waiting profile adopts (or, when
    the Job failed, takes over) at once instead of after the expiry."""
    # Only artifacts of the revision each model tunes under now: one an earlier spec made,
    # served while the new revision tunes, is not the current identity's.
    current = [r for r in served if r.revision == s.rev(r.gpu_model)]
    for record in current:
        if record.adopted or not record.job or record.sha256 in s.memory.published:
            continue
        where = _where(s, record.gpu_model, publishing=True)
        if where is None:
            continue
        key = contract.published_key(where.location, record.gpu_model, where.identity)
        entry = adopt.entry_for(record, where.identity, where.holder, _iso(time.time()))
        try:
            assert s.spec is not None
            if adopt.publish(where.store, key, entry, s.spec, s.config.stand_in_models):
                s.events.append(
                    ("Normal", EventReason.PUBLISHED, truncate(
                        f"{record.gpu_model}: artifact {record.sha256[:12]} published for the "
                        "profiles and clusters that share this store and tune the same identity"))
                )  # fmt: skip
        except StoreError as e:
            log.warning(f"{_name(s)} {record.gpu_model}: publishing for the fleet: {e}")
            _again(s, WAIT_POLL_S)
            continue
        s.memory.published.add(record.sha256)
    # Released once the model's Job is seen finished, or its artifact served; never because
    # its Job is not seen: the cache may not have the Job just made yet (a pass on the echo
    # of our own status write), and a Job Kueue holds is not observed until admitted.
    # A sharded Job whose shares are all in is not over: its merge Job publishes.
    ended = {
        o.model
        for o in observations
        if o.revision == s.rev(o.model)
        and (
            o.state == "Failed" or (o.state == "Succeeded" and (o.role == "merge" or o.shards <= 1))
        )
    }
    ended = (ended | {r.gpu_model for r in current}) - _running(s, observations)
    for model in [m for m in s.memory.claims if m in ended]:
        where = _where(s, model)
        if where is not None and not _give_back(s, model, where, "releasing the fleet's claim"):
            _again(s, WAIT_POLL_S)
            continue
        s.memory.claims.pop(model, None)


def _running(s: Sync, observations: list[JobObservation]) -> set[str]:
    """Models with a Job of the revision they tune under now that has not ended (a Job of an
    earlier revision, being stopped, holds no claim of the current identity)."""
    return {
        o.model
        for o in observations
        if o.state in ("Pending", "Running") and o.revision == s.rev(o.model)
    }


def _name(s: Sync) -> str:
    return f"TuningProfile {s.meta['namespace']}/{s.meta['name']}"


def _again(s: Sync, after: float) -> None:
    s.fleet_requeue = after if s.fleet_requeue is None else min(s.fleet_requeue, after)


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))
