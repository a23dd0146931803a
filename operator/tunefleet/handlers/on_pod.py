"""Pods: admission of model pods (labelled pods get the profile's artifact; webhook/admission.py
decides), and tuning pods, kept in the cache because they say why a tuning Job waits or how
its steps ended."""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import Future
from typing import Any

import kopf

from tunefleet import metrics, naming
from tunefleet.api.conditions import EventReason
from tunefleet.artifacts import volumes
from tunefleet.artifacts.volumes import VolumeVerdict
from tunefleet.builders.webhook import HANDLER_ID
from tunefleet.config import Config
from tunefleet.contracts.admission_record import Admission, Code
from tunefleet.contracts.artifact_record import IMAGE_VOLUME, ArtifactRecord
from tunefleet.handlers.startup import Operator
from tunefleet.kube import Kube
from tunefleet.runtime import reflector
from tunefleet.watched import kinds, views
from tunefleet.webhook.admission import Decision, admit, already_injected, repeats, seen_injected

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
async def pod_mutate(
    body: kopf.Body,
    patch: kopf.Patch,
    warnings: list[str],
    memo: kopf.Memo,
    **kwargs: Any,
) -> None:
    # async on purpose: kopf runs sync handlers in its shared thread pool, where admission
    # would queue behind reconciles (seen: 9 s at startup with 400 profiles, past the API
    # server's timeout). admit() is pure and sub-millisecond, fine on the event loop.
    await admit_pod(memo.operator, body, patch, warnings)


async def admit_pod(
    operator: Operator, body: kopf.Body, patch: kopf.Patch, warnings: list[str]
) -> None:
    """Admit a labelled pod: its profile from the cache (or the API server), the decision
    (webhook/admission.py), the patch, and what is counted, logged and announced."""
    started = time.perf_counter()
    namespace = body.metadata.namespace or ""
    pod_name = body.metadata.name or f"{body.metadata.get('generateName', '')}*"
    metrics.HANDLER_CALLS.labels("pod_mutate").inc()
    config = operator.config
    watched = config.namespaces
    if watched and namespace not in watched:
        # Another release's namespace (its webhook's namespaceSelector keeps such pods away
        # from ours; this holds if a configuration says otherwise): not ours to label or patch.
        metrics.ADMISSIONS.labels("unchanged", Code.NOT_WATCHED).inc()
        return
    try:
        if already_injected(dict(body)):
            # The usual call of every entry after the first (one per replica, in turn): no
            # lookup, nothing to change but the label if it lacks it.
            metrics.ADMISSIONS.labels("unchanged", Code.ALREADY_ADMITTED).inc()
            apply(body, patch, seen_injected(dict(body)))
            return
        profile_name = body.metadata.labels.get(naming.PROFILE_LABEL, "")
        entry = operator.cache.profile((namespace, profile_name)) or await _read_profile(
            operator.client, namespace, profile_name
        )
        config_maps = await _config_map_uids(operator, namespace, entry)
        volumes = await _volume_verdicts(entry, config, check_budget(config, started))
        decision = admit(dict(body), profile_name, entry, config, config_maps, volumes)
    except Exception:
        # A bug here must not block pods: a handler error would reach the API server as a
        # refusal, which failurePolicy: Ignore does not cover. Admit unchanged instead.
        metrics.HANDLER_ERRORS.labels("pod_mutate", "unexpected").inc()
        metrics.ADMISSIONS.labels("unchanged", "error").inc()
        log.exception(f"admission of pod {namespace}/{pod_name} failed; admitted untuned")
        return
    took = time.perf_counter() - started
    metrics.ADMISSION_SECONDS.observe(took)
    if repeats(dict(body), decision):
        metrics.ADMISSIONS.labels("unchanged", Code.ALREADY_ADMITTED).inc()
        apply(body, patch, decision)
        return
    _count(decision, namespace, profile_name)
    if decision.deny:
        log.info(f"refused pod {namespace}/{pod_name}: {decision.deny}")
        raise kopf.AdmissionError(decision.deny, code=403)
    apply(body, patch, decision)
    warnings.extend([*decision.warnings, *decision.notes])
    for note in decision.notes:
        log.info(f"pod {namespace}/{pod_name}: {note}")
    if entry is not None:
        announce(operator.client, views.profile_ref(entry), pod_name, decision)
    # One line per admission with the handler's own duration: `make bench` reads these.
    log.info(f"admission pod {namespace}/{pod_name}: {decision.outcome} in {took * 1000:.2f} ms")


def _count(decision: Decision, namespace: str, profile: str) -> None:
    """The admission by outcome, and a pod served its artifact by profile and delivery."""
    metrics.ADMISSIONS.labels(decision.outcome, decision.code).inc()
    served = Admission.read(decision.pod) if decision.injected else None
    if served is not None:
        metrics.PODS_SERVED.labels(namespace, profile, served.delivery).inc()


async def _read_profile(client: Kube, namespace: str, name: str) -> dict[str, Any] | None:
    """A profile the cache does not hold: ask the API server (a profile created a moment
    ago, or one this replica has not seen yet). Misses only, and bounded: admission must
    stay well inside the webhook's timeout."""
    if not name:
        return None
    try:
        raw = await asyncio.wait_for(
            asyncio.to_thread(client.get_profile, namespace, name, 1.5), timeout=2.0
        )
    except Exception as e:
        log.info(f"admission: could not read TuningProfile {namespace}/{name}: {e}")
        return None
    return views.profile_view(raw) if raw is not None else None


async def _config_map_uids(
    operator: Operator, namespace: str, entry: dict[str, Any] | None
) -> dict[str, str]:
    """The uid each of the profile's artifact ConfigMaps has now ("" when gone), from what this
    replica's watch follows (delivered.py): admission mounts one only while it is the object
    the operator made, and serves the artifact from the store otherwise. No API call while the
    watch agrees with status: a scale-up of N pods costs the API server nothing here. Where it
    does not, the API server is asked (bounded): the object made is recognised by its uid,
    not by the labels the watch selects on, which anyone may remove."""
    uids: dict[str, str] = {}
    for a in ((entry or {}).get("status") or {}).get("artifacts") or []:
        cm = a.get("configMap")
        if not isinstance(cm, dict) or not (name := str(cm.get("name") or "")):
            continue
        made, seen = str(cm.get("uid") or ""), operator.delivered.uid_of(namespace, name)
        if seen != made and made:
            seen = await _read_uid(operator.client, namespace, name, seen)
        uids[name] = seen
    return uids


async def _read_uid(client: Kube, namespace: str, name: str, watched: str) -> str:
    """The ConfigMap's uid as the API server has it ("" when gone); the watch's word when the
    API server does not answer in time (admission must stay inside the webhook's timeout)."""
    try:
        there = await asyncio.wait_for(
            asyncio.to_thread(client.read, "ConfigMap", namespace, name), timeout=1.5
        )
    except Exception as e:
        log.info(f"admission: could not read ConfigMap {namespace}/{name}: {e}")
        return watched
    return str(((there or {}).get("metadata") or {}).get("uid") or "")


async def _volume_verdicts(
    entry: dict[str, Any] | None, config: Config, budget_s: float
) -> dict[str, VolumeVerdict]:
    """The verdict on each volume image the profile's status says pods mount, for the key and
    policy its spec says now: a recent one (artifacts/volumes.py keeps them TTL_S seconds, the
    leader's delivery fills them), else its check against the registry (volumes.CHECKS: one in
    flight per digest, shared by every pod that needs it; several digests side by side),
    waited for together for at most budget_s. A digest without a verdict in time is not
    mounted (the pod fetches and verifies it itself), so a forged or stale status mounts
    nothing unverified; its check runs on and keeps its verdict for the next pod."""
    spec = (entry or {}).get("spec") or {}
    storage = spec.get("storage") or {}
    if not str(storage.get("uri") or "").startswith("oci://"):
        return {}
    signing = storage.get("signing") or {}
    key = str(signing.get("publicKey") or "")
    required = (signing.get("policy") or "Required") == "Required"
    got: dict[str, VolumeVerdict] = {}
    flights: dict[str, Future[VolumeVerdict]] = {}
    for a in ((entry or {}).get("status") or {}).get("artifacts") or []:
        record = ArtifactRecord.from_status(a) if a.get("delivery") == IMAGE_VOLUME else None
        if record is None or not record.volume or record.volume in got or record.volume in flights:
            continue
        verdict = volumes.VERDICTS.get(record.volume, key, required)
        if verdict is not None:
            got[record.volume] = verdict
        else:
            flights[record.volume] = volumes.CHECKS.start(record, key, required, config)
    if flights:
        got.update(await _landed(flights, budget_s))
    return got


async def _landed(
    flights: dict[str, Future[VolumeVerdict]], budget_s: float
) -> dict[str, VolumeVerdict]:
    """The verdicts of the checks that land within budget_s, all waited for at once."""
    waits = {digest: asyncio.wrap_future(f) for digest, f in flights.items()}
    if budget_s > 0:
        await asyncio.wait(waits.values(), timeout=budget_s)
    got: dict[str, VolumeVerdict] = {}
    for digest, wait in waits.items():
        if not wait.done():
            # Not cancelled: the check is shared, and its verdict serves the next pod.
            wait.add_done_callback(_retrieved)
            log.info(f"admission: volume image {digest[:19]} not checked in {budget_s:.1f} s")
        elif wait.cancelled() or (error := wait.exception()) is not None:
            why = "cancelled" if wait.cancelled() else error
            log.info(f"admission: volume image {digest[:19]} not checked: {why}")
        else:
            got[digest] = wait.result()
    return got


def _retrieved(wait: asyncio.Future[VolumeVerdict]) -> None:
    """A check's outcome nobody waits for any more, taken, so asyncio does not log it."""
    if not wait.cancelled():
        wait.exception()


# How long admission waits for volume images' checks, all of them together (a few small
# registry reads each, run side by side): inside the webhook's timeout, with room for the rest.
VOLUME_CHECK_S = 3.0
# What admission needs after the checks, within the webhook's timeout: the decision, the
# patch, the answer's way back to the API server.
ROOM_S = 1.0


def check_budget(config: Config, started: float) -> float:
    """How long the checks may take, admission having started at `started` (perf_counter):
    VOLUME_CHECK_S at most, and never past the webhook's timeout less ROOM_S."""
    spent = time.perf_counter() - started
    return max(0.0, min(VOLUME_CHECK_S, config.webhook_timeout_seconds - ROOM_S - spent))


def apply(body: kopf.Body, patch: kopf.Patch, decision: Decision) -> None:
    """Set what changed; kopf turns it into the JSON patch against the original pod."""
    for key in ("metadata", "spec"):
        for field, value in (decision.pod.get(key) or {}).items():
            if (body.get(key) or {}).get(field) != value:
                patch.setdefault(key, {})[field] = value


def announce(client: Kube, profile_ref: dict[str, Any], pod_name: str, decision: Decision) -> None:
    if decision.reason:
        log.warning(f"pod {pod_name} starts untuned: {decision.reason}")
        client.post_event_soon(
            profile_ref,
            "Warning",
            EventReason.POD_UNTUNED,
            f"pod {pod_name} starts untuned: {decision.reason}",
        )
    if decision.warnings:
        client.post_event_soon(
            profile_ref, "Warning", EventReason.IMAGE_MISMATCH, "; ".join(decision.warnings)
        )


@reflector.on(kinds.PODS)
def pod_event(operator: Operator, type: str | None, body: dict[str, Any]) -> None:
    """A tuning pod (kinds.PODS selects them): kept in the cache under its Job."""
    operator.follow_child("pods", type, body)
