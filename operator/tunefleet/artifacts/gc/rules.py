"""The rules: what is kept and what goes, artifact by artifact and each revision's scratch
(the libraries' rule is compaction.py's), and `collect`, which reads the fleet and lists the
store, then decides everything without writing or deleting anything.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any

from tunefleet.storage.store import Location, Store

from . import fleet_objects
from .common import store_uri
from .compaction import plan_library
from .fleet_objects import FLEET_CLAIM, FLEET_ENTRY, FLEET_REFS, FleetObjects, Found
from .fleet_state import ArtifactId, Fleet, ProfileFacts, fleet_of
from .inventory import Group, Inventory, list_store
from .plan import Delete, Plan, Rules, deletion, kept_young


def clock() -> float:
    """Now, for the ages the rules judge (the tests move it)."""
    return time.time()


# Why artifacts and scratch are kept, as the report says it.
KEPT_REFERENCED = "artifacts referenced by a profile's status"
KEPT_PINNED = "artifacts a model pod still running was pinned to"
KEPT_CURRENT = "scratch of a current revision not yet published"
KEPT_UNKNOWN = "objects of no layout tunefleet writes (left alone)"
KEPT_FLEET_REFS = (
    "artifacts a profile of a cluster on this store references (an unexpired refs doc)"
)
KEPT_FLEET_ENTRY = "artifacts a published fleet entry names (another cluster may adopt them)"
KEPT_FLEET_UNLISTED = (
    f"artifacts not judged: the fleet's folder holds over {fleet_objects.MAX_FLEET_OBJECTS} "
    "objects, so what other clusters reference is not known"
)
KEPT_FLEET = "fleet objects in use, or not ours to judge (claims, entries, refs docs, probes)"


def kept_newest(rules: Rules) -> str:
    return f"artifacts among the newest {rules.keep} of their profile and GPU model"


def plan_artifacts(plan: Plan, inv: Inventory, fleet: Fleet, others: Others) -> None:
    rules = plan.rules
    for owner, dirs in sorted(inv.artifacts.items()):
        complete = sorted((-g.newest, sha) for sha, g in dirs.items() if g.complete)
        newest = {sha for _, sha in complete[: rules.keep]}
        for sha, group in sorted(dirs.items()):
            reason = _artifact_verdict(plan, group, (*owner, sha), (fleet, others), sha in newest)
            if reason:
                plan.deletes.append(deletion(plan, group, reason))


class Others:
    """What the other clusters on the store keep (fleet_objects.py): the artifacts their
    unexpired refs docs and the fleet's live entries name; everything, when the fleet's folder
    could not be listed whole."""

    def __init__(self, found: FleetObjects, live_entries: set[ArtifactId]) -> None:
        self.refs = found.refs
        self.entries = live_entries
        self.unlisted = found.truncated


def _artifact_verdict(
    plan: Plan, group: Group, ident: ArtifactId, fleets: tuple[Fleet, Others], among_newest: bool
) -> str:
    """Why the artifact goes; "" when it stays (counted under its reason)."""
    fleet, others = fleets
    count = len(group.objects)
    if ident in fleet.referenced:
        plan.keep(KEPT_REFERENCED, count)
    elif ident in fleet.pinned:
        plan.keep(KEPT_PINNED, count)
    elif ident in others.refs:
        plan.keep(KEPT_FLEET_REFS, count)
    elif ident in others.entries:
        plan.keep(KEPT_FLEET_ENTRY, count)
    elif others.unlisted:
        plan.keep(KEPT_FLEET_UNLISTED, count)
    elif among_newest:
        plan.keep(kept_newest(plan.rules), count)
    elif plan.rules.young(group.newest):
        plan.keep(kept_young(plan.rules), count)
    elif not group.complete:
        return "incomplete (no manifest.json: a publish that never finished), not referenced"
    else:
        return (
            f"not referenced by any profile's status or running pod, not among the newest "
            f"{plan.rules.keep} of {ident[0]}/{ident[1]}/{ident[2]}, named by no refs doc "
            "or fleet entry"
        )
    return ""


def plan_scratch(plan: Plan, inv: Inventory, fleet: Fleet) -> None:
    for (ns, profile, model, _kind, revision), group in sorted(inv.scratch.items()):
        if plan.rules.young(group.newest):
            plan.keep(kept_young(plan.rules), len(group.objects))
            continue
        reason = _scratch_verdict(fleet.profiles.get((ns, profile)), model, revision)
        if reason:
            plan.deletes.append(deletion(plan, group, reason))
        else:
            plan.keep(KEPT_CURRENT, len(group.objects))


def _scratch_verdict(facts: ProfileFacts | None, model: str, revision: str) -> str:
    """Why a revision's checkpoints or shard outputs are no longer needed; "" if they are."""
    if facts is None:
        return "its profile is gone"
    if (model, revision) in facts.published:
        return f"revision {revision} is published (its artifact is in the profile's status)"
    if facts.models is not None and model not in facts.models:
        return f"GPU model {model} is no longer in the profile's spec"
    if revision not in facts.revisions:
        current = ", ".join(sorted(facts.revisions)) or "unknown"
        return f"revision {revision} is superseded (current: {current})"
    return ""


def plan_fleet(
    plan: Plan, inv: Inventory, found: FleetObjects, namespaces: Sequence[str] | None
) -> set[ArtifactId]:
    """The fleet's objects past their use, to delete (each only if it still holds what was
    read): claims long expired, expired refs docs (of the namespaces collected), and entries
    whose artifact is gone from this store (only when the whole store was listed: a partial
    listing cannot say an artifact is gone). Returns the artifacts live entries keep."""
    rules = plan.rules
    deletes: list[Delete] = []
    whole = namespaces is None
    if whole:
        deletes += [_fleet_deletion(plan, FLEET_CLAIM, f, why) for f, why in found.expired_claims]
    for f, why in found.expired_refs:
        namespace = fleet_objects.refs_namespace(plan.location, f.listed.key)
        if whole or namespace in (namespaces or ()):
            deletes.append(_fleet_deletion(plan, FLEET_REFS, f, why))
    live: set[ArtifactId] = set()
    for e in found.entries:
        ours = e.uri.startswith(store_uri(plan.location).rstrip("/") + "/")
        group = inv.artifacts.get(e.artifact[:3], {}).get(e.artifact[3]) if e.artifact else None
        gone = whole and ours and (group is None or not group.complete)
        if e.artifact is not None and not gone:
            live.add(e.artifact)
        elif gone and not rules.young(e.found.listed.modified):
            why = f"names artifact {e.uri}, which is not in this store (no manifest.json)"
            deletes.append(_fleet_deletion(plan, FLEET_ENTRY, e.found, why))
    plan.deletes += deletes
    plan.keep(KEPT_FLEET, found.listed - len(deletes))
    return live


def _fleet_deletion(plan: Plan, kind: str, found: Found, reason: str) -> Delete:
    key, o = found.listed.key, found.listed
    where = plan.location.uri(key)
    return Delete(kind, where, (key,), o.size, o.modified, reason, ((key, found.data),))


def collect(
    store: Store,
    location: Location,
    profiles: Iterable[dict[str, Any]],
    rules: Rules,
    namespaces: Sequence[str] | None = None,
    pinned: Iterable[str] = (),
) -> Plan:
    """Decide everything (reads only). Profiles and pods come first: read before the store
    is listed, an artifact published (or pinned by a new pod) in between is younger than the
    grace period. `pinned`: artifact URIs running model pods were pinned to (read_pinned)."""
    docs = list(profiles)
    fleet = fleet_of(docs, location, pinned)
    if not rules.now:
        rules = Rules(rules.keep, rules.grace_s, clock())
    # Like the profiles, read before the store is listed: an artifact another cluster started
    # to reference in between was adopted through an entry, which keeps it already.
    found = fleet_objects.read(store, location, rules.now)
    inv = list_store(store, location, namespaces)
    plan = Plan(location, rules, listed=inv.listed, listed_bytes=inv.listed_bytes)
    plan.profiles, plan.using_store = len(docs), fleet.using_store
    plan.fleet_listed = found.listed
    live = plan_fleet(plan, inv, found, namespaces)
    plan_artifacts(plan, inv, fleet, Others(found, live))
    plan_scratch(plan, inv, fleet)
    for base in sorted(inv.libraries):
        plan_library(plan, store, inv.libraries[base])
    plan.keep(KEPT_UNKNOWN, len(inv.unknown))
    plan.notes += fleet_objects.skipped_notes(found)
    if found.truncated:
        plan.notes.append(
            f"the fleet's folder {store_uri(location)}/_fleet holds over "
            f"{fleet_objects.MAX_FLEET_OBJECTS} objects: only the first were read, and no "
            "artifact is deleted (what other clusters reference is not known)"
        )
    if not fleet.using_store:
        plan.notes.append(
            f"none of the {len(docs)} profiles read names {store_uri(location)} in "
            "spec.storage.uri: is --uri (or the kubeconfig context) right? Artifacts here are "
            "kept only by the newest-N rule and status references"
        )
    return plan
