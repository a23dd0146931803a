"""The rules: what is kept and what goes, artifact by artifact and each revision's scratch
(the libraries' rule is compaction.py's), and `collect`, which reads the fleet and lists the
store, then decides everything without writing or deleting anything.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any

from tunefleet.storage.store import Location, Store

from .common import store_uri
from .compaction import plan_library
from .fleet_state import ArtifactId, Fleet, ProfileFacts, fleet_of
from .inventory import Group, Inventory, list_store
from .plan import Plan, Rules, deletion, kept_young


def clock() -> float:
    """Now, for the ages the rules judge (the tests move it)."""
    return time.time()


# Why artifacts and scratch are kept, as the report says it.
KEPT_REFERENCED = "artifacts referenced by a profile's status"
KEPT_PINNED = "artifacts a model pod still running was pinned to"
KEPT_CURRENT = "scratch of a current revision not yet published"
KEPT_UNKNOWN = "objects of no layout tunefleet writes (left alone)"


def kept_newest(rules: Rules) -> str:
    return f"artifacts among the newest {rules.keep} of their profile and GPU model"


def plan_artifacts(plan: Plan, inv: Inventory, fleet: Fleet) -> None:
    rules = plan.rules
    for owner, dirs in sorted(inv.artifacts.items()):
        complete = sorted((-g.newest, sha) for sha, g in dirs.items() if g.complete)
        newest = {sha for _, sha in complete[: rules.keep]}
        for sha, group in sorted(dirs.items()):
            reason = _artifact_verdict(plan, group, (*owner, sha), fleet, sha in newest)
            if reason:
                plan.deletes.append(deletion(plan, group, reason))


def _artifact_verdict(
    plan: Plan, group: Group, ident: ArtifactId, fleet: Fleet, among_newest: bool
) -> str:
    """Why the artifact goes; "" when it stays (counted under its reason)."""
    count = len(group.objects)
    if ident in fleet.referenced:
        plan.keep(KEPT_REFERENCED, count)
    elif ident in fleet.pinned:
        plan.keep(KEPT_PINNED, count)
    elif among_newest:
        plan.keep(kept_newest(plan.rules), count)
    elif plan.rules.young(group.newest):
        plan.keep(kept_young(plan.rules), count)
    elif not group.complete:
        return "incomplete (no manifest.json: a publish that never finished), not referenced"
    else:
        return (
            f"not referenced by any profile's status or running pod, not among the newest "
            f"{plan.rules.keep} of {ident[0]}/{ident[1]}/{ident[2]}"
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
    inv = list_store(store, location, namespaces)
    if not rules.now:
        rules = Rules(rules.keep, rules.grace_s, clock())
    plan = Plan(location, rules, listed=inv.listed, listed_bytes=inv.listed_bytes)
    plan.profiles, plan.using_store = len(docs), fleet.using_store
    plan_artifacts(plan, inv, fleet)
    plan_scratch(plan, inv, fleet)
    for base in sorted(inv.libraries):
        plan_library(plan, store, inv.libraries[base])
    plan.keep(KEPT_UNKNOWN, len(inv.unknown))
    if not fleet.using_store:
        plan.notes.append(
            f"none of the {len(docs)} profiles read names {store_uri(location)} in "
            "spec.storage.uri: is --uri (or the kubeconfig context) right? Artifacts here are "
            "kept only by the newest-N rule and status references"
        )
    return plan
