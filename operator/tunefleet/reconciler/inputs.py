"""The values one reconcile works on: the view the engine hands it (View, Around), and what
its read step found (Inputs, gather.py), frozen. decide.plan and status.compute take Inputs
whole; nothing here reads or writes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tunefleet import images, naming
from tunefleet.api import TuningProfileSpec
from tunefleet.capture import step as capture_step
from tunefleet.capture.retune_sets import RetuneSet
from tunefleet.config import Config
from tunefleet.contracts import fleet as contract
from tunefleet.contracts.artifact_record import REJECTED, ArtifactRecord
from tunefleet.contracts.fleet import Published
from tunefleet.fleet.probe import Probes, Verdict
from tunefleet.informers.view_cache import Untrusted
from tunefleet.kube import Kube
from tunefleet.placement.gate import Gate
from tunefleet.reconciler.diagnose import Hints
from tunefleet.reconciler.memory import ProfileMemory
from tunefleet.reconciler.observe import Gathered, JobObservation, observe
from tunefleet.serving.served import Untuned
from tunefleet.storage import registry
from tunefleet.storage.store import Location, Store, StoreOptions
from tunefleet.watched import views


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


@dataclass(frozen=True)
class View:
    """The profile and what it controls, as the engine's cache holds them (cache.py)."""

    profile: dict[str, Any]
    jobs: list[dict[str, Any]]  # the Jobs the profile controls, nothing else
    pods: list[dict[str, Any]]  # the pods those Jobs control


@dataclass(frozen=True)
class ConfigMapFact:
    """A ConfigMap the reconcile may act on, as read: its uid now ("" when there is none),
    the object read from the API server (None: gone, or the watch's word was taken), and
    whether it could be read at all."""

    uid: str
    there: dict[str, Any] | None = None
    known: bool = True

    def owned_by(self, profile_uid: str) -> bool:
        """Whether the ConfigMap read is this profile's (read, never assumed)."""
        meta = (self.there or {}).get("metadata") or {}
        return self.there is not None and views.owning_profile(meta) == profile_uid


@dataclass(frozen=True)
class Where:
    """Where the fleet's objects for one model's identity are (docs/fleet.md)."""

    identity: str
    store: Store
    location: Location
    holder: contract.Holder


@dataclass(frozen=True)
class RefsPlace:
    """Where this profile's refs doc goes (contracts/fleet.Refs): the store fleet mode claims
    and publishes through, and this cluster's name in it."""

    store: Store
    location: Location
    cluster: str


@dataclass(frozen=True)
class Probe:
    """A store whose conditional writes fleet mode checks before its first claim through it
    (fleet/probe.py, apply.probe): the store opened, where the probe object goes, the key its
    verdict is kept under (endpoint and bucket) and the store in words."""

    store: Store
    location: Location
    key: str
    words: str


@dataclass(frozen=True)
class FleetFacts:
    """One model's fleet facts: where its identity's objects are, and the published entry as
    read and checked (adopt.read, adopt.verify): one to adopt, why not (refused, said once
    under `seen`), or a store that did not answer."""

    where: Where
    entry: Published | None = None
    refused: str = ""
    seen: str = ""
    unread: str = ""


@dataclass(frozen=True)
class Inputs:
    """Everything one reconcile read, frozen: decide.plan and status.compute take it whole."""

    view: View
    config: Config
    # What the operator remembers of the profile (memory.py): read by the decision for its
    # timings, written by apply.py alone.
    memory: ProfileMemory
    around: Around
    spec: TuningProfileSpec | None
    problems: tuple[str, ...] = ()
    refused: tuple[str, ...] = ()  # what of spec.template the profile policy refuses
    too_few: Mapping[str, str] = field(default_factory=dict)
    unadmitted: tuple[str, ...] = ()  # labelled pods the webhook never saw
    # The capture step's plan while acting (its freezes are made by apply.py), and the
    # revisions it assumes made; else the revisions status holds.
    planned: capture_step.Planned | None = None
    capture: capture_step.Outcome = field(default_factory=capture_step.Outcome)
    stale_sets: tuple[RetuneSet, ...] = ()
    config_maps: Mapping[str, ConfigMapFact] = field(default_factory=dict)
    gathered: Gathered = field(default_factory=Gathered)
    hints: Hints = field(default_factory=Hints)
    # Fleet mode: where each model's identity's objects are (publishing included), and the
    # published entry of each model that needs a Job and may adopt.
    wheres: Mapping[str, Where] = field(default_factory=dict)
    fleet: Mapping[str, FleetFacts] = field(default_factory=dict)
    # Fleet mode's check of the store's conditional writes (fleet/probe.py): the store to probe
    # before any claim this pass (no fresh verdict, and a model may claim), the verdict that
    # the store fails them (fleet mode does not coordinate through it: `wheres` is empty), or
    # the probe's store error (no verdict: nothing is adopted or claimed this pass); and the
    # process's verdicts, by store.
    probe: Probe | None = None
    refusal: Verdict | None = None
    unprobed: str = ""
    probes: Probes = field(default_factory=Probes)
    # Fleet mode: where the profile's refs doc goes (an s3:// store; None: no doc).
    refs_at: RefsPlace | None = None
    untrusted: tuple[Untrusted, ...] = ()
    untuned_pods: tuple[Untuned, ...] = ()
    wall: float = 0.0  # time.time() at the gather
    at: float = 0.0  # time.monotonic() at the gather

    @property
    def profile(self) -> dict[str, Any]:
        return self.view.profile

    @property
    def meta(self) -> dict[str, Any]:
        meta: dict[str, Any] = self.view.profile["metadata"]
        return meta

    @property
    def previous(self) -> dict[str, Any]:
        """The status the profile holds."""
        return self.view.profile.get("status") or {}

    @property
    def acting(self) -> bool:
        """Whether children may be made: a valid spec, and a profile not being deleted."""
        return (
            self.spec is not None
            and not self.problems
            and not self.refused
            and not self.meta.get("deletionTimestamp")
        )

    def revision(self, capture: capture_step.Outcome | None = None) -> Callable[[str], str]:
        """model -> the revision it tunes under (a retune's, or the spec's)."""
        revisions = (capture or self.capture).revisions
        base = naming.revision(self.spec) if self.spec is not None else ""
        return lambda model: revisions.get(model) or base

    def served(self, capture: capture_step.Outcome | None = None) -> dict[str, ArtifactRecord]:
        """Status's artifacts of each model's current revision, by model."""
        rev, out = self.revision(capture), {}
        for entry in self.previous.get("artifacts") or []:
            record = ArtifactRecord.from_status(entry)
            if (
                record is not None
                and self.spec is not None
                and record.revision == rev(record.gpu_model)
            ):
                out[record.gpu_model] = record
        return out

    def rejected(self, capture: capture_step.Outcome | None = None) -> set[str]:
        """Models whose artifact of their current revision the gate refused (status.history):
        tuned, not to be tuned again (a changed spec or a retune makes a new revision)."""
        rev, out = self.revision(capture), set()
        for entry in self.previous.get("history") or []:
            record = ArtifactRecord.from_status(entry)
            if (
                record is not None
                and self.spec is not None
                and record.verdict == REJECTED
                and record.revision == rev(record.gpu_model)
            ):
                out.add(record.gpu_model)
        return out

    def fleet_where(
        self, model: str, capture: capture_step.Outcome | None = None, publishing: bool = False
    ) -> Where | None:
        """Where the fleet's objects for this model's identity are, or None when fleet mode
        does not apply to it now: a retune of captured misses (its shapes are this
        profile's), spec.tuning.adopt Never (such a profile still publishes what it tuned), a
        profile with no spec.storage.signing.publicKey (it can verify no one's artifact, so it
        neither adopts, claims nor publishes: publishing replaces an entry the publisher
        cannot verify, and it could verify none; `unkeyed` says why)."""
        w = self.wheres.get(model)
        if w is None or self.spec is None or self.unkeyed:
            return None
        if self.revision(capture)(model) != naming.revision(self.spec):
            return None
        return w if publishing or self.spec.tuning.adopt != "Never" else None

    @property
    def unkeyed(self) -> str:
        """Why fleet mode adopts nothing for this profile though it would apply (fleet mode on,
        a store it coordinates through, an image by digest, adopt not Never): it gives no key
        to verify another cluster's signature with. "" otherwise. From the spec and the
        configuration alone, so the condition that says it does not flap with the store."""
        spec = self.spec
        if spec is None or not self.config.fleet or not self.config.fleet_cluster:
            return ""
        if spec.storage.public_key or spec.tuning.adopt == "Never":
            return ""
        try:
            scheme = registry.parse_uri(spec.storage.uri).scheme
        except ValueError:
            return ""
        if scheme not in ("s3", "oci"):
            return ""  # pvc:// and file:// stores: fleet mode leaves them out (gather._open)
        if images.parse(spec.image).digest is None:
            return ""  # no identity: tuning proceeds as before
        return (
            "fleet mode adopts only artifacts signed by this profile's key, and "
            "spec.storage.signing.publicKey is not set: this profile adopts nothing, takes no "
            "claim and publishes nothing for the fleet; it tunes its own. Set publicKey (the "
            "PEM of cosign.pub the fleet signs with) to share, or spec.tuning.adopt: Never to "
            "say this is meant."
        )

    @property
    def name(self) -> str:
        return f"TuningProfile {self.meta['namespace']}/{self.meta['name']}"

    def observe(
        self, jobs: list[dict[str, Any]], capture: capture_step.Outcome | None = None
    ) -> list[JobObservation]:
        """The Jobs observed (pure) with what was gathered for them."""
        by_job = {r.job: r for r in self.served(capture).values() if r.job}
        return observe(jobs, self.view.pods, self.hints, by_job, self.gathered)


def iso(t: float) -> str:
    """An epoch time as status's (and the fleet's) timestamps read."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def now_iso() -> str:
    """Now, as status's timestamps read."""
    return iso(time.time())
