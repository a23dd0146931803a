"""Events of tuning Jobs: any change may move the owning profile's status."""

from __future__ import annotations

from typing import Any

import kopf

from tunefleet import KIND, kube
from tunefleet.handlers.startup import CONFIG
from tunefleet.reconcile import sync_profile


@kopf.on.event("batch", "v1", "jobs", labels={"app.kubernetes.io/managed-by": "tunefleet"})
def job_event(body: kopf.Body, type: str | None, logger: kopf.Logger, **_: Any) -> None:
    owner = next(
        (o for o in body.metadata.get("ownerReferences") or [] if o.get("kind") == KIND), None
    )
    if owner is None or body.metadata.namespace is None:
        return
    profile = kube.get_profile(body.metadata.namespace, owner["name"])
    if profile is None or profile["metadata"]["uid"] != owner.get("uid"):
        return  # the profile is gone; garbage collection takes the Job
    try:
        # A deleted Job is recreated: deleting a failed Job is how a user asks for a retry.
        sync_profile(profile, CONFIG.get(), ensure_jobs=type == "DELETED")
    except kopf.PermanentError:
        pass  # an invalid spec is reported in the profile's own status and events
    except kopf.TemporaryError as e:
        # Event handlers are not retried by kopf; the profile's next event or resume will.
        logger.warning(f"could not update TuningProfile {owner['name']}: {e}")
