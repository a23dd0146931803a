"""The GPU gate: a tuning Job is made suspended while every GPU of its model is held by
tunefleet's own tuning Jobs, and started, oldest first, as they free.

Why: a burst of profiles of one GPU model (10,000 against one node of 8 GPUs, bench/scale.md)
made a pod for every Job that the scheduler could not place. Each such pod is a create, a
scheduling attempt, a status patch, an Event and a Job status write for the API server, and
watch events for the operator; a suspended Job is none of these (what Kueue does for Jobs under
spec.tuning.queueName; those are Kueue's and never gated here).

The gate is soft. The scheduler still decides where and when a pod runs; the gate only keeps
back what could not run anyway:
- it counts what tunefleet's own tuning Jobs hold (their GPU requests), not other pods: it
  never holds back a Job the cluster could place unless ours fill the model's GPUs;
- a model whose nodes advertise none of the resource, or fewer GPUs than a Job asks, is never
  held: its pod is made, and the scheduler's word says in status why it does not start;
- a Job that holds GPUs on paper but whose pods no node took within GRACE_S stops counting
  (a pod stuck on a taint must not keep the model's queue shut);
- what it granted and what it let go are counted until the Job's watch event says so.
Its state is rebuilt from the Job and pod watches (follow_job, follow_pod): no object of its
own, nothing to lose on a restart. Only Jobs controlled by the profile they name count.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tunefleet import naming
from tunefleet.informers.views import controller_uid
from tunefleet.watched.views import owning_profile

log = logging.getLogger(__name__)

TICK_S = 2.0  # how often waiting Jobs are looked at while some wait
CAPACITY_TTL_S = 30.0  # how long a pool's node list is trusted
GRACE_S = 120.0  # a started Job with no pod on a node counts this long
GRANT_TTL_S = 30.0  # a grant (a start allowed) counts this long before its Job is seen
GPU_SUFFIX = "/gpu"  # nvidia.com/gpu, amd.com/gpu: what a tuning pod asks for

Key = tuple[str, str]  # (namespace, profile name)


@dataclass(frozen=True)
class Pool:
    """The GPUs of one model: nodes labelled label_key=model, counted in `resource`."""

    label_key: str
    model: str
    resource: str

    @property
    def selector(self) -> str:
        return f"{self.label_key}={self.model}"


@dataclass(frozen=True)
class Demand:
    """What one tuning Job asks of a pool: every pod's GPUs together."""

    pool: Pool
    gpus: int


def demand(job: Mapping[str, Any]) -> Demand | None:
    """What a tuning Job (the whole object, as built or as watched) asks for, or None when it
    names no GPU model or asks for no GPU. Read from its pod template, as the scheduler does:
    a pod asks for the most any one init container asks, or all its containers together."""
    meta = job.get("metadata") or {}
    model = str((meta.get("annotations") or {}).get(naming.MODEL_ANNOTATION) or "")
    spec = job.get("spec") or {}
    pod = (spec.get("template") or {}).get("spec") or {}
    keys = [k for k, v in (pod.get("nodeSelector") or {}).items() if v == model]
    if not model or not keys:
        return None
    asked: dict[str, int] = defaultdict(int)
    for c in pod.get("containers") or []:
        for res, n in _gpus(c).items():
            asked[res] += n
    for c in pod.get("initContainers") or []:
        for res, n in _gpus(c).items():
            asked[res] = max(asked[res], n)
    if len(asked) != 1:
        return None
    resource, per_pod = next(iter(asked.items()))
    pods = max(1, int(spec.get("parallelism") or 1))
    return Demand(Pool(sorted(keys)[0], model, resource), per_pod * pods) if per_pod else None


def _gpus(container: Mapping[str, Any]) -> dict[str, int]:
    res = container.get("resources") or {}
    out: dict[str, int] = {}
    for part in (res.get("limits") or {}, res.get("requests") or {}):
        for k, v in part.items():
            if str(k).endswith(GPU_SUFFIX):
                try:
                    out[str(k)] = max(out.get(str(k), 0), int(str(v)))
                except ValueError:
                    continue
    return out


def held(job: Mapping[str, Any]) -> bool:
    """Whether the gate made this Job suspended (and so may start it)."""
    meta = job.get("metadata") or {}
    gated = (meta.get("annotations") or {}).get(naming.GPU_GATE_ANNOTATION) == "true"
    return gated and bool((job.get("spec") or {}).get("suspend"))


@dataclass
class _Job:
    demand: Demand
    key: Key
    order: tuple[str, str, str]  # creationTimestamp, namespace, name: oldest first
    waiting: bool  # suspended by the gate
    holding: bool  # started and not finished
    since: float  # when first seen holding
    bound: bool = False  # one of its pods is on a node


class Gate:
    """What tunefleet's tuning Jobs hold and wait for, by pool; see the module's docstring."""

    def __init__(self, capacity: Callable[[Pool], int]) -> None:
        self._capacity_of = capacity  # the pool's GPUs, as its nodes advertise (an API list)
        self._lock = threading.Lock()
        self._jobs: dict[str, _Job] = {}  # by Job uid
        self._capacity: dict[Pool, tuple[float, int]] = {}
        self._granted: dict[Pool, list[tuple[float, int]]] = defaultdict(list)
        self._admitted: dict[str, float] = {}  # waiting Job uid -> when let go

    # --- what the watches say -------------------------------------------------------------

    def follow_job(self, event: str | None, body: Mapping[str, Any]) -> None:
        meta = body.get("metadata") or {}
        uid = str(meta.get("uid") or "")
        if not uid:
            return
        labels = meta.get("labels") or {}
        owner = owning_profile(meta)
        d = demand(body) if "spec" in body else None
        ours = owner and owner == labels.get(naming.PROFILE_UID_LABEL)
        tune = labels.get(naming.ROLE_LABEL, "tune") == "tune"
        with self._lock:
            if event == "DELETED" or meta.get("deletionTimestamp") or not (ours and tune and d):
                self._jobs.pop(uid, None)
                self._admitted.pop(uid, None)
                return
            waiting = held(body)
            holding = not (body.get("spec") or {}).get("suspend") and not _finished(body)
            was = self._jobs.get(uid)
            if was is None and holding:
                self._take_grant(d)
            since = was.since if was is not None and was.holding else time.monotonic()
            key = (str(meta.get("namespace") or ""), str(labels.get(naming.TUNING_PROFILE_LABEL)))
            order = (str(meta.get("creationTimestamp") or ""), key[0], str(meta.get("name")))
            self._jobs[uid] = _Job(
                d, key, order, waiting, holding, since, bound=bool(was and was.bound)
            )
            if not waiting:
                self._admitted.pop(uid, None)

    def follow_pod(self, event: str | None, body: Mapping[str, Any]) -> None:
        """A tuning pod on a node: its Job holds GPUs for sure, past GRACE_S too."""
        meta = body.get("metadata") or {}
        if event == "DELETED" or not (body.get("spec") or {}).get("nodeName"):
            return
        job_uid = controller_uid(meta, "Job", "batch/v1")
        with self._lock:
            job = self._jobs.get(job_uid or "")
            if job is not None:
                job.bound = True

    # --- what the reconcile asks ----------------------------------------------------------

    def may_start(self, d: Demand) -> bool:
        """Whether a new Job of this demand may start now (counted as granted if so)."""
        capacity = self.capacity(d.pool)
        with self._lock:
            if capacity < d.gpus:  # none advertised, or never enough: the scheduler says why
                return True
            now = time.monotonic()
            if d.gpus > capacity - self._in_use(d.pool, now):
                return False
            self._granted[d.pool].append((now, d.gpus))
            return True

    def admitted(self, uid: str) -> bool:
        """Whether the gate let this waiting Job go: the reconcile starts it."""
        with self._lock:
            return uid in self._admitted

    def capacity(self, pool: Pool) -> int:
        now = time.monotonic()
        with self._lock:
            cached = self._capacity.get(pool)
        if cached is not None and now - cached[0] < CAPACITY_TTL_S:
            return cached[1]
        gpus = self._capacity_of(pool)
        with self._lock:
            self._capacity[pool] = (now, gpus)
        return gpus

    # --- the tick -------------------------------------------------------------------------

    def tick(self) -> list[Key]:
        """Let go the oldest waiting Jobs that fit what is free now; returns their profiles
        (the reconcile starts each). Pure but for the node lists behind capacity()."""
        now = time.monotonic()
        with self._lock:
            self._expire(now)
            waiting: dict[Pool, list[tuple[tuple[str, str, str], str, _Job]]] = defaultdict(list)
            for uid, job in self._jobs.items():
                if job.waiting and uid not in self._admitted:
                    waiting[job.demand.pool].append((job.order, uid, job))
        out: list[Key] = []
        for pool, jobs in waiting.items():
            capacity = self.capacity(pool)
            with self._lock:
                free = capacity - self._in_use(pool, now)
                if free <= 0 and all(j.demand.gpus <= capacity for _, _, j in jobs):
                    continue  # nothing frees: no sorting 10,000 waiting Jobs every tick
                for _, uid, job in sorted(jobs, key=lambda j: j[0]):
                    if capacity < job.demand.gpus or job.demand.gpus <= free:
                        self._admitted[uid] = now
                        free -= job.demand.gpus if capacity >= job.demand.gpus else 0
                        out.append(job.key)
                    if free <= 0:
                        break
        return out

    def waiting(self) -> int:
        with self._lock:
            return sum(1 for j in self._jobs.values() if j.waiting)

    def run(
        self, stop: threading.Event, active: threading.Event, start: Callable[[Key], None]
    ) -> None:
        """Tick while this replica leads and some Job waits; `start` queues a profile."""
        while not stop.wait(TICK_S):
            if not active.is_set() or not self.waiting():
                continue
            try:
                for key in self.tick():
                    start(key)
            except Exception:  # a node list that failed: the next tick tries again
                log.exception("GPU gate: could not look at the waiting tuning Jobs")

    # --- inside the lock ------------------------------------------------------------------

    def _in_use(self, pool: Pool, now: float) -> int:
        used = sum(
            j.demand.gpus
            for j in self._jobs.values()
            if j.demand.pool == pool and j.holding and (j.bound or now - j.since < GRACE_S)
        )
        used += sum(n for _, n in self._granted.get(pool, []))
        used += sum(
            self._jobs[uid].demand.gpus
            for uid in self._admitted
            if uid in self._jobs and self._jobs[uid].demand.pool == pool
        )
        return used

    def _take_grant(self, d: Demand) -> None:
        grants = self._granted.get(d.pool)
        if grants:
            grants.pop(0)

    def _expire(self, now: float) -> None:
        for pool, grants in list(self._granted.items()):
            kept = [g for g in grants if now - g[0] < GRANT_TTL_S]
            if kept:
                self._granted[pool] = kept
            else:
                del self._granted[pool]
        for uid, at in list(self._admitted.items()):
            if now - at >= GRANT_TTL_S:
                del self._admitted[uid]


def _finished(body: Mapping[str, Any]) -> bool:
    done = ("Complete", "Failed", "SuccessCriteriaMet", "FailureTarget")
    return any(
        c.get("type") in done and c.get("status") == "True"
        for c in (body.get("status") or {}).get("conditions") or []
    )


def node_gpus(nodes: Iterable[Mapping[str, Any]], resource: str) -> int:
    """The GPUs nodes offer to new pods: their allocatable `resource`, but for nodes marked
    unschedulable (cordoned) or not Ready."""
    total = 0
    for node in nodes:
        if (node.get("spec") or {}).get("unschedulable"):
            continue
        conditions = (node.get("status") or {}).get("conditions") or []
        if any(c.get("type") == "Ready" and c.get("status") != "True" for c in conditions):
            continue
        value = ((node.get("status") or {}).get("allocatable") or {}).get(resource, "0")
        try:
            total += int(str(value))
        except ValueError:
            continue
    return total
