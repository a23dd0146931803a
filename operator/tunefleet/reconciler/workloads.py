"""Why a tuning Job under Kueue waits: Kueue's own word, from the Workload it made for the Job.

With `spec.tuning.queueName` the Jobs are created suspended in that LocalQueue
(builders/kueue.py). Kueue makes a Workload per Job (owned by it: its controller
ownerReference, label kueue.x-k8s.io/job-uid), reserves quota for it and resumes the Job; until
then the Workload's QuotaReserved (and Admitted) conditions say why not ("couldn't assign
flavors to pod set main: insufficient unused quota for nvidia.com/gpu ..."). The operator only
reads Workloads (v1beta2, the storage version since Kueue 0.15; v1beta1 before): it never
resumes a Job, and never takes a suspended one for a failed one.
"""

from __future__ import annotations

import logging
from typing import Any

from tunefleet.builders.kueue import QUEUE_LABEL
from tunefleet.kube import Kube

log = logging.getLogger(__name__)

GROUP = "kueue.x-k8s.io"
VERSIONS = ("v1beta2", "v1beta1")  # newest first: the first one the API server serves is read
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
NOT_INSTALLED = "no-kueue"  # what `workloads_of` answers when the API has no Workloads


def workloads_of(client: Kube, namespace: str, job_uid: str) -> list[dict[str, Any]] | str:
    """The Workloads Kueue made for a Job (by its uid label), or NOT_INSTALLED."""
    found = client.list_custom(
        GROUP, VERSIONS, namespace, "workloads", f"{JOB_UID_LABEL}={job_uid}"
    )
    return NOT_INSTALLED if found is None else found


def _owned_by(workload: dict[str, Any], job_uid: str) -> bool:
    """Only a Workload the Job controls speaks for it: a label is not identity."""
    return any(
        r.get("controller") and r.get("kind") == "Job" and r.get("uid") == job_uid
        for r in (workload.get("metadata") or {}).get("ownerReferences") or []
    )


def _condition(workload: dict[str, Any], type_: str) -> dict[str, Any]:
    for c in (workload.get("status") or {}).get("conditions") or []:
        if c.get("type") == type_:
            return dict(c)
    return {}


def _of_job(job: dict[str, Any], workloads: list[dict[str, Any]]) -> list[dict[str, Any]]:
    uid = str((job.get("metadata") or {}).get("uid") or "")
    return [w for w in workloads if isinstance(w, dict) and _owned_by(w, uid)]


def has_workload(job: dict[str, Any], workloads: list[dict[str, Any]] | str) -> bool:
    """Whether Kueue answered for this Job: it has no Workload API, or a Workload of it."""
    if isinstance(workloads, str):
        return workloads == NOT_INSTALLED
    return bool(_of_job(job, workloads))


def why_queued(job: dict[str, Any], workloads: list[dict[str, Any]] | str) -> str:
    """Why a suspended tuning Job (a view) has not started, in Kueue's words when it has any."""
    labels = (job.get("metadata") or {}).get("labels") or {}
    queue = labels.get(QUEUE_LABEL)
    if not queue:
        name = (job.get("metadata") or {}).get("name", "")
        return (
            "the Job is suspended (spec.suspend), not by tunefleet and not in a Kueue queue: "
            f"tunefleet never resumes a Job; resume it (kubectl patch job {name} --type merge "
            '-p \'{"spec":{"suspend":false}}\') or set spec.tuning.queueName'
        )
    where = f"queued in Kueue LocalQueue {queue}"
    if workloads == NOT_INSTALLED:
        return (
            f"{where}, but this cluster has no Kueue (no workloads.{GROUP} API): the Job "
            "stays suspended until Kueue admits it; install Kueue or unset spec.tuning.queueName"
        )
    mine = _of_job(job, workloads) if not isinstance(workloads, str) else []
    if not mine:
        return (
            f"{where}: Kueue has made no Workload for the Job yet (is Kueue running, and does its "
            "configuration manage batch/job?)"
        )
    wl = mine[0]
    evicted = _condition(wl, "Evicted")
    if evicted.get("status") == "True":
        return f"{where}: evicted by Kueue ({evicted.get('reason')}): {evicted.get('message')}"
    for type_ in ("QuotaReserved", "Admitted"):
        c = _condition(wl, type_)
        if c.get("status") == "False" and c.get("message"):
            return f"{where}: {' '.join(str(c['message']).split())}"
    if _condition(wl, "Admitted").get("status") == "True":
        return f"{where}: admitted by Kueue, starting"
    return f"{where}: waiting for Kueue to consider Workload {wl['metadata'].get('name')}"
