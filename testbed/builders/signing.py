"""Objects as the API server returns them to the operator's signing endpoint and store broker
(tests/unit/test_signer.py, test_store_broker.py): a profile, a Job the builders made with one
of its pods, and the endpoint's view of the API server holding them."""

from __future__ import annotations

import json
from typing import Any

from tunefleet.runtime.pod_tokens import POD_NAME_CLAIM, POD_UID_CLAIM
from tunefleet.signer.route import Deps


def profile_object(spec: Any, namespace: str, name: str, uid: str) -> dict[str, Any]:
    """A TuningProfile of `spec` (the pydantic model) as read back."""
    return {
        "metadata": {"name": name, "namespace": namespace, "uid": uid},
        "spec": spec.model_dump(by_alias=True, exclude_none=True),
    }


def tuning_job(
    spec: Any, namespace: str, name: str, uid: str, model: str, config: Any
) -> dict[str, Any]:
    """The tuning Job the operator builds for the profile's `model` under `config`."""
    from tunefleet.builders.job import Child, build_tuning_job

    return build_tuning_job(Child(spec, namespace, name, uid, model, config))


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


def api_server_deps(
    pod: dict[str, Any], job: dict[str, Any], prof: dict[str, Any], audience: str
) -> Deps:
    """The API server as an endpoint sees it: the token "good" is `pod`'s, for `audience`;
    the pod, its Job and the profile are read back by name."""
    namespace = pod["metadata"]["namespace"]

    async def review(token: str) -> dict[str, Any]:
        if token != "good":
            return {"authenticated": False, "error": "bad token"}
        extra = {POD_NAME_CLAIM: [pod["metadata"]["name"]], POD_UID_CLAIM: [pod["metadata"]["uid"]]}
        user = {"username": f"system:serviceaccount:{namespace}:default", "extra": extra}
        return {"authenticated": True, "audiences": [audience], "user": user}

    async def read_pod(ns: str, name: str) -> dict[str, Any] | None:
        return pod if name == pod["metadata"]["name"] else None

    async def read_job(ns: str, name: str) -> dict[str, Any] | None:
        return job if name == job["metadata"]["name"] else None

    async def read_profile(ns: str, name: str) -> dict[str, Any] | None:
        return prof if name == prof["metadata"]["name"] else None

    return Deps(review, read_pod, read_job, read_profile)


def credential_refs(pod: dict[str, Any]) -> list[str]:
    """Every way a pod could hold a credential: Secret env, envFrom, Secret volumes (also
    projected), and projected tokens with their audiences."""
    found = []
    spec_ = pod["template"]["spec"] if "template" in pod else pod
    for c in [*spec_.get("initContainers", []), *spec_["containers"]]:
        for e in c.get("env") or []:
            if "secretKeyRef" in (e.get("valueFrom") or {}):
                found.append(f"{c['name']}: env {e['name']} from a Secret")
        for e in c.get("envFrom") or []:
            if "secretRef" in e:
                found.append(f"{c['name']}: envFrom a Secret")
    for v in spec_.get("volumes") or []:
        if "secret" in v:
            found.append(f"volume {v['name']}: a Secret")
        for src in (v.get("projected") or {}).get("sources") or []:
            if "secret" in src:
                found.append(f"volume {v['name']}: a Secret")
            if "serviceAccountToken" in src:
                found.append(f"volume {v['name']}: token {src['serviceAccountToken']['audience']}")
    return found
