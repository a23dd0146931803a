"""Model pods that run without their artifact for a cause of ours, by profile: what the
Degraded condition counts (status.py) and `kubectl tunefleet status` shows.

A cause of ours is one the operator can fix or must report, as against a choice the pod or
the profile made (a model not tuned, Default-only results, a partition): the artifact's
ConfigMap was gone and the store could not stand in (admission's `config_map_replaced`), or
the pod's fetch init container started it untuned (the store unreachable, a checksum or
identity refused), served its results but not its caches, or waits for a volume image its
node cannot pull; or the fetch init container died without its outcome line (OOMKilled,
killed, crashed), or the kubelet evicted the pod over fetch or one of the volumes tunefleet
added (an emptyDir past its sizeLimit): such a pod is counted even once Failed. Followed by
a reflector of admitted model pods (watched/kinds.MODEL_PODS; handlers/on_delivery.py) on every
replica; the leader's reconcile reads it.

The pod's own words are the source (contracts/admission_record.py, contracts/fetch_outcome.py): a
pod anyone could label is only ever counted, never acted on.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from typing import Any

from tunefleet import naming
from tunefleet.builders.webhook import CACHES_VOLUME, PACKED_VOLUME, VOLUME
from tunefleet.contracts.admission_record import UNTUNED, Admission, Code
from tunefleet.contracts.fetch_outcome import CONTAINER as FETCH_CONTAINER
from tunefleet.contracts.fetch_outcome import LOADED, FetchOutcome
from tunefleet.contracts.fetch_outcome import UNTUNED as FETCH_UNTUNED
from tunefleet.runtime.heap import compacted

# Admission's untuned decisions that are ours to fix or report.
OURS = frozenset({Code.CONFIG_MAP_REPLACED})
FETCH_FAILED = "fetch_failed"  # the cause of a pod its fetch init container started untuned
# Its TunableOp results were served, its caches were not (a tampered or unreadable archive):
# the stack compiles cold, which is what the profile promised it would not.
CACHES_NOT_SERVED = "caches_not_served"
# Admitted with an image volume its node cannot pull (the kubelet's ErrImagePull or
# ImagePullBackOff naming that image): it waits for it, for good, never starting.
VOLUME_NOT_PULLED = "volume_not_pulled"
_PULL_FAILURES = ("ErrImagePull", "ImagePullBackOff")
# The fetch init container died without its outcome line (OOMKilled, killed, crashed: the pod
# never starts, or is Failed), or the kubelet evicted the pod over fetch or a volume tunefleet
# added (an emptyDir past the sizeLimit tunefleet gave it): a pod that does not serve at all.
FETCH_DIED = "fetch_died"
# What the kubelet names when it evicts a pod over what tunefleet added to it: the fetch init
# container (its memory, its ephemeral storage) and the volumes the webhook adds.
_OURS = (FETCH_CONTAINER, CACHES_VOLUME, VOLUME, PACKED_VOLUME)
_OURS_RE = re.compile(r"(?<![\w-])(" + "|".join(map(re.escape, _OURS)) + r")(?![\w-])")
# The kubelet's words for an emptyDir past its sizeLimit.
_EMPTY_DIR_RE = re.compile(
    r'EmptyDir volume "(?P<volume>[^"]+)" exceeds the limit "(?P<limit>[^"]+)"'
)
_SIGKILL = 137  # 128 + 9: killed by the kernel's OOM killer or the kubelet

Key = tuple[str, str]  # (namespace, profile name)


@dataclass(frozen=True, slots=True)
class Untuned:
    pod: str
    cause: str  # a Code of OURS, FETCH_FAILED, CACHES_NOT_SERVED, VOLUME_NOT_PULLED, FETCH_DIED
    reason: str


@dataclass(frozen=True, slots=True)
class Died:
    """How a pod's fetch died, or why the kubelet evicted it over what tunefleet added: what
    FETCH_DIED counts and `kubectl tunefleet why` picks its fix by."""

    how: str  # OOM_KILLED, KILLED, CRASHED or EVICTED
    reason: str  # what the Degraded condition and `why` say
    memory_limit: str = ""  # the fetch init container's, from the pod's spec ("" unknown)
    volume: str = ""  # an evicted pod's emptyDir past its sizeLimit, and that limit
    size_limit: str = ""
    exit_code: int | None = None


OOM_KILLED, KILLED, CRASHED, EVICTED = "OOMKilled", "killed", "crashed", "Evicted"


def cause_of(pod: dict[str, Any]) -> Untuned | None:
    """Why this model pod runs without its artifact, when that is a cause of ours; else None
    (served, ended, never admitted, or untuned by the pod's or profile's own choice)."""
    meta = pod.get("metadata") or {}
    if meta.get("deletionTimestamp"):
        return None
    phase = (pod.get("status") or {}).get("phase")
    if phase == "Succeeded":
        return None
    admitted = Admission.read(pod)
    if admitted is None:
        return None
    name = str(meta.get("name") or "")
    died = fetch_died(pod)
    if died is not None:
        # Counted even Failed: a pod our fetch or our volumes ended is what must be told.
        return Untuned(name, FETCH_DIED, died.reason)
    if phase == "Failed":
        return None  # ended for a cause of its own
    if admitted.outcome == UNTUNED:
        if admitted.code in OURS:
            return Untuned(name, str(admitted.code), admitted.reason)
        return None
    if admitted.image_volume and (why := _volume_not_pulled(pod, admitted.image_volume)):
        return Untuned(name, VOLUME_NOT_PULLED, why)
    outcome = _fetch_outcome(pod)
    if outcome is not None and outcome.verdict == LOADED and outcome.caches_failed:
        return Untuned(name, CACHES_NOT_SERVED, f"caches not served: {outcome.caches_failed}")
    if outcome is None or outcome.verdict != FETCH_UNTUNED:
        return None
    if outcome.gpu_model and admitted.candidates.get(outcome.gpu_model) == "":
        return None  # picked at its node, where admission had already said untuned
    return Untuned(name, FETCH_FAILED, outcome.reason)


def _volume_not_pulled(pod: dict[str, Any], image: str) -> str:
    """The kubelet's word that it cannot pull the pod's volume image ("" when it has none):
    a container waiting in ErrImagePull or ImagePullBackOff on a message naming that image
    (containers of the pod's own images are the pod's business, not ours)."""
    status = pod.get("status") or {}
    for cs in [
        *(status.get("initContainerStatuses") or []),
        *(status.get("containerStatuses") or []),
    ]:
        waiting = (cs.get("state") or {}).get("waiting") or {}
        message = str(waiting.get("message") or "")
        if waiting.get("reason") in _PULL_FAILURES and image in message:
            return f"its volume image {image} is not pulled: {waiting['reason']}: {message[-200:]}"
    return ""


def _fetch_outcome(pod: dict[str, Any]) -> FetchOutcome | None:
    ended = _fetch_terminated(pod)
    return FetchOutcome.parse(ended[0].get("message")) if ended is not None else None


def _fetch_terminated(pod: dict[str, Any]) -> tuple[dict[str, Any], int] | None:
    """The fetch init container's latest termination (its state's, else its lastState's: the
    run before the one now waiting or running) and its restart count."""
    for cs in (pod.get("status") or {}).get("initContainerStatuses") or []:
        if cs.get("name") != FETCH_CONTAINER:
            continue
        for state in (cs.get("state") or {}, cs.get("lastState") or {}):
            done = state.get("terminated")
            if done:
                restarts = cs.get("restartCount")
                return done, restarts if isinstance(restarts, int) else 0
    return None


def fetch_died(pod: dict[str, Any]) -> Died | None:
    """The pod was evicted by the kubelet over what tunefleet added to it (its message names
    fetch or one of tunefleet's volumes), or its fetch init container ended without saying
    what it did: OOMKilled, killed (exit 137), or any other non-zero exit without its outcome
    line. None otherwise: fetch said what it did or has not ended, or the kubelet ended the
    pod for another cause."""
    status = pod.get("status") or {}
    message = " ".join(str(status.get("message") or "").split())
    if status.get("reason") == EVICTED and _OURS_RE.search(message):
        over = _EMPTY_DIR_RE.search(message)
        return Died(
            EVICTED,
            f"the pod was evicted by the kubelet: {message[:300]}",
            volume=over["volume"] if over else "",
            size_limit=over["limit"] if over else "",
        )
    ended = _fetch_terminated(pod)
    if ended is None or status.get("reason"):
        # Or ended by the kubelet for another cause (evicted over another container, its
        # node shut down), which killed fetch with it: not ours.
        return None
    done, restarts = ended
    code = done.get("exitCode") if isinstance(done.get("exitCode"), int) else None
    said = FetchOutcome.parse(done.get("message")) is not None
    limit = _fetch_memory_limit(pod)
    if done.get("reason") == OOM_KILLED:
        how, what = OOM_KILLED, "was OOMKilled" + (f" (memory limit {limit})" if limit else "")
    elif code == _SIGKILL and not said:
        how, what = KILLED, f"was killed (exit {code}, SIGKILL) before it said what it did"
    elif code not in (0, None) and not said:
        last = _last_line(done.get("message"))
        how = CRASHED
        what = f"exited {code} without its outcome line" + (f": {last}" if last else "")
    else:
        return None
    reason = f"the {FETCH_CONTAINER} init container {what}; restarts: {restarts}"
    return Died(how, reason, memory_limit=limit, exit_code=code)


def _fetch_memory_limit(pod: dict[str, Any]) -> str:
    for c in (pod.get("spec") or {}).get("initContainers") or []:
        if c.get("name") == FETCH_CONTAINER:
            limit = ((c.get("resources") or {}).get("limits") or {}).get("memory")
            return str(limit) if limit else ""
    return ""


def _last_line(message: Any) -> str:
    """The last line of what a container left (its log's tail, FallbackToLogsOnError)."""
    lines = [line.strip() for line in str(message or "").splitlines() if line.strip()]
    return lines[-1][-200:] if lines else ""


class ServedPods:
    """Admitted model pods that run untuned for a cause of ours, by (namespace, profile)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_profile: dict[Key, dict[str, Untuned]] = {}  # pod uid -> why
        # pod uid -> where kept. Served pods are not kept at all: a fleet's pods cost nothing
        # here until one runs untuned.
        self._at: dict[str, Key] = {}

    def follow(self, event: str | None, body: dict[str, Any]) -> Key | None:
        """Keep one watch event; returns the profile whose count changed, or None."""
        meta = body.get("metadata") or {}
        uid = str(meta.get("uid") or "")
        ns = str(meta.get("namespace") or "")
        profile = str((meta.get("labels") or {}).get(naming.PROFILE_LABEL) or "")
        why = None if event == "DELETED" else cause_of(body)
        with self._lock:
            before = self._drop(uid)
            if why is not None and profile:
                key = (ns, profile)
                self._by_profile.setdefault(key, {})[uid] = why
                self._at[uid] = key
                return key if before != (key, why) else None
        return before[0] if before is not None else None

    def _drop(self, uid: str) -> tuple[Key, Untuned] | None:
        key = self._at.pop(uid, None)
        if key is None:
            return None
        pods = self._by_profile.get(key) or {}
        why = pods.pop(uid, None)
        if not pods:
            self._by_profile.pop(key, None)
        return (key, why) if why is not None else None

    def of(self, namespace: str, profile: str) -> list[Untuned]:
        with self._lock:
            found = list((self._by_profile.get((namespace, profile)) or {}).values())
        return sorted(found, key=lambda u: u.pod)

    def known(self, kind: str, namespace: str | None) -> set[str]:
        with self._lock:
            return {u for u, k in self._at.items() if namespace is None or k[0] == namespace}

    def stub(self, kind: str, uid: str) -> dict[str, Any]:
        with self._lock:
            key = self._at.get(uid)
        if key is None:
            return {}
        labels = {naming.PROFILE_LABEL: key[1]}
        return {"metadata": {"namespace": key[0], "uid": uid, "labels": labels}}

    def compact(self) -> None:
        with self._lock:
            self._by_profile = compacted(self._by_profile)
            self._at = compacted(self._at)

    def sizes(self) -> dict[str, int]:
        with self._lock:
            return {"untunedPods": len(self._at)}
