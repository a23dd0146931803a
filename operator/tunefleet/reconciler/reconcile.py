"""One profile's reconciliation: make the children that should exist, then report what is.

`sync_profile` is level-based and idempotent. It reads the profile, its Jobs and their pods
from the operator's cache (cache.py), so a reconcile that changes nothing makes no API call at
all; it creates only what is missing (a ConfigMap and a Job per GPU model of the current
revision, a merge Job once a sharded Job's shares are in) and writes status only when it
changed. Events mark transitions, so a resync never repeats them.
"""

from __future__ import annotations

import datetime
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from pydantic import ValidationError

from tunefleet import kube, metrics, naming
from tunefleet.api import TuningProfileSpec, policy
from tunefleet.api.conditions import EventReason, Reason, Type, find, truncate
from tunefleet.api.models import CaptureStatus
from tunefleet.api.status import TuningProfileStatus
from tunefleet.artifacts.fetch import FetchError, Signature
from tunefleet.artifacts.volumes import key_id
from tunefleet.builders.storage import pod_storage
from tunefleet.capture import step as capture_step
from tunefleet.config import Config
from tunefleet.contracts import pin
from tunefleet.contracts.artifact import ArtifactRecord
from tunefleet.informers.cache import Untrusted
from tunefleet.kube import Kube
from tunefleet.placement.gate import Gate
from tunefleet.reconciler import apply, decide, fleet
from tunefleet.reconciler.diagnose import Hints
from tunefleet.reconciler.memory import NODES_TTL, QUEUED_TTL, Memory, ProfileMemory
from tunefleet.reconciler.observe import JobObservation, observe, observe_wanting
from tunefleet.reconciler.state import Sync
from tunefleet.reconciler.status import Observed, compute_status, with_degraded
from tunefleet.serving import delivery
from tunefleet.serving.served import Untuned
from tunefleet.storage import registry
from tunefleet.storage.store import Location, Store, StoreError, StoreOptions
from tunefleet.watched import views
from tunefleet.watched.views import ProfileRef

log = logging.getLogger(__name__)
# A delivered artifact whose ConfigMap was deleted or replaced and could not be made again
# (the store down) is tried again this soon, not after DELIVERY_RETRY_S: until then every new
# pod fetches it from the store.
REDELIVER_AFTER_S = 30.0


@dataclass(frozen=True)
class Outcome:
    """What one reconcile leaves: the status the profile holds, and how soon to reconcile it
    again when no event will say so (None: at its next change or resync). The engine acts on
    the delay only (controller-runtime's Result{RequeueAfter}); why is the domain's business."""

    status: dict[str, Any]
    requeue_after: float | None = None
    # The project's error the reconcile ended on, after reporting what it could in status:
    # kube.Permanent (terminal: nothing to retry until the spec changes), kube.Temporary
    # (retried after its delay), kube.Gone, kube.Conflict (read again, compute again),
    # kube.NotLeading. sync_profile returns it rather than raising it: nothing raises after a
    # write, and what the reconcile made stays said (its Events are posted all the same).
    error: Exception | None = None

    @property
    def terminal(self) -> bool:
        return isinstance(self.error, kube.Permanent)


# The errors a reconcile ends on (see Outcome.error); anything else is a bug, and raises.
ENDS = (kube.Temporary, kube.Permanent, kube.Gone, kube.Conflict, kube.NotLeading)


def requeue_after(status: dict[str, Any]) -> float | None:
    """How soon a profile with this status must be looked at again without an event: a
    queued Job's reason changes in Kueue's Workload, which nothing here watches; a delivery
    that could not be made again (the store down) comes back only when tried again."""
    if any(j.get("reason") == Reason.QUEUED for j in status.get("jobs") or []):
        return QUEUED_TTL
    if find(status, Type.DEGRADED).get("reason") == Reason.DELIVERY_FAILED:
        return REDELIVER_AFTER_S
    return None


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def validation_message(err: ValidationError) -> str:
    parts = []
    for e in err.errors():
        where = ".".join(str(p) for p in e["loc"])
        parts.append(f"spec.{where}: {e['msg']}" if where else e["msg"])
    return "; ".join(parts)


def parse_spec(raw: dict[str, Any]) -> tuple[TuningProfileSpec | None, list[str]]:
    try:
        spec = TuningProfileSpec.model_validate(raw)
    except ValidationError as e:
        return None, [validation_message(e)]
    return spec, naming.spec_problems(spec)


def hints_for(spec: TuningProfileSpec | None, config: Config) -> Hints:
    if spec is None:
        return Hints()
    storage = pod_storage(spec, config)
    return Hints(
        label_key=naming.label_key(spec),
        resource=naming.resource_name(spec),
        credentials_secret=storage.credentials_secret,
        credentials_kind=storage.credentials_kind or "storage credentials",
        credential_keys=storage.credential_keys,
        pull_secrets=tuple(s.name for s in spec.image_pull_secrets or []),
        # A record that does not fit its model's vendor is refused, never served (fit.py).
        gpu_vendor=spec.gpu.vendor,
        stand_in_models=tuple(config.stand_in_models),
        tolerations=tuple(
            str(t.get("key") or "every taint")
            for t in (
                spec.template.spec.tolerations or [] if spec.template and spec.template.spec else []
            )
        ),
    )


def _too_few_nodes(client: Kube, spec: TuningProfileSpec, memory: Memory) -> dict[str, str]:
    """Models with fewer nodes than spec.gpu.parallelism: each share needs a node of its own."""
    key = naming.label_key(spec)
    out = {}
    for model in spec.gpu.models:
        cached = memory.node_counts.get((key, model))
        if cached is None or time.monotonic() - cached[0] > NODES_TTL:
            cached = (time.monotonic(), client.count_nodes(f"{key}={model}"))
            memory.node_counts[(key, model)] = cached
        nodes = cached[1]
        if nodes < spec.gpu.parallelism:
            out[model] = (
                f"spec.gpu.parallelism is {spec.gpu.parallelism} but {nodes} node(s) have "
                f"{key}={model}: each share runs on a node of its own. Lower "
                f"spec.gpu.parallelism to at most {max(nodes, 1)}, or add nodes; nothing was "
                "started for this model"
            )
    return out


def _deliver(s: Sync, status: TuningProfileStatus) -> None:
    """Each current artifact gets its ConfigMap (delivery.py), or a word on why not; status
    then says how pods get it. One that status names but that was deleted or replaced since
    is made again (admission serves the artifact from the store meanwhile)."""
    if s.spec is None or not status.artifacts:
        return
    if s.spec.serving.delivery != "ConfigMap":
        status.artifacts = [
            replace(a, delivery="Store (spec.serving.delivery)") for a in status.artifacts
        ]
        return
    if s.spec.storage.is_oci:
        status.artifacts = _deliver_image_volumes(s, status.artifacts)
        return
    why_not = delivery.deliverable(s.config)
    status.artifacts = [_delivered(s, a, why_not) for a in status.artifacts]
    s.memory.prune_deliveries({a.sha256 for a in status.artifacts})


def _delivered(s: Sync, record: ArtifactRecord, why_not: str) -> ArtifactRecord:
    """One artifact as delivered now: its ConfigMap kept, made (again), or why not."""
    if record.config_map:
        if not _lost(s, record):
            return record
        record = replace(record, config_map="", config_map_uid="", delivery="")
    lost = s.memory.lost.get(record.sha256, "")
    tried = s.memory.deliveries.get(record.sha256)
    store_only = _store_only(record, why_not)
    if store_only:
        return replace(record, delivery=store_only)
    wait = REDELIVER_AFTER_S if lost else delivery.DELIVERY_RETRY_S
    if tried and time.monotonic() - tried[0] < wait:
        return replace(record, delivery=tried[1])
    try:
        got = apply.place_config_map(s.client, _artifact_config_map(s, record), record)
    except (FetchError, StoreError, delivery.DeliveryError, kube.NotOurs,
            kube.Temporary) as e:  # fmt: skip
        if isinstance(e, delivery.DeliveryError):
            s.foreign += list(e.foreign)
        note = truncate(f"Store: delivery as a ConfigMap failed: {e}", 300)
        s.memory.deliveries[record.sha256] = (time.monotonic(), note)
        return replace(record, delivery=note)
    s.foreign += list(got.foreign)
    if lost:
        s.remade.append(
            f"{record.gpu_model}: the ConfigMap of artifact {record.sha256[:12]} {lost}; "
            f"made again as {got.name}"
        )
        s.memory.lost.pop(record.sha256, None)
        metrics.CONFIG_MAPS_REMADE.inc()
    return replace(record, config_map=got.name, config_map_uid=got.uid, delivery=got.note)


def capture_status(entries: list[dict[str, Any]] | None) -> list[CaptureStatus] | None:
    """status.capture's entries (capture/loop.py's) as the status model holds them."""
    return None if entries is None else [CaptureStatus.model_validate(e) for e in entries]


def _artifact_config_map(s: Sync, record: ArtifactRecord) -> dict[str, Any]:
    """The artifact's ConfigMap to make: read from the store with the operator's read
    identity and verified (delivery.artifact_config_map)."""
    assert s.spec is not None
    storage = s.spec.storage
    endpoint = storage.endpoint or s.config.default_s3_endpoint
    return delivery.artifact_config_map(
        record,
        ProfileRef.of(s.profile),
        store=delivery.store_options(endpoint, storage.region or "", s.config),
        config=s.config,
        vendor=s.spec.gpu.vendor,
        signature=Signature.asked(storage.public_key, storage.signing_policy),
    )


def _deliver_image_volumes(s: Sync, artifacts: list[ArtifactRecord]) -> list[ArtifactRecord]:
    """oci:// stores: each artifact's volume image, once verified, is what model pods mount
    (delivery ImageVolume); else they fetch and verify it themselves (Store: why). Checked
    again after DELIVERY_RETRY_S, as a ConfigMap's delivery is tried again. This is the
    operator's delivery of an oci:// artifact: serving.delivery ConfigMap (the default) reads
    as "delivered by the operator", and Store keeps pods fetching."""
    assert s.spec is not None
    public_key = s.spec.storage.public_key
    required = s.spec.storage.signing_policy == "Required"
    mode = s.config.image_volumes
    memos = set()
    out = []
    for record in artifacts:
        # Remembered by the key and policy too: a changed key is checked now, not 5 min on.
        memo = f"{record.sha256}|{key_id(public_key)}|{required}"
        memos.add(memo)
        tried = s.memory.deliveries.get(memo)
        if tried and time.monotonic() - tried[0] < delivery.DELIVERY_RETRY_S:
            out.append(replace(record, delivery=tried[1]))
            continue
        try:
            auto = mode == "auto"
            label = f"{naming.label_key(s.spec)}={record.gpu_model}"
            problem = delivery.image_volume_problem(
                mode,
                s.client.server_minor() if auto else 0,
                s.client.node_runtimes(label) if auto and record.gpu_model else {},
            )
            note = delivery.deliver_image_volume(record, public_key, required, s.config, problem)
        except (FetchError, StoreError, kube.Temporary, kube.Permanent) as e:
            note = truncate(f"Store: {e}", 300)
        s.memory.deliveries[memo] = (time.monotonic(), note)
        out.append(replace(record, delivery=note))
    s.memory.prune_deliveries(memos)
    return out


def _store_only(record: ArtifactRecord | None, why_not: str) -> str:
    """How pods get an artifact that gets no ConfigMap, or "" when it gets one."""
    if why_not or record is None:
        return f"Store: {why_not}" if why_not else "Store"
    if not record.results_only:
        # A ConfigMap of 1 MiB holds few caches anyway.
        return "Store: the artifact carries caches, unpacked by fetch"
    return ""


def _lost(s: Sync, record: ArtifactRecord) -> bool:
    """Whether the ConfigMap status names for this artifact is gone or is not the one made
    (another uid): then it is dropped from the artifact, to be made again. The cache's word is
    checked with the API server before it is taken (the watch may not have seen one just
    made); one the cache agrees with is taken as it is (immutable, ours: its uid says so)."""
    if s.config_map_uid is None:
        return False
    ns, name, made = s.meta["namespace"], record.config_map, record.config_map_uid
    if s.config_map_uid(ns, name) == made and made:
        return False
    try:
        there = s.client.read("ConfigMap", ns, name)
    except kube.Temporary:
        return False  # not known now: the next reconcile looks again
    now_uid = str(((there or {}).get("metadata") or {}).get("uid") or "")
    if now_uid == made and made:
        # The very object made (its uid), which the watch no longer sees: its labels were
        # removed or changed. Admission, which reads that watch, took it for gone; labelled
        # again, it is mounted again (a user's label edit is no identity, its uid is).
        apply.relabel(s, there or {}, record)
        return False
    what = f"was replaced (uid {now_uid})" if there is not None else "was deleted"
    if there is not None:
        s.foreign.append(
            delivery.Foreign(name, now_uid, f"it replaced the ConfigMap made ({made})")
        )
    sha = record.sha256
    s.memory.lost[sha] = s.memory.lost.get(sha) or f"{name} {what}"
    s.memory.deliveries.pop(sha, None)  # tried again now, whatever failed before
    log.warning(f"TuningProfile {ns}/{s.meta['name']}: ConfigMap {name} {what}; delivering again")
    return True


def _retire_config_maps(s: Sync, previous: dict[str, Any], status: TuningProfileStatus) -> None:
    """Artifact ConfigMaps status no longer names (a retune pushed one out of the bounded
    history) go once no model pod mounts them (delivery.to_retire reads, apply deletes).
    Checked when status drops one, every RETIRE_EVERY_S while one is still mounted, and once
    after a restart for a profile with history (what was waiting before is not remembered)."""
    mem, now_ = s.memory, time.monotonic()
    serves = {a.config_map for a in [*status.artifacts, *status.history] if a.config_map}
    dropped = delivery.referenced_names(previous) - serves
    first = mem.retiring is None
    waiting = bool(mem.retiring) and now_ - mem.retired_at >= delivery.RETIRE_EVERY_S
    if not (dropped or waiting or (first and status.history)):
        mem.retiring = mem.retiring or set()
        return
    mem.retired_at = now_
    meta = s.meta
    try:
        owner = ProfileRef.of(s.profile)
        unused, mounted = delivery.to_retire(s.client, owner, status.to_status())
        apply.retire_config_maps(s, unused)
        mem.retiring = set(mounted)
    except kube.Temporary as e:
        mem.retiring = (mem.retiring or set()) | dropped | {""}  # checked again later
        log.info(f"TuningProfile {meta['namespace']}/{meta['name']}: retiring ConfigMaps: {e}")


def _status(s: Sync, observations: list[JobObservation]) -> TuningProfileStatus:
    """The status the observations, the spec and capture's figures say (status.py, pure)."""
    return compute_status(
        Observed(
            generation=int(s.meta.get("generation") or 0),
            spec=s.spec,
            problems=s.problems,
            refused=s.refused,
            jobs=observations,
            previous=s.profile.get("status") or {},
            unadmitted=len(s.unadmitted),
            create_error=truncate(str(s.create_error or "")),
            capacity=s.too_few,
            revisions=s.capture.revisions,
            capture=capture_status(s.capture.entries),
            coverage=s.capture.coverage,
            pins=pin.read(s.meta.get("annotations")),
            adopted=s.adopted,
            waiting=s.waiting,
        ),
        now(),
    )


def _degraded(s: Sync, status: TuningProfileStatus) -> TuningProfileStatus:
    """Status with its Degraded condition: after delivery, which may have made a lost
    ConfigMap again in this very pass."""
    lost = [s.memory.lost[a.sha256] for a in status.artifacts if a.sha256 in s.memory.lost]
    previous = s.profile.get("status") or {}
    gen = int(s.meta.get("generation") or 0)
    return with_degraded(status, previous, s.untuned_pods, lost, gen, now())


def _capture_against_new_artifacts(
    s: Sync, previous: dict[str, Any], status: TuningProfileStatus
) -> None:
    """status.capture counts against the artifacts this status serves: when one is new, the
    counts are made again against it (no retune is decided on this pass; our own write's
    echo brings no reconcile, the next event or resync decides)."""
    if s.spec is None or s.capture.entries is None or not s.acting:
        return
    before = {a.get("gpuModel"): a.get("sha256") for a in previous.get("artifacts") or []}
    after = {a.gpu_model: a.sha256 for a in status.artifacts}
    if before == after or s.captures is None:
        return
    # The capture loop reads a status as the API server holds it (capture/loop.py).
    planned = capture_step.planned(
        s.captures, s.spec, {**s.profile, "status": status.to_status()},
        default_endpoint=s.config.default_s3_endpoint, decide=False,
    )  # fmt: skip
    again = capture_step.outcome(planned, [])
    if again.entries is not None:
        if again.entries:
            status.capture = capture_status(again.entries)
        status.coverage = again.coverage or None
        s.capture.events += [e for e in again.events if e not in s.capture.events]


def _report_delivery(s: Sync) -> None:
    """ConfigMaps made again, and foreign objects found where an artifact's ConfigMap was to
    be: one Event each (a foreign one once per uid), a metric."""
    counts: dict[str, int] = {}
    for u in s.untuned_pods:
        counts[u.cause] = counts.get(u.cause, 0) + 1
    for cause, count in sorted(counts.items()):
        if count > s.memory.untuned_said.get(cause, 0):
            first = next(u for u in s.untuned_pods if u.cause == cause)
            s.events.append(
                (
                    "Warning",
                    Reason.PODS_UNTUNED,
                    f"{count} model pod(s) run without the artifact ({cause}): {first.reason} "
                    f"(pod {first.pod}). `kubectl tunefleet why {first.pod}` says what to do.",
                )
            )
    s.memory.untuned_said = counts
    for line in s.remade:
        s.events.append(("Warning", EventReason.CONFIG_MAP_REMADE, line + "."))
    for obj in s.foreign:
        if obj.uid in s.memory.reported:
            continue
        s.memory.reported.add(obj.uid)
        metrics.UNTRUSTED_OBJECTS.labels("configmaps").inc()
        s.events.append(
            (
                "Warning",
                EventReason.UNTRUSTED_OBJECT,
                f"ConfigMap {s.meta['namespace']}/{obj.name} (uid {obj.uid}) stands where an "
                f"artifact's ConfigMap is made, but is not that artifact: {obj.why}. It is never "
                "mounted; the artifact is delivered under another name. Delete it if nothing "
                "else needs it.",
            )
        )


def _report_untrusted(s: Sync, untrusted: list[Untrusted]) -> None:
    """Objects that claim the profile by its labels without being owned by it: said once."""
    for obj in untrusted:
        if obj.uid in s.memory.reported:
            continue
        s.memory.reported.add(obj.uid)
        s.events.append(
            (
                "Warning",
                EventReason.UNTRUSTED_OBJECT,
                f"{obj.kind[:-1].capitalize()} {obj.namespace}/{obj.name} carries tunefleet's "
                f"labels for TuningProfile {s.meta['name']} but is not controlled by it (no "
                "controller ownerReference to it in its namespace): it is ignored, never read "
                "as one of its tuning Jobs or pods. Delete it if nothing else needs it.",
            )
        )


@dataclass
class Around:
    """What the engine hands a reconcile beside the profile and its own children: objects
    that claim it without its ownership, the model pods served untuned for a cause of ours,
    the capture source, the artifact ConfigMaps' uids as watched (None: not watched), and
    where the API server's answer to a status write goes (`on_written(resourceVersion,
    status)`); first of all, the process's client, through which every read and write of
    the reconcile goes."""

    client: Kube
    untrusted: list[Untrusted] = field(default_factory=list)
    untuned_pods: list[Untuned] = field(default_factory=list)
    captures: capture_step.CaptureSource | None = None
    config_map_uid: Callable[[str, str], str] | None = None
    on_written: Callable[[str, dict[str, Any]], None] = lambda rv, status: None
    open_store: Callable[[Location, StoreOptions], Store] = registry.open_store
    gate: Gate | None = None


def sync_profile(
    profile: dict[str, Any],
    jobs: list[dict[str, Any]],
    pods: list[dict[str, Any]],
    config: Config,
    memory: Memory,
    around: Around,
) -> Outcome:
    """Reconcile one profile (a view, see views.profile_view); returns the status it holds
    and when to look again (Outcome).

    Never raises the project's errors (a bug raises): the Outcome's error says kube.Permanent
    for a spec that can't be tuned (after reporting it in status), kube.Temporary for what
    may pass, kube.Gone when the profile or namespace is going, kube.Conflict when the
    profile changed since it was read, kube.NotLeading when this replica may no longer write.
    The Events of every step are posted last, whatever the status write did.
    """
    a = around
    untrusted = a.untrusted
    meta = profile["metadata"]
    mine = memory.of(meta["uid"])
    unadmitted = memory.unadmitted.get((meta["namespace"], meta["name"]), [])
    s = Sync(
        profile, jobs, pods, config, mine, a.client, unadmitted=unadmitted, on_written=a.on_written,
        captures=a.captures, config_map_uid=a.config_map_uid, untuned_pods=a.untuned_pods,
        open_store=a.open_store, gate=a.gate,
    )  # fmt: skip
    with mine.lock:
        try:
            return _steps(s, memory, untrusted)
        except ENDS as e:
            return Outcome(profile.get("status") or {}, error=e)
        finally:
            apply.post_events(s)


def _steps(s: Sync, memory: Memory, untrusted: list[Untrusted]) -> Outcome:
    """sync_profile's steps, in order: each gathers through the client's reads and decides
    with pure functions; what they decide is written by apply.py alone."""
    profile, pods, mine = s.profile, s.pods, s.memory
    apply.drop_legacy_finalizer(s)
    _read_spec(s, untrusted, memory)
    if s.acting:
        assert s.spec is not None
        done = [*s.served, *s.rejected]
        wanted = decide.models_to_tune(s.spec.gpu.models, s.rev, s.jobs, done, s.too_few)
        # Fleet mode: some adopt another's artifact or wait for its tuning instead (fleet.py).
        apply.create_missing(s, fleet.to_tune(s, wanted) if s.config.fleet else wanted)
        apply.stop_superseded(s, _superseded(s))
        queue = s.spec.tuning.queue_name
        apply.follow_queue(s, decide.queue_moves(s.jobs, queue, naming.revision(s.spec)))
        if not queue:
            # With the gate turned off (operator.gpuGate: false, a helm upgrade), the Jobs it
            # held would wait for nobody: each starts.
            let_go = s.gate.admitted if s.gate is not None else lambda uid: True
            apply.start_admitted(s, decide.admitted(s.jobs, let_go, s.rev))
    observations = _observe(s, mine)
    if s.acting:
        fleet.renew(s, observations)
    if s.acting:
        apply.merge(s, decide.merges_due(observations, s.rev, s.jobs))
    apply.tend(s, decide.tend(observations, s.memory.image_ids, s.spec is not None))
    previous = profile.get("status") or {}
    status = _status(s, observations)
    # Delivery is a step of its own: it makes ConfigMaps (or says why not) and tells
    # status how pods get each artifact; Degraded is computed after it.
    _deliver(s, status)
    status = _degraded(s, status)
    _capture_against_new_artifacts(s, previous, status)
    if s.acting:
        _retire_config_maps(s, previous, status)
    _report_delivery(s)
    written = apply.write_status(s, status)
    if s.acting and s.config.fleet:
        fleet.settle(s, observations, status.artifacts)
    mine.prune(s.jobs, pods, {u.uid for u in untrusted} | {f.uid for f in s.foreign})
    error: Exception | None = s.create_error
    if s.problems or s.spec is None or s.refused:
        why = s.problems or s.refused
        error = kube.Permanent(truncate("; ".join(why) or "invalid spec"))
    again = requeue_after(written)
    if s.fleet_requeue is not None:
        again = s.fleet_requeue if again is None else min(again, s.fleet_requeue)
    return Outcome(written, again, error)


def _superseded(s: Sync) -> list[apply.Superseded]:
    """The Jobs of an earlier revision (decide.superseded), each with its ConfigMap's uid
    when the API server has that ConfigMap and it is this profile's (read, never assumed)."""
    out = []
    ns, uid = s.meta["namespace"], s.meta["uid"]
    for job in decide.superseded(s.jobs, s.rev):
        name = job["metadata"]["name"]
        there = s.client.read("ConfigMap", ns, name)
        meta = (there or {}).get("metadata") or {}
        ours = there is not None and views.owning_profile(meta) == uid
        out.append(apply.Superseded(job, str(meta.get("uid") or "") if ours else ""))
    return out


def _read_spec(s: Sync, untrusted: list[Untrusted], memory: Memory) -> None:
    """The spec parsed and checked against policy, what is not ours reported, the nodes
    counted (parallelism), and the capture step's revisions (while acting, its plan: the
    retune sets it froze are made, and the stale ones removed, by apply.py)."""
    s.spec, problems = parse_spec(s.profile.get("spec") or {})
    s.problems = list(problems)
    if s.spec is not None and not s.problems:
        s.refused = policy.refusals(s.spec, s.config.profile_policy)
    _report_untrusted(s, untrusted)
    if s.acting and s.spec is not None and s.spec.gpu.parallelism > 1:
        s.too_few = _too_few_nodes(s.client, s.spec, memory)
    if s.spec is None:
        return
    base = naming.revision(s.spec)
    if not s.acting or s.captures is None:
        s.capture = capture_step.revisions_only(s.spec, base, s.profile.get("status") or {})
        return
    planned = capture_step.planned(
        s.captures, s.spec, s.profile, default_endpoint=s.config.default_s3_endpoint
    )
    s.capture = capture_step.outcome(planned, apply.freeze_retunes(s, planned))
    apply.remove_retune_sets(s, capture_step.stale_sets(s.captures, planned))


def _observe(s: Sync, mine: ProfileMemory) -> list[JobObservation]:
    """Gather what observing needs beyond the cache (each read behind its TTL), then observe
    (pure) with it: a settled profile wants nothing and reads nothing."""
    by_job = {r.job: r for r in s.served.values() if r.job}
    hints = hints_for(s.spec, s.config)
    observations, wants = observe_wanting(s.jobs, s.pods, hints, by_job)
    if wants:
        observations = observe(s.jobs, s.pods, hints, by_job, mine.gather(wants, s.client))
    return observations
