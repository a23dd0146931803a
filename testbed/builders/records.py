"""A tuning pod's published record as the operator reads it, for unit tests of records that
outlive pods: `pod_body(name, job_uid, message)` (a Succeeded tuning pod whose publish step
terminated with `message`), `record(uri)` (that message), `completed(profile)` (its Job,
Complete, optionally with the record annotation) and `published_pod(job, uri)`."""

from __future__ import annotations

import json
from typing import Any

from testbed.builders.profiles import MODELS, jobs_for
from tunefleet import naming

SHA = "ab" * 32


def pod_body(name: str, job_uid: str | None, message: str = "", ns: str = "ml") -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": ns,
        "uid": f"uid-{name}",
        "labels": {naming.PROFILE_UID_LABEL: "uid-1", naming.JOB_UID_LABEL: job_uid or "x"},
    }
    if job_uid:
        meta["ownerReferences"] = [
            {"apiVersion": "batch/v1", "kind": "Job", "uid": job_uid, "controller": True}
        ]
    term = {"exitCode": 0, "message": message}
    return {
        "metadata": meta,
        "spec": {"nodeName": "n"},
        "status": {
            "phase": "Succeeded",
            "containerStatuses": [{"name": "publish", "state": {"terminated": term}}],
        },
    }


def record(uri: str = f"s3://evil/x/{SHA}") -> str:
    return json.dumps({"uri": uri, "sha256": SHA, "gemms": 1, "identity": {}})


def completed(p: dict[str, Any], annotation: str | None = None) -> dict[str, Any]:
    (job,) = jobs_for(p, MODELS[:1])
    job = {**job, "status": {"conditions": [{"type": "Complete", "status": "True"}]}}
    if annotation:
        job["metadata"]["annotations"][naming.RECORD_ANNOTATION] = annotation
    return job


def published_pod(job: dict[str, Any], uri: str) -> dict[str, Any]:
    from tunefleet.watched.views import pod_view

    return pod_view(pod_body("tune-0", job["metadata"]["uid"], record(uri)))
