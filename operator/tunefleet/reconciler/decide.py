"""A reconcile's decision, pure: what gather.py read (Inputs) in, the Plan out. decide.plan is
called once per reconcile; its Plan holds round one's acts (what later decisions turn on:
retune sets, the fleet's adoptions and claims) and decides round two from what round one
answered (Plan.then). It reads no API and no store, and writes nothing (apply.py carries
the Plan out).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace
from typing import Any

from tunefleet import naming
from tunefleet.api.conditions import EventReason, truncate
from tunefleet.api.profile_status import TuningProfileStatus
from tunefleet.builders.job import Child
from tunefleet.capture import step as capture_step
from tunefleet.contracts import fleet as contract
from tunefleet.contracts.artifact_record import ArtifactRecord
from tunefleet.contracts.fleet import Published
from tunefleet.fleet import adopt
from tunefleet.fleet.probe import Verdict
from tunefleet.reconciler import children, status
from tunefleet.reconciler.acts import (
    Adoption,
    Applied,
    Delivery,
    Event,
    First,
    Publish,
    RefsWrite,
    Renewal,
    Second,
    Stop,
    sooner,
)
from tunefleet.reconciler.inputs import Inputs, iso
from tunefleet.reconciler.observe import JobObservation
from tunefleet.serving import delivery

WAIT_POLL_S = 5.0  # how soon a waiting profile reads the claim and the entry again (2 GETs)
# A delivered artifact whose ConfigMap was deleted or replaced and could not be made again
# (the store down) is tried again this soon, not after DELIVERY_RETRY_S: until then every new
# pod fetches it from the store.
REDELIVER_AFTER_S = 30.0


def wanted(inputs: Inputs, capture: capture_step.Outcome | None = None) -> list[str]:
    """The models that need a tuning Job now (children.models_to_tune)."""
    assert inputs.spec is not None
    done = [*inputs.served(capture), *inputs.rejected(capture)]
    return children.models_to_tune(
        inputs.spec.gpu.models, inputs.revision(capture), inputs.view.jobs, done, inputs.too_few
    )


def child(inputs: Inputs, model: str, capture: capture_step.Outcome) -> Child:
    """What a GPU model's children are named and labelled by, under its revision now."""
    assert inputs.spec is not None
    m = inputs.meta
    rev = inputs.revision(capture)(model)
    base = naming.revision(inputs.spec)
    return Child(
        inputs.spec, m["namespace"], m["name"], m["uid"], model, inputs.config,
        revision_override=rev if rev != base else "",
        captured=capture.captured.get(model, "") if rev != base else "",
    )  # fmt: skip


@dataclass(frozen=True)
class Plan:
    """One reconcile's decision: round one's acts, and round two's once round one answered."""

    inputs: Inputs
    first: First

    def after(self, answered: Applied) -> Inputs:
        """The inputs as round one's answers leave them (the store's probe: probed)."""
        return probed(self.inputs, answered.probe)

    def then(self, answered: Applied) -> Second:
        """Round two, decided from round one's answers (pure)."""
        return _second(self.after(answered), self.first, answered)


def probed(inputs: Inputs, answer: Verdict | str | None) -> Inputs:
    """The inputs once round one probed the store's conditional writes (apply, before any
    claim through it): a store that fails them is not coordinated through (the profile tunes
    its own, nothing adopted through it); a store error leaves no verdict, and nothing is
    adopted or claimed this pass."""
    if answer is None:
        return inputs
    if isinstance(answer, str):
        return replace(inputs, probe=None, unprobed=answer)
    if answer.honours:
        return replace(inputs, probe=None)
    return replace(inputs, probe=None, wheres={}, fleet={}, refusal=answer)


def plan(inputs: Inputs) -> Plan:
    """The reconcile's plan (see the module's docstring)."""
    if not inputs.acting:
        return Plan(inputs, First(drop_finalizer=_legacy(inputs)))
    adoptions, claims, refused = [], {}, {}
    for model, facts in inputs.fleet.items():
        if facts.entry is not None:
            adoptions.append(_adoption(inputs, model, facts.entry, facts.where))
        elif not facts.unread:
            claims[model] = facts.where
            if facts.seen and facts.seen not in inputs.memory.refused_entries:
                refused[model] = facts
    planned = inputs.planned
    return Plan(
        inputs,
        First(
            drop_finalizer=_legacy(inputs),
            freezes=tuple(planned.plan.freezes) if planned is not None else (),
            stale_sets=inputs.stale_sets,
            adoptions=tuple(adoptions),
            claims=claims,
            refused=refused,
            probe=inputs.probe,
        ),
    )


def _store_refused(inputs: Inputs) -> Verdict | None:
    """The store's refusal, when this profile has not said it yet and tunes its own for it."""
    said = inputs.refusal
    if said is None or said.mark == inputs.memory.said_refusal or not wanted(inputs):
        return None
    return said


def _legacy(inputs: Inputs) -> bool:
    return children.holds_legacy_finalizer(inputs.meta)


def _adoption(inputs: Inputs, model: str, entry: Published, w: Any) -> Adoption:
    """An identity's published artifact adopted (checked in gather.read_entry)."""
    record = adopt.adopted(entry, inputs.revision()(model), iso(inputs.wall))
    said = truncate(
        f"{model}: adopted artifact {record.sha256[:12]}, tuned by "
        f"{entry.holder.describe()} at {record.tuned_at or entry.published_at}, after "
        "checking its SHA-256s, manifest, image digest and fit; no tuning Job"
    )
    # Our bid stood while the entry was published (its holder released just before we
    # looked): taken down now, or it would hold the identity until it expires.
    return Adoption(model, record, said, w if model in inputs.memory.bidding else None)


def capture_after(inputs: Inputs, answered: Applied) -> capture_step.Outcome:
    """The capture step's outcome once its retune sets were made: one that could not be is
    taken back from the plan, with why, and tried again at the next reconcile."""
    if inputs.planned is None:
        return inputs.capture
    if not answered.unfrozen:
        return capture_step.outcome(inputs.planned, list(answered.made))
    planned = copy.deepcopy(inputs.planned)
    for model, why in answered.unfrozen.items():
        planned.revert(model, why)
    return capture_step.outcome(planned, list(answered.made))


def adopted(inputs: Inputs, first: First, answered: Applied) -> dict[str, ArtifactRecord]:
    """Artifacts adopted this pass, by model: read before the claim, or published while we
    claimed (its claim is then given back)."""
    if inputs.unprobed or inputs.refusal is not None:
        return {}  # nothing through a store not known to honour conditional writes
    out = {a.model: a.record for a in first.adoptions}
    for model, facts in answered.published_meanwhile.items():
        if facts.entry is not None:
            out[model] = _adoption(inputs, model, facts.entry, facts.where).record
    return out


def waiting(inputs: Inputs, answered: Applied) -> tuple[dict[str, str], float | None]:
    """Models that wait for the fleet (with why), and how soon to look again."""
    out, again = {}, None
    for model, facts in inputs.fleet.items():
        if inputs.unprobed:
            out[model] = truncate(
                "fleet mode could not check that the store honours conditional writes "
                f"({inputs.unprobed}); nothing is claimed through it until then: trying again",
                500,
            )
            again = sooner(again, WAIT_POLL_S)
        elif facts.unread:
            out[model] = truncate(
                f"the fleet's entry could not be read ({facts.unread}); reading again", 500
            )
            again = sooner(again, WAIT_POLL_S)
    now, ttl = inputs.wall, inputs.config.fleet_claim_seconds
    for model, standing in answered.standings.items():
        if model in answered.published_meanwhile:
            continue
        if isinstance(standing, str):
            out[model] = truncate(
                f"the fleet's claim could not be taken ({standing}); trying again", 500
            )
            again = sooner(again, WAIT_POLL_S)
        elif standing.held:
            again = sooner(again, ttl / 2)
        else:
            out[model] = standing.waiting_words(now)
            left = max(1.0, standing.claim.expires - now)
            again = sooner(
                again, standing.settling if standing.settling > 0 else min(WAIT_POLL_S, left)
            )
    return out, again


def _second(inputs: Inputs, first: First, answered: Applied) -> Second:
    """Round two (see Second). A profile not acted on (an invalid spec, being deleted) still
    has its Jobs tended and its artifacts delivered; nothing is made or stopped for it."""
    capture = capture_after(inputs, answered)
    now = preliminary(inputs, first, answered, capture)
    delivered = tuple(deliveries(inputs, now.artifacts))
    refs = refs_due(inputs, now)
    if not inputs.acting:
        return Second(capture, tends=_tends(inputs, capture), deliveries=delivered, refs=refs)
    rev = inputs.revision(capture)
    observations = inputs.observe(inputs.view.jobs, capture)
    waits, again = waiting(inputs, answered)
    renewals, renew_again = _renewals(inputs, observations, capture)
    publishes, releases = _settle(inputs, observations, now.artifacts, capture)
    return Second(
        capture,
        creates=_creates(inputs, first, answered, capture, waits),
        stops=_stops(inputs, capture),
        moves=tuple(_moves(inputs)),
        starts=tuple(_starts(inputs, rev)),
        renewals=renewals,
        merges=tuple(
            child(inputs, m, capture)
            for m in children.merges_due(observations, rev, inputs.view.jobs)
        ),
        tends=_tends(inputs, capture),
        deliveries=delivered,
        retire=_retire_due(inputs, now),
        publishes=publishes,
        releases=releases,
        refs=refs,
        recount=_recount(inputs, now),
        store_refused=_store_refused(inputs),
        events=tuple(_fleet_events(inputs, first, answered)),
        requeue=sooner(again, renew_again),
    )


def _creates(
    inputs: Inputs,
    first: First,
    answered: Applied,
    capture: capture_step.Outcome,
    waits: dict[str, str],
) -> tuple[Child, ...]:
    """A Job for each model that needs one and tunes itself: not adopted, not waiting for the
    fleet, not a retune whose set could not be made (tried again next reconcile)."""
    taken = set(adopted(inputs, first, answered)) | set(waits) | set(answered.unfrozen)
    out = []
    for model in wanted(inputs, capture):
        if model in taken:
            continue
        fleet = model in inputs.fleet or inputs.fleet_where(model, capture) is not None
        standing = answered.standings.get(model)
        if fleet and (standing is None or isinstance(standing, str) or not standing.held):
            continue  # the fleet's: tuned here only under our claim
        out.append(child(inputs, model, capture))
    return tuple(out)


def _stops(inputs: Inputs, capture: capture_step.Outcome) -> tuple[Stop, ...]:
    """The Jobs of an earlier revision, each with its ConfigMap's uid when the API server has
    that ConfigMap and it is this profile's (read, never assumed)."""
    out = []
    rev, uid = inputs.revision(capture), inputs.meta["uid"]
    for job in children.superseded(inputs.view.jobs, rev):
        fact = inputs.config_maps.get(job["metadata"]["name"])
        ours = fact is not None and fact.owned_by(uid)
        out.append(
            Stop(job, fact.uid if fact is not None and ours else "", rev(children.model_of(job)))
        )
    return tuple(out)


def _moves(inputs: Inputs) -> list[children.QueueMove]:
    assert inputs.spec is not None
    return children.queue_moves(
        inputs.view.jobs, inputs.spec.tuning.queue_name, naming.revision(inputs.spec)
    )


def _starts(inputs: Inputs, rev: children.Revision) -> list[dict[str, Any]]:
    """The Jobs the GPU gate let go. With the gate turned off (operator.gpuGate: false, a
    helm upgrade), the Jobs it held would wait for nobody: each starts. A queue's are
    Kueue's."""
    assert inputs.spec is not None
    if inputs.spec.tuning.queue_name:
        return []
    gate = inputs.around.gate
    let_go = gate.admitted if gate is not None else lambda uid: True
    return children.admitted(inputs.view.jobs, let_go, rev)


def _tends(inputs: Inputs, capture: capture_step.Outcome) -> tuple[children.Tend, ...]:
    observations = inputs.observe(inputs.view.jobs, capture)
    ops = children.tend(observations, inputs.memory.image_ids, inputs.spec is not None)
    return tuple(ops)


def preliminary(
    inputs: Inputs, first: First, answered: Applied, capture: capture_step.Outcome
) -> TuningProfileStatus:
    """The status the Jobs as read say, before this pass's Jobs and deliveries: which
    artifacts are served, for delivery, publishing and retiring to act on."""
    jobs = inputs.observe(inputs.view.jobs, capture)
    return status.computed(inputs, jobs, extra(inputs, first, answered, capture))


def extra(
    inputs: Inputs, first: First, answered: Applied, capture: capture_step.Outcome
) -> status.Extra:
    """What the decision adds to the Jobs observed, for status."""
    waits, _ = waiting(inputs, answered)
    return status.Extra(capture, adopted(inputs, first, answered), waits, inputs.unkeyed)


def deliveries(inputs: Inputs, artifacts: list[ArtifactRecord]) -> list[Delivery]:
    """Each current artifact's delivery (delivery.py): its ConfigMap kept, made (again), or
    why not; an oci:// artifact's volume image checked."""
    spec = inputs.spec
    if spec is None or not artifacts:
        return []
    if spec.serving.delivery != "ConfigMap":
        return [Delivery(replace(a, delivery="Store (spec.serving.delivery)")) for a in artifacts]
    if spec.storage.is_oci:
        return [_volume(inputs, a) for a in artifacts]
    why_not = delivery.deliverable(inputs.config)
    return [_delivery(inputs, a, why_not) for a in artifacts]


def _volume(inputs: Inputs, record: ArtifactRecord) -> Delivery:
    """An oci:// artifact: its volume image, once verified, is what model pods mount; checked
    again after DELIVERY_RETRY_S (remembered by the key and policy too: a changed key is
    checked now, not 5 min on)."""
    assert inputs.spec is not None
    from tunefleet.artifacts.volumes import key_id

    storage = inputs.spec.storage
    memo = f"{record.sha256}|{key_id(storage.public_key)}|{storage.signing_policy == 'Required'}"
    tried = inputs.memory.deliveries.get(memo)
    if tried and inputs.at - tried[0] < delivery.DELIVERY_RETRY_S:
        return Delivery(replace(record, delivery=tried[1]), memo=memo)
    return Delivery(record, "volume", memo=memo)


def _delivery(inputs: Inputs, record: ArtifactRecord, why_not: str) -> Delivery:
    """One artifact as delivered now: its ConfigMap kept, made (again), or why not."""
    if record.config_map:
        fact = inputs.config_maps.get(record.config_map)
        made = record.config_map_uid
        if fact is None or not fact.known or (made and fact.uid == made and fact.there is None):
            return Delivery(record)  # as watched, or not known now: looked at again later
        if made and fact.uid == made:
            # The very object made (its uid), which the watch no longer sees: its labels were
            # removed or changed. Labelled again, it is mounted again.
            return Delivery(record, "relabel", there=fact.there)
        what = f"was replaced (uid {fact.uid})" if fact.there is not None else "was deleted"
        found = Delivery(
            replace(record, config_map="", config_map_uid="", delivery=""),
            found_lost=f"{record.config_map} {what}",
            replaced_by=delivery.Foreign(
                record.config_map, fact.uid, f"it replaced the ConfigMap made ({made})"
            )
            if fact.there is not None
            else None,
        )
        # Tried again now, whatever failed before.
        return _to_place(inputs, found, why_not, found.found_lost)
    return _to_place(inputs, Delivery(record), why_not, "")


def _to_place(inputs: Inputs, d: Delivery, why_not: str, found_lost: str) -> Delivery:
    """An artifact without its ConfigMap: made (again), or why not."""
    record = d.record
    lost = inputs.memory.lost.get(record.sha256, "") or found_lost
    store_only = store_only_note(record, why_not)
    if store_only:
        return replace(d, record=replace(record, delivery=store_only), lost=lost)
    tried = None if found_lost else inputs.memory.deliveries.get(record.sha256)
    wait = REDELIVER_AFTER_S if lost else delivery.DELIVERY_RETRY_S
    if tried and inputs.at - tried[0] < wait:
        return replace(d, record=replace(record, delivery=tried[1]), lost=lost)
    return replace(d, act="place", lost=lost)


def store_only_note(record: ArtifactRecord | None, why_not: str) -> str:
    """How pods get an artifact that gets no ConfigMap, or "" when it gets one."""
    if why_not or record is None:
        return f"Store: {why_not}" if why_not else "Store"
    if not record.results_only:
        # A ConfigMap of 1 MiB holds few caches anyway.
        return "Store: the artifact carries caches, unpacked by fetch"
    return ""


def _retire_due(inputs: Inputs, said: TuningProfileStatus) -> frozenset[str] | None:
    """Whether to look for artifact ConfigMaps status no longer names (a retune pushed one
    out of the bounded history): when status drops one, every RETIRE_EVERY_S while one is
    still mounted, and once after a restart for a profile with history. What status serves
    (artifacts and history) is kept."""
    mem = inputs.memory
    serves = {a.config_map for a in [*said.artifacts, *said.history] if a.config_map}
    dropped = delivery.referenced_names(inputs.previous) - serves
    first = mem.retiring is None
    waiting_ = bool(mem.retiring) and inputs.at - mem.retired_at >= delivery.RETIRE_EVERY_S
    due = dropped or waiting_ or (first and said.history)
    return frozenset(serves) if due else None


def refs_due(inputs: Inputs, said: TuningProfileStatus) -> RefsWrite | None:
    """The profile's refs doc, when it must be written: what it references changed since this
    replica last wrote it, under half its life is left, or this replica has written none yet
    (a restart, a new leader: once, then remembered). It names what status references as held
    and as this pass computes it (both: until the status write lands, the API server may hold
    either), exactly as tunefleet-gc reads its own cluster's profiles (contracts/fleet.py).
    Nothing is written for a profile that references nothing and wrote no doc. No requeue is
    needed for the renewal: every profile is reconciled at least every resync."""
    at = inputs.refs_at
    if at is None:
        return None
    m = inputs.meta
    records = [*contract.status_records(inputs.previous), *said.artifacts, *said.history]
    ids = contract.referenced(records, m["namespace"], m["name"])
    uris = tuple(sorted(at.location.uri(at.location.key(*i)) for i in ids))
    last = inputs.memory.refs
    if last is None and not uris:
        return None
    fresh = last is not None and last[1] - inputs.wall > contract.REFS_TTL_SECONDS / 2
    if last is not None and last[0] == uris and fresh:
        return None
    expires = inputs.wall + contract.REFS_TTL_SECONDS
    refs = contract.Refs(at.cluster, m["namespace"], m["name"], m["uid"], uris, expires)
    return RefsWrite(at, refs)


def _recount(inputs: Inputs, said: TuningProfileStatus) -> bool:
    """status.capture counts against the artifacts this status serves: when one is new, the
    counts are made again against it (no retune is decided on this pass)."""
    if inputs.spec is None or inputs.capture.entries is None or not inputs.acting:
        return False
    before = {a.get("gpuModel"): a.get("sha256") for a in inputs.previous.get("artifacts") or []}
    after = {a.gpu_model: a.sha256 for a in said.artifacts}
    return before != after and inputs.around.captures is not None


def _running(
    inputs: Inputs, observations: list[JobObservation], rev: children.Revision
) -> set[str]:
    """Models with a Job of the revision they tune under now that has not ended (a Job of an
    earlier revision, being stopped, holds no claim of the current identity)."""
    return {
        o.model
        for o in observations
        if o.state in ("Pending", "Running") and o.revision == rev(o.model)
    }


def _renewals(
    inputs: Inputs, observations: list[JobObservation], capture: capture_step.Outcome
) -> tuple[tuple[Renewal, ...], float | None]:
    """Each claim this profile holds past half its time (its Job runs); a Job running that
    this replica holds no claim for (it restarted, or took over) has its claim read back."""
    if not inputs.config.fleet:
        return (), None
    now, ttl = inputs.wall, inputs.config.fleet_claim_seconds
    claims = dict(inputs.memory.claims)
    for model in _running(inputs, observations, inputs.revision(capture)) - set(claims):
        claims[model] = now - ttl
    out, again = [], None
    # Claims and bids alike: a bid's readers stop obeying one not posted again for
    # bids.LIVE_SECONDS, so a long claim is renewed more often than at half its life.
    due = ttl - contract.renew_every(ttl)
    for model, expires in claims.items():
        if expires - now > due:
            again = sooner(again, expires - now - due)
            continue
        out.append(Renewal(model, inputs.fleet_where(model, capture)))
    return tuple(out), again


def _settle(
    inputs: Inputs,
    observations: list[JobObservation],
    served: list[ArtifactRecord],
    capture: capture_step.Outcome,
) -> tuple[tuple[Publish, ...], dict[str, Any]]:
    """Publish each artifact this profile tuned and serves (never an adopted one) for the
    fleet, once; release the claims of models whose Job ended, so that a waiting profile
    adopts (or, when the Job failed, takes over) at once instead of after the expiry."""
    if not inputs.config.fleet:
        return (), {}
    rev = inputs.revision(capture)
    # Only artifacts of the revision each model tunes under now.
    current = [r for r in served if r.revision == rev(r.gpu_model)]
    publishes = []
    for record in current:
        if record.adopted or not record.job or record.sha256 in inputs.memory.published:
            continue
        w = inputs.fleet_where(record.gpu_model, capture, publishing=True)
        if w is not None:
            key = contract.published_key(w.location, record.gpu_model, w.identity)
            publishes.append(Publish(record, w, key))
    # Released once the model's Job is seen finished, or its artifact served; never because
    # its Job is not seen: the cache may not have the Job just made yet. A sharded Job whose
    # shares are all in is not over: its merge Job publishes.
    ended = {
        o.model
        for o in observations
        if o.revision == rev(o.model)
        and (
            o.state == "Failed" or (o.state == "Succeeded" and (o.role == "merge" or o.shards <= 1))
        )
    }
    ended = (ended | {r.gpu_model for r in current}) - _running(inputs, observations, rev)
    releases = {m: inputs.fleet_where(m, capture) for m in inputs.memory.claims if m in ended}
    return tuple(publishes), releases


def _fleet_events(inputs: Inputs, first: First, answered: Applied) -> list[Event]:
    """What the fleet step says: entries refused (once each), artifacts adopted."""
    out: list[Event] = []
    refused = _store_refused(inputs)
    if refused is not None:
        out.append(("Warning", EventReason.FLEET_STORE_REFUSED, truncate(refused.refusal())))
    for model, facts in first.refused.items():
        out.append(("Warning", EventReason.NOT_ADOPTED, truncate(
            f"{model}: not adopted: {facts.refused}; this profile claims the identity and "
            "tunes its own (or waits for whoever tunes it now)")))  # fmt: skip
    for a in first.adoptions:
        out.append(("Normal", EventReason.ADOPTED, a.said))
    for model, facts in answered.published_meanwhile.items():
        if facts.entry is not None:
            out.append(("Normal", EventReason.ADOPTED,
                        _adoption(inputs, model, facts.entry, facts.where).said))  # fmt: skip
    return out
