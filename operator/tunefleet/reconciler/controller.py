"""The reconciler's engine: a work queue of profiles, worker threads, and a slow resync.

Reflectors (runtime/reflector.py, the kinds in watched/kinds.py) feed handlers (handlers/) that
keep a small view of each object in the cache (watched/cache.py) and add the owning profile to the
queue (runtime/workqueue.py). Workers take keys and run the reconcile the engine was handed
(the operator hands it reconcile.sync_profile) against the cache; its Outcome says how soon
to look again when no event will (the engine never reads a condition). A reconcile whose
Outcome ends on a transient error (kube.Temporary) is retried with per-profile exponential
backoff (1 s doubling to 5 min); a permanent problem (kube.Permanent) is reported in status
once and waits for the next change. Every `config.resync_seconds` all profiles are queued
again (a no-op unless something drifted) and labelled pods that the webhook never saw are
counted.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from tunefleet import kube, metrics, naming
from tunefleet.capture.step import CaptureSource
from tunefleet.config import Config
from tunefleet.contracts.admission_record import ADMISSION_LABEL, STATUS_ANNOTATION
from tunefleet.informers.view_cache import Untrusted
from tunefleet.kube import Kube
from tunefleet.placement.gate import Gate
from tunefleet.reconciler.memory import Memory

# The reconcile's value types only: which reconcile runs is handed in (Reconcile), so the engine
# runs under a stand-in in tests, and the reconcile's insides change without touching it.
from tunefleet.reconciler.reconcile import Around, Outcome
from tunefleet.runtime.heap import release_memory
from tunefleet.runtime.workqueue import Backoff, WorkQueue
from tunefleet.serving.served import Untuned
from tunefleet.watched import views

log = logging.getLogger(__name__)

Key = tuple[str, str]  # (namespace, profile name)
HOUSEKEEPING_SECONDS = 30.0
EVENT_DELAY = 0.5


@dataclass
class Indexes:
    """Readers of the cache (cache.py), and where a status write's answer goes back."""

    profile: Callable[[Key], dict[str, Any] | None]
    profiles: Callable[[], list[Key]]
    jobs: Callable[[str, str], list[dict[str, Any]]]  # (namespace, profile uid): controlled
    pods: Callable[[str, str], list[dict[str, Any]]]  # (namespace, Job uid): controlled
    untrusted: Callable[[str], list[Untrusted]] = lambda uid: []
    # (key, resourceVersion, status): what the API server holds after our write.
    written: Callable[[Key, str, dict[str, Any]], None] = lambda key, rv, status: None
    # A profile read again from the API server (after a conflict).
    refresh: Callable[[dict[str, Any]], object] = lambda body: None
    # Whether the cache holds a profile of this uid (what is remembered follows it).
    has_profile: Callable[[str], bool] = lambda uid: True
    # Rebuild the cache's tables once a deletion emptied them (heap.compacted).
    compact: Callable[[], None] = lambda: None
    # Capture stores and retune sets (capture/step.py); None: no capture.
    captures: CaptureSource | None = None
    # (namespace, name) -> the uid of that artifact ConfigMap now, "" when none (delivered.py);
    # None: not followed (the reconcile then trusts what status recorded).
    config_map_uid: Callable[[str, str], str] | None = None
    # (namespace, profile) -> its model pods that run untuned for a cause of ours (served.py).
    untuned_pods: Callable[[str, str], list[Untuned]] = lambda ns, name: []
    # The GPU gate (placement/gate.py), fed by the Job and pod watches; None: every Job starts
    # at once.
    gate: Gate | None = None


class Reconcile(Protocol):
    """One reconcile of a profile against what the cache holds of it (reconcile.sync_profile):
    the status it holds and when to look again. It returns the project's errors in the
    Outcome; what it raises is a bug."""

    def __call__(
        self,
        profile: dict[str, Any],
        jobs: list[dict[str, Any]],
        pods: list[dict[str, Any]],
        config: Config,
        memory: Memory,
        around: Around,
        /,
    ) -> Outcome: ...


class Controller:
    def __init__(
        self,
        client: Kube,
        config: Config,
        indexes: Indexes,
        reconcile: Reconcile,
        *,
        workers: int = 8,
        backoff: Backoff | None = None,
    ) -> None:
        self.client = client  # the process's one (kube.Kube; a FakeKube in unit tests)
        self.config = config
        self.indexes = indexes
        self.reconcile = reconcile
        self.gate = indexes.gate
        self.workers = workers
        self.resync_seconds = config.resync_seconds
        self.queue: WorkQueue[Key] = WorkQueue(backoff or Backoff(base=1.0, cap=300.0))
        self.memory = Memory()
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()
        self._synced = threading.Event()  # the cache has been primed: resyncs may run
        # Set while this replica leads (always, without leader election): only then do the
        # workers take keys. Keys queued meanwhile wait, deduplicated.
        self.active = threading.Event()

    # --- triggers -------------------------------------------------------------------------

    def enqueue(self, key: Key, delay: float = 0.0) -> None:
        self.queue.add_after(key, delay)

    def enqueue_owner(self, namespace: str | None, profile: str | None) -> None:
        """A tuning Job or pod changed: its profile, after EVENT_DELAY (a pod's start is a
        burst of events: scheduled, pulling, init started...; one reconcile covers them), in
        the refresh lane (behind profiles' own changes: runtime/workqueue.py)."""
        if namespace and profile:
            self.queue.add_after((namespace, profile), EVENT_DELAY, urgent=False)

    def echoes_made(self, event: str | None, job: dict[str, Any]) -> bool:
        """Whether a Job's watch event is the echo of its own creation by a reconcile that
        observed it in the status it wrote (ProfileMemory.made): then nothing new."""
        meta = job.get("metadata") or {}
        mine = self.memory.profiles.get(views.owning_profile(meta) or "")
        if mine is None:
            return False
        uid = meta.get("uid", "")
        echo = event == "ADDED" and uid in mine.made
        mine.made.discard(uid)  # only its first event
        return echo

    def wants(self, profile: dict[str, Any]) -> bool:
        """Whether a profile event can change anything: not when it only brings back the
        status we wrote ourselves (every write echoes through the watch, with the very
        resourceVersion our write was answered with)."""
        meta = profile.get("metadata") or {}
        if meta.get("deletionTimestamp"):
            return True
        mine = self.memory.profiles.get(meta.get("uid", ""))
        return mine is None or not mine.written_rv or mine.written_rv != meta.get("resourceVersion")

    def forget(self, key: Key, uid: str | None) -> None:
        """The profile is gone: drop what we remember of it."""
        if uid:
            self.memory.forget(uid)
        self.memory.unadmitted.pop(key, None)
        self.queue.forget(key)

    # --- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        """Start the workers and the resync; the caller has primed what `indexes` read."""
        self._synced.set()
        for i in range(self.workers):
            t = threading.Thread(target=self._work, name=f"reconcile-{i}", daemon=True)
            t.start()
            self._threads.append(t)
        t = threading.Thread(target=self._resync_loop, name="resync", daemon=True)
        t.start()
        self._threads.append(t)
        if self.gate is not None:
            # Waiting Jobs let go as GPUs free: their profiles come first in the queue.
            start = self.enqueue
            t = threading.Thread(
                target=self.gate.run, args=(self._stop, self.active, start), name="gate",
                daemon=True,
            )  # fmt: skip
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        self._stop.set()
        self.queue.shutdown()

    # --- work -----------------------------------------------------------------------------

    def lead(self) -> None:
        """This replica leads now: reconcile everything once (the last leader's work may have
        stopped midway), then follow events."""
        self.active.set()
        metrics.LEADER.set(1)
        if self._synced.is_set():
            self.resync()

    def follow(self) -> None:
        """This replica no longer leads: it stops writing at once (kube's fence) and forgets
        what it remembered as leader; a later lead starts from what the API server holds."""
        self.active.clear()
        metrics.LEADER.set(0)
        self.memory = Memory()

    def _work(self) -> None:
        while not self._stop.is_set():
            if not self.active.wait(timeout=1.0):
                continue
            key = self.queue.get(timeout=1.0)
            if key is None:
                continue
            if not self.active.is_set():  # lost the lead while waiting: keep it for later
                self.queue.done(key)
                self.queue.add(key)
                continue
            try:
                self.process(key)
            finally:
                self.queue.done(key)

    def process(self, key: Key) -> None:
        profile = self.indexes.profile(key)
        if profile is None:
            self.forget(key, None)
            return  # deleted: garbage collection takes its children
        uid = profile["metadata"].get("uid", "")
        metrics.HANDLER_CALLS.labels("reconcile").inc()
        started = time.perf_counter()
        try:
            outcome = self._sync(key, profile)
        except Exception as e:  # a bug: the reconcile returns the project's own errors
            self._failed(key, uid, e)
        else:
            if outcome.error is not None:
                self._failed(key, uid, outcome.error)
                return
            self.queue.forget(key)
            if outcome.requeue_after is not None:
                self.queue.add_after(key, outcome.requeue_after)
        finally:
            metrics.RECONCILE_SECONDS.observe(time.perf_counter() - started)

    def _sync(self, key: Key, profile: dict[str, Any]) -> Outcome:
        """One reconcile of the profile against what the cache holds of it."""
        ns, name = key
        uid = profile["metadata"].get("uid", "")
        jobs = self.indexes.jobs(ns, uid)
        pods = [p for j in jobs for p in self.indexes.pods(ns, j["metadata"].get("uid", ""))]
        return self.reconcile(
            profile,
            jobs,
            pods,
            self.config,
            self.memory,
            Around(
                self.client,
                untrusted=self.indexes.untrusted(uid),
                untuned_pods=self.indexes.untuned_pods(ns, name),
                captures=self.indexes.captures,
                config_map_uid=self.indexes.config_map_uid,
                on_written=lambda rv, status: self.indexes.written(key, rv, status),
                gate=self.gate,
            ),
        )

    def _failed(self, key: Key, uid: str, e: Exception) -> None:
        """What a failed reconcile leaves queued: by the error its Outcome ended on, or (a bug)
        the exception it raised, while that is handled."""
        where = f"TuningProfile {key[0]}/{key[1]}"
        if isinstance(e, kube.Permanent):
            # Reported in the profile's status (and an Event on the transition); nothing to
            # retry until the spec changes.
            metrics.HANDLER_ERRORS.labels("reconcile", "permanent").inc()
            self.queue.forget(key)
            log.debug(f"{where}: {e}")
        elif isinstance(e, kube.Temporary):
            metrics.HANDLER_ERRORS.labels("reconcile", "temporary").inc()
            metrics.QUEUE_RETRIES.inc()
            delay = self.queue.retry(key, float(e.delay or 0))
            log.warning(f"{where}: {e} (attempt {self.queue.failures(key)}, next in {delay:.0f}s)")
        elif isinstance(e, kube.Gone):
            self.forget(key, uid)
            log.info(f"{where}: {e}")
        elif isinstance(e, kube.NotLeading):
            # Lost (or losing) the Lease: the next leader reconciles it; keep it for later.
            self.queue.forget(key)
            self.queue.add_after(key, 2.0)
            log.info(f"{where}: {e}")
        elif isinstance(e, kube.Conflict):
            # The profile changed since it was read: read it again, compute again.
            metrics.STATUS_CONFLICTS.inc()
            self._refresh(*key)
            self.queue.forget(key)
            self.queue.add_after(key, 0.1)
            log.debug(f"{where}: {e}")
        else:
            # A bug must not stop reconciliation of this profile or any other.
            metrics.HANDLER_ERRORS.labels("reconcile", "unexpected").inc()
            metrics.QUEUE_RETRIES.inc()
            delay = self.queue.retry(key)
            log.exception(f"{where}: reconcile failed; next in {delay:.0f}s")

    def _refresh(self, namespace: str, name: str) -> None:
        try:
            fresh = self.client.get_profile(namespace, name, kube.REQUEST_TIMEOUT)
        except Exception as e:  # the watch will bring it; this only saves a round
            log.info(f"could not read TuningProfile {namespace}/{name} again: {e}")
            return
        if fresh is not None:
            self.indexes.refresh(fresh)

    # --- resync ---------------------------------------------------------------------------

    def _resync_loop(self) -> None:
        # The first pass waits for kopf's indexes, then runs at once: after a restart it finds
        # what changed while nobody watched (pods admitted while the webhook was down).
        while not self._stop.is_set():
            if self._synced.wait(timeout=1.0):
                break
        first, due = True, 0.0
        while not self._stop.is_set():
            if self.active.is_set() and time.monotonic() >= due:
                metrics.HANDLER_CALLS.labels("resync").inc()
                try:
                    self.resync(scan_only=first)
                except Exception:
                    metrics.HANDLER_ERRORS.labels("resync", "unexpected").inc()
                    log.exception("resync failed; trying again at the next interval")
                first, due = False, time.monotonic() + self.resync_seconds
            # Between resyncs: what is remembered follows what the cache holds, and what bursts
            # of events (a restart's listing, a mass apply or delete) left on the heap goes
            # back to the system, so the resident size follows the load down.
            self.housekeeping()
            self._stop.wait(HOUSEKEEPING_SECONDS if not first else 1.0)

    def housekeeping(self) -> None:
        keys = set(self.indexes.profiles())
        self.memory.prune(self.indexes.has_profile, keys)
        self.memory.prune_node_counts()
        self.queue.prune(keys.__contains__)
        self.indexes.compact()
        release_memory()

    def resync(self, scan_only: bool = False) -> None:
        changed = self.scan_unadmitted()
        keys = changed if scan_only else set(self.indexes.profiles())
        for key in keys:
            self.queue.add(key, urgent=False)

    def scan_unadmitted(self) -> set[Key]:
        """Count labelled pods the webhook never admitted; returns the profiles whose count
        changed. One label-selected list per watched namespace (or one cluster-wide)."""
        selector = f"{naming.PROFILE_LABEL},!{ADMISSION_LABEL}"
        namespaces: Iterable[str | None] = self.config.namespaces or [None]
        found: dict[Key, list[str]] = defaultdict(list)
        for ns in namespaces:
            try:
                pods = self.client.list_pods(ns, selector)
            except (kube.Temporary, kube.Gone) as e:
                log.warning(f"could not look for pods the webhook missed: {e}")
                return set()
            for pod in pods:
                meta = pod.get("metadata") or {}
                anns = meta.get("annotations") or {}
                if anns.get(STATUS_ANNOTATION):
                    continue  # admitted by a version that did not set the label yet
                if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                    continue
                profile = (meta.get("labels") or {}).get(naming.PROFILE_LABEL, "")
                found[(meta.get("namespace", ""), profile)].append(meta.get("name", ""))
        before = self.memory.unadmitted
        changed = {
            k
            for k in set(before) | set(found)
            if sorted(before.get(k, [])) != sorted(found.get(k, []))
        }
        self.memory.unadmitted = {k: sorted(v) for k, v in found.items()}
        return changed
