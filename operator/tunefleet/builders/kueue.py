"""A tuning Job under Kueue (pure): what `spec.tuning.queueName` adds to the Jobs tunefleet
makes. Kueue's job integration admits a Job that carries its queue label and was created
suspended: it makes a Workload for it, reserves quota, and resumes it (adding its flavor's
node labels and tolerations on admission). tunefleet never resumes a Job itself
(kueue.py reads why one waits)."""

from __future__ import annotations

from typing import Any

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"


def under_queue(job: dict[str, Any], queue: str | None) -> dict[str, Any]:
    """The Job, queued in LocalQueue `queue` (None: as it is). Its name does not change."""
    if queue:
        # A new dict: the Job's labels may be its pod template's too.
        job["metadata"]["labels"] = {**(job["metadata"].get("labels") or {}), QUEUE_LABEL: queue}
        job["spec"]["suspend"] = True
    return job
