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
from dataclasses import dataclass, field
from typing import Any

from tunefleet import naming
from tunefleet.builders.kueue import QUEUE_LABEL
from tunefleet.informers.view_parts import controller_uid
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
    """Whether the gate holds this Job (a whole Job or its view): made suspended by it, and
    not moved to a Kueue queue since (then it is Kueue's). The one reading of the mark."""
    meta = job.get("metadata") or {}
    gated = (meta.get("annotations") or {}).get(naming.GPU_GATE_ANNOTATION) == "true"
    queued = (meta.get("labels") or {}).get(QUEUE_LABEL)
    return gated and not queued and bool((job.get("spec") or {}).get("suspend"))


@dataclass
class _Job:
    demand: Demand
    key: Key
    order: tuple[str, str, str]  # creationTimestamp, namespace, name: oldest first
    waiting: bool  # suspended by the gate
    holding: bool  # started and not finished
    since: float  # when first seen holding
    bound: bool = False  # one of its pods is on a node


@dataclass
class _Pool:
    """What the gate knows of one pool, kept as the watches speak: a burst of 10,000 Jobs must
    not be counted Job by Job at each decision."""

    bound_gpus: int = 0  # held by started Jobs with a pod on a node
    unbound: dict[str, tuple[float, int]] = field(default_factory=dict)  # uid: (since, gpus)
    waiting: dict[str, _Job] = field(default_factory=dict)  # by uid
    granted: list[tuple[float, int]] = field(default_factory=list)  # (when, gpus)
    admitted: dict[str, tuple[float, int]] = field(default_factory=dict)  # uid: (when, gpus)

    def in_use(self, now: float) -> int:
        recent = sum(n for since, n in self.unbound.values() if now - since < GRACE_S)
        let_go = sum(n for _, n in self.admitted.values())
        return self.bound_gpus + recent + sum(n for _, n in self.granted) + let_go


class Gate:
    """What tunefleet's tuning Jobs hold and wait for, by pool; see the module's docstring."""

    def __init__(self, capacity: Callable[[Pool], int]) -> None:
        self._capacity_of = capacity  # the pool's GPUs, as its nodes advertise (an API list)
        self._lock = threading.Lock()
        self._jobs: dict[str, _Job] = {}  # by Job uid
        self._pools: dict[Pool, _Pool] = defaultdict(_Pool)
        self._capacity: dict[Pool, tuple[float, int]] = {}

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
            was = self._drop(uid)
            if event == "DELETED" or meta.get("deletionTimestamp") or not (ours and tune and d):
                if was is not None:
                    self._pools[was.demand.pool].admitted.pop(uid, None)
                return
            waiting = held(body)
            holding = not (body.get("spec") or {}).get("suspend") and not _finished(body)
            pool = self._pools[d.pool]
            if holding and not (was is not None and was.holding) and pool.granted:
                pool.granted.pop(0)  # a start granted (may_start) is now the Job itself
            since = was.since if was is not None and was.holding else time.monotonic()
            key = (str(meta.get("namespace") or ""), str(labels.get(naming.TUNING_PROFILE_LABEL)))
            order = (str(meta.get("creationTimestamp") or ""), key[0], str(meta.get("name")))
            job = _Job(d, key, order, waiting, holding, since, bound=bool(was and was.bound))
            if not waiting:
                pool.admitted.pop(uid, None)
            self._add(uid, job)

    def follow_pod(self, event: str | None, body: Mapping[str, Any]) -> None:
        """A tuning pod on a node: its Job holds GPUs for sure, past GRACE_S too."""
        meta = body.get("metadata") or {}
        if event == "DELETED" or not (body.get("spec") or {}).get("nodeName"):
            return
        job_uid = controller_uid(meta, "Job", "batch/v1") or ""
        with self._lock:
            job = self._jobs.get(job_uid)
            if job is not None and not job.bound:
                self._drop(job_uid)
                job.bound = True
                self._add(job_uid, job)

    # --- what the reconcile asks ----------------------------------------------------------

    def may_start(self, d: Demand) -> bool:
        """Whether a new Job of this demand may start now (counted as granted if so)."""
        capacity = self.capacity(d.pool)
        with self._lock:
            if capacity < d.gpus:  # none advertised, or never enough: the scheduler says why
                return True
            now = time.monotonic()
            pool = self._pools[d.pool]
            self._expire(pool, now)
            if d.gpus > capacity - pool.in_use(now):
                return False
            pool.granted.append((now, d.gpus))
            return True

    def admitted(self, uid: str) -> bool:
        """Whether the gate let this waiting Job go: the reconcile starts it."""
        with self._lock:
            job = self._jobs.get(uid)
            return job is not None and uid in self._pools[job.demand.pool].admitted

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
            pools = [p for p, state in self._pools.items() if state.waiting]
        out: list[Key] = []
        for p in pools:
            capacity = self.capacity(p)
            with self._lock:
                pool = self._pools[p]
                self._expire(pool, now)
                free = capacity - pool.in_use(now)
                if free <= 0 and capacity > 0:
                    continue  # nothing frees: no sorting 10,000 waiting Jobs every tick
                jobs = [(j.order, u, j) for u, j in pool.waiting.items() if u not in pool.admitted]
                for _, uid, job in sorted(jobs, key=lambda j: j[0]):
                    never_fits = capacity < job.demand.gpus  # the scheduler's to say why
                    if never_fits or job.demand.gpus <= free:
                        pool.admitted[uid] = (now, 0 if never_fits else job.demand.gpus)
                        free -= 0 if never_fits else job.demand.gpus
                        out.append(job.key)
                    if free <= 0:
                        break
        return out

    def waiting(self) -> int:
        with self._lock:
            return sum(len(p.waiting) for p in self._pools.values())

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

    def _drop(self, uid: str) -> _Job | None:
        """Take a Job's part out of its pool's sums (to put it back changed, or not)."""
        job = self._jobs.pop(uid, None)
        if job is None:
            return None
        pool = self._pools[job.demand.pool]
        if job.holding and job.bound:
            pool.bound_gpus -= job.demand.gpus
        pool.unbound.pop(uid, None)
        pool.waiting.pop(uid, None)
        return job

    def _add(self, uid: str, job: _Job) -> None:
        self._jobs[uid] = job
        pool = self._pools[job.demand.pool]
        if job.holding and job.bound:
            pool.bound_gpus += job.demand.gpus
        elif job.holding:
            pool.unbound[uid] = (job.since, job.demand.gpus)
        if job.waiting:
            pool.waiting[uid] = job

    @staticmethod
    def _expire(pool: _Pool, now: float) -> None:
        pool.granted = [g for g in pool.granted if now - g[0] < GRANT_TTL_S]
        for uid, (at, _) in list(pool.admitted.items()):
            if now - at >= GRANT_TTL_S:
                del pool.admitted[uid]
        for uid, (since, _) in list(pool.unbound.items()):
            if now - since >= GRACE_S:
                del pool.unbound[uid]  # it no longer counts (see the module's docstring)


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
