"""One profile's reconciliation: make the Jobs that should exist, then report what is.

Handlers call `sync_profile` for every event that may change a profile's picture (its own
create/update/resume, any of its Jobs changing). It is idempotent and level-based.
"""

from __future__ import annotations

import datetime
import logging
import threading
from collections import defaultdict
from typing import Any, cast

import kopf
from pydantic import ValidationError

from tunefleet import kube, naming
from tunefleet.api import TuningProfileSpec
from tunefleet.builders.job import build_tuning_job
from tunefleet.config import Config
from tunefleet.status import JobObservation, Observed, compute_status, observe_job, status_changed

log = logging.getLogger(__name__)
# Two events of one profile (its own, one of its Jobs') must not interleave their status writes.
FINISHED = ("Complete", "Failed", "SuccessCriteriaMet", "FailureTarget")
_locks: defaultdict[str, threading.Lock] = defaultdict(threading.Lock)


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


def sync_profile(
    profile: dict[str, Any], config: Config, ensure_jobs: bool = True
) -> dict[str, Any]:
    """Reconcile one profile; returns the status it wrote (or would have, if unchanged)."""
    meta = profile["metadata"]
    ns, name, uid = meta["namespace"], meta["name"], meta["uid"]
    with _locks[f"{ns}/{name}"]:
        spec, problems = parse_spec(profile.get("spec") or {})
        created: list[str] = []
        if spec and not problems and ensure_jobs and not meta.get("deletionTimestamp"):
            for model in spec.gpu.models:
                job = build_tuning_job(
                    spec, namespace=ns, profile=name, uid=uid, model=model, config=config
                )
                if kube.create_job_if_missing(job):
                    created.append(job["metadata"]["name"])
        observations: list[JobObservation] = []
        for job in kube.list_jobs(ns, uid):
            finished = any(
                c.get("status") == "True" and c.get("type") in FINISHED
                for c in (job.get("status") or {}).get("conditions") or []
            )
            pods = kube.job_pods(ns, job["metadata"]["uid"]) if finished else []
            observations.append(observe_job(job, pods))
        previous = profile.get("status") or {}
        status = compute_status(
            Observed(
                generation=int(meta.get("generation") or 0),
                spec=spec,
                problems=problems,
                jobs=observations,
                previous=previous,
            ),
            now(),
        )
        if status_changed(previous, status):
            kube.patch_profile_status(ns, name, status)
            _announce(profile, previous, status)
        for job_name in created:
            kopf.info(
                _body(profile),
                reason="TuningJobCreated",
                message=f"Created tuning Job {job_name}.",
            )
        if problems or spec is None:
            raise kopf.PermanentError("; ".join(problems) or "invalid spec")
        return status


def _cond(status: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in status.get("conditions") or [] if c["type"] == type_), {})


def _announce(profile: dict[str, Any], before: dict[str, Any], after: dict[str, Any]) -> None:
    """Events on transitions only, so a resync never repeats them."""
    was, now_ = _cond(before, "Failed"), _cond(after, "Failed")
    if now_.get("status") == "True" and (
        was.get("status") != "True" or was.get("message") != now_.get("message")
    ):
        kopf.warn(
            _body(profile),
            reason=now_.get("reason", "TuningFailed"),
            message=now_["message"][:1000],
        )
    was_phase, phase = before.get("phase"), after.get("phase")
    if phase == "Ready" and was_phase != "Ready":
        arts = ", ".join(
            f"{a['gpuModel']}@{a['sha256'][:12]}" for a in after.get("artifacts") or []
        )
        kopf.info(_body(profile), reason="Ready", message=f"Artifacts published: {arts}")


def _body(obj: dict[str, Any]) -> kopf.Body:
    return kopf.Body(cast(kopf.RawBody, obj))
