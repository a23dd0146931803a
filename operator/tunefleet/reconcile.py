"""One profile's reconciliation: make the children that should exist, then report what is.

`sync_profile` is level-based and idempotent. It reads the profile, its Jobs and their pods
from the operator's in-memory indexes (views.py), so a reconcile that changes nothing makes
no API call at all; it creates only what is missing (a ConfigMap and a Job per GPU model of
the current revision) and writes status only when it changed. Events mark transitions, so a
resync never repeats them.
"""

from __future__ import annotations

import datetime
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import kopf
from pydantic import ValidationError

from tunefleet import kube, metrics, naming
from tunefleet.api import TuningProfileSpec
from tunefleet.builders.job import (
    IMAGE_ID_KEY,
    build_merge_job,
    build_tuning_config_map,
    build_tuning_job,
)
from tunefleet.config import Config
from tunefleet.status import (
    Hints,
    JobObservation,
    Observed,
    compute_status,
    observe_job,
    pull_secrets_missing,
    status_changed,
)
from tunefleet.views import profile_ref

log = logging.getLogger(__name__)
MESSAGE_LIMIT = 2000  # kopf and Events keep messages; a condition message stays readable
EVENTS_TTL = 60.0  # seconds a pod's kubelet Events are trusted before being read again


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


def hints_for(spec: TuningProfileSpec | None, config: Config) -> Hints:
    if spec is None:
        return Hints()
    secret = (
        spec.storage.credentials_secret.name
        if spec.storage.credentials_secret
        else config.default_credentials_secret
    )
    return Hints(
        label_key=naming.label_key(spec),
        resource=naming.resource_name(spec),
        credentials_secret=secret,
        pull_secrets=tuple(s.name for s in spec.image_pull_secrets or []),
    )


def _pods_by_job(pods: Iterable[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for pod in pods:
        job_uid = ((pod.get("metadata") or {}).get("labels") or {}).get(naming.JOB_UID_LABEL)
        if job_uid:
            out[job_uid].append(pod)
    return out


def _events_of(memory: Memory, pod: dict[str, Any]) -> list[dict[str, Any]]:
    meta = pod.get("metadata") or {}
    uid = meta.get("uid", "")
    cached = memory.pod_events.get(uid)
    if cached and time.monotonic() - cached[0] < EVENTS_TTL:
        return cached[1]
    events = kube.pod_events(meta.get("namespace", ""), meta.get("name", ""))
    memory.pod_events[uid] = (time.monotonic(), events)
    return events


def observe(
    jobs: Iterable[dict[str, Any]],
    pods: Iterable[dict[str, Any]],
    hints: Hints,
    memory: Memory,
) -> list[JobObservation]:
    by_job = _pods_by_job(pods)
    out = []
    for job in jobs:
        if (job.get("metadata") or {}).get("deletionTimestamp"):
            continue  # a Job on its way out (deleted to retry) is not part of the picture
        job_pods = by_job.get(job["metadata"].get("uid", ""), [])
        obs = observe_job(job, job_pods, hints)
        if obs.reason == "ImagePullFailed" and hints.pull_secrets and job_pods:
            # Whether a pull Secret is missing only the kubelet's Events say (the operator
            # may not read Secrets): read them for this one stuck pod, now and then.
            missing = pull_secrets_missing(_events_of(memory, job_pods[0]))
            if missing:
                obs = observe_job(job, job_pods, replace(hints, missing_pull_secrets=missing))
        out.append(obs)
    return out


NODES_TTL = 60.0  # seconds a node count is trusted (parallelism checks only)


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
    meta = profile["metadata"]
    ns, name, uid = meta["namespace"], meta["name"], meta["uid"]
    generation = int(meta.get("generation") or 0)
    with memory.locks[uid]:
        spec, problems = memory.spec(uid, generation, profile.get("spec") or {})
        problems = list(problems)
        create_error: kopf.TemporaryError | None = None
        too_few: dict[str, str] = {}
        if spec and not problems and spec.gpu.parallelism > 1:
            too_few = _too_few_nodes(spec, memory)
        if spec and not problems and not meta.get("deletionTimestamp"):
            rev = naming.revision(spec)
            have = _present(jobs)
            for model in spec.gpu.models:
                if (model, rev) in have or model in too_few:
                    continue
                args = {"namespace": ns, "profile": name, "uid": uid, "model": model}
                try:
                    # The ConfigMap first: the Job's pod mounts it.
                    kube.create_if_missing(build_tuning_config_map(spec, **args))
                    job = build_tuning_job(spec, config=config, **args)
                    if kube.create_if_missing(job):
                        job_name = job["metadata"]["name"]
                        log.info(f"created tuning Job {ns}/{job_name} for TuningProfile {name}")
                        kube.post_event_soon(
                            profile_ref(profile),
                            "Normal",
                            "TuningJobCreated",
                            f"Created tuning Job {job_name}.",
                        )
                except kopf.PermanentError as e:
                    # The API server refused what the spec made: a spec problem to report.
                    problems.append(f"gpu model {model}: {e}")
                    break
                except kopf.TemporaryError as e:
                    # Quota, RBAC, an API hiccup: say so in status, then retry with backoff.
                    create_error = e
                    break
        hints = hints_for(spec, config)
        observations = observe(jobs, pods, hints, memory)
        if spec is not None and not problems and not meta.get("deletionTimestamp"):
            merged = _present(jobs, role="merge")
            rev = naming.revision(spec)
            for obs in observations:
                shares_done = obs.role == "tune" and obs.shards > 1 and obs.state == "Succeeded"
                if shares_done and obs.revision == rev and (obs.model, rev) not in merged:
                    # Every share is in: one Job merges them into the artifact.
                    kube.create_if_missing(
                        build_merge_job(
                            spec,
                            namespace=ns,
                            profile=name,
                            uid=uid,
                            model=obs.model,
                            config=config,
                        )
                    )
        for obs in observations:
            if (
                obs.state == "Running"
                and obs.image_id
                and memory.image_ids.get(obs.uid) != obs.image_id
            ):
                # The tune step runs: tell publish (in the same pod, later) which image it is,
                # through the Job's ConfigMap, for the manifest.
                kube.patch_config_map(ns, obs.name, {IMAGE_ID_KEY: obs.image_id})
                memory.image_ids[obs.uid] = obs.image_id
            if obs.reason == "ConfigMapMissing" and spec is not None:
                # Someone deleted a tuning Job's ConfigMap: make it again, the pod waits for it.
                kube.create_if_missing(
                    build_tuning_config_map(
                        spec, namespace=ns, profile=name, uid=uid, model=obs.model
                    )
                )
        previous = memory.written.get(uid) or profile.get("status") or {}
        status = compute_status(
            Observed(
                generation=generation,
                spec=spec,
                problems=problems,
                jobs=observations,
                previous=previous,
                unadmitted=len(memory.unadmitted.get((ns, name), [])),
                create_error=str(create_error or "")[:MESSAGE_LIMIT],
                capacity=too_few,
            ),
            now(),
        )
        if status_changed(previous, status):
            kube.patch_profile_status(ns, name, status)
            memory.written[uid] = status
            announce(profile, previous, status, memory)
        if problems or spec is None:
            message = "; ".join(problems) or "invalid spec"
            raise kopf.PermanentError(message[:MESSAGE_LIMIT])
        if create_error is not None:
            raise create_error
        return status


def _cond(status: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in status.get("conditions") or [] if c["type"] == type_), {})


def announce(
    profile: dict[str, Any], before: dict[str, Any], after: dict[str, Any], memory: Memory
) -> None:
    """Events on transitions only, so a resync never repeats them."""
    ref = profile_ref(profile)
    meta = profile["metadata"]
    was, now_ = _cond(before, "Failed"), _cond(after, "Failed")
    if now_.get("status") == "True" and (
        was.get("status") != "True" or was.get("message") != now_.get("message")
    ):
        reason = now_.get("reason", "TuningFailed")
        log.info(f"TuningProfile {meta['namespace']}/{meta['name']}: {reason}")
        kube.post_event_soon(ref, "Warning", reason, now_["message"][:MESSAGE_LIMIT])
    was_p, now_p = _cond(before, "Progressing"), _cond(after, "Progressing")
    blocked = now_p.get("status") == "True" and now_p.get("reason") not in (
        "TuningJobsRunning",
        None,
    )
    if blocked and (was_p.get("reason"), was_p.get("message")) != (
        now_p.get("reason"),
        now_p.get("message"),
    ):
        kube.post_event_soon(ref, "Warning", now_p["reason"], now_p["message"][:MESSAGE_LIMIT])
    old_shas = {a.get("gpuModel"): a.get("sha256") for a in before.get("artifacts") or []}
    for art in after.get("artifacts") or []:
        if old_shas.get(art.get("gpuModel")) != art.get("sha256"):
            metrics.ARTIFACTS_PUBLISHED.inc()
            if art.get("librarySkipped"):
                kube.post_event_soon(
                    ref,
                    "Warning",
                    "LibraryEntrySkipped",
                    f"{art['gpuModel']}: {art['librarySkipped']} library entr(y/ies) failed "
                    f"verification and were not used: {art.get('librarySkippedReason', '')}",
                )
            if isinstance(art.get("tuningSeconds"), int | float):
                metrics.TUNING_SECONDS.observe(float(art["tuningSeconds"]))
    was_phase, phase = before.get("phase"), after.get("phase")
    if phase == "Ready" and was_phase != "Ready":
        arts = ", ".join(
            f"{a['gpuModel']}@{a['sha256'][:12]}" for a in after.get("artifacts") or []
        )
        kube.post_event_soon(ref, "Normal", "Ready", f"Artifacts published: {arts}")
    count, before_count = after.get("unadmittedPods") or 0, before.get("unadmittedPods") or 0
    if count > before_count:
        names = memory.unadmitted.get((meta["namespace"], meta["name"]), [])
        shown = ", ".join(names[:10]) + (", ..." if len(names) > 10 else "")
        kube.post_event_soon(
            ref,
            "Warning",
            "PodsNotAdmitted",
            f"{count} pod(s) labelled {naming.PROFILE_LABEL}={meta['name']} were created while "
            f"the tunefleet webhook was unreachable and run without the artifact: {shown}. "
            f"List them: kubectl get pods -n {meta['namespace']} -l "
            f"'{naming.PROFILE_LABEL}={meta['name']},!{naming.ADMISSION_LABEL}'; recreate them "
            "(e.g. kubectl rollout restart) to get it.",
        )
