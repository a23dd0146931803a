"""What a reconcile decided (Plan, decide.py) and what carrying it out answered (Applied,
apply.py), as values. A reconcile runs at most two rounds: the first makes what later
decisions turn on (retune sets, the fleet's claims), the second everything else; each
round's acts are carried out in the order of their fields.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tunefleet import kube
from tunefleet.builders.job import Child
from tunefleet.capture import step as capture_step
from tunefleet.capture.retune_sets import RetuneSet
from tunefleet.contracts.artifact_record import ArtifactRecord
from tunefleet.contracts.fleet import Refs
from tunefleet.fleet.claims import Standing
from tunefleet.fleet.probe import Verdict
from tunefleet.reconciler import children
from tunefleet.reconciler.inputs import FleetFacts, Probe, RefsPlace, Where
from tunefleet.serving import delivery

# An Event about the profile, (type, reason, message): every step's are posted in one place,
# after the status write (children, then status, then Events).
Event = tuple[str, str, str]


@dataclass(frozen=True)
class Stop:
    """A Job of an earlier revision, the uid of its ConfigMap when that is ours (""), and the
    revision that replaces it."""

    job: dict[str, Any]
    config_map_uid: str
    revision: str


@dataclass(frozen=True)
class Adoption:
    """An identity's published artifact, adopted: the record served, and our bid to take down
    (its holder released just before we looked)."""

    model: str
    record: ArtifactRecord
    said: str
    take_down: Where | None = None


@dataclass(frozen=True)
class Delivery:
    """One artifact's delivery this pass: `record` as it stands, and what to do: "" (nothing),
    "place" (its ConfigMap made, again when `lost` says what happened to the one before),
    "relabel" (the very ConfigMap made lost its labels: `there`), "volume" (an oci://
    artifact's volume image checked, remembered under `memo`)."""

    record: ArtifactRecord
    act: str = ""
    lost: str = ""
    there: dict[str, Any] | None = None
    memo: str = ""
    # Found deleted or replaced this pass: what happened, and what replaced it (never used).
    found_lost: str = ""
    replaced_by: delivery.Foreign | None = None


@dataclass(frozen=True)
class Renewal:
    """A claim this profile holds (or must read back: a Job runs that it holds none for)."""

    model: str
    where: Where | None  # None: fleet mode no longer applies to it (forgotten)


@dataclass(frozen=True)
class Publish:
    """An artifact this profile tuned and serves, published for the fleet under `key`."""

    record: ArtifactRecord
    where: Where
    key: str


@dataclass(frozen=True)
class RefsWrite:
    """The profile's refs doc, written (replaced) where `at` says: what it references for the
    other clusters' gc, with a new expiry."""

    at: RefsPlace
    refs: Refs


@dataclass(frozen=True)
class First:
    """Round one: what later decisions turn on."""

    drop_finalizer: bool = False
    freezes: tuple[RetuneSet, ...] = ()
    stale_sets: tuple[RetuneSet, ...] = ()
    adoptions: tuple[Adoption, ...] = ()
    claims: Mapping[str, Where] = field(default_factory=dict)
    refused: Mapping[str, FleetFacts] = field(default_factory=dict)  # said once each
    # The store whose conditional writes are checked first, before any claim through it
    # (fleet/probe.py): a claim is taken only through a store that honours them.
    probe: Probe | None = None


@dataclass(frozen=True)
class Second:
    """Round two: children, deliveries, the fleet's renewals, publishing and releases, and
    the profile's refs doc."""

    capture: capture_step.Outcome
    creates: tuple[Child, ...] = ()
    stops: tuple[Stop, ...] = ()
    moves: tuple[children.QueueMove, ...] = ()
    starts: tuple[dict[str, Any], ...] = ()
    renewals: tuple[Renewal, ...] = ()
    merges: tuple[Child, ...] = ()
    tends: tuple[children.Tend, ...] = ()
    deliveries: tuple[Delivery, ...] = ()
    # Artifact ConfigMaps no status entry names are looked for and deleted, all but these
    # (None: not due now).
    retire: frozenset[str] | None = None
    publishes: tuple[Publish, ...] = ()
    releases: Mapping[str, Where | None] = field(default_factory=dict)
    refs: RefsWrite | None = None  # the refs doc, when what it names changed or it is due
    recount: bool = False  # status.capture counted again against new artifacts
    # The store fails conditional writes (fleet/probe.py): said once per verdict.
    store_refused: Verdict | None = None
    events: tuple[Event, ...] = ()
    requeue: float | None = None


@dataclass(frozen=True)
class Applied:
    """What the API server and the stores answered to one round (or both, `+`)."""

    made: tuple[RetuneSet, ...] = ()
    unfrozen: Mapping[str, str] = field(default_factory=dict)  # model -> why not made
    standings: Mapping[str, Standing | str] = field(default_factory=dict)  # str: the error
    published_meanwhile: Mapping[str, FleetFacts] = field(default_factory=dict)
    # The store's verdict on conditional writes, probed this pass (a str: its error, no
    # verdict; None: not probed).
    probe: Verdict | str | None = None
    jobs: tuple[dict[str, Any], ...] | None = None  # the Jobs as this pass left them
    problems: tuple[str, ...] = ()
    create_error: kube.Temporary | None = None
    delivered: Mapping[str, ArtifactRecord] = field(default_factory=dict)  # by SHA-256
    remade: tuple[str, ...] = ()
    foreign: tuple[delivery.Foreign, ...] = ()
    recounted: capture_step.Outcome | None = None
    requeue: float | None = None
    events: tuple[Event, ...] = ()

    def __add__(self, later: Applied) -> Applied:
        again = [a for a in (self.requeue, later.requeue) if a is not None]
        return Applied(
            made=self.made + later.made,
            unfrozen={**self.unfrozen, **later.unfrozen},
            standings={**self.standings, **later.standings},
            published_meanwhile={**self.published_meanwhile, **later.published_meanwhile},
            probe=later.probe if later.probe is not None else self.probe,
            jobs=later.jobs if later.jobs is not None else self.jobs,
            problems=self.problems + later.problems,
            create_error=later.create_error or self.create_error,
            delivered={**self.delivered, **later.delivered},
            remade=self.remade + later.remade,
            foreign=self.foreign + later.foreign,
            recounted=later.recounted or self.recounted,
            requeue=min(again) if again else None,
            events=self.events + later.events,
        )


def sooner(a: float | None, b: float | None) -> float | None:
    """The sooner of two requeue delays (None: no need)."""
    return b if a is None else a if b is None else min(a, b)
