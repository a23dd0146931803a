"""One profile's reconciliation: make the children that should exist, then report what is.

`sync_profile` is level-based and idempotent. It reads the profile, its Jobs and their pods
from the operator's cache (cache.py), so a reconcile that changes nothing makes no API call at
all; it creates only what is missing (a ConfigMap and a Job per GPU model of the current
revision, a merge Job once a sharded Job's shares are in) and writes status only when it
changed. Events mark transitions, so a resync never repeats them.
"""

from __future__ import annotations

import datetime
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import kopf
from pydantic import ValidationError

from tunefleet import kube, metrics, naming
from tunefleet.api import TuningProfileSpec
from tunefleet.builders.job import (
    IMAGE_ID_KEY,
    Child,
    build_merge_job,
    build_tuning_config_map,
    build_tuning_job,
)
from tunefleet.builders.storage import pod_storage
from tunefleet.conditions import BLOCKED, EventReason, Reason, Type, find, truncate
from tunefleet.config import Config
from tunefleet.observe import Hints, JobObservation, observe
from tunefleet.status import Observed, compute_status, status_changed
from tunefleet.views import profile_ref

log = logging.getLogger(__name__)
EVENTS_TTL = 60.0  # seconds a pod's kubelet Events are trusted before being read again
NODES_TTL = 60.0  # seconds a node count is trusted (parallelism checks only)


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def validation_message(err: ValidationError) -> str:
    parts = []
    for e in err.errors():
        where = ".".join(str(p) for p in e["loc"])
        parts.append(f"spec.{where}: {e['msg']}" if where else e["msg"])
    return "; ".join(parts)


def parse_spec(raw: dict[str, Any]) -> tuple[TuningProfileSpec | None, list[str]]:
    try:
        spec = TuningProfileSpec.model_validate(raw)
    except ValidationError as e:
        return None, [validation_message(e)]
    return spec, naming.spec_problems(spec)


@dataclass
class Memory:
    """What the operator remembers between reconciles of a profile (lost on restart, which
    is fine: everything here can be read again)."""

    # The status we last wrote, by profile uid: fresher than the watch's copy right after
    # a write, so two quick reconciles never compute from a stale previous status.
    written: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Parsed spec by (uid, generation): generation changes exactly when the spec does.
    specs: dict[tuple[str, int], tuple[TuningProfileSpec | None, list[str]]] = field(
        default_factory=dict
    )
    # Labelled pods the webhook never saw, by (namespace, profile name).
    unadmitted: dict[tuple[str, str], list[str]] = field(default_factory=dict)
    # Nodes per (label key, model): (read at, count), for parallelism checks.
    node_counts: dict[tuple[str, str], tuple[float, int]] = field(default_factory=dict)
    # The tune step's imageID already written to a Job's ConfigMap, by Job uid.
    image_ids: dict[str, str] = field(default_factory=dict)
    # The kubelet's Events about a stuck pod, by pod uid: (read at, events).
    pod_events: dict[str, tuple[float, list[dict[str, Any]]]] = field(default_factory=dict)
    locks: defaultdict[str, threading.Lock] = field(
        default_factory=lambda: defaultdict(threading.Lock)
    )

    def spec(
        self, uid: str, generation: int, raw: dict[str, Any]
    ) -> tuple[TuningProfileSpec | None, list[str]]:
        key = (uid, generation)
        if key not in self.specs:
            for old in [k for k in self.specs if k[0] == uid]:
                del self.specs[old]
            self.specs[key] = parse_spec(raw)
        return self.specs[key]

    def forget(self, uid: str) -> None:
        self.written.pop(uid, None)
        for old in [k for k in self.specs if k[0] == uid]:
            del self.specs[old]

    def events_of(self, pod: dict[str, Any]) -> list[dict[str, Any]]:
        """The kubelet's Events about a pod, read at most every EVENTS_TTL seconds."""
        meta = pod.get("metadata") or {}
        uid = meta.get("uid", "")
        cached = self.pod_events.get(uid)
        if cached and time.monotonic() - cached[0] < EVENTS_TTL:
            return cached[1]
        events = kube.pod_events(meta.get("namespace", ""), meta.get("name", ""))
        self.pod_events[uid] = (time.monotonic(), events)
        return events


def hints_for(spec: TuningProfileSpec | None, config: Config) -> Hints:
    if spec is None:
        return Hints()
    storage = pod_storage(spec, config)
    return Hints(
        label_key=naming.label_key(spec),
        resource=naming.resource_name(spec),
        credentials_secret=storage.credentials_secret,
        credentials_kind=storage.credentials_kind or "storage credentials",
        credential_keys=storage.credential_keys,
        pull_secrets=tuple(s.name for s in spec.image_pull_secrets or []),
    )


def _too_few_nodes(spec: TuningProfileSpec, memory: Memory) -> dict[str, str]:
    """Models with fewer nodes than spec.gpu.parallelism: each share needs a node of its own."""
    key = naming.label_key(spec)
    out = {}
    for model in spec.gpu.models:
        cached = memory.node_counts.get((key, model))
        if cached is None or time.monotonic() - cached[0] > NODES_TTL:
            cached = (time.monotonic(), kube.count_nodes(f"{key}={model}"))
            memory.node_counts[(key, model)] = cached
        nodes = cached[1]
        if nodes < spec.gpu.parallelism:
            out[model] = (
                f"spec.gpu.parallelism is {spec.gpu.parallelism} but {nodes} node(s) have "
                f"{key}={model}: each share runs on a node of its own. Lower "
                f"spec.gpu.parallelism to at most {max(nodes, 1)}, or add nodes; nothing was "
                "started for this model"
            )
    return out


def _present(jobs: Iterable[dict[str, Any]], role: str = "tune") -> set[tuple[str, str]]:
    """(model, revision) of the profile's Jobs of one role; names of older versions count too."""
    out = set()
    for job in jobs:
        meta = job.get("metadata") or {}
        labels = meta.get("labels") or {}
        if labels.get(naming.ROLE_LABEL, "tune") != role:
            continue
        model = (meta.get("annotations") or {}).get(naming.MODEL_ANNOTATION) or labels.get(
            naming.MODEL_LABEL, ""
        )
        out.add((model, labels.get(naming.REVISION_LABEL, "")))
    return out


@dataclass
class _Sync:
    """One reconcile of one profile: its parts, and what the steps found."""

    profile: dict[str, Any]
    jobs: list[dict[str, Any]]
    pods: list[dict[str, Any]]
    config: Config
    memory: Memory
    spec: TuningProfileSpec | None = None
    problems: list[str] = field(default_factory=list)
    too_few: dict[str, str] = field(default_factory=dict)
    create_error: kopf.TemporaryError | None = None

    @property
    def meta(self) -> dict[str, Any]:
        meta: dict[str, Any] = self.profile["metadata"]
        return meta

    @property
    def child_args(self) -> dict[str, str]:
        m = self.meta
        return {"namespace": m["namespace"], "profile": m["name"], "uid": m["uid"]}

    @property
    def acting(self) -> bool:
        """Whether children may be made: a valid spec, and a profile not being deleted."""
        return (
            self.spec is not None and not self.problems and not self.meta.get("deletionTimestamp")
        )


def _create_missing(s: _Sync) -> None:
    """A ConfigMap and a Job for every model of the current revision that has none."""
    assert s.spec is not None
    spec = s.spec
    have = _present(s.jobs)
    rev = naming.revision(spec)
    for model in spec.gpu.models:
        if (model, rev) in have or model in s.too_few:
            continue
        try:
            # The ConfigMap first: the Job's pod mounts it.
            kube.create_if_missing(build_tuning_config_map(spec, **s.child_args, model=model))
            job = build_tuning_job(spec, **s.child_args, model=model, config=s.config)
            if kube.create_if_missing(job):
                name, ns = job["metadata"]["name"], s.meta["namespace"]
                log.info(f"created tuning Job {ns}/{name} for TuningProfile {s.meta['name']}")
                kube.post_event_soon(
                    profile_ref(s.profile),
                    "Normal",
                    EventReason.TUNING_JOB_CREATED,
                    f"Created tuning Job {name}.",
                )
        except kopf.PermanentError as e:
            # The API server refused what the spec made: a spec problem to report.
            s.problems.append(f"gpu model {model}: {e}")
            return
        except kopf.TemporaryError as e:
            # Quota, RBAC, an API hiccup: say so in status, then retry with backoff.
            s.create_error = e
            return


def _merge_when_shares_are_in(s: _Sync, observations: list[JobObservation]) -> None:
    assert s.spec is not None
    merged, rev = _present(s.jobs, role="merge"), naming.revision(s.spec)
    for obs in observations:
        shares_done = obs.role == "tune" and obs.shards > 1 and obs.state == "Succeeded"
        if shares_done and obs.revision == rev and (obs.model, rev) not in merged:
            # Every share is in: one Job merges them into the artifact.
            kube.create_if_missing(
                build_merge_job(Child(s.spec, **s.child_args, model=obs.model, config=s.config))
            )


def _tend_running(s: _Sync, observations: list[JobObservation]) -> None:
    """Tell publish which image tune ran (through the Job's ConfigMap, for the manifest), and
    make a ConfigMap that someone deleted again (the pod waits for it)."""
    ns = s.meta["namespace"]
    for obs in observations:
        if (
            obs.state == "Running"
            and obs.image_id
            and s.memory.image_ids.get(obs.uid) != obs.image_id
        ):
            kube.patch_config_map(ns, obs.name, {IMAGE_ID_KEY: obs.image_id})
            s.memory.image_ids[obs.uid] = obs.image_id
        if obs.reason == Reason.CONFIG_MAP_MISSING and s.spec is not None:
            kube.create_if_missing(build_tuning_config_map(s.spec, **s.child_args, model=obs.model))


def _report(s: _Sync, observations: list[JobObservation]) -> dict[str, Any]:
    """Compute status; write it only when it changed, with Events on transitions."""
    ns, name, uid = s.meta["namespace"], s.meta["name"], s.meta["uid"]
    previous = s.memory.written.get(uid) or s.profile.get("status") or {}
    status = compute_status(
        Observed(
            generation=int(s.meta.get("generation") or 0),
            spec=s.spec,
            problems=s.problems,
            jobs=observations,
            previous=previous,
            unadmitted=len(s.memory.unadmitted.get((ns, name), [])),
            create_error=truncate(str(s.create_error or "")),
            capacity=s.too_few,
        ),
        now(),
    )
    if status_changed(previous, status):
        kube.patch_profile_status(ns, name, status)
        s.memory.written[uid] = status
        announce(s.profile, previous, status, s.memory)
    return status


def sync_profile(
    profile: dict[str, Any],
    jobs: list[dict[str, Any]],
    pods: list[dict[str, Any]],
    config: Config,
    memory: Memory,
) -> dict[str, Any]:
    """Reconcile one profile (a view, see views.profile_view); returns the status it holds.

    Raises kopf.PermanentError for a spec that can't be tuned (after reporting it in status),
    kopf.TemporaryError for what may pass, kube.Gone when the profile or namespace is going.
    """
    s = _Sync(profile, jobs, pods, config, memory)
    with memory.locks[s.meta["uid"]]:
        generation = int(s.meta.get("generation") or 0)
        s.spec, problems = memory.spec(s.meta["uid"], generation, profile.get("spec") or {})
        s.problems = list(problems)
        if s.acting and s.spec is not None and s.spec.gpu.parallelism > 1:
            s.too_few = _too_few_nodes(s.spec, memory)
        if s.acting:
            _create_missing(s)
        observations = observe(jobs, pods, hints_for(s.spec, config), memory.events_of)
        if s.acting:
            _merge_when_shares_are_in(s, observations)
        _tend_running(s, observations)
        status = _report(s, observations)
        if s.problems or s.spec is None:
            raise kopf.PermanentError(truncate("; ".join(s.problems) or "invalid spec"))
        if s.create_error is not None:
            raise s.create_error
        return status


def announce(
    profile: dict[str, Any], before: dict[str, Any], after: dict[str, Any], memory: Memory
) -> None:
    """Events on transitions only, so a resync never repeats them."""
    ref = profile_ref(profile)
    meta = profile["metadata"]
    was, now_ = find(before, Type.FAILED), find(after, Type.FAILED)
    if now_.get("status") == "True" and (
        was.get("status") != "True" or was.get("message") != now_.get("message")
    ):
        reason = now_.get("reason", Reason.TUNING_FAILED)
        log.info(f"TuningProfile {meta['namespace']}/{meta['name']}: {reason}")
        kube.post_event_soon(ref, "Warning", reason, now_["message"])
    was_p, now_p = find(before, Type.PROGRESSING), find(after, Type.PROGRESSING)
    blocked = now_p.get("status") == "True" and now_p.get("reason") in BLOCKED
    if blocked and (was_p.get("reason"), was_p.get("message")) != (
        now_p.get("reason"),
        now_p.get("message"),
    ):
        kube.post_event_soon(ref, "Warning", now_p["reason"], now_p["message"])
    _announce_artifacts(ref, before, after)
    if after.get("phase") == "Ready" and before.get("phase") != "Ready":
        arts = ", ".join(
            f"{a['gpuModel']}@{a['sha256'][:12]}" for a in after.get("artifacts") or []
        )
        kube.post_event_soon(ref, "Normal", EventReason.READY, f"Artifacts published: {arts}")
    _announce_unadmitted(ref, meta, before, after, memory)


def _announce_artifacts(ref: dict[str, Any], before: dict[str, Any], after: dict[str, Any]) -> None:
    old_shas = {a.get("gpuModel"): a.get("sha256") for a in before.get("artifacts") or []}
    for art in after.get("artifacts") or []:
        if old_shas.get(art.get("gpuModel")) == art.get("sha256"):
            continue
        metrics.ARTIFACTS_PUBLISHED.inc()
        if art.get("librarySkipped"):
            kube.post_event_soon(
                ref,
                "Warning",
                EventReason.LIBRARY_ENTRY_SKIPPED,
                f"{art['gpuModel']}: {art['librarySkipped']} library entr(y/ies) failed "
                f"verification and were not used: {art.get('librarySkippedReason', '')}",
            )
        if isinstance(art.get("tuningSeconds"), int | float):
            metrics.TUNING_SECONDS.observe(float(art["tuningSeconds"]))


def _announce_unadmitted(
    ref: dict[str, Any],
    meta: dict[str, Any],
    before: dict[str, Any],
    after: dict[str, Any],
    memory: Memory,
) -> None:
    count, before_count = after.get("unadmittedPods") or 0, before.get("unadmittedPods") or 0
    if count <= before_count:
        return
    names = memory.unadmitted.get((meta["namespace"], meta["name"]), [])
    shown = ", ".join(names[:10]) + (", ..." if len(names) > 10 else "")
    kube.post_event_soon(
        ref,
        "Warning",
        EventReason.PODS_NOT_ADMITTED,
        f"{count} pod(s) labelled {naming.PROFILE_LABEL}={meta['name']} were created while "
        f"the tunefleet webhook was unreachable and run without the artifact: {shown}. "
        f"List them: kubectl get pods -n {meta['namespace']} -l "
        f"'{naming.PROFILE_LABEL}={meta['name']},!{naming.ADMISSION_LABEL}'; recreate them "
        "(e.g. kubectl rollout restart) to get it.",
    )
