"""From observations (observe.py) to TuningProfile status: pure functions, no API calls.

The status is recomputed from scratch each time (level-based), so a missed or repeated event
never leaves it wrong, and it is written only when it changes. The steps of `compute_status`:
the artifacts (fresh records, else what status already serves, with history), then each
condition (conditions.py names their types and reasons), the phase, and the Job lines.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from tunefleet import naming
from tunefleet.api import TuningProfileSpec
from tunefleet.api.conditions import Phase, Reason, Stamp, Type, condition, truncate
from tunefleet.api.models import CaptureStatus, Condition
from tunefleet.api.profile_status import JobLine, Summary, TuningProfileStatus, records
from tunefleet.artifacts import kinds
from tunefleet.capture import step as capture_step
from tunefleet.contracts import pin
from tunefleet.contracts.artifact_record import ArtifactRecord
from tunefleet.contracts.pin import Pin
from tunefleet.reconciler import promotion
from tunefleet.reconciler.acts import Applied
from tunefleet.reconciler.inputs import Inputs, now_iso
from tunefleet.reconciler.observe import JobObservation
from tunefleet.serving.served import Untuned

HISTORY_LIMIT = 10


@dataclass(frozen=True)
class Observed:
    generation: int
    spec: TuningProfileSpec | None
    problems: list[str] = field(default_factory=list)
    # What of spec.template the operator's profile policy refuses (policy.py).
    refused: list[str] = field(default_factory=list)
    jobs: list[JobObservation] = field(default_factory=list)
    previous: dict[str, Any] = field(default_factory=dict)
    # Labelled pods the webhook never saw (created while it was unreachable).
    unadmitted: int = 0
    # A tuning Job (or its ConfigMap) could not be made just now; retried with backoff.
    create_error: str = ""
    # Models whose Jobs were not started because too few nodes have them (parallelism).
    capacity: dict[str, str] = field(default_factory=dict)
    # The revision each GPU model tunes under when it is not the spec's: a retune of captured
    # misses (capture/loop.py); and status.capture with its printer column.
    revisions: dict[str, str] = field(default_factory=dict)
    capture: list[CaptureStatus] | None = None
    coverage: str = ""
    # The profile's pins (contracts/pin.py), by GPU model.
    pins: dict[str, Pin] = field(default_factory=dict)
    # Fleet mode (fleet/): artifacts adopted this pass, verified, by GPU model; and the models
    # that wait for another profile or cluster tuning their identity, with who and until when.
    adopted: dict[str, ArtifactRecord] = field(default_factory=dict)
    waiting: dict[str, str] = field(default_factory=dict)
    # Why fleet mode adopts nothing for this profile though it would apply (Inputs.unkeyed):
    # the FleetAdoption condition says it; "" leaves the condition out.
    unkeyed: str = ""


@dataclass
class _Picture:
    """One reconcile's view of the current revision, shared by the condition steps."""

    obs: Observed
    spec: TuningProfileSpec
    rev: str
    models: list[str]
    mine: list[JobObservation]  # Jobs of this revision, for models of the spec
    current: dict[str, JobObservation]  # what each model's Jobs amount to
    artifacts: dict[str, ArtifactRecord]
    now: str
    revs: dict[str, str] = field(default_factory=dict)
    # Models whose newest artifact of their revision the gate refused, and pins not honoured.
    rejected: dict[str, ArtifactRecord] = field(default_factory=dict)
    pin_problems: dict[str, str] = field(default_factory=dict)

    def rev_of(self, model: str) -> str:
        return self.revs.get(model, self.rev)

    def cond(self, type_: Type, status: bool, reason: Reason, message: str) -> Condition:
        previous = list(self.obs.previous.get("conditions") or [])
        return condition(
            previous, type_, status, reason, message, Stamp(self.obs.generation, self.now)
        )

    @property
    def failed(self) -> list[JobObservation]:
        return [j for j in self.current.values() if j.state == "Failed"]

    @property
    def blocked(self) -> list[JobObservation]:
        return [j for j in self.current.values() if j.state == "Pending" and j.reason]

    @property
    def served(self) -> list[str]:
        return [m for m in self.models if m in self.artifacts]

    @property
    def unserved(self) -> str:
        return ", ".join(m for m in self.models if m not in self.artifacts)

    @property
    def up_to_date(self) -> list[str]:
        return [
            m
            for m in self.models
            if m in self.artifacts and self.artifacts[m].revision == self.rev_of(m)
        ]


def _joined(jobs: list[JobObservation]) -> str:
    return " | ".join(f"{j.model}: {j.message}" for j in jobs)


QUEUES = (Reason.QUEUED, Reason.WAITING_FOR_GPU)


def _queued_only(jobs: list[JobObservation]) -> bool:
    """Every Job that waits, waits in its Kueue queue or for a GPU our Jobs hold (not a
    fault)."""
    return bool(jobs) and all(j.reason in QUEUES for j in jobs)


def _wait_words(jobs: list[JobObservation]) -> str:
    if _queued_only(jobs):
        return "are queued in Kueue" if jobs[0].reason == Reason.QUEUED else "wait for a GPU"
    return "cannot start"


def _capacity(obs: Observed) -> str:
    return " | ".join(f"{m}: {msg}" for m, msg in obs.capacity.items()) + "."


def _invalid(obs: Observed, now: str) -> TuningProfileStatus:
    """Nothing is tuned for an invalid spec; what was served stays, nothing else is shown."""
    previous = list(obs.previous.get("conditions") or [])
    gen = obs.generation
    if obs.spec is not None and not obs.problems and obs.refused:
        reason = Reason.TEMPLATE_REFUSED
        message = (
            "Refused by the operator's profile policy, nothing was tuned. Change the spec or "
            f"the policy: {'; '.join(obs.refused)}"
        )
        no_jobs = "No tuning Jobs for a spec the profile policy refuses."
    else:
        reason = Reason.INVALID_SPEC
        message = "; ".join(obs.problems) or "the spec is invalid"
        message = f"Invalid spec, nothing was tuned. Fix and re-apply: {message}"
        no_jobs = "No tuning Jobs for an invalid spec."
    return TuningProfileStatus(
        observed_generation=gen,
        phase=Phase.INVALID,
        conditions=[
            condition(previous, Type.READY, False, reason, message, Stamp(gen, now)),
            condition(previous, Type.PROGRESSING, False, reason, no_jobs, Stamp(gen, now)),
            condition(previous, Type.FAILED, True, reason, message, Stamp(gen, now)),
        ],
        artifacts=records(obs.previous.get("artifacts")),
        history=records(obs.previous.get("history")),
        unadmitted_pods=obs.unadmitted,
    )


def _artifacts(p: _Picture) -> tuple[list[ArtifactRecord], list[ArtifactRecord]]:
    """(artifacts, history): per model, what promotion.py chooses among the Job's fresh record,
    what status served and what history keeps (the gate, pins); artifacts of models dropped
    from the spec go to history. p.artifacts gets the served records, p.rejected the refused."""
    previous = {r.gpu_model: r for r in records(p.obs.previous.get("artifacts"))}
    history = records(p.obs.previous.get("history"))
    served: dict[str, ArtifactRecord] = {}
    for model in p.models:
        job = p.current.get(model)
        fresh = None
        if job is not None and job.state == "Succeeded" and job.record is not None:
            fresh = job.record.for_job(
                gpu_model=model, revision=job.revision, job=job.name, image_id=job.image_id
            )
        elif model in p.obs.adopted:
            fresh = p.obs.adopted[model]
        choice = promotion.choose(
            model,
            promotion.Had(fresh, previous.get(model), history),
            p.obs.pins.get(model),
            (p.rev_of(model), p.rev),
            p.spec.promotion.min_gain,
        )
        history = choice.history
        if choice.served is not None:
            p.artifacts[model] = served[model] = choice.served
        if choice.rejected is not None:
            p.rejected[model] = choice.rejected
        if choice.pin_problem:
            p.pin_problems[model] = choice.pin_problem
    for model, record in previous.items():
        if model not in p.models:
            history.insert(0, record)  # a model dropped from the spec: kept for the record
    return [served[m] for m in p.models if m in served], history[:HISTORY_LIMIT]


def _failed_condition(p: _Picture) -> Condition:
    if p.failed:
        return p.cond(Type.FAILED, True, Reason.TUNING_FAILED, _joined(p.failed))
    return p.cond(Type.FAILED, False, Reason.NO_FAILURES, "No tuning Job of this revision failed.")


def _running(p: _Picture) -> list[str]:
    return [
        m
        for m in p.models
        if p.current.get(m) is None or p.current[m].state in ("Pending", "Running")
    ]


def _retrying(p: _Picture) -> list[JobObservation]:
    """Jobs still underway after failed attempts (the Job retries them)."""
    return [
        j for j in p.current.values() if j.state in ("Pending", "Running") and j.failed_attempts
    ]


def attempt_message(j: JobObservation) -> str:
    return (
        f"{j.model}: attempt {j.failed_attempts} of {j.attempts} failed"
        + (f" ({j.last_failure})" if j.last_failure else "")
        + f"; Job {j.name} tries again"
    )


def _progressing_condition(p: _Picture) -> Condition:
    obs, blocked, n = p.obs, p.blocked, len(p.models)
    if obs.capacity:
        return p.cond(Type.PROGRESSING, False, Reason.PARALLELISM_TOO_HIGH, _capacity(obs))
    if obs.create_error:
        message = f"{obs.create_error}. Retrying with backoff."
        return p.cond(Type.PROGRESSING, False, Reason.JOB_CREATE_FAILED, message)
    if blocked:
        message = f"{len(blocked)} of {n} tuning Jobs {_wait_words(blocked)}. {_joined(blocked)}"
        return p.cond(Type.PROGRESSING, True, Reason(blocked[0].reason), message)
    if _waiting(p):
        return p.cond(Type.PROGRESSING, True, Reason.TUNED_ELSEWHERE, _waiting_words(p))
    retrying = _retrying(p)
    if retrying:
        message = " | ".join(attempt_message(j) for j in retrying)
        return p.cond(Type.PROGRESSING, True, Reason.ATTEMPT_FAILED, message)
    running = _running(p)
    if running:
        message = f"Tuning {len(running)} of {n} GPU models: " + ", ".join(running)
        return p.cond(Type.PROGRESSING, True, Reason.TUNING_JOBS_RUNNING, message)
    message = f"Tuning of revision {p.rev} has finished."
    return p.cond(Type.PROGRESSING, False, Reason.TUNING_FINISHED, message)


def _served_message(p: _Picture) -> str:
    stale = [m for m in p.models if m not in p.up_to_date]
    n = len(p.models)
    if stale:
        revs = ", ".join(sorted({p.rev_of(m) for m in stale}))
        msg = f"Serving earlier artifacts for {', '.join(stale)} while revision {revs} tunes."
        if p.blocked:
            words = {
                "are queued in Kueue": "It is queued in Kueue",
                "wait for a GPU": "It waits for a GPU",
            }.get(_wait_words(p.blocked), "It cannot start")
            msg += f" {words}: {_joined(p.blocked)}"
    else:
        msg = f"{n} of {n} GPU models have an artifact."
    msg += _promotion_words(p)
    for m in p.models:
        art = p.artifacts[m]
        if art.default_only:
            msg += (
                f" {m}: no GEMM where a kernel beat Default ({art.no_gain_reason()}):"
                " it gains nothing, so pods get it only with spec.serving.serveDefaultOnly."
            )
    return msg


def _promotion_words(p: _Picture) -> str:
    """What the gate refused (which figure, by how much), pins, and pins not honoured."""
    words = ""
    for m, art in p.rejected.items():
        now = p.artifacts.get(m)
        if now is not None and now.sha256 == art.sha256:
            words += (
                f" {m}: the artifact served, {art.sha256[:12]}, fails the promotion gate now: "
                f"{art.verdict_message}; it keeps serving, nothing else passes."
            )
            continue
        keeps = f"{now.sha256[:12]} keeps serving" if now else "nothing earlier to serve"
        words += (
            f" {m}: the newest artifact {art.sha256[:12]} failed the promotion gate: "
            f"{art.verdict_message}; it is kept in status.history, {keeps}."
        )
    for m in p.models:
        now = p.artifacts.get(m)
        if now is not None and now.pinned_reason:
            words += (
                f" {m}: {now.sha256[:12]} is pinned ({now.pinned_reason}); `kubectl tunefleet "
                "unpin` returns to the newest artifact that passed the gate."
            )
        if m in p.pin_problems:
            words += f" {m}: {p.pin_problems[m]}."
    return words


def _ready_condition(p: _Picture) -> Condition:
    obs = p.obs
    if len(p.served) == len(p.models):
        reason = Reason.PROMOTION_REJECTED if p.rejected else Reason.ARTIFACTS_PUBLISHED
        return p.cond(Type.READY, True, reason, _served_message(p))
    missing = f"No artifact for {p.unserved}"
    refused = [m for m in p.models if m in p.rejected and m not in p.artifacts]
    if refused:
        message = (
            f"{missing}.{_promotion_words(p)} Lower spec.promotion.minGain, or retune "
            "(a changed spec, or `kubectl tunefleet retune`)."
        )
        return p.cond(Type.READY, False, Reason.PROMOTION_REJECTED, message)
    if obs.capacity:
        return p.cond(
            Type.READY, False, Reason.PARALLELISM_TOO_HIGH, f"{missing}: {_capacity(obs)}"
        )
    if obs.create_error:
        message = f"{missing}: {obs.create_error}. Retrying with backoff."
        return p.cond(Type.READY, False, Reason.JOB_CREATE_FAILED, message)
    if p.failed:
        return p.cond(Type.READY, False, Reason.TUNING_FAILED, f"{missing}. {_joined(p.failed)}")
    if p.blocked:
        words = _wait_words(p.blocked)
        message = f"{missing}: {len(p.blocked)} tuning Job(s) {words}. {_joined(p.blocked)}"
        return p.cond(Type.READY, False, Reason(p.blocked[0].reason), message)
    if _waiting(p):
        return p.cond(Type.READY, False, Reason.TUNED_ELSEWHERE, f"{missing}: {_waiting_words(p)}")
    message = f"Waiting for tuning Jobs of {p.unserved} to publish."
    retrying = _retrying(p)
    if retrying:
        message += " " + " | ".join(attempt_message(j) for j in retrying) + "."
    return p.cond(Type.READY, False, Reason.TUNING, message)


def _phase(p: _Picture) -> Phase:
    if p.failed:
        return Phase.FAILED
    if p.rejected:
        return Phase.REJECTED
    if len(p.up_to_date) == len(p.models):
        return Phase.READY
    running = any(p.current.get(m) and p.current[m].state == "Running" for m in p.models)
    if _waiting(p) and not running and not p.blocked:
        return Phase.QUEUED
    if _queued_only(p.blocked):
        return Phase.TUNING if running else Phase.QUEUED
    return Phase.TUNING if running and not p.blocked else Phase.PENDING


def _waiting(p: _Picture) -> list[str]:
    """Models with no Job of their own that wait for another profile or cluster's tuning."""
    return [m for m in p.models if m in p.obs.waiting and m not in p.artifacts]


def _waiting_words(p: _Picture) -> str:
    return (
        " | ".join(f"{m}: {p.obs.waiting[m]}" for m in _waiting(p))
        + ". Its artifact is adopted here when it is published (docs/fleet.md); "
        "spec.tuning.adopt: Never tunes this profile's own instead."
    )


def _job_lines(p: _Picture) -> list[JobLine]:
    lines = []
    for j in sorted(p.mine, key=lambda j: (p.models.index(j.model), j.role != "tune")):
        attempts = j.failed_attempts if j.state in ("Pending", "Running") else 0
        lines.append(
            JobLine(
                gpu_model=j.model,
                name=j.name,
                state=j.state,
                message=j.message,
                uid=j.uid or None,
                reason=j.reason or None,
                shards=f"{j.shards_done}/{j.shards}" if j.role == "tune" and j.shards > 1 else None,
                failed_attempts=attempts or None,
                last_failure=j.last_failure[:1000] if attempts and j.last_failure else None,
            )
        )
    return lines


def _progress(p: _Picture) -> str:
    progress = []
    for m in p.models:
        now_ = p.current.get(m)
        if now_ is None or now_.state in ("Succeeded", "Failed"):
            continue
        tune = next((t for t in p.mine if t.model == m and t.role == "tune"), None)
        if now_.role == "merge" or (tune and tune.shards > 1 and tune.state == "Succeeded"):
            progress.append(f"{m}: merging")
        elif tune and tune.shards > 1:
            progress.append(f"{m}: {tune.shards_done}/{tune.shards} shards")
        else:
            progress.append(f"{m}: {now_.state.lower()}")
    return "; ".join(progress)


def _summary(artifacts: list[ArtifactRecord], models: list[str]) -> Summary:
    """The printer columns' fields (`kubectl get tp`, `-o wide`)."""
    current = [a for a in artifacts if a.gpu_model in models]
    if not current:
        return Summary(gpu_models=",".join(models))
    results = [a for a in current if a.kind == kinds.DEFAULT]  # caches alone have no GEMMs
    gemms = sum(a.gemms or 0 for a in results)
    if not results:
        tuned_gemms = "-"
    elif all(a.outcomes is not None for a in results):
        won = sum(a.outcomes[0] for a in results if a.outcomes is not None)
        tuned_gemms = f"{won}/{gemms}"
    else:
        tuned_gemms = f"?/{gemms}"  # artifacts from before outcomes were counted
    flat = [a.gpu_model for a in current if a.default_only]
    if flat and len(flat) == len(current):
        note = "Default only: no gain, not served"
    else:
        note = f"Default only on {', '.join(flat)}" if flat else ""
    counted = all("reused" in a.counts and a.counts.get("recorded") for a in current)
    reused = sum(a.counts.get("reused", 0) for a in current)
    recorded = sum(a.counts.get("recorded", 0) for a in current)
    tuned = [a.tuned_at for a in current if a.tuned_at]
    return Summary(
        gpu_models=",".join(models),
        gemms=gemms,
        tuned_gemms=tuned_gemms,
        note=note,
        reuse=f"{reused}/{recorded}" if counted else "",
        short_sha256=",".join(a.sha256[:12] for a in current),
        kinds=",".join(sorted({"+".join(a.kinds) for a in current})),
        last_tuned_at=max(tuned) if tuned else None,
        gain=gain_column(current) or None,
        source=source_column(current) or None,
    )


def source_column(current: list[ArtifactRecord]) -> str:
    """The SOURCE printer column: where each adopted artifact was tuned (cluster uid's first 8
    characters, the profile); "" when every artifact is this profile's own."""
    shown = [
        f"{a.gpu_model}: {a.source_cluster[:8]} {a.source_profile}".strip()
        if len(current) > 1
        else f"{a.source_cluster[:8]} {a.source_profile}".strip()
        for a in current
        if a.adopted
    ]
    return ", ".join(shown)


def gain_column(current: list[ArtifactRecord]) -> str:
    """The GAIN printer column: each served artifact's headline figure (the workload's, else the
    GEMMs'), "stand-in" where the timings are the stand-in torch's; "" when none is measured."""
    shown = []
    for a in current:
        f = a.gain.headline() if a.gain is not None else None
        if f is None:
            continue
        text = f"{f.speedup:.2f}x" + (" stand-in" if a.gain and a.gain.stand_in else "")
        text += " pinned" if a.pinned_reason else ""
        shown.append(text if len(current) == 1 else f"{a.gpu_model} {text}")
    return ", ".join(shown)


def compute_status(obs: Observed, now: str) -> TuningProfileStatus:
    if obs.spec is None or obs.problems or obs.refused:
        return _invalid(obs, now)
    spec = obs.spec
    rev = naming.revision(spec)
    models = list(spec.gpu.models)
    revs = {m: obs.revisions.get(m, rev) for m in models}
    mine = [j for j in obs.jobs if j.model in models and j.revision == revs[j.model]]
    current = {}
    for m in models:
        found = effective([j for j in mine if j.model == m])
        if found is not None:
            current[m] = found
    p = _Picture(obs, spec, rev, models, mine, current, {}, now, revs)
    artifacts, history = _artifacts(p)
    ordered = [p.artifacts[m] for m in models if m in p.artifacts]
    return TuningProfileStatus(
        observed_generation=obs.generation,
        phase=_phase(p),
        revision=rev,
        summary=_summary(ordered, models),
        conditions=[
            _ready_condition(p),
            _progressing_condition(p),
            _failed_condition(p),
            *_fleet_condition(p),
        ],
        jobs=_job_lines(p),
        progress=_progress(p),
        artifacts=artifacts,
        history=history,
        unadmitted_pods=obs.unadmitted,
        capture=obs.capture or None,
        coverage=obs.coverage or None,
    )


def _fleet_condition(p: _Picture) -> list[Condition]:
    """FleetAdoption, only while fleet mode would apply and adopts nothing (Inputs.unkeyed)."""
    if not p.obs.unkeyed:
        return []
    return [p.cond(Type.FLEET_ADOPTION, False, Reason.ADOPTION_NEEDS_KEY, p.obs.unkeyed)]


def effective(jobs: list[JobObservation]) -> JobObservation | None:
    """What one model's Jobs of a revision amount to: the merge Job's word once there is
    one; a sharded tuning Job whose shares are all done is still running (merging)."""
    merge = next((j for j in jobs if j.role == "merge"), None)
    if merge is not None:
        return merge
    tune = next((j for j in jobs if j.role == "tune"), None)
    if tune is not None and tune.shards > 1 and tune.state == "Succeeded":
        return replace(tune, state="Running", record=None)
    return tune


def status_changed(old: dict[str, Any], new: dict[str, Any]) -> bool:
    """Whether the status must be written. The write replaces the whole status, so a field
    the new one no longer has (an Invalid profile's old figures) is a change too."""
    return old != new


def with_degraded(
    status: TuningProfileStatus,
    previous: dict[str, Any],
    untuned: list[Untuned],
    lost: list[str],
    generation: int,
    now: str,
) -> TuningProfileStatus:
    """Status with its Degraded condition: True while model pods run untuned for a cause of
    ours (served.py) or a delivered artifact's ConfigMap is gone and not made again yet
    (`lost`, what happened to each); the phase then says Degraded instead of Ready. Computed
    after delivery (which may have made a lost ConfigMap again in this very pass)."""
    prior = list(previous.get("conditions") or [])
    if lost:
        reason = Reason.DELIVERY_FAILED
        message = (
            f"The artifact ConfigMap could not be made again: {'; '.join(lost)}. New pods fetch "
            "the artifact from the store meanwhile (verified); tunefleet retries every "
            "30 s. Check the operator's read access to the store (the chart's delivery values)."
        )
    elif untuned:
        reason = Reason.PODS_UNTUNED
        message = untuned_message(untuned)
    else:
        reason, message = (
            Reason.PODS_SERVED,
            "No model pod runs untuned for a cause of tunefleet's.",
        )
    degraded = condition(
        prior, Type.DEGRADED, bool(lost or untuned), reason, message, Stamp(generation, now)
    )
    others = [c for c in status.conditions if c.type != Type.DEGRADED]
    phase = status.phase
    if degraded.status == "True" and phase == Phase.READY:
        phase = Phase.DEGRADED
    return replace(status, conditions=[*others, degraded], phase=phase)


def untuned_message(untuned: list[Untuned]) -> str:
    """How many model pods run untuned, by cause, with the pods named and what to do."""
    by_cause: dict[str, list[Untuned]] = {}
    for u in untuned:
        by_cause.setdefault(u.cause, []).append(u)
    parts = []
    for cause, pods in sorted(by_cause.items()):
        names = ", ".join(u.pod for u in pods[:5]) + (", ..." if len(pods) > 5 else "")
        parts.append(f"{len(pods)} {cause} ({pods[0].reason}; pods: {names})")
    return (
        f"{len(untuned)} model pod(s) run without the artifact: {' | '.join(parts)}. "
        "`kubectl tunefleet why <pod>` says more; once the cause is fixed, recreate them "
        "(e.g. kubectl rollout restart)."
    )


# --- the reconcile's status step -----------------------------------------------------------


@dataclass(frozen=True)
class Extra:
    """What the decision adds to the Jobs observed: the revisions each model tunes under
    (capture's), and fleet mode's artifacts adopted and models waiting, by model."""

    capture: capture_step.Outcome
    adopted: dict[str, ArtifactRecord] = field(default_factory=dict)
    waiting: dict[str, str] = field(default_factory=dict)
    unkeyed: str = ""


def capture_status(entries: list[dict[str, Any]] | None) -> list[CaptureStatus] | None:
    """status.capture's entries (capture/loop.py's) as the status model holds them."""
    return None if entries is None else [CaptureStatus.model_validate(e) for e in entries]


def computed(
    inputs: Inputs,
    jobs: list[JobObservation],
    extra: Extra,
    applied: Applied | None = None,
) -> TuningProfileStatus:
    """The status the observations, the spec and capture's figures say (compute_status)."""
    answered = applied or Applied()
    meta = inputs.meta
    return compute_status(
        Observed(
            generation=int(meta.get("generation") or 0),
            spec=inputs.spec,
            problems=[*inputs.problems, *answered.problems],
            refused=list(inputs.refused),
            jobs=jobs,
            previous=inputs.previous,
            unadmitted=len(inputs.unadmitted),
            create_error=truncate(str(answered.create_error or "")),
            capacity=dict(inputs.too_few),
            revisions=extra.capture.revisions,
            capture=capture_status(extra.capture.entries),
            coverage=extra.capture.coverage,
            pins=pin.read(meta.get("annotations")),
            adopted=extra.adopted,
            waiting=extra.waiting,
            unkeyed=extra.unkeyed,
        ),
        now_iso(),
    )


def compute(inputs: Inputs, extra: Extra, applied: Applied) -> TuningProfileStatus:
    """The status one reconcile leaves (pure): its Jobs as this pass left them, each artifact
    as delivered, Degraded after delivery (which may have made a lost ConfigMap again in this
    very pass), status.capture counted again against new artifacts."""
    jobs = list(applied.jobs) if applied.jobs is not None else inputs.view.jobs
    status = computed(inputs, inputs.observe(jobs, extra.capture), extra, applied)
    status.artifacts = [applied.delivered.get(delivered_key(a), a) for a in status.artifacts]
    again = applied.recounted
    if again is not None and again.entries is not None:
        if again.entries:
            status.capture = capture_status(again.entries)
        status.coverage = again.coverage or None
    lost_now = inputs.memory.lost
    lost = [lost_now[a.sha256] for a in status.artifacts if a.sha256 in lost_now]
    gen = int(inputs.meta.get("generation") or 0)
    return with_degraded(status, inputs.previous, list(inputs.untuned_pods), lost, gen, now_iso())


def delivered_key(record: ArtifactRecord) -> str:
    """How a delivered artifact is found again in status: its model and SHA-256."""
    return f"{record.gpu_model}/{record.sha256}"
