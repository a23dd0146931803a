"""Objects as the API server returns them to the operator's signing endpoint
(tests/unit/test_signer.py): a profile, and a Job the builders made with one of its pods."""

from __future__ import annotations

import json
from typing import Any


def profile_object(spec: Any, namespace: str, name: str, uid: str) -> dict[str, Any]:
    """A TuningProfile of `spec` (the pydantic model) as read back."""
    return {
        "metadata": {"name": name, "namespace": namespace, "uid": uid},
        "spec": spec.model_dump(by_alias=True, exclude_none=True),
    }


def job_and_pod(
    built: dict[str, Any], job_uid: str = "uid-job-1", pod_uid: str = "uid-pod-1"
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The Job `built` (a builder's manifest) as the API server returns it (with a uid), and
    one of its pods: its template, controlled by the Job."""
    job = json.loads(json.dumps(built))
    job["metadata"]["uid"] = job_uid
    template = job["spec"]["template"]
    pod = {
        "metadata": {
            "name": f"{job['metadata']['name']}-0-abcde",
            "namespace": job["metadata"]["namespace"],
            "uid": pod_uid,
            "labels": dict(template["metadata"]["labels"]),
            "ownerReferences": [
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": job["metadata"]["name"],
                    "uid": job_uid,
                    "controller": True,
                }
            ],
        },
        "spec": json.loads(json.dumps(template["spec"])),
    }
    return job, pod
