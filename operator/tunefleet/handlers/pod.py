"""Pod admission: labelled pods get the profile's artifact (builders/webhook.py decides)."""

from __future__ import annotations

import logging
import time
from typing import Any, cast

import kopf

from tunefleet import naming
from tunefleet.builders.webhook import HANDLER_ID, inject
from tunefleet.handlers.startup import CONFIG

# Not kopf's per-object logger: that one posts Events, and an admitted pod has no uid yet.
log = logging.getLogger("tunefleet.webhook")


@kopf.on.mutate(
    "",
    "v1",
    "pods",
    id=HANDLER_ID,
    operations=["CREATE"],
    labels={naming.PROFILE_LABEL: kopf.PRESENT},
    ignore_failures=True,
    side_effects=False,
)
def pod_mutate(
    body: kopf.Body,
    patch: kopf.Patch,
    warnings: list[str],
    **kwargs: Any,
) -> None:
    started = time.perf_counter()
    index: kopf.Index[tuple[str, str], dict[str, Any]] = kwargs["tuningprofile_index"]
    pod = dict(body)
    namespace = body.metadata.namespace or ""
    profile_name = body.metadata.labels.get(naming.PROFILE_LABEL, "")
    entries = list(index.get((namespace, profile_name), []))
    decision = inject(pod, profile_name, entries[0] if entries else None, CONFIG.get())
    pod_name = body.metadata.name or f"{body.metadata.get('generateName', '')}*"
    if decision.deny:
        log.info(f"refused pod {namespace}/{pod_name}: {decision.deny}")
        raise kopf.AdmissionError(decision.deny, code=403)
    if decision.reason:
        log.warning(f"pod {namespace}/{pod_name} starts untuned: {decision.reason}")
        if entries:
            kopf.warn(
                kopf.Body(cast(kopf.RawBody, entries[0]["ref"])),
                reason="PodUntuned",
                message=f"pod {pod_name} starts untuned: {decision.reason}",
            )
    warnings.extend(decision.warnings)
    if decision.warnings and entries:
        kopf.warn(
            kopf.Body(cast(kopf.RawBody, entries[0]["ref"])),
            reason="ImageMismatch",
            message="; ".join(decision.warnings)[:1000],
        )
    for key in ("metadata", "spec"):
        for field, value in (decision.pod.get(key) or {}).items():
            if (pod.get(key) or {}).get(field) != value:
                patch.setdefault(key, {})[field] = value
    # One line per admission with the handler's own duration: `make bench` reads these.
    took = (time.perf_counter() - started) * 1000
    outcome = "injected" if decision.injected else ("untuned" if decision.reason else "unchanged")
    log.info(f"admission pod {namespace}/{pod_name}: {outcome} in {took:.2f} ms")
