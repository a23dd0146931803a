"""What a run decides, before anything is written or deleted: the rules' settings (Rules),
each group to delete and why (Delete), each compacted library entry to write (Write), and the
Plan that holds them with what is kept, counted by reason. rules.py and compaction.py fill it,
apply_plan.py carries it out, report.py says it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from tunefleet.storage.store import Location

from .common import duration_text
from .inventory import Group

DEFAULT_KEEP = 3
DEFAULT_GRACE_S = 6 * 3600.0


@dataclass(frozen=True)
class Rules:
    keep: int = DEFAULT_KEEP
    grace_s: float = DEFAULT_GRACE_S
    now: float = 0.0  # 0: the time of the run

    def young(self, modified: float) -> bool:
        return self.now - modified < self.grace_s


@dataclass(frozen=True)
class Delete:
    kind: str
    where: str  # the group's URI
    keys: tuple[str, ...]  # in the order they are deleted
    size: int
    newest: float
    reason: str
    # Objects that must still hold these bytes when the deletion runs, else it is left (a
    # fleet object its owner wrote again since gc read it: a renewed refs doc, a claim taken).
    unchanged: tuple[tuple[str, bytes], ...] = ()


@dataclass(frozen=True)
class Write:
    where: str  # the library's URI
    key: str
    data: bytes
    gemms: int


@dataclass
class Plan:
    location: Location
    rules: Rules
    writes: list[Write] = field(default_factory=list)
    deletes: list[Delete] = field(default_factory=list)
    kept: Counter[str] = field(default_factory=Counter)  # why -> objects
    notes: list[str] = field(default_factory=list)
    listed: int = 0
    listed_bytes: int = 0
    profiles: int = 0
    using_store: int = 0
    fleet_listed: int = 0  # objects under _fleet/ (claims, entries, refs docs, the probe's)

    def keep(self, why: str, objects: int) -> None:
        self.kept[why] += objects


def kept_young(rules: Rules) -> str:
    return f"written within the grace period ({duration_text(rules.grace_s)})"


def deletion(plan: Plan, group: Group, reason: str) -> Delete:
    """What deleting `group` takes: its URI, its keys in the order they go, and why."""
    return Delete(
        group.kind,
        plan.location.uri(group.base),
        group.ordered_keys(),
        group.size,
        group.newest,
        reason,
    )
