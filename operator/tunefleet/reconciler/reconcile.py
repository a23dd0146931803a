"""One profile's reconciliation: make the children that should exist, then report what is.

`sync_profile` is level-based and idempotent. It reads the profile, its Jobs and their pods
from the operator's cache (cache.py), so a reconcile that changes nothing makes no API call at
all; it creates only what is missing (a ConfigMap and a Job per GPU model of the current
revision, a merge Job once a sharded Job's shares are in) and writes status only when it
changed. Events mark transitions, so a resync never repeats them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from tunefleet import kube
from tunefleet.api.conditions import Reason, Type, truncate
from tunefleet.api.profile_status import TuningProfileStatus
from tunefleet.config import Config
from tunefleet.reconciler import apply, decide, gather
from tunefleet.reconciler.acts import Event, sooner
from tunefleet.reconciler.inputs import Around, Inputs, View
from tunefleet.reconciler.memory import QUEUED_TTL, Memory
from tunefleet.reconciler.status import compute

log = logging.getLogger(__name__)

__all__ = ["ENDS", "Around", "Outcome", "requeue_after", "sync_profile"]


@dataclass(frozen=True)
class Outcome:
    """What one reconcile leaves: the status the profile holds, and how soon to reconcile it
    again when no event will say so (None: at its next change or resync). The engine acts on
    the delay only (controller-runtime's Result{RequeueAfter}); why is the domain's business."""

    status: TuningProfileStatus
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


def requeue_after(status: TuningProfileStatus) -> float | None:
    """How soon a profile with this status must be looked at again without an event: a
    queued Job's reason changes in Kueue's Workload, which nothing here watches; a delivery
    that could not be made again (the store down) comes back only when tried again."""
    if any(j.reason == Reason.QUEUED for j in status.jobs):
        return QUEUED_TTL
    degraded = status.condition(Type.DEGRADED)
    if degraded is not None and degraded.reason == Reason.DELIVERY_FAILED:
        return decide.REDELIVER_AFTER_S
    return None


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
    mine = memory.of(profile["metadata"]["uid"])
    events: list[Event] = []
    with mine.lock:
        inputs: Inputs | None = None
        try:
            inputs = gather.gather(View(profile, jobs, pods), around, memory, config)
            return _steps(inputs, events)
        except ENDS as e:
            return Outcome(TuningProfileStatus.from_status(profile.get("status")), error=e)
        finally:
            if inputs is not None:
                apply.post_events(inputs, events)


def _steps(inputs: Inputs, events: list[Event]) -> Outcome:
    """Gather is done: decide once, carry the plan out in at most two rounds (the second
    decided from what the first answered), compute the status, write it, say what happened."""
    events += apply.report(inputs)
    plan = decide.plan(inputs)
    first = apply.carry_out(inputs, plan.first, events)
    second = plan.then(first)
    applied = first + apply.carry_out(inputs, second, events)
    events += apply.report_delivery(inputs, applied)
    extra = decide.extra(plan.after(first), plan.first, first, second.capture)
    status = compute(inputs, extra, applied)
    events += apply.write_status(inputs, status, second.capture)
    apply.forget(inputs, [f.uid for f in applied.foreign])
    error: Exception | None = applied.create_error
    problems = [*inputs.problems, *applied.problems]
    if problems or inputs.spec is None or inputs.refused:
        why = problems or list(inputs.refused)
        error = kube.Permanent(truncate("; ".join(why) or "invalid spec"))
    return Outcome(status, sooner(requeue_after(status), applied.requeue), error)
