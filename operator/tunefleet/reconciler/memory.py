"""What the operator remembers of each profile between its reconciles, and the gather step's
readers that fill it (a stuck pod's Events, a Job's, Kueue's word on a queued Job), each
behind its TTL. None of it is the truth about a profile (that is what the API server holds):
it saves calls and repeats, and what a new leader does not remember it reads again.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kubernetes.client.exceptions import ApiException

from tunefleet import kube
from tunefleet.fleet.probe import Probes
from tunefleet.kube import Kube
from tunefleet.reconciler import workloads
from tunefleet.reconciler.observe import Gathered, Want
from tunefleet.runtime.heap import compacted

_EVENT_FIELDS = ("reason", "message", "type", "lastTimestamp", "eventTime")  # what observe reads
EVENTS_TTL = 60.0  # seconds a pod's kubelet Events are trusted before being read again
# Seconds Kueue's word on a queued Job is trusted; the controller reconciles a profile with a
# queued Job that often (workloads.py: nothing of the Job changes while its Workload waits).
QUEUED_TTL = 15.0
NODES_TTL = 60.0  # seconds a node count is trusted (parallelism checks only)


@dataclass(slots=True)
class ProfileMemory:
    """What the operator remembers of one profile between its reconciles. None of it is the
    truth about the profile (that is what the API server holds): it saves calls and repeats.
    Not the parsed spec: parsing takes ~40 microseconds a reconcile, keeping it ~10 KB a
    profile (bench/scale.md)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    # The resourceVersion our last status write made: its watch echo needs no reconcile.
    written_rv: str = ""
    # Jobs a reconcile made and observed in its own status, by uid: their ADDED echo brings
    # what that reconcile read, so it needs none (Controller.echoes_made).
    made: set[str] = field(default_factory=set)
    # The tune step's imageID already written to a Job's ConfigMap, by Job uid.
    image_ids: dict[str, str] = field(default_factory=dict)
    # The kubelet's Events about a stuck pod, by pod uid: (read at, events).
    pod_events: dict[str, tuple[float, list[dict[str, Any]]]] = field(default_factory=dict)
    # Untrusted objects (cache.Untrusted) already reported, by uid.
    reported: set[str] = field(default_factory=set)
    # The failed attempt last announced, by Job uid (one Event per distinct cause).
    failures: dict[str, str] = field(default_factory=dict)
    # A delivery that failed, by artifact SHA-256: (when, why); tried again after a while.
    deliveries: dict[str, tuple[float, str]] = field(default_factory=dict)
    # Artifact ConfigMaps found deleted or replaced and not made again yet, by artifact
    # SHA-256: what happened to the one status named (Degraded until it is made again).
    lost: dict[str, str] = field(default_factory=dict)
    # Model pods that run untuned for a cause of ours, by cause, as last announced.
    untuned_said: dict[str, int] = field(default_factory=dict)
    # Artifact ConfigMaps that status stopped naming but a pod may still mount, and when they
    # were last checked (None: never since this replica started, so not known).
    retiring: set[str] | None = None
    retired_at: float = 0.0
    # Why a suspended Job waits (Kueue's Workload), by Job uid: (read at, message).
    queued: dict[str, tuple[float, str]] = field(default_factory=dict)
    # Fleet mode (fleet/): the claim this profile holds on each GPU model's identity, by model
    # (its expiry, epoch seconds), and the artifacts it published for the fleet, by SHA-256.
    claims: dict[str, float] = field(default_factory=dict)
    published: set[str] = field(default_factory=set)
    # Models whose bid stands on a board (oci://: fleet/bids.py), not yet holding: taken down
    # if the model is adopted meanwhile, else it would stand until it expires.
    bidding: set[str] = field(default_factory=set)
    # Published entries that failed adoption's checks (already said, not downloaded again).
    refused_entries: set[str] = field(default_factory=set)
    # The verdict that the profile's store fails conditional writes, as last said (its mark).
    said_refusal: str = ""
    # The refs doc this replica last wrote for the profile (contracts/fleet.Refs): the
    # artifact URIs it named and when it expires. None: none written since this replica
    # started or took the Lease, so the first reconcile writes it (once) whatever is there.
    refs: tuple[tuple[str, ...], float] | None = None

    def queued_of(self, job: dict[str, Any], client: Kube) -> str:
        """Kueue's word on a queued Job, read at most every QUEUED_TTL seconds."""
        meta = job.get("metadata") or {}
        uid = meta.get("uid", "")
        cached = self.queued.get(uid)
        if cached and time.monotonic() - cached[0] < QUEUED_TTL:
            return cached[1]
        try:
            found = workloads.workloads_of(client, meta.get("namespace", ""), uid)
        except (kube.Temporary, kube.Permanent, kube.Gone, ApiException) as e:
            # Only the reason is missing: the Job waits all the same.
            message = f"{workloads.why_queued(job, [])} (its Workload could not be read: {e})"
        else:
            message = workloads.why_queued(job, found)
            if not workloads.has_workload(job, found):
                # Kueue makes a Job's Workload moments after the Job: "none yet" is asked
                # again on the next reconcile, not kept for QUEUED_TTL.
                return message
        self.queued[uid] = (time.monotonic(), message)
        return message

    def gather(self, wants: list[Want], client: Kube) -> Gathered:
        """Read what observing wants beyond the cache (observe.observe_wanting): the only API
        reads of a reconcile before it decides, each kept for its TTL."""
        events: dict[str, list[dict[str, Any]]] = {}
        queued: dict[str, str] = {}
        for what, obj in wants:
            uid = (obj.get("metadata") or {}).get("uid", "")
            if what == "workload":
                queued[uid] = self.queued_of(obj, client)
            elif what == "pod-events":
                events[uid] = self.events_of(obj, client)
            else:
                events[uid] = self.job_events_of(obj, client)
        return Gathered(events, queued)

    def events_of(self, pod: dict[str, Any], client: Kube) -> list[dict[str, Any]]:
        """The kubelet's Events about one of the profile's pods."""
        return self._events(pod, client.pod_events)

    def job_events_of(self, job: dict[str, Any], client: Kube) -> list[dict[str, Any]]:
        """The Job controller's Events about one of the profile's Jobs."""
        return self._events(job, client.job_events)

    def _events(
        self, obj: dict[str, Any], read: Callable[[str, str], list[dict[str, Any]]]
    ) -> list[dict[str, Any]]:
        """Events about a pod or Job, read at most every EVENTS_TTL seconds (kept by uid)."""
        meta = obj.get("metadata") or {}
        uid = meta.get("uid", "")
        cached = self.pod_events.get(uid)
        if cached and time.monotonic() - cached[0] < EVENTS_TTL:
            return cached[1]
        events = [
            {k: e[k] for k in _EVENT_FIELDS if k in e}  # kept: raw Events were ~2 KB a Job
            for e in read(meta.get("namespace", ""), meta.get("name", ""))
        ]
        self.pod_events[uid] = (time.monotonic(), events)
        return events

    def prune(
        self, jobs: list[dict[str, Any]], pods: list[dict[str, Any]], untrusted: set[str]
    ) -> None:
        """Keep only what describes objects that still exist."""
        job_uids = {j["metadata"].get("uid", "") for j in jobs}
        pod_uids = {p["metadata"].get("uid", "") for p in pods}
        for table, alive in (
            (self.image_ids, job_uids),
            (self.failures, job_uids),
            (self.pod_events, pod_uids | job_uids),
            (self.queued, job_uids),
        ):
            for uid in [u for u in table if u not in alive]:
                del table[uid]
        self.reported &= untrusted

    def prune_deliveries(self, shas: set[str]) -> None:
        for table in (self.deliveries, self.lost):
            for sha in [k for k in table if k not in shas]:
                del table[sha]


@dataclass
class Memory:
    """What the operator remembers between reconciles (lost on restart, and on losing the
    Lease, which is fine: everything here can be read again)."""

    profiles: dict[str, ProfileMemory] = field(default_factory=dict)
    # Labelled pods the webhook never saw, by (namespace, profile name).
    unadmitted: dict[tuple[str, str], list[str]] = field(default_factory=dict)
    # Nodes per (label key, model): (read at, count), for parallelism checks.
    node_counts: dict[tuple[str, str], tuple[float, int]] = field(default_factory=dict)
    # Fleet mode: whether each store honours conditional writes (fleet/probe.py), by store.
    probes: Probes = field(default_factory=Probes)
    _guard: threading.Lock = field(default_factory=threading.Lock)

    def of(self, uid: str) -> ProfileMemory:
        with self._guard:
            found = self.profiles.get(uid)
            if found is None:
                found = self.profiles[uid] = ProfileMemory()
            return found

    def forget(self, uid: str) -> None:
        with self._guard:
            self.profiles.pop(uid, None)

    def prune(self, alive: Callable[[str], bool], keys: set[tuple[str, str]]) -> int:
        """Drop what is remembered of profiles the cache no longer holds (by uid), and of
        keys it no longer has: a reconcile that was under way when its profile was deleted
        may have made an entry after the deletion's own `forget`. Returns how many went."""
        with self._guard:
            gone = [uid for uid in self.profiles if not alive(uid)]
            for uid in gone:
                del self.profiles[uid]
            self.profiles = compacted(self.profiles)
        stale = [k for k in self.unadmitted if k not in keys]
        for k in stale:
            self.unadmitted.pop(k, None)
        self.unadmitted = compacted(self.unadmitted)
        return len(gone) + len(stale)

    def prune_node_counts(self) -> None:
        stale = time.monotonic() - NODES_TTL
        for key in [k for k, (at, _) in self.node_counts.items() if at < stale]:
            self.node_counts.pop(key, None)

    def sizes(self) -> dict[str, int]:
        return {
            "profiles": len(self.profiles),
            "unadmitted": len(self.unadmitted),
            "node_counts": len(self.node_counts),
            "image_ids": sum(len(m.image_ids) for m in list(self.profiles.values())),
            "pod_events": sum(len(m.pod_events) for m in list(self.profiles.values())),
        }
