"""The Events a profile's status changes announce: on transitions only, so a resync never
repeats them (a failure, a blocked Job, new artifacts and what their library skipped, Ready,
a failed attempt, pods the webhook never saw), and the metrics counted with them.
"""

from __future__ import annotations

import logging
from typing import Any

from tunefleet import metrics, naming
from tunefleet.api.conditions import BLOCKED, EventReason, Phase, Reason, Type
from tunefleet.api.profile_status import TuningProfileStatus
from tunefleet.contracts.admission_record import ADMISSION_LABEL

log = logging.getLogger(__name__)


# An Event about the profile: (type, reason, message); the reconcile posts them after the
# status write that announces them.
Event = tuple[str, str, str]


def announce(
    profile: dict[str, Any],
    before: TuningProfileStatus,
    after: TuningProfileStatus,
    unadmitted: list[str],
) -> list[Event]:
    """The Events of a status change, on transitions only, so a resync never repeats them.
    Pure but for the published-artifact metrics."""
    out: list[Event] = []
    meta = profile["metadata"]
    was, now_ = before.condition(Type.FAILED), after.condition(Type.FAILED)
    if (
        now_ is not None
        and now_.status == "True"
        and (was is None or was.status != "True" or was.message != now_.message)
    ):
        reason = now_.reason or Reason.TUNING_FAILED
        log.info(f"TuningProfile {meta['namespace']}/{meta['name']}: {reason}")
        out.append(("Warning", reason, now_.message))
    was_p, now_p = before.condition(Type.PROGRESSING), after.condition(Type.PROGRESSING)
    blocked = now_p is not None and now_p.status == "True" and now_p.reason in BLOCKED
    if (
        blocked
        and now_p is not None
        and (was_p is None or (was_p.reason, was_p.message) != (now_p.reason, now_p.message))
    ):
        out.append(("Warning", now_p.reason, now_p.message))
    was_f, now_f = before.condition(Type.FLEET_ADOPTION), after.condition(Type.FLEET_ADOPTION)
    if now_f is not None and (was_f is None or was_f.message != now_f.message):
        # Once per change: the condition is in status, so a resync or a restart repeats nothing.
        out.append(("Warning", now_f.reason, now_f.message))
    _announce_artifacts(out, before, after)
    if after.phase == Phase.READY and before.phase not in (Phase.READY, Phase.DEGRADED):
        arts = ", ".join(f"{a.gpu_model}@{a.sha256[:12]}" for a in after.artifacts)
        out.append(("Normal", EventReason.READY, f"Artifacts published: {arts}"))
    _announce_failed_attempts(out, before, after)
    _announce_unadmitted(out, meta, before, after, unadmitted)
    return out


def _announce_artifacts(
    out: list[Event], before: TuningProfileStatus, after: TuningProfileStatus
) -> None:
    old_shas = {a.gpu_model: a.sha256 for a in before.artifacts}
    for art in after.artifacts:
        if old_shas.get(art.gpu_model) == art.sha256:
            continue
        metrics.ARTIFACTS_PUBLISHED.inc()
        if art.library_skipped:
            out.append(
                (
                    "Warning",
                    EventReason.LIBRARY_ENTRY_SKIPPED,
                    f"{art.gpu_model}: {art.library_skipped} library entr(y/ies) failed "
                    f"verification and were not used: {art.library_skipped_reason}",
                )
            )
        if art.tuning_seconds is not None:
            metrics.TUNING_SECONDS.observe(float(art.tuning_seconds))


def _announce_failed_attempts(
    out: list[Event], before: TuningProfileStatus, after: TuningProfileStatus
) -> None:
    """One Event per distinct cause of a failed attempt (the Job retries; status says so)."""
    said = {j.name: j.last_failure for j in before.jobs}
    for job in after.jobs:
        cause = job.last_failure
        if cause and said.get(job.name) != cause:
            out.append(
                (
                    "Warning",
                    Reason.ATTEMPT_FAILED,
                    f"{job.gpu_model}: an attempt of Job {job.name} failed ({cause}); "
                    f"{job.failed_attempts or 1} so far, the Job retries",
                )
            )


def _announce_unadmitted(
    out: list[Event],
    meta: dict[str, Any],
    before: TuningProfileStatus,
    after: TuningProfileStatus,
    names: list[str],
) -> None:
    count, before_count = after.unadmitted_pods, before.unadmitted_pods
    if count <= before_count:
        return
    shown = ", ".join(names[:10]) + (", ..." if len(names) > 10 else "")
    out.append(
        (
            "Warning",
            EventReason.PODS_NOT_ADMITTED,
            f"{count} pod(s) labelled {naming.PROFILE_LABEL}={meta['name']} were created while "
            f"the tunefleet webhook was unreachable and run without the artifact: {shown}. "
            f"List them: kubectl get pods -n {meta['namespace']} -l "
            f"'{naming.PROFILE_LABEL}={meta['name']},!{ADMISSION_LABEL}'; recreate them "
            "(e.g. kubectl rollout restart) to get it.",
        )
    )
