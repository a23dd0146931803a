"""TuningProfile events."""

from __future__ import annotations

from typing import Any

import kopf

from tunefleet import GROUP, PLURAL, VERSION
from tunefleet.handlers.startup import CONFIG
from tunefleet.reconcile import sync_profile


@kopf.on.create(GROUP, VERSION, PLURAL)
def tuningprofile_create(body: kopf.Body, **_: Any) -> None:
    sync_profile(dict(body), CONFIG.get())


@kopf.on.update(GROUP, VERSION, PLURAL, field="spec")
def tuningprofile_update(body: kopf.Body, **_: Any) -> None:
    sync_profile(dict(body), CONFIG.get())


@kopf.on.resume(GROUP, VERSION, PLURAL)
def tuningprofile_resume(body: kopf.Body, **_: Any) -> None:
    sync_profile(dict(body), CONFIG.get())


@kopf.index(GROUP, VERSION, PLURAL)
def tuningprofile_index(
    body: kopf.Body,
    namespace: str | None,
    name: str,
    spec: kopf.Spec,
    status: kopf.Status,
    **_: Any,
) -> dict[tuple[str | None, str], dict[str, Any]]:
    """What the pod webhook needs, kept in memory so admission never waits on the API."""
    ref = {
        "apiVersion": body.get("apiVersion"),
        "kind": body.get("kind"),
        "metadata": {"namespace": namespace, "name": name, "uid": body.metadata.uid},
    }
    return {(namespace, name): {"spec": dict(spec), "status": dict(status), "ref": ref}}


@kopf.timer(GROUP, VERSION, PLURAL, interval=60, idle=60)
def tuningprofile_timer(body: kopf.Body, **_: Any) -> None:
    """A slow safety net: a Job event lost while the API was unreachable is caught here."""
    sync_profile(dict(body), CONFIG.get())
