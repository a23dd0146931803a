"""Condition types and reasons of a TuningProfile, and of the Events the operator posts, named
once (as kueue's workload_types.go does). Reconcile, status, events and `kubectl tunefleet`
use these names; a new reason is added here, with what it means.

Conditions are shaped like metav1.Condition: type, status, reason, message (capped at
MESSAGE_LIMIT where it is set), lastTransitionTime (moves only when status flips) and
observedGeneration.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal

from tunefleet.api.models import Condition

# Kubernetes allows 32 KiB; a condition message stays readable in `kubectl get -o wide`.
MESSAGE_LIMIT = 2000


class Type(StrEnum):
    READY = "Ready"  # True: every GPU model of the spec has an artifact that pods get
    PROGRESSING = "Progressing"  # True: tuning Jobs of the current revision are underway
    FAILED = "Failed"  # True: a tuning Job of the current revision failed, or the spec is invalid
    # True: model pods run without the artifact for a cause tunefleet can fix or must report
    # (its delivery is gone, a pod's fetch failed), or a delivery could not be made again.
    DEGRADED = "Degraded"
    # Fleet mode (docs/fleet.md), only where it would apply and does not: False, with why,
    # while this profile adopts nothing from the fleet (no key to verify a signature with).
    FLEET_ADOPTION = "FleetAdoption"


TYPES = (Type.READY, Type.PROGRESSING, Type.FAILED, Type.DEGRADED, Type.FLEET_ADOPTION)
# Shown only where a status has them (Degraded came with 0.2.0; FleetAdoption is there only
# while it says something).
OPTIONAL_TYPES = frozenset({Type.DEGRADED, Type.FLEET_ADOPTION})


class Phase(StrEnum):
    """status.phase: the one word `kubectl get tuningprofiles` shows (crds/ lists the same)."""

    PENDING = "Pending"  # nothing tuning yet (Jobs not started, or blocked)
    QUEUED = "Queued"  # every Job waits in its Kueue queue, or for a GPU tunefleet's Jobs hold
    TUNING = "Tuning"  # a tuning Job runs
    READY = "Ready"  # every GPU model has an artifact that pods get
    DEGRADED = "Degraded"  # Ready, but model pods run untuned for a cause of ours
    FAILED = "Failed"  # a tuning Job of the current revision failed
    # The newest artifact of a model failed the promotion gate: the previous one, if any, serves.
    REJECTED = "Rejected"
    INVALID = "Invalid"  # the spec can't be tuned as written


class Reason(StrEnum):
    # Ready
    ARTIFACTS_PUBLISHED = "ArtifactsPublished"  # every model has an artifact
    # A model's newest artifact failed spec.promotion's gate: kept in history, not served.
    PROMOTION_REJECTED = "PromotionRejected"
    TUNING = "Tuning"  # waiting for the Jobs to publish
    # Progressing
    TUNING_JOBS_RUNNING = "TuningJobsRunning"
    # A Job's attempt failed and the Job retries (its backoff limit not reached yet).
    ATTEMPT_FAILED = "AttemptFailed"
    TUNING_FINISHED = "TuningFinished"
    # Failed
    NO_FAILURES = "NoFailures"
    TUNING_FAILED = "TuningFailed"  # also Ready's, while no artifact is left to serve
    # Any of the three
    INVALID_SPEC = "InvalidSpec"  # the spec can't be tuned; nothing runs until it changes
    # spec.template asks for what the operator's profile policy (policy.py) does not allow;
    # nothing runs until the spec or the policy changes.
    TEMPLATE_REFUSED = "TemplateRefused"
    PARALLELISM_TOO_HIGH = "ParallelismTooHigh"  # fewer nodes of a model than shares
    JOB_CREATE_FAILED = "JobCreateFailed"  # the API server refused a Job for now; retried
    # Why a tuning pod cannot start (Progressing True, Ready False): diagnose.pod_blocker.
    UNSCHEDULABLE = "Unschedulable"
    IMAGE_PULL_FAILED = "ImagePullFailed"
    SECRET_MISSING = "SecretMissing"
    CONFIG_MAP_MISSING = "ConfigMapMissing"
    CONTAINER_CONFIG_ERROR = "ContainerConfigError"
    CONTAINER_ERROR = "ContainerError"
    # The Job controller cannot make the tuning pod: admission refuses it (a ServiceAccount,
    # PriorityClass or RuntimeClass spec.template names that does not exist, a quota).
    POD_CREATE_FAILED = "PodCreateFailed"
    # A Job waits in its Kueue LocalQueue (spec.tuning.queueName): Kueue's reason in the message.
    QUEUED = "Queued"
    # A Job the GPU gate made suspended: every GPU of its model is held by tunefleet's tuning
    # Jobs (placement/gate.py); it starts, oldest first, as they end. Not a fault.
    WAITING_FOR_GPU = "WaitingForGPU"
    # Another profile or cluster sharing the store tunes this identity now (fleet/): the
    # message names it and when its claim expires; its artifact is adopted when published.
    TUNED_ELSEWHERE = "TunedElsewhere"
    # Degraded
    PODS_SERVED = "PodsServed"  # False: no model pod runs untuned for a cause of ours
    PODS_UNTUNED = "PodsStartedUntuned"  # True: the count and each cause in the message
    DELIVERY_FAILED = "DeliveryFailed"  # True: a delivered artifact is gone and not made again
    # FleetAdoption (False), also the Warning Event's reason when it appears: fleet mode adopts
    # only artifacts signed by the profile's key, and it gives none
    # (spec.storage.signing.publicKey): it neither adopts, claims nor publishes; it tunes its own.
    ADOPTION_NEEDS_KEY = "AdoptionNeedsPublicKey"


# What a tuning pod stuck before it ran is waiting on: the Job is not failing (yet).
BLOCKED = frozenset(
    {
        Reason.UNSCHEDULABLE,
        Reason.IMAGE_PULL_FAILED,
        Reason.SECRET_MISSING,
        Reason.CONFIG_MAP_MISSING,
        Reason.CONTAINER_CONFIG_ERROR,
        Reason.CONTAINER_ERROR,
        Reason.POD_CREATE_FAILED,
    }
)


class EventReason(StrEnum):
    """Reasons of the Events the operator posts on a TuningProfile (beside the condition
    reasons above, posted on a transition of Failed or a blocked Progressing)."""

    TUNING_JOB_CREATED = "TuningJobCreated"
    # A Job the GPU gate held is started (placement/gate.py): its one routine Event, said when
    # it starts, not at creation (a burst of 10,000 held Jobs is 10,000 Events fewer at once).
    TUNING_JOB_STARTED = "TuningJobStarted"
    READY = "Ready"
    LIBRARY_ENTRY_SKIPPED = "LibraryEntrySkipped"
    PODS_NOT_ADMITTED = "PodsNotAdmitted"  # labelled pods the webhook never saw
    POD_UNTUNED = "PodUntuned"  # the webhook admitted a model pod untuned
    IMAGE_MISMATCH = "ImageMismatch"  # a model pod runs another image than the tuned one
    UNTRUSTED_OBJECT = "UntrustedObject"  # a Job or pod with our labels that is not ours
    SUPERSEDED = "TuningJobSuperseded"  # a Job of an earlier revision was stopped or removed
    # Captures (docs/capture.md): a retune of captured misses started; model pods recorded
    # GEMMs their artifact has (their process did not load the results while recording).
    RETUNE_STARTED = "RetuneStarted"
    RETUNE_NOT_STARTED = "RetuneNotStarted"  # asked for (or due), and why it could not be
    CAPTURE_NOT_LOADED = "CaptureResultsNotLoaded"
    # An artifact's ConfigMap was deleted or replaced under its name: made again (delivery.py).
    CONFIG_MAP_REMADE = "ArtifactConfigMapRemade"
    # Fleet mode (docs/fleet.md): an artifact of the same identity, tuned by another profile
    # or cluster, adopted after its checks; one found that failed them (this profile tunes its
    # own); this profile's own artifact published for the fleet.
    ADOPTED = "ArtifactAdopted"
    NOT_ADOPTED = "ArtifactNotAdopted"
    PUBLISHED = "ArtifactPublishedForFleet"
    # The profile's store fails the probe of its conditional writes (fleet/probe.py): fleet
    # mode does not coordinate through it, and the profile tunes its own (said once a verdict).
    FLEET_STORE_REFUSED = "FleetStoreRefused"


def truncate(message: str, limit: int = MESSAGE_LIMIT) -> str:
    return message if len(message) <= limit else message[: limit - 3] + "..."


@dataclass(frozen=True)
class Stamp:
    """When a condition is written: the generation of the spec observed, and the time."""

    generation: int
    now: str


def condition(
    previous: list[dict[str, Any]],
    type_: Type,
    status: bool,
    reason: Reason,
    message: str,
    stamp: Stamp,
) -> Condition:
    """A metav1.Condition (`previous`: the conditions as the API server holds them);
    lastTransitionTime moves only when status flips."""
    generation, now = stamp.generation, stamp.now
    value: Literal["True", "False"] = "True" if status else "False"
    before = next((c for c in previous if c.get("type") == type_), None)
    since = before["lastTransitionTime"] if before and before.get("status") == value else now
    return Condition(
        type=str(type_),
        status=value,
        reason=str(reason),
        message=truncate(message),
        last_transition_time=str(since),
        observed_generation=generation,
    )


def find(status: dict[str, Any], type_: Type) -> dict[str, Any]:
    """The condition of that type in a status, or {}."""
    return next((c for c in status.get("conditions") or [] if c.get("type") == type_), {})
