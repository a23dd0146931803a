"""Every write of a reconcile, in one place: sync_profile (reconcile.py) gathers (gather.py),
decides (decide.plan) and carries the plan out here, in at most two rounds, in a fixed
order: round one (retune sets, the fleet's adoptions and claims), round two (tuning
ConfigMaps and Jobs, superseded and requeued Jobs, starts, the fleet's renewals, merges,
tending, artifact ConfigMaps, retired ones, publishing and releases for the fleet, the
profile's refs doc), then the
status, then the Events. API writes and store writes alike: nothing else on a reconcile's
path writes (tests/unit/test_layering.py fails if it does). What the API server and the
stores answered comes back as a value (acts.Applied); the process memory's bookkeeping of
what was tried and said is kept here too.
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from dataclasses import replace
from typing import Any

from tunefleet import kube, metrics, naming
from tunefleet.api import TuningProfileSpec
from tunefleet.api.conditions import EventReason, Reason, truncate
from tunefleet.api.profile_status import TuningProfileStatus
from tunefleet.artifacts.fetch import FetchError, Signature
from tunefleet.builders.artifact import is_packed
from tunefleet.builders.job import (
    IMAGE_ID_KEY,
    Child,
    build_merge_job,
    build_tuning_config_map,
    build_tuning_job,
    held_for_gpu,
)
from tunefleet.builders.kueue import QUEUE_LABEL
from tunefleet.capture import step as capture_step
from tunefleet.capture.retune_sets import build_retune_config_map
from tunefleet.contracts import fleet as contract
from tunefleet.contracts.artifact_record import ArtifactRecord
from tunefleet.contracts.fleet import Claim, Holder
from tunefleet.fleet import adopt, bids, claims
from tunefleet.fleet import probe as probing
from tunefleet.fleet.claims import Standing
from tunefleet.kube import Kube
from tunefleet.placement import gate
from tunefleet.reconciler import children, gather
from tunefleet.reconciler.acts import (
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
from tunefleet.reconciler.announce import announce
from tunefleet.reconciler.decide import WAIT_POLL_S, child
from tunefleet.reconciler.inputs import FleetFacts, Inputs, Probe, Where, iso
from tunefleet.reconciler.status import delivered_key, status_changed
from tunefleet.serving import delivery
from tunefleet.storage.store import (
    Board,
    NotFoundError,
    Store,
    StoreError,
    Swappable,
    SwappableStore,
    board,
    swappable,
)
from tunefleet.watched import views
from tunefleet.watched.views import ProfileRef, profile_ref

log = logging.getLogger(__name__)


def carry_out(inputs: Inputs, acts: First | Second, said: list[Event]) -> Applied:
    """One round of the plan, carried out in its fixed order. Its Events go to `said` as
    they happen: what was made stays said even when a later write fails."""
    if isinstance(acts, First):
        return _first(inputs, acts)
    return _second(inputs, acts, said)


# --- round one, first of all: the store's conditional writes ---------------------------------


def probe(inputs: Inputs, target: Probe) -> probing.Verdict | str:
    """Probe the store gather found unprobed (fleet/probe.py) before any claim through it: its
    verdict, kept for the process; or the store's error (no verdict: probed again next pass).
    Of the reconciles that find one store unprobed at once, one probes and the others take
    its verdict."""
    with inputs.probes.lock(target.key):
        known = inputs.probes.verdict(target.key, time.monotonic())
        if known is not None:
            return known
        swap = swappable(target.store)
        assert swap is not None  # gather probes only a store that swaps
        key = contract.probe_key(target.location, uuid.uuid4().hex)
        try:
            fault = probe_store(swap, key)
        except StoreError as e:
            log.warning(
                f"{inputs.name}: fleet mode could not probe the conditional writes of "
                f"{target.words} ({e}); no claim is taken through it until it can: trying again"
            )
            return truncate(str(e), 400)
        verdict = probing.Verdict(target.words, fault, time.monotonic())
        inputs.probes.record(target.key, verdict)
    if verdict.honours:
        log.info(f"fleet mode: {target.words} honours conditional writes; claims go through it")
    else:
        log.error(verdict.refusal())
    return verdict


def probe_store(store: SwappableStore, key: str) -> str:
    """The probe's steps at `key` (fleet/probe.py), with the very calls claims make, then the
    probe object deleted: "" when the store honoured each, else what it did wrong.
    StoreError when the store fails (no verdict)."""
    first = probing.VERSIONS[0]
    if not store.create(key, first, probing.CONTENT_TYPE):
        return probing.REFUSED_CREATE
    try:
        return _probe_steps(store, key)
    finally:
        try:
            store.delete(key)
        except StoreError as e:  # the verdict stands; the object is 11 bytes
            log.warning(f"the fleet's probe object {store.uri(key)} stays: {e}")


def _probe_steps(store: SwappableStore, key: str) -> str:
    """Steps 2 to 4 of the probe, on the object step 1 created."""
    first, second, third, fourth = probing.VERSIONS
    if store.create(key, second, probing.CONTENT_TYPE):
        return probing.IGNORED_IF_NONE_MATCH
    tagged = store.read_tagged(key, contract.MAX_BYTES)
    if tagged.data != first:
        return probing.IGNORED_IF_NONE_MATCH
    if not store.replace_if(key, third, probing.CONTENT_TYPE, tagged.tag):
        return probing.REFUSED_IF_MATCH
    if store.replace_if(key, fourth, probing.CONTENT_TYPE, tagged.tag):
        return probing.IGNORED_IF_MATCH
    if store.get(key, contract.MAX_BYTES) != third:
        return probing.IGNORED_IF_MATCH
    return ""


# --- round one -------------------------------------------------------------------------------


def _first(inputs: Inputs, acts: First) -> Applied:
    client = inputs.around.client
    if acts.drop_finalizer:
        meta = inputs.meta
        client.remove_profile_finalizer(
            meta["namespace"], meta["name"], meta["uid"], meta["finalizers"],
            naming.LEGACY_FINALIZER,
        )  # fmt: skip
    made, unfrozen = [], {}
    for frozen in acts.freezes:
        try:
            client.create_owned(build_retune_config_map(frozen))
            made.append(frozen)
        except (kube.NotOurs, kube.Temporary, kube.Permanent) as e:
            log.info(f"{inputs.name}: retune of {frozen.model}: {e}")
            unfrozen[frozen.model] = str(e)
    _remove_retune_sets(client, acts)
    for facts in acts.refused.values():
        inputs.memory.refused_entries.add(facts.seen)  # said once (decide's Event)
    probed = probe(inputs, acts.probe) if acts.probe is not None else None
    if isinstance(probed, str) or (probed is not None and not probed.honours):
        # Nothing through a store not known to honour conditional writes (decide.probed).
        return Applied(made=tuple(made), unfrozen=unfrozen, probe=probed)
    for adoption in acts.adoptions:
        w = adoption.take_down
        if w is not None and _give_back(inputs, adoption.model, w, "taking down our bid"):
            inputs.memory.bidding.discard(adoption.model)
    standings, meanwhile = _claims(inputs, acts)
    return Applied(
        made=tuple(made), unfrozen=unfrozen, standings=standings,
        published_meanwhile=meanwhile, probe=probed,
    )  # fmt: skip


def _remove_retune_sets(client: Kube, acts: First) -> None:
    """Retune sets no status entry names (capture_step.stale_sets): nothing mounts them, and
    each is up to 900 KiB: they do not pile up in etcd."""
    for old in acts.stale_sets:
        try:
            client.delete_owned("ConfigMap", old.namespace, old.name, old.uid)
        except (kube.Temporary, kube.Permanent) as e:
            log.info(f"retune set {old.namespace}/{old.name} not removed now: {e}")


def _claims(inputs: Inputs, acts: First) -> tuple[dict[str, Any], dict[str, FleetFacts]]:
    """Claim each identity decided (True: this profile holds it, and tunes). A claim held is
    followed by one more read of the entry: its last holder may have published and released
    between our read of the entry and of the claim; then this profile adopts and gives the
    claim back, instead of tuning the identity again."""
    standings: dict[str, Any] = {}
    meanwhile: dict[str, FleetFacts] = {}
    mem, config = inputs.memory, inputs.config
    for model, w in acts.claims.items():
        now, ttl = time.time(), config.fleet_claim_seconds
        key = contract.claim_key(w.location, model, w.identity)
        try:
            standing = take(
                w.store, key, w.identity, w.holder, (now, ttl, config.fleet_settle_seconds)
            )
        except StoreError as e:
            standings[model] = str(e)
            continue
        standings[model] = standing
        if standing.settling > 0:
            mem.bidding.add(model)
        else:
            mem.bidding.discard(model)  # held, or waiting: our bid is taken down
        if not standing.held:
            continue
        mem.claims[model] = standing.claim.expires
        again = gather.read_entry(inputs, model, w)
        if again.entry is not None:
            _give_back(inputs, model, w, "giving back the fleet's claim")
            mem.claims.pop(model, None)
            meanwhile[model] = again
    return standings, meanwhile


def _give_back(inputs: Inputs, model: str, w: Where, doing: str) -> bool:
    """Take our claim (or bid) on the model's identity down; False, logged, when the store
    fails."""
    key = contract.claim_key(w.location, model, w.identity)
    try:
        give_back(w.store, key, w.identity, w.holder, time.time())
    except StoreError as e:
        log.warning(f"{inputs.name} {model}: {doing}: {e}")
        return False
    return True


# --- round two -------------------------------------------------------------------------------


class _Pass:
    """Round two's answers as they come in (the Jobs as this pass leaves them, the problems
    the API server found, what delivery made), returned as one Applied."""

    def __init__(self, inputs: Inputs, said: list[Event]) -> None:
        self.inputs = inputs
        self.client = inputs.around.client
        self.jobs = list(inputs.view.jobs)
        self.problems: list[str] = []
        self.create_error: kube.Temporary | None = None
        self.delivered: dict[str, ArtifactRecord] = {}
        self.remade: list[str] = []
        self.foreign: list[delivery.Foreign] = []
        self.events = said
        self.requeue: float | None = None
        self.recounted: capture_step.Outcome | None = None

    def again(self, after: float) -> None:
        self.requeue = sooner(self.requeue, after)

    def applied(self) -> Applied:
        return Applied(
            jobs=tuple(self.jobs), problems=tuple(self.problems),
            create_error=self.create_error, delivered=self.delivered,
            remade=tuple(self.remade), foreign=tuple(self.foreign),
            recounted=self.recounted, requeue=self.requeue,
        )  # fmt: skip


def _second(inputs: Inputs, acts: Second, said: list[Event]) -> Applied:
    p = _Pass(inputs, said)
    p.events += acts.events
    if acts.store_refused is not None:
        inputs.memory.said_refusal = acts.store_refused.mark  # said once (decide's Event)
    if acts.requeue is not None:
        p.again(acts.requeue)
    _create_missing(p, acts)
    _stop_superseded(p, acts.stops)
    _follow_queue(p, acts)
    _start_admitted(p, acts)
    _renew(p, acts.renewals)
    for merge in acts.merges:
        p.client.create_owned(build_merge_job(merge))
    _tend(p, acts)
    for d in acts.deliveries:
        record = _deliver(p, d)
        p.delivered[delivered_key(record)] = record
    if acts.retire is None:
        inputs.memory.retiring = inputs.memory.retiring or set()
    else:
        _retire(p, acts.retire)
    _publish(p, acts.publishes)
    _release(p, acts)
    _write_refs(p, acts.refs)
    if acts.recount:
        _recount(p, acts)
    return p.applied()


def _create_missing(p: _Pass, acts: Second) -> None:
    """A ConfigMap and a Job for each GPU model decided; a Job made is observed in this very
    pass, what the API server refused is said in status."""
    for c in acts.creates:
        try:
            _create(p, c)
        except kube.Permanent as e:
            # The API server refused what the spec made: a spec problem to report.
            p.problems.append(f"gpu model {c.model}: {e}")
            return
        except kube.NotOurs as e:
            # Someone else's object sits under our deterministic name: never use it.
            p.create_error = kube.Temporary(str(e), delay=30)
            return
        except kube.Temporary as e:
            # Quota, RBAC, an API hiccup: say so in status, then retry with backoff.
            p.create_error = e
            return


def _create(p: _Pass, c: Child) -> None:
    job = _gated(p.inputs, build_tuning_job(c))
    if not gate.held(job):
        # The ConfigMap first: the Job's pod mounts it. A Job the GPU gate holds has no pod
        # yet; its ConfigMap is made when it starts (_config_before_start), so a burst of
        # profiles on few GPUs costs the API server one write fewer each.
        p.client.create_owned(build_tuning_config_map(c))
    made = p.client.create_owned(job)
    if made is None:
        return
    if not (made.get("spec") or {}).get("suspend") or gate.held(made):
        # Observed in this reconcile's status: the watch's echo of it then finds the status
        # already saying so (one status write a Job fewer). Not a suspended (Kueue) one:
        # Kueue cannot have made its Workload yet, and why it waits is Kueue's to say once
        # it has (its echo's reconcile reads it). One the GPU gate holds says why at once.
        p.jobs.append(views.job_view(made))
        p.inputs.memory.made.add(made["metadata"]["uid"])
    name = job["metadata"]["name"]
    log.info(f"created tuning Job {c.namespace}/{name} for TuningProfile {c.profile}")
    if not gate.held(made):  # one held says so in status; its Event is its start
        p.events.append(("Normal", EventReason.TUNING_JOB_CREATED, f"Created tuning Job {name}."))


def _gated(inputs: Inputs, job: dict[str, Any]) -> dict[str, Any]:
    """The Job as the GPU gate lets it be made: started, or suspended while every GPU of its
    model is held by our Jobs (placement/gate.py). Asking the gate reserves the GPUs, so it
    is asked here, as the Job is made. Kueue's Jobs are Kueue's to hold."""
    g = inputs.around.gate
    if g is None or (job.get("spec") or {}).get("suspend"):
        return job
    d = gate.demand(job)
    return job if d is None or g.may_start(d) else held_for_gpu(job)


def _start_admitted(p: _Pass, acts: Second) -> None:
    """Start the Jobs the GPU gate let go; each is observed started in this very pass."""
    ns, uid = p.inputs.meta["namespace"], p.inputs.meta["uid"]
    for job in acts.starts:
        name = job["metadata"]["name"]
        if not _config_before_start(p, acts, job):
            continue
        if p.client.patch_owned("Job", ns, name, uid, {"spec": {"suspend": False}}):
            log.info(f"Job {ns}/{name}: a GPU is free; started")
            p.events.append(
                ("Normal", EventReason.TUNING_JOB_STARTED,
                 f"Started tuning Job {name}: a GPU of its model is free.")
            )  # fmt: skip
            started = {**job, "spec": {**(job.get("spec") or {}), "suspend": False}}
            p.jobs = [started if j is job else j for j in p.jobs]


def _config_before_start(p: _Pass, acts: Second, job: dict[str, Any]) -> bool:
    """Make the tuning ConfigMap of a Job the GPU gate held before anything may start the Job:
    its pod mounts it. False when it cannot be made now: the Job stays held and the next pass
    tries again (a ConfigMap already there, ours, is kept)."""
    c = child(p.inputs, children.model_of(job), acts.capture)
    if c.name() != job["metadata"]["name"]:
        return True  # not the current revision's: children.admitted and queue_moves skip those
    try:
        p.client.create_owned(build_tuning_config_map(c))
    except (kube.Temporary, kube.Permanent, kube.NotOurs) as e:
        log.info(f"Job {c.namespace}/{c.name()} not started now: {e}")
        return False
    return True


def _stop_superseded(p: _Pass, stops: tuple[Stop, ...]) -> None:
    """Jobs of an earlier revision are not served: stop the running ones (their sync sidecar
    keeps what they tuned) and remove the finished ones, with their ConfigMaps (ours, as
    read) and pods. Their artifacts stay in status.history."""
    ns = p.inputs.meta["namespace"]
    for gone in stops:
        meta = gone.job["metadata"]
        name = meta["name"]
        p.client.delete_owned("Job", ns, name, meta["uid"])
        if gone.config_map_uid:
            p.client.delete_owned("ConfigMap", ns, name, gone.config_map_uid)
        log.info(f"{p.inputs.name}: removed Job {name} of an earlier revision")
        p.events.append(
            (
                "Normal",
                EventReason.SUPERSEDED,
                f"Removed tuning Job {name} of revision "
                f"{meta['labels'].get(naming.REVISION_LABEL)}: revision {gone.revision} "
                "replaces it.",
            )
        )


def _follow_queue(p: _Pass, acts: Second) -> None:
    """A Job that has not started follows spec.tuning.queueName: moved to the new LocalQueue,
    or, once the spec names none, made again outside Kueue. A running Job keeps its queue."""
    ns, uid = p.inputs.meta["namespace"], p.inputs.meta["uid"]
    for move in acts.moves:
        meta = move.job["metadata"]
        if move.action == "relabel":
            # Kueue starts it without us: a Job the gate held needs its ConfigMap first.
            if gate.held(move.job) and not _config_before_start(p, acts, move.job):
                continue
            patch = {"metadata": {"labels": {QUEUE_LABEL: move.queue}}}
            if p.client.patch_owned("Job", ns, meta["name"], uid, patch):
                log.info(f"Job {ns}/{meta['name']}: moved to Kueue LocalQueue {move.queue}")
        else:
            p.client.delete_owned("Job", ns, meta["name"], meta["uid"])
            log.info(f"Job {ns}/{meta['name']}: no queue any more; made again outside Kueue")


def _tend(p: _Pass, acts: Second) -> None:
    """Tell publish which image tune ran (through the Job's ConfigMap, for the manifest); keep
    a record read from a pod on its Job, where it outlives the pods; make a ConfigMap that
    someone deleted again (the pod waits for it)."""
    ns, uid = p.inputs.meta["namespace"], p.inputs.meta["uid"]
    for op in acts.tends:
        if op.image_id:
            p.client.patch_owned(
                "ConfigMap", ns, op.name, uid, {"data": {IMAGE_ID_KEY: op.image_id}}
            )
            p.inputs.memory.image_ids[op.uid] = op.image_id
        if op.record:
            kept = {"metadata": {"annotations": {naming.RECORD_ANNOTATION: op.record}}}
            p.client.patch_owned("Job", ns, op.name, uid, kept)
        if op.config_map_of:
            p.client.create_owned(
                build_tuning_config_map(child(p.inputs, op.config_map_of, acts.capture))
            )


# --- the fleet: renewals, publishing, releases -----------------------------------------------


def _renew(p: _Pass, renewals: tuple[Renewal, ...]) -> None:
    """Renew each claim due. On a board, a lapsed bid with no other bidder is bid again; a
    claim taken over while our Job runs is not read again for this Job (both tune, and the
    first to publish is the identity's entry)."""
    mem, config = p.inputs.memory, p.inputs.config
    for r in renewals:
        if r.where is None:
            mem.claims.pop(r.model, None)
            continue
        now, ttl = time.time(), config.fleet_claim_seconds
        w = r.where
        key = contract.claim_key(w.location, r.model, w.identity)
        try:
            standing = take(
                w.store, key, w.identity, w.holder, (now, ttl, config.fleet_settle_seconds)
            )
        except StoreError as e:
            log.warning(f"{p.inputs.name} {r.model}: renewing the fleet's claim: {e}")
            p.again(WAIT_POLL_S)
            continue
        if not standing.held and standing.settling > 0:
            mem.claims[r.model] = now - ttl
            p.again(standing.settling)
        elif not standing.held:
            log.warning(
                f"{p.inputs.name} {r.model}: the fleet's claim was taken over by "
                f"{standing.claim.holder.describe()} while our Job runs"
            )
            mem.claims[r.model] = math.inf
        else:
            mem.claims[r.model] = standing.claim.expires
            p.again(ttl / 2)


def _publish(p: _Pass, publishes: tuple[Publish, ...]) -> None:
    """Publish each artifact this profile tuned and serves, once (the first of an identity
    stays, whoever wrote it)."""
    spec = p.inputs.spec
    for pub in publishes:
        record, w = pub.record, pub.where
        entry = adopt.entry_for(record, w.identity, w.holder, iso(time.time()))
        try:
            assert spec is not None
            if publish_entry(w.store, pub.key, entry, spec, p.inputs.config.stand_in_models):
                p.events.append(
                    ("Normal", EventReason.PUBLISHED, truncate(
                        f"{record.gpu_model}: artifact {record.sha256[:12]} published for the "
                        "profiles and clusters that share this store and tune the same identity"))
                )  # fmt: skip
        except StoreError as e:
            log.warning(f"{p.inputs.name} {record.gpu_model}: publishing for the fleet: {e}")
            p.again(WAIT_POLL_S)
            continue
        p.inputs.memory.published.add(record.sha256)


def _release(p: _Pass, acts: Second) -> None:
    """Give back the claims of models whose Job ended."""
    for model, w in acts.releases.items():
        if w is not None and not _give_back(p.inputs, model, w, "releasing the fleet's claim"):
            p.again(WAIT_POLL_S)
            continue
        p.inputs.memory.claims.pop(model, None)


def _write_refs(p: _Pass, due: RefsWrite | None) -> None:
    """Write the profile's refs doc (one writer per key: this cluster's leader), remembered
    once written; a store that fails is tried again at the profile's next reconcile (it
    was renewed with half its life left)."""
    if due is None:
        return
    refs, at = due.refs, due.at
    key = refs.key(at.location)
    try:
        at.store.put(key, refs.to_bytes(), adopt.CONTENT_TYPE)
    except StoreError as e:
        log.warning(f"{p.inputs.name}: writing the fleet's refs doc {at.store.uri(key)}: {e}")
        return
    p.inputs.memory.refs = (refs.artifacts, refs.expires)


# --- delivery --------------------------------------------------------------------------------


def _deliver(p: _Pass, d: Delivery) -> ArtifactRecord:
    """One artifact's delivery act (decide.deliveries); the record as delivered."""
    mem = p.inputs.memory
    if d.found_lost:
        _found_lost(p, d)
    if d.act == "relabel" and d.there is not None:
        relabel(p, d.there, d.record)
        return d.record
    if d.act == "volume":
        return _check_volume(p, d)
    if d.act != "place":
        return d.record
    record = d.record
    try:
        got = place_config_map(p.client, _artifact_config_map(p.inputs, record), record)
    except (FetchError, StoreError, delivery.DeliveryError, kube.NotOurs,
            kube.Temporary) as e:  # fmt: skip
        if isinstance(e, delivery.DeliveryError):
            p.foreign += list(e.foreign)
        note = truncate(f"Store: delivery as a ConfigMap failed: {e}", 300)
        mem.deliveries[record.sha256] = (time.monotonic(), note)
        return replace(record, delivery=note)
    p.foreign += list(got.foreign)
    if d.lost:
        p.remade.append(
            f"{record.gpu_model}: the ConfigMap of artifact {record.sha256[:12]} {d.lost}; "
            f"made again as {got.name}"
        )
        mem.lost.pop(record.sha256, None)
        metrics.CONFIG_MAPS_REMADE.inc()
    return replace(record, config_map=got.name, config_map_uid=got.uid, delivery=got.note)


def _found_lost(p: _Pass, d: Delivery) -> None:
    """A ConfigMap status named, found deleted or replaced: remembered (Degraded until made
    again), the replacement reported as foreign, tried again now whatever failed before."""
    mem, sha = p.inputs.memory, d.record.sha256
    if d.replaced_by is not None:
        p.foreign.append(d.replaced_by)
    mem.lost[sha] = mem.lost.get(sha) or d.found_lost
    mem.deliveries.pop(sha, None)
    log.warning(f"{p.inputs.name}: ConfigMap {d.found_lost}; delivering again")


def _artifact_config_map(inputs: Inputs, record: ArtifactRecord) -> dict[str, Any]:
    """The artifact's ConfigMap to make: read from the store with the operator's read
    identity and verified (delivery.artifact_config_map)."""
    assert inputs.spec is not None
    storage = inputs.spec.storage
    endpoint = storage.endpoint or inputs.config.default_s3_endpoint
    return delivery.artifact_config_map(
        record,
        ProfileRef.of(inputs.profile),
        store=delivery.store_options(endpoint, storage.region or "", inputs.config),
        config=inputs.config,
        vendor=inputs.spec.gpu.vendor,
        signature=Signature.asked(storage.public_key, storage.signing_policy),
    )


def _check_volume(p: _Pass, d: Delivery) -> ArtifactRecord:
    """An oci:// artifact's volume image, verified (what model pods then mount), or why
    not: they fetch and verify it themselves."""
    inputs, record = p.inputs, d.record
    assert inputs.spec is not None
    storage, config = inputs.spec.storage, inputs.config
    try:
        auto = config.image_volumes == "auto"
        label = f"{naming.label_key(inputs.spec)}={record.gpu_model}"
        problem = delivery.image_volume_problem(
            config.image_volumes,
            p.client.server_minor() if auto else 0,
            p.client.node_runtimes(label) if auto and record.gpu_model else {},
        )
        required = storage.signing_policy == "Required"
        note = delivery.deliver_image_volume(record, storage.public_key, required, config, problem)
    except (FetchError, StoreError, kube.Temporary, kube.Permanent) as e:
        note = truncate(f"Store: {e}", 300)
    inputs.memory.deliveries[d.memo] = (time.monotonic(), note)
    return replace(record, delivery=note)


def relabel(p: _Pass, there: dict[str, Any], record: ArtifactRecord) -> None:
    """Put the artifact ConfigMap's labels back (only on the object controlled by this
    profile, fenced by the resourceVersion read: kube.patch_owned)."""
    meta, uid = there.get("metadata") or {}, str(p.inputs.meta.get("uid") or "")
    want = naming.artifact_config_map_labels(uid)
    labels = meta.get("labels") or {}
    if all(labels.get(k) == v for k, v in want.items()):
        return  # the watch has not caught up with one just made: nothing to put back
    ns, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    try:
        if not p.client.patch_owned("ConfigMap", ns, name, uid, {"metadata": {"labels": want}}):
            return
    except (kube.Temporary, kube.Permanent) as e:
        log.warning(f"ConfigMap {ns}/{name} lost its labels; labelling it again failed: {e}")
        return
    p.remade.append(
        f"{record.gpu_model or '?'}: the ConfigMap {name} of artifact "
        f"{record.sha256[:12]} had lost its labels (so new pods could not mount "
        "it); labelled again"
    )
    metrics.CONFIG_MAPS_REMADE.inc()


def place_config_map(
    client: Kube, cm: dict[str, Any], record: ArtifactRecord
) -> delivery.Delivered:
    """Make the artifact's ConfigMap (delivery.artifact_config_map), or take the one under
    its name if it holds exactly the artifact; a foreign one is stepped around under a name
    derived from its uid (delivery.NAMES_TRIED names)."""
    namespace = cm["metadata"]["namespace"]
    uid = views.owning_profile(cm["metadata"]) or ""  # the profile it is made for
    base = name = cm["metadata"]["name"]
    foreign: list[delivery.Foreign] = []
    for _ in range(delivery.NAMES_TRIED):
        cm["metadata"]["name"] = name
        there, made = _create_or_read(client, cm, namespace, name)
        meta = there.get("metadata") or {}
        # What we made holds the verified bytes; what we found is judged by what it holds.
        problem = (
            ""
            if made
            else delivery.content_problem(there, record.sha256, record.manifest_sha256, uid)
        )
        if not problem:
            log.info(f"delivered {record.uri} as ConfigMap {namespace}/{name}")
            return delivery.Delivered(
                name, str(meta.get("uid") or ""), is_packed(cm), tuple(foreign)
            )
        squatter = str(meta.get("uid") or "")
        foreign.append(delivery.Foreign(name, squatter, problem))
        log.warning(
            f"ConfigMap {namespace}/{name} is not the artifact {record.sha256[:12]} ({problem}): "
            "never mounted; delivering under another name"
        )
        name = delivery.next_name(base, squatter)
    raise delivery.DeliveryError(
        f"{delivery.NAMES_TRIED} objects under the names of the artifact's ConfigMap are not it "
        f"({', '.join(f.name for f in foreign)}); pods fetch it from the store",
        tuple(foreign),
    )


def _create_or_read(
    client: Kube, cm: dict[str, Any], namespace: str, name: str
) -> tuple[dict[str, Any], bool]:
    """What stands under `name` once we tried to make `cm` there, and whether we made it."""
    try:
        made = client.create_owned(cm)
    except kube.NotOurs:
        made = None  # judged by content, like any object found there
    if made is not None:
        return made, True
    there = client.read("ConfigMap", namespace, name)
    if there is None:
        raise StoreError(f"ConfigMap {namespace}/{name} vanished as it was made")
    return there, False


def _retire(p: _Pass, kept: frozenset[str]) -> None:
    """Delete the artifact ConfigMaps nothing uses any more (delivery.to_retire reads the
    profile's ConfigMaps and, when one is a candidate, its pods): what status serves now,
    delivered in this very pass included, stays."""
    inputs, mem = p.inputs, p.inputs.memory
    mem.retired_at = time.monotonic()
    keep = kept | {r.config_map for r in p.delivered.values() if r.config_map}
    ns = inputs.meta["namespace"]
    try:
        unused, mounted = delivery.to_retire(p.client, ProfileRef.of(inputs.profile), set(keep))
        for name, uid in unused:
            p.client.delete_owned("ConfigMap", ns, name, uid)
            log.info(f"removed artifact ConfigMap {ns}/{name}: no status or pod names it")
        mem.retiring = set(mounted)
    except kube.Temporary as e:
        mem.retiring = (mem.retiring or set()) | {""}  # checked again later
        log.info(f"{inputs.name}: retiring ConfigMaps: {e}")


def _recount(p: _Pass, acts: Second) -> None:
    """status.capture counted again against the artifacts this pass serves (the capture
    loop reads a status as the API server holds it; the artifacts' keys are read from the
    store, once each)."""
    inputs = p.inputs
    captures = inputs.around.captures
    if captures is None or inputs.spec is None:
        return
    status = {**inputs.previous, "artifacts": [r.to_status() for r in p.delivered.values()]}
    planned = capture_step.planned(
        captures, inputs.spec, {**inputs.profile, "status": status},
        default_endpoint=inputs.config.default_s3_endpoint, decide=False,
    )  # fmt: skip
    p.recounted = capture_step.outcome(planned, [])


# --- the status and the Events ---------------------------------------------------------------


def write_status(
    inputs: Inputs, typed: TuningProfileStatus, capture: capture_step.Outcome
) -> list[Event]:
    """Write status (the model's one serialisation) only when it changed, over the version
    it was computed from; then what the change announces (Events, capture's Events, retune
    metrics)."""
    status = typed.to_status()
    previous = inputs.previous
    if not status_changed(previous, status):
        return []
    meta = inputs.meta
    rv = str(meta.get("resourceVersion") or "")
    written = inputs.around.client.replace_profile_status(
        meta["namespace"], meta["name"], rv, status
    )
    inputs.memory.written_rv = written
    inputs.around.on_written(written, status)
    before = TuningProfileStatus.from_status(previous)
    said = announce(inputs.profile, before, typed, list(inputs.unadmitted))
    for reason in capture.retunes:
        metrics.RETUNES.labels(reason).inc()
    return [*said, *capture.events]


def report(inputs: Inputs) -> list[Event]:
    """Objects that claim the profile by its labels without its ownership: said once."""
    mem = inputs.memory
    out: list[Event] = []
    for obj in inputs.untrusted:
        if obj.uid not in mem.reported:
            mem.reported.add(obj.uid)
            message = (
                f"{obj.kind[:-1].capitalize()} {obj.namespace}/{obj.name} carries tunefleet's "
                f"labels for TuningProfile {inputs.meta['name']} but is not controlled by it (no "
                "controller ownerReference to it in its namespace): it is ignored, never read "
                "as one of its tuning Jobs or pods. Delete it if nothing else needs it."
            )
            out.append(("Warning", EventReason.UNTRUSTED_OBJECT, message))
    return out


def report_delivery(inputs: Inputs, applied: Applied) -> list[Event]:
    """Model pods untuned, by cause, when their count grows; ConfigMaps made again; foreign
    objects where an artifact's ConfigMap was to be (once per uid)."""
    mem = inputs.memory
    out: list[Event] = []
    counts: dict[str, int] = {}
    for u in inputs.untuned_pods:
        counts[u.cause] = counts.get(u.cause, 0) + 1
    for cause, count in sorted(counts.items()):
        if count > mem.untuned_said.get(cause, 0):
            first = next(u for u in inputs.untuned_pods if u.cause == cause)
            message = (
                f"{count} model pod(s) run without the artifact ({cause}): {first.reason} "
                f"(pod {first.pod}). `kubectl tunefleet why {first.pod}` says what to do."
            )
            out.append(("Warning", Reason.PODS_UNTUNED, message))
    mem.untuned_said = counts
    out += [("Warning", EventReason.CONFIG_MAP_REMADE, line + ".") for line in applied.remade]
    return out + _foreign(inputs, applied)


def _foreign(inputs: Inputs, applied: Applied) -> list[Event]:
    out: list[Event] = []
    for obj in applied.foreign:
        if obj.uid in inputs.memory.reported:
            continue
        inputs.memory.reported.add(obj.uid)
        metrics.UNTRUSTED_OBJECTS.labels("configmaps").inc()
        out.append(("Warning", EventReason.UNTRUSTED_OBJECT, (
            f"ConfigMap {inputs.meta['namespace']}/{obj.name} (uid {obj.uid}) stands where an "
            f"artifact's ConfigMap is made, but is not that artifact: {obj.why}. It is never "
            "mounted; the artifact is delivered under another name. Delete it if nothing "
            "else needs it.")))  # fmt: skip
    return out


def post_events(inputs: Inputs, events: list[Event]) -> None:
    """Every Event the reconcile has to say, by one route, after its writes: what it made
    stays said even when its status write did not land."""
    ref = profile_ref(inputs.profile)
    for type_, reason, message in events:
        inputs.around.client.post_event_soon(ref, type_, reason, message)


def forget(inputs: Inputs, foreign: list[str]) -> None:
    """Drop what the memory holds of children gone (memory.prune)."""
    untrusted = {u.uid for u in inputs.untrusted}
    inputs.memory.prune(inputs.view.jobs, inputs.view.pods, untrusted | set(foreign))


# --- the fleet's store protocol: fleet/ decides (pure), these write ------------------------


def take(
    store: Store, key: str, identity: str, me: Holder, times: tuple[float, float, float]
) -> Standing:
    """Take, renew, hold or wait on the claim on `identity` at `key`; `times` is (now, the
    claim's life, the settle window a board's bid stands for)."""
    now, ttl, _ = times
    swap = swappable(store)
    if swap is not None:
        return swap_claim(swap, key, identity, me, now, ttl)
    posts = board(store)
    if posts is None:
        raise StoreError(f"{store.uri(key)}: this store cannot hold a claim")
    return bid(posts, key, identity, me, times)


def give_back(store: Store, key: str, identity: str, me: Holder, now: float) -> None:
    """End our claim now (its Job ended), for the next taker."""
    swap = swappable(store)
    if swap is not None:
        swap_release(swap, key, identity, me, now)
        return
    posts = board(store)
    if posts is not None:
        unbid(posts, key, me)


def swap_claim(
    store: Swappable, key: str, identity: str, me: Holder, now: float, ttl: float
) -> Standing:
    """Take, renew, hold or wait on the claim at `key`. StoreError when the store fails; a race
    lost to another writer is read again (at most TRIES times, then reported as waiting on
    whoever won, or as a StoreError when what won is not a claim)."""
    mine = Claim(identity, me, now, now + ttl)
    found: Claim | None = None
    for _ in range(claims.TRIES):
        tagged = claims.read_claim(store, key)
        found = Claim.from_bytes(tagged.data, identity) if tagged else None
        what = claims.step(found, tagged is not None and found is None, me, now, ttl)
        if what is claims.Step.WAIT:
            assert found is not None
            return Standing(False, found)
        if what is claims.Step.HOLD:
            assert found is not None
            return Standing(True, found)
        if what is claims.Step.TAKE:
            if store.create(key, mine.to_bytes(), claims.CONTENT_TYPE):
                return Standing(True, mine)
            continue
        assert tagged is not None
        if what is claims.Step.RENEW:
            assert found is not None
            mine = Claim(identity, me, found.taken, now + ttl)
        if store.replace_if(key, mine.to_bytes(), claims.CONTENT_TYPE, tagged.tag):
            if found is None:
                # Said once it is gone: what blocked the identity, for whoever wrote it.
                what_was = contract.odd(tagged.data, tagged.oversize, "a claim on this identity")
                log.warning(f"{key}: held {what_was}; taken over by {me.describe()}")
            return Standing(True, mine)
    if found is not None and found.holder != me:
        return Standing(False, found)
    raise StoreError(
        f"the claim at {key} changed under each of {claims.TRIES} writes: read again later"
    )


def swap_release(store: Swappable, key: str, identity: str, me: Holder, now: float) -> bool:
    """End our claim now (its Job ended): it stays, expired, for the next taker. False when
    the claim there is not ours (taken over meanwhile) or changed as we wrote."""
    tagged = claims.read_claim(store, key)
    found = Claim.from_bytes(tagged.data, identity) if tagged else None
    if tagged is None or found is None or found.holder != me or found.expires <= now:
        return False
    ended = Claim(identity, me, found.taken, now)
    return store.replace_if(key, ended.to_bytes(), claims.CONTENT_TYPE, tagged.tag)


def bid(
    board: Board,
    group: str,
    identity: str,
    me: Holder,
    times: tuple[float, float, float],
    reader: bids.Reader | None = None,
) -> Standing:
    """Bid, settle, hold, renew or wait on the identity's board `group`; `times` is (now, the
    claim's life, the settle window). A Standing that is not held but `settling` is our own
    bid standing: ask again after that many seconds. StoreError when the store fails."""
    now, ttl, settle = times
    reader = reader or bids.Reader()
    standing, floor = reader.seen.place(group, bids.read(board, group, identity), now)
    move, which = bids.decide(standing, me, now, ttl, settle, floor)
    if move is bids.Move.WAIT:
        assert which is not None
        if any(b.holder == me for b in standing):
            board.unpost(group, bids.member(me))
        return Standing(False, which)
    if move is bids.Move.HOLD:
        assert which is not None
        return Standing(True, which)
    if move is bids.Move.SETTLE:
        assert which is not None
        return Standing(False, which, settling=which.window - (now - which.taken))
    if move is bids.Move.RENEW:
        assert which is not None
        renewed = Claim(identity, me, which.taken, now + ttl, which.window, now)
        board.post(group, bids.member(me), renewed.to_bytes())
        return Standing(True, renewed)
    taken = reader.clock()
    mine = Claim(identity, me, taken, taken + ttl, settle, taken)
    board.post(group, bids.member(me), mine.to_bytes())
    took = reader.clock() - taken
    if took > settle / 2:
        board.unpost(group, bids.member(me))
        raise StoreError(
            f"posting a bid took {took:.1f}s, over half the {settle:g}s settle window: taken "
            "down (it might show after a later bid settled); bidding again"
        )
    return Standing(False, mine, settling=settle)


def unbid(board: Board, group: str, me: Holder) -> None:
    """Take our bid down (its Job ended): the next bidder holds after its own window."""
    board.unpost(group, bids.member(me))


def publish_entry(
    store: Store,
    key: str,
    entry: contract.Published,
    spec: TuningProfileSpec,
    stand_in: tuple[str, ...],
) -> bool:
    """Publish an artifact for its identity: True if this is now the entry. An entry there
    first stays, unless it is not adoptable (forged, or its artifact tampered with or gone):
    then it is replaced, on the version read, so that one bad object cannot make every
    cluster tune the identity again forever. A store with no conditional write (oci://)
    replaces it plainly: two publishers at once (both tuned: the claim was taken over while a
    Job ran) leave either entry, each a complete, verified artifact of the identity."""
    swap = swappable(store)
    if swap is None:
        try:
            found = adopt.read(store, key, entry.identity, entry.gpu_model)
            if found is not None:
                adopt.verify(found, spec, stand_in, store)
                return False
        except adopt.NotAdoptable:
            pass
        store.put(key, entry.to_bytes(), adopt.CONTENT_TYPE)
        return True
    if swap.create(key, entry.to_bytes(), adopt.CONTENT_TYPE):
        return True
    try:
        # One over MAX_BYTES comes as its tag alone (no data): not an entry, replaced below.
        there = swap.read_tagged(key, contract.MAX_BYTES)
    except NotFoundError:
        return swap.create(key, entry.to_bytes(), adopt.CONTENT_TYPE)
    found = contract.Published.from_bytes(there.data, entry.identity, entry.gpu_model)
    try:
        if found is None:
            what = "an entry for this identity and GPU model"
            raise adopt.NotAdoptable(f"it held {contract.odd(there.data, there.oversize, what)}")
        adopt.verify(found, spec, stand_in, store)
    except adopt.NotAdoptable as e:
        replaced = swap.replace_if(key, entry.to_bytes(), adopt.CONTENT_TYPE, there.tag)
        if replaced:
            log.warning(f"{store.uri(key)}: {e}; replaced by artifact {entry.record.sha256[:12]}")
        return replaced
    return False
