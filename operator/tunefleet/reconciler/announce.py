"""The Events a profile's status changes announce: on transitions only, so a resync never
repeats them (a failure, a blocked Job, new artifacts and what their library skipped, Ready,
a failed attempt, pods the webhook never saw), and the metrics counted with them.
"""

from __future__ import annotations

import logging
from typing import Any

from tunefleet import metrics, naming
from tunefleet.api.conditions import BLOCKED, EventReason, Phase, Reason, Type, find
from tunefleet.contracts.admission_record import ADMISSION_LABEL

log = logging.getLogger(__name__)


# An Event about the profile: (type, reason, message); the reconcile posts them after the
# status write that announces them.
Event = tuple[str, str, str]


def announce(
    profile: dict[str, Any], before: dict[str, Any], after: dict[str, Any], unadmitted: list[str]
) -> list[Event]:
    """The Events of a status change, on transitions only, so a resync never repeats them.
    Pure but for the published-artifact metrics."""
    out: list[Event] = []
    meta = profile["metadata"]
    was, now_ = find(before, Type.FAILED), find(after, Type.FAILED)
    if now_.get("status") == "True" and (
        was.get("status") != "True" or was.get("message") != now_.get("message")
    ):
        reason = now_.get("reason", Reason.TUNING_FAILED)
        log.info(f"TuningProfile {meta['namespace']}/{meta['name']}: {reason}")
        out.append(("Warning", reason, now_["message"]))
    was_p, now_p = find(before, Type.PROGRESSING), find(after, Type.PROGRESSING)
    blocked = now_p.get("status") == "True" and now_p.get("reason") in BLOCKED
    if blocked and (was_p.get("reason"), was_p.get("message")) != (
        now_p.get("reason"),
        now_p.get("message"),
    ):
        out.append(("Warning", now_p["reason"], now_p["message"]))
    _announce_artifacts(out, before, after)
    if after.get("phase") == Phase.READY and before.get("phase") not in (
        Phase.READY,
        Phase.DEGRADED,
    ):
        arts = ", ".join(
            f"{a['gpuModel']}@{a['sha256'][:12]}" for a in after.get("artifacts") or []
        )
        out.append(("Normal", EventReason.READY, f"Artifacts published: {arts}"))
    _announce_failed_attempts(out, before, after)
    _announce_unadmitted(out, meta, before, after, unadmitted)
    return out


def _announce_artifacts(out: list[Event], before: dict[str, Any], after: dict[str, Any]) -> None:
    old_shas = {a.get("gpuModel"): a.get("sha256") for a in before.get("artifacts") or []}
    for art in after.get("artifacts") or []:
        if old_shas.get(art.get("gpuModel")) == art.get("sha256"):
            continue
        metrics.ARTIFACTS_PUBLISHED.inc()
        if art.get("librarySkipped"):
            out.append(
                (
                    "Warning",
                    EventReason.LIBRARY_ENTRY_SKIPPED,
                    f"{art['gpuModel']}: {art['librarySkipped']} library entr(y/ies) failed "
                    f"verification and were not used: {art.get('librarySkippedReason', '')}",
                )
            )
        if isinstance(art.get("tuningSeconds"), int | float):
            metrics.TUNING_SECONDS.observe(float(art["tuningSeconds"]))


def _announce_failed_attempts(
    out: list[Event], before: dict[str, Any], after: dict[str, Any]
) -> None:
    """One Event per distinct cause of a failed attempt (the Job retries; status says so)."""
    said = {j.get("name"): j.get("lastFailure") for j in before.get("jobs") or []}
    for job in after.get("jobs") or []:
        cause = job.get("lastFailure")
        if cause and said.get(job.get("name")) != cause:
            out.append(
                (
                    "Warning",
                    Reason.ATTEMPT_FAILED,
                    f"{job['gpuModel']}: an attempt of Job {job['name']} failed ({cause}); "
                    f"{job.get('failedAttempts', 1)} so far, the Job retries",
                )
            )


def _announce_unadmitted(
    out: list[Event],
    meta: dict[str, Any],
    before: dict[str, Any],
    after: dict[str, Any],
    names: list[str],
) -> None:
    count, before_count = after.get("unadmittedPods") or 0, before.get("unadmittedPods") or 0
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
