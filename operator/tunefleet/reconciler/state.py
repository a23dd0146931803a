"""One reconcile's state: the profile, its children and what the steps found (Sync), shared
by the reconcile's gather, decide and apply steps (reconcile.py, gather.py, apply.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tunefleet import kube, naming
from tunefleet.api import TuningProfileSpec
from tunefleet.builders.job import Child
from tunefleet.capture import step as capture_step
from tunefleet.config import Config
from tunefleet.contracts.artifact import REJECTED, ArtifactRecord
from tunefleet.kube import Kube
from tunefleet.placement.gate import Gate
from tunefleet.reconciler.memory import ProfileMemory
from tunefleet.serving import delivery
from tunefleet.serving.served import Untuned
from tunefleet.storage import registry
from tunefleet.storage.store import Location, Store, StoreOptions

# An Event about the profile, (type, reason, message): every step's are posted in one place,
# after the status write (children, then status, then Events).
Event = tuple[str, str, str]


@dataclass
class Sync:
    """One reconcile of one profile: its parts, and what the steps found."""

    profile: dict[str, Any]
    jobs: list[dict[str, Any]]  # the Jobs the profile controls (cache.py), nothing else
    pods: list[dict[str, Any]]  # the pods those Jobs control
    config: Config
    memory: ProfileMemory
    client: Kube  # the process's client: every read and write of this reconcile goes through it
    spec: TuningProfileSpec | None = None
    problems: list[str] = field(default_factory=list)
    # What of spec.template the profile policy refuses (policy.py): nothing is made.
    refused: list[str] = field(default_factory=list)
    too_few: dict[str, str] = field(default_factory=dict)
    create_error: kube.Temporary | None = None
    unadmitted: list[str] = field(default_factory=list)  # labelled pods the webhook never saw
    on_written: Callable[[str, dict[str, Any]], None] = lambda rv, status: None
    # Production misses (capture/step.py): the revision each model tunes under (a retune's,
    # or the spec's), status.capture, and the Events to post once the status is written.
    capture: capture_step.Outcome = field(default_factory=capture_step.Outcome)
    captures: capture_step.CaptureSource | None = None
    # The uid of an artifact ConfigMap now, by (namespace, name) (delivered.py); None: not
    # followed, status's word is taken.
    config_map_uid: Callable[[str, str], str] | None = None
    # Model pods that run untuned for a cause of ours (served.py): the Degraded condition.
    untuned_pods: list[Untuned] = field(default_factory=list)
    # What delivery found this pass: ConfigMaps made again, foreign objects in the way.
    remade: list[str] = field(default_factory=list)
    foreign: list[delivery.Foreign] = field(default_factory=list)
    # Fleet mode (reconciler/fleet.py): artifacts adopted this pass, by model; models waiting
    # for another's tuning, with who; how soon to look again for the fleet's sake (None: no need).
    # How the fleet step opens the profile's store (storage/registry.open_store; a test's
    # directory store under an s3:// URI).
    open_store: Callable[[Location, StoreOptions], Store] = registry.open_store
    adopted: dict[str, ArtifactRecord] = field(default_factory=dict)
    waiting: dict[str, str] = field(default_factory=dict)
    fleet_requeue: float | None = None
    events: list[Event] = field(default_factory=list)  # posted once, at the end (_post_events)
    # The GPU gate (placement/gate.py): whether a new Job starts or waits suspended, and which
    # waiting ones it let go. None: no gate (every Job starts at once).
    gate: Gate | None = None

    @property
    def meta(self) -> dict[str, Any]:
        meta: dict[str, Any] = self.profile["metadata"]
        return meta

    def rev(self, model: str) -> str:
        """The revision a GPU model tunes under now."""
        assert self.spec is not None
        return self.capture.revisions.get(model) or naming.revision(self.spec)

    def child(self, model: str) -> Child:
        assert self.spec is not None
        m = self.meta
        rev = self.rev(model)
        base = naming.revision(self.spec)
        return Child(
            self.spec, m["namespace"], m["name"], m["uid"], model, self.config,
            revision_override=rev if rev != base else "",
            captured=self.capture.captured.get(model, "") if rev != base else "",
        )  # fmt: skip

    @property
    def acting(self) -> bool:
        """Whether children may be made: a valid spec, and a profile not being deleted."""
        return (
            self.spec is not None
            and not self.problems
            and not self.refused
            and not self.meta.get("deletionTimestamp")
        )

    @property
    def served(self) -> dict[str, ArtifactRecord]:
        """Status's artifacts of each model's current revision, by model."""
        out = {}
        for entry in (self.profile.get("status") or {}).get("artifacts") or []:
            record = ArtifactRecord.from_status(entry)
            if (
                record is not None
                and self.spec is not None
                and record.revision == self.rev(record.gpu_model)
            ):
                out[record.gpu_model] = record
        return out

    @property
    def rejected(self) -> set[str]:
        """Models whose artifact of their current revision the gate refused (status.history):
        tuned, not to be tuned again (a changed spec or a retune makes a new revision)."""
        out = set()
        for entry in (self.profile.get("status") or {}).get("history") or []:
            record = ArtifactRecord.from_status(entry)
            if (
                record is not None
                and self.spec is not None
                and record.verdict == REJECTED
                and record.revision == self.rev(record.gpu_model)
            ):
                out.add(record.gpu_model)
        return out
