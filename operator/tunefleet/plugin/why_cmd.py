"""`kubectl tunefleet why <pod>`: whether a pod got its artifact, why (not), and the fix.

The evidence, in the order it is trusted:
- the label tunefleet.io/profile: without it the pod never asked for tuning;
- what the webhook wrote at admission (contracts/admission_record.py): without its label the webhook
  never saw the pod (created while it was unreachable, or labelled afterwards); its decision
  code picks the fix from FIXES below, its reason is quoted; the pinned artifact and warnings;
- the fetch init container's outcome (contracts/fetch_outcome.py): a fail-open start or a
  fail-closed refusal, after admission injected the pod;
- the profile now (its phase, current artifacts, its Degraded condition) and its Events about
  the pod. A pod that runs untuned for a cause of tunefleet's is judged by served.cause_of, the
  very rule the operator counts it by in the Degraded condition, so the two agree.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tunefleet import naming
from tunefleet.api.conditions import Phase, Reason, Type
from tunefleet.builders.webhook import CACHES_VOLUME, FILENAME, RESULTS_DIR, TUNABLE_ENV
from tunefleet.contracts.admission_record import (
    ADMISSION_LABEL,
    ARTIFACT_CONFIG_MAP_ANNOTATION,
    ARTIFACT_VOLUME_ANNOTATION,
    DECISION_ANNOTATION,
    STATUS_ANNOTATION,
    UNTUNED,
    Admission,
    Code,
)
from tunefleet.contracts.fetch_outcome import CONTAINER as FETCH_CONTAINER
from tunefleet.contracts.fetch_outcome import LOADED, REFUSED, FetchOutcome
from tunefleet.contracts.nodemap import ROLE as NODE_MAP_ROLE
from tunefleet.serving import served

from .report_parts import event_lines, recent_events, short

TUNABLEOP_ENV = tuple(TUNABLE_ENV)


@dataclass(frozen=True)
class _Pod:
    """One pod and its profile, as the fixes need them."""

    pod: dict[str, Any]
    profile: dict[str, Any] | None
    name: str  # the profile's name, from the pod's label
    namespace: str
    recreate: str

    @property
    def status(self) -> dict[str, Any]:
        return (self.profile or {}).get("status") or {}

    @property
    def models(self) -> list[str]:
        spec = (self.profile or {}).get("spec") or {}
        return [str(m) for m in (spec.get("gpu") or {}).get("models") or []]

    @property
    def label_key(self) -> str:
        gpu = ((self.profile or {}).get("spec") or {}).get("gpu") or {}
        key = gpu.get("labelKey") or naming.DEFAULT_LABEL_KEYS.get(str(gpu.get("vendor")), "")
        return str(key) or "<GPU model label>"

    @property
    def status_cmd(self) -> str:
        return f"kubectl tunefleet status {self.name} -n {self.namespace}"


def _fix_no_profile(p: _Pod, a: Admission) -> str:
    if p.profile is not None:
        return (
            f"TuningProfile {p.name!r} exists now: once `{p.status_cmd}` shows Ready, recreate "
            f"the pod: {p.recreate}"
        )
    return (
        f"create TuningProfile {p.name!r} in namespace {p.namespace} (or fix the pod's label "
        f"{naming.PROFILE_LABEL}), wait until `{p.status_cmd}` shows Ready, then recreate the "
        f"pod: {p.recreate}"
    )


def _fix_invalid(p: _Pod, a: Admission) -> str:
    return (
        f"fix the profile's spec (its Ready condition says what: `{p.status_cmd}`), wait for "
        f"Ready, then recreate the pod: {p.recreate}"
    )


def _fix_no_selector(p: _Pod, a: Admission) -> str:
    choices = ", ".join(p.models) or "the profile's spec.gpu.models"
    return (
        f"add nodeSelector {{{p.label_key}: <one of {choices}>}} to the pod (or its template), "
        f"then recreate it: {p.recreate}"
    )


def _fix_other_model(p: _Pod, a: Admission) -> str:
    return (
        f"add {a.gpu_model} to TuningProfile {p.name!r}'s spec.gpu.models, or select one of "
        f"{', '.join(p.models) or 'its models'}; then recreate the pod: {p.recreate}"
    )


def _fix_no_artifact(p: _Pod, a: Admission) -> str:
    now_art = {x.get("gpuModel"): x for x in p.status.get("artifacts") or []}.get(a.gpu_model)
    if now_art:
        return (
            f"the profile has an artifact for {a.gpu_model} now ({short(now_art.get('sha256'))})"
            f": recreate the pod to get it (pods are pinned at admission): {p.recreate}"
        )
    if p.status.get("phase") == Phase.FAILED:
        return (
            f"tuning failed (see `{p.status_cmd}`): fix it, wait for Ready, then recreate the "
            f"pod: {p.recreate}"
        )
    return f"wait until `{p.status_cmd}` shows Ready, then recreate the pod: {p.recreate}"


def _fix_default_only(p: _Pod, a: Admission) -> str:
    return (
        f"nothing to gain from this artifact; to switch TunableOp on anyway, set "
        f"spec.serving.serveDefaultOnly: true on TuningProfile {p.name!r}, or retune where "
        "kernels can beat Default (the reason says why none did); then recreate the pod: "
        f"{p.recreate}"
    )


def _fix_partition(p: _Pod, a: Admission) -> str:
    return (
        "serve the pod on the GPU partition the artifact was tuned on (or a whole GPU), or tune "
        f"TuningProfile {p.name!r} on nodes with the pod's partition (a model per partition: a "
        "MIG product label, or a profile whose nodes are partitioned alike); if the pod's "
        "partition was guessed wrong, annotate it tunefleet.io/gpu-partition: whole|<partition>; "
        f"then recreate the pod: {p.recreate}"
    )


def _fix_config_map(p: _Pod, a: Admission) -> str:
    return (
        "the operator makes the artifact's ConfigMap again when it reconciles the profile "
        f"(`{p.status_cmd}` shows the artifact's delivery); then recreate the pod: {p.recreate}"
    )


def _fix_not_watched(p: _Pod, a: Admission) -> str:
    return (
        f"no tunefleet release watches namespace {p.namespace}: add it to one release's "
        f"watchNamespaces (helm upgrade), then recreate the pod: {p.recreate}"
    )


def _fix_unknown(p: _Pod, a: Admission) -> str:
    return "the reason above says what is missing; fix it, then recreate the pod: " + p.recreate


# The fix for each reason the webhook admits a pod untuned (contracts.admission_record.Code).
FIXES: dict[Code, Callable[[_Pod, Admission], str]] = {
    Code.NO_PROFILE: _fix_no_profile,
    Code.INVALID_PROFILE: _fix_invalid,
    Code.NO_MODEL_SELECTOR: _fix_no_selector,
    Code.MODEL_NOT_TUNED: _fix_other_model,
    Code.NO_ARTIFACT: _fix_no_artifact,
    Code.DEFAULT_ONLY: _fix_default_only,
    Code.PARTITION_MISMATCH: _fix_partition,
    Code.PARTITION_UNKNOWN: _fix_partition,
    Code.CONFIG_MAP_REPLACED: _fix_config_map,
    Code.NOT_WATCHED: _fix_not_watched,
}


def recreate_hint(pod: dict[str, Any]) -> str:
    """How to recreate this pod, so that admission runs again."""
    meta = pod.get("metadata") or {}
    ns, name = meta.get("namespace", ""), meta.get("name", "")
    owners = [o for o in meta.get("ownerReferences") or [] if o.get("controller")]
    if owners:
        owner = owners[0]
        kind, oname = str(owner.get("kind") or ""), str(owner.get("name") or "")
        text = f"kubectl delete pod -n {ns} {name} (its {kind} {oname} makes a new one)"
        pth = (meta.get("labels") or {}).get("pod-template-hash")
        if kind == "ReplicaSet" and pth and oname.endswith(f"-{pth}"):
            deployment = oname[: -len(pth) - 1]
            text += f", or kubectl rollout restart deployment -n {ns} {deployment}"
        return text
    return f"kubectl get pod -n {ns} {name} -o yaml | kubectl replace --force -f -"


def _fetch_state(pod: dict[str, Any]) -> dict[str, Any] | None:
    """The fetch init container's state: {"state": running|waiting|terminated|unknown, ...}."""
    spec = pod.get("spec") or {}
    if not any(c.get("name") == FETCH_CONTAINER for c in spec.get("initContainers") or []):
        return None
    for cs in (pod.get("status") or {}).get("initContainerStatuses") or []:
        if cs.get("name") != FETCH_CONTAINER:
            continue
        for key in ("state", "lastState"):
            term = (cs.get(key) or {}).get("terminated")
            if term:
                return {
                    "state": "terminated",
                    "exitCode": term.get("exitCode"),
                    "message": " ".join(str(term.get("message") or "").split()),
                }
        for state in ("running", "waiting"):
            got = (cs.get("state") or {}).get(state)
            if got is not None:
                detail = " ".join(f"{got.get('reason') or ''} {got.get('message') or ''}".split())
                return {"state": state, "exitCode": None, "message": detail}
    return {"state": "unknown", "exitCode": None, "message": ""}


def _containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    """The app containers the webhook gave TunableOp's environment and the results mount."""
    out = []
    for c in (pod.get("spec") or {}).get("containers") or []:
        env = {e.get("name"): e for e in c.get("env") or []}
        mounted = any(m.get("mountPath") == RESULTS_DIR for m in c.get("volumeMounts") or [])
        if not mounted and "PYTORCH_TUNABLEOP_FILENAME" not in env:
            continue
        values: dict[str, str] = {}
        notes = []
        for key in TUNABLEOP_ENV:
            e = env.get(key)
            if e is None:
                continue
            values[key] = str(e["value"]) if "value" in e else "(from valueFrom)"
        if values.get("PYTORCH_TUNABLEOP_ENABLED", "1") not in ("1", "(from valueFrom)"):
            notes.append(
                f"sets PYTORCH_TUNABLEOP_ENABLED={values['PYTORCH_TUNABLEOP_ENABLED']} itself: "
                "TunableOp is off in it"
            )
        if values.get("PYTORCH_TUNABLEOP_TUNING") == "1":
            notes.append("sets PYTORCH_TUNABLEOP_TUNING=1 itself: it tunes online as well")
        filename = values.get("PYTORCH_TUNABLEOP_FILENAME", FILENAME)
        if filename not in (FILENAME, "(from valueFrom)"):
            notes.append(
                f"sets PYTORCH_TUNABLEOP_FILENAME={filename} itself: it does not read the "
                "fetched files"
            )
        out.append({"name": c.get("name", ""), "env": values, "notes": notes})
    return out


def _pod_events(pod: dict[str, Any], events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The profile's Events that name this pod (as the webhook names it: at admission a pod
    made from a template has no name yet, only its generateName)."""
    meta = pod.get("metadata") or {}
    names = [f"pod {meta['name']} "] if meta.get("name") else []
    if meta.get("generateName"):
        names.append(f"pod {meta['generateName']}* ")
    return [e for e in events if any(n in str(e.get("message") or "") for n in names)]


def _fix_for_fetch(
    reason: str, profile_name: str, model: str, ns: str, recreate: str, job: str
) -> str:
    retune = f"kubectl delete job -n {ns} {job}" if job else "delete the profile's tuning Job"
    download = (
        f"kubectl tunefleet download {profile_name} -n {ns} --gpu-model {model or '<model>'} "
        "--dest <dir>"
    )
    lowered = reason.lower()
    if "node map" in lowered:
        return (
            "the pod could not tell its node's GPU model (a node that joined moments ago, or "
            "of a GPU model the pod's affinity allows but the profile does not tune): "
            f"recreate the pod once `kubectl get configmap -n {ns} -l "
            f"{naming.ROLE_LABEL}={NODE_MAP_ROLE} -o yaml` lists its node: {recreate}"
        )
    if any(
        w in lowered
        for w in ("credential", "accessdenied", "invalidaccesskeyid", "signature", "http 403")
    ):
        return (
            "the pod's S3 credentials were missing or refused: check the Secret named by "
            f"spec.storage.credentialsSecret (or the operator's default) in namespace {ns} "
            f"(AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY), then recreate the pod: {recreate}"
        )
    if any(w in lowered for w in ("sha-256", "corrupt", "manifest", "does not parse", "differ")):
        return (
            "the artifact in object storage does not verify (corrupted or changed after it was "
            f"published): check it with `{download}` (the same checks); retune to publish a new "
            f"one ({retune}: the operator runs it again), then recreate the pod: {recreate}"
        )
    if "no object at" in lowered or "nosuchbucket" in lowered:
        return (
            "the artifact is not in object storage (deleted, or another bucket/endpoint): "
            f"check spec.storage and `{download}`, then recreate the pod: {recreate}"
        )
    if any(w in lowered for w in ("connect", "timed out", "time limit", "endpoint")):
        return (
            "the pod could not reach object storage: check spec.storage.endpoint (or the "
            "operator's default endpoint) and the network from the pod's node, then recreate "
            f"the pod: {recreate}"
        )
    return (
        f"fix the cause above (`{download}` runs the same checks), then recreate the pod: "
        f"{recreate}"
    )


def _report(p: _Pod, admission: str | None) -> dict[str, Any]:
    pstatus = p.status
    meta = p.pod.get("metadata") or {}
    return {
        "namespace": p.namespace,
        "pod": str(meta.get("name") or ""),
        "profile": p.name or None,
        "profileExists": p.profile is not None,
        "profilePhase": pstatus.get("phase"),
        "admission": admission,
        "tuned": False,
        "verdict": "",
        "code": "",
        "summary": "",
        "reason": "",
        "reasonSource": "",
        "fix": "",
        "artifact": None,
        "containers": [],
        "imageWarnings": [],
        "fetch": None,
        "notes": [],
        "events": [],
    }


def _unadmitted(p: _Pod, out: dict[str, Any]) -> dict[str, Any]:
    out.update(
        verdict="unadmitted",
        summary="not tuned: the tunefleet webhook never saw this pod",
        reason=f"it has the label {naming.PROFILE_LABEL}={p.name} but not "
        f"{ADMISSION_LABEL}, which the webhook sets on every pod it admits: it was "
        "created while the webhook was unreachable (failurePolicy Ignore lets pods through "
        "untouched), or the label was added after it was created",
        reasonSource="the pod's labels",
        fix=f"recreate it while the tunefleet webhook is up: {p.recreate}",
    )
    if p.status.get("unadmittedPods"):
        out["notes"].append(
            f"TuningProfile {p.name!r} counts {p.status['unadmittedPods']} such pod(s)"
        )
    return out


def _untuned(p: _Pod, a: Admission, out: dict[str, Any]) -> dict[str, Any]:
    out.update(
        verdict="untuned",
        code=str(a.code),
        summary="not tuned: the webhook admitted it untuned",
        reason=a.reason or "(no reason recorded)",
        reasonSource=f"annotation {STATUS_ANNOTATION}",
        fix=FIXES.get(a.code, _fix_unknown)(p, a),
    )
    if p.profile is not None and p.status.get("phase"):
        ready: dict[str, Any] = next(
            (c for c in p.status.get("conditions") or [] if c.get("type") == Type.READY), {}
        )
        out["notes"].append(
            f"TuningProfile {p.name!r} is {p.status['phase']} now"
            + (f": {ready['message']}" if ready.get("message") else "")
        )
    cause = served.cause_of(p.pod)
    if cause is not None:
        out["notes"].append(_degraded_note(p, cause))
    return out


def _job_of(p: _Pod, sha256: str) -> str:
    """The Job that published an artifact, if status still lists it ("" when not)."""
    listed = [*(p.status.get("artifacts") or []), *(p.status.get("history") or [])]
    return next((str(x.get("job") or "") for x in listed if x.get("sha256") == sha256), "")


def _fetch_refused(
    p: _Pod, outcome: FetchOutcome, model: str, pinned_job: str, out: dict[str, Any]
) -> None:
    """A fetch that did not load the artifact: it refused to start the pod (fail closed) or
    started it untuned (fail open), with why and the fix."""
    refused = outcome.verdict == REFUSED
    out.update(
        verdict="refused-at-start" if refused else "untuned-at-start",
        summary=(
            "not started: injected, but the fetch init container refused to start it "
            "(spec.serving.failClosed)"
            if refused
            else "not tuned: injected, but the fetch init container started it untuned (fail open)"
        ),
        reason=outcome.reason,
        reasonSource=f"{FETCH_CONTAINER}'s termination message",
        fix=_fix_for_fetch(outcome.reason, p.name, model, p.namespace, p.recreate, pinned_job),
    )


def _fetch_verdict(p: _Pod, a: Admission, out: dict[str, Any], fetch: dict[str, Any]) -> None:
    """What the fetch init container's state says of a pod the webhook injected."""
    ns, name = p.namespace, out["pod"]
    message = fetch.get("message", "")
    outcome = FetchOutcome.parse(message) if fetch["state"] == "terminated" else None
    model, pinned = a.gpu_model, a.sha256
    if outcome is not None and outcome.gpu_model:
        # Picked at the node among the candidates: what it picked is fetch's word.
        model = outcome.gpu_model
        pinned = a.candidates.get(model, "") or outcome.sha256
        out["artifact"] = {**(out["artifact"] or {}), "gpuModel": model, "sha256": pinned or None}
        out["notes"].append(f"picked {model} on node {outcome.node} (its GPU model)")
    sha = short(pinned)
    source = f"{FETCH_CONTAINER}'s termination message"
    if outcome is not None and outcome.verdict != LOADED:
        _fetch_refused(p, outcome, model, _job_of(p, pinned), out)
    elif outcome is not None:
        summary = f"tuned: injected, artifact {sha} loaded"
        summary += f" for {model}" if model else ""
        out.update(
            tuned=True, verdict="injected", summary=summary, reason=message, reasonSource=source
        )
        if outcome.caches:
            out["notes"].append(f"caches {', '.join(outcome.caches)} unpacked (a writable copy)")
        if outcome.caches_failed:
            # The results serve; the stack compiles as it would without its caches.
            out["notes"].append(
                f"caches not served, the stack starts cold: {outcome.caches_failed}"
            )
    elif fetch["state"] == "terminated":
        code = fetch.get("exitCode")
        out.update(
            tuned=None,  # fetch did not say: unknown
            verdict="injected",
            summary=f"injected: pinned to artifact {sha}; {FETCH_CONTAINER} ended "
            f"(exit {code}) without saying what it wrote",
            reason=message or f"{FETCH_CONTAINER} exited {code} and left no termination message",
            reasonSource=source if message else "pod status",
            fix=f"look at its log: kubectl logs -n {ns} {name} -c {FETCH_CONTAINER}",
        )
    else:
        out.update(
            tuned=None,  # not known until fetch has run
            verdict="injected",
            summary=f"injected: pinned to artifact {sha}; {FETCH_CONTAINER} has not finished "
            f"yet ({fetch['state']}{': ' + message if message else ''})",
            reason="the webhook's annotations say injected",
            reasonSource=f"annotation {STATUS_ANNOTATION}",
        )


def _fetch_died(p: _Pod, died: served.Died, out: dict[str, Any]) -> None:
    """A pod that does not serve at all for a cause of tunefleet's (served.fetch_died): its
    fetch init container died without its outcome line, or the kubelet evicted the pod over
    fetch or one of tunefleet's volumes."""
    if died.how == served.EVICTED:
        summary = (
            "not running: injected, but the kubelet evicted it over what tunefleet added to it"
        )
        source = "the pod's status"
    else:
        summary = (
            f"not started: injected, but the {FETCH_CONTAINER} init container died "
            f"({died.how}) before it said what it did"
        )
        source = f"{FETCH_CONTAINER}'s state in the pod's status"
    out.update(
        tuned=False,
        verdict="fetch-died",
        summary=summary,
        reason=died.reason,
        reasonSource=source,
        fix=_fix_for_died(p, died, out["pod"]),
    )


def _fix_for_died(p: _Pod, died: served.Died, pod: str) -> str:
    """What to do about a fetch that died, or a pod evicted over tunefleet's volumes."""
    log = f"kubectl logs -n {p.namespace} {pod} -c {FETCH_CONTAINER} --previous"
    limit = died.memory_limit or "not set in its spec"
    smaller = "serve a smaller artifact (fewer or smaller caches in spec.artifacts.caches, retuned)"
    then = f"then recreate the pod: {p.recreate}"
    if died.how == served.OOM_KILLED:
        return (
            f"{FETCH_CONTAINER} streams a bundle of any size in a few tens of MiB, so an "
            f"OOMKill at its memory limit ({limit}) means something lowered that limit (a "
            "LimitRange or a policy that rewrites pods in this namespace: let tunefleet's own "
            "stand), or a tunefleet before streamed fetches admitted the pod (it read bundles "
            f"whole: upgrade); fetch's log before it died: `{log}`; {then}"
        )
    if died.how == served.KILLED:
        return (
            f"{FETCH_CONTAINER} was killed (SIGKILL) by the OOM killer (its memory limit: "
            f"{limit}) or by its node: `{log}` and `kubectl describe pod -n {p.namespace} "
            f"{pod}` say which; if it was memory, raise that limit, or {smaller}; {then}"
        )
    if died.how == served.CRASHED:
        return f"fetch's log says why it exited {died.exit_code}: `{log}`; fix that, {then}"
    if died.volume == CACHES_VOLUME:
        return (
            "the bundle, unpacked, with what the stack adds to its caches, is larger than the "
            f"{died.volume} volume's sizeLimit ({died.size_limit}), which tunefleet sizes from "
            "the artifact's caches when it admits the pod (room for them, their largest "
            "archive, and as much again for the stack): the stack wrote more than that into "
            f"its caches; bound what it writes there, or {smaller}; {then}"
        )
    if died.volume:
        return (
            f"the files in the {died.volume} volume grew past its sizeLimit "
            f"({died.size_limit}), which tunefleet sets when it admits the pod: the artifact is "
            f"larger than it holds; raise that limit, or {smaller}; {then}"
        )
    return (
        f"the kubelet's message above says what {FETCH_CONTAINER} or tunefleet's volumes used "
        f"too much of on the node; {then} (on a node with room)"
    )


def _store_fallback_note(a: Admission) -> str:
    """Why a pod admitted with decision store_fallback fetches its artifact from the store."""
    model = f" for {a.gpu_model}" if a.gpu_model else ""
    return (
        f"admitted with decision {Code.STORE_FALLBACK}{model} (annotation "
        f"{DECISION_ANNOTATION}): the artifact's ConfigMap was gone or not the one the "
        f"operator made, so the {FETCH_CONTAINER} init container fetches the same artifact from "
        "the store, verified, instead; the operator makes the ConfigMap again, and pods "
        "admitted after that mount it"
    )


def _degraded_note(p: _Pod, cause: served.Untuned) -> str:
    """What the profile's Degraded condition says of a pod that runs untuned for a cause of
    tunefleet's (served.cause_of: the rule the operator counts it by)."""
    said: dict[str, Any] = next(
        (c for c in p.status.get("conditions") or [] if c.get("type") == Type.DEGRADED), {}
    )
    doing = "does not run" if cause.cause == served.FETCH_DIED else "runs untuned"
    counted = f"{doing} for a cause of tunefleet's ({cause.cause})"
    if p.profile is None:
        return f"this pod {counted}"
    if not said:
        return (
            f"this pod {counted}; TuningProfile {p.name!r} has no Degraded condition (its "
            "status was written by an operator before 0.2.0), so it does not count it"
        )
    message = str(said.get("message") or "")
    if said.get("status") == "True" and said.get("reason") == Reason.PODS_UNTUNED:
        return (
            f"this pod {counted}: TuningProfile {p.name!r} is Degraded "
            f"({Reason.PODS_UNTUNED}) and counts it: {message}"
        )
    return (
        f"this pod {counted}, which TuningProfile {p.name!r}'s Degraded condition counts "
        f"({Reason.PODS_UNTUNED}) once the operator's next reconcile sees the pod; it says now: "
        f"{said.get('status')}, {said.get('reason')}: {message}"
    )


def _without_fetch(p: _Pod, a: Admission, out: dict[str, Any]) -> None:
    """An injected pod with no fetch init container: mounted from a ConfigMap or an image
    volume, or changed after admission."""
    started = (p.pod.get("status") or {}).get("phase") in ("Running", "Succeeded")
    model = f" for {a.gpu_model}" if a.gpu_model else ""
    # (where from, why, the annotation that says so) of a mounted artifact
    mounted = (
        (f"from ConfigMap {a.config_map}",
         "the webhook mounted the artifact's ConfigMap (no fetch, no store request)",
         ARTIFACT_CONFIG_MAP_ANNOTATION)
        if a.config_map
        else (f"as image volume {a.image_volume}",
              "the webhook mounted the artifact's volume image, which the operator verified "
              "(signature and pins); the kubelet pulls it once per node",
              ARTIFACT_VOLUME_ANNOTATION)
        if a.image_volume
        else None
    )  # fmt: skip
    if mounted is not None:
        where, reason, annotation = mounted
        out.update(
            tuned=True if started else None,
            verdict="injected",
            summary=f"{'tuned' if started else 'injected'}: artifact {short(a.sha256)} mounted "
            f"{where}{model}",
            reason=reason,
            reasonSource=f"annotation {annotation}",
        )
    else:
        out.update(
            verdict="injected",
            summary=f"injected: pinned to artifact {short(a.sha256)}, but the pod has no "
            f"{FETCH_CONTAINER} init container (its spec was changed after admission?)",
            reason="the webhook's annotations say injected",
            reasonSource=f"annotation {STATUS_ANNOTATION}",
            fix=f"recreate the pod: {p.recreate}",
        )


def _injected(p: _Pod, a: Admission, out: dict[str, Any]) -> dict[str, Any]:
    out["artifact"] = {
        "uri": a.uri or None,
        "sha256": a.sha256 or None,
        "gpuModel": a.gpu_model or None,
    }
    if a.candidates:
        # The pod may land on several models: picked where it lands, among these.
        out["artifact"]["candidates"] = dict(a.candidates)
    gate = _gate_of(p.status, a.sha256)
    if gate:
        out["artifact"]["gate"] = gate
    load = _cache_load_of(p.status, str((p.pod.get("metadata") or {}).get("name") or ""))
    if load:
        out["artifact"]["cacheLoad"] = load
    out["containers"] = _containers(p.pod)
    out["imageWarnings"] = [w.strip() for w in a.image_warning.split("; ") if w.strip()]
    if a.code not in (Code.NONE, Code.UNKNOWN):
        out["code"] = str(a.code)  # injected, with something to say (store_fallback, ...)
    if a.code == Code.STORE_FALLBACK:
        out["notes"].append(_store_fallback_note(a))
    fetch = _fetch_state(p.pod)
    out["fetch"] = fetch
    if fetch is None:
        _without_fetch(p, a, out)
    else:
        _fetch_verdict(p, a, out, fetch)
    died = served.fetch_died(p.pod)
    if died is not None:
        _fetch_died(p, died, out)
    cause = served.cause_of(p.pod)
    if cause is not None:
        out["notes"].append(_degraded_note(p, cause))
    if out["verdict"] == "injected" and not out["containers"]:
        out["notes"].append("no app container has TunableOp's environment and results mount")
    for c in out["containers"]:
        for note in c["notes"]:
            out["notes"].append(f"container {c['name']} {note}")
    current = next(
        (x for x in p.status.get("artifacts") or [] if x.get("gpuModel") == a.gpu_model), None
    )
    if current and a.sha256 and current.get("sha256") != a.sha256:
        out["notes"].append(
            f"TuningProfile {p.name!r} has a newer artifact for {a.gpu_model} now "
            f"({short(current.get('sha256'))}); pods keep the one pinned at admission: "
            f"recreate the pod to get it: {p.recreate}"
        )
    return out


def explain(
    pod: dict[str, Any],
    profile: dict[str, Any] | None,
    events: list[dict[str, Any]],
) -> dict[str, Any]:
    """The verdict on one pod, as plain data (the `-o json` form).

    verdict: not-requested, unadmitted, untuned (the webhook's decision in `code`), injected
    (fetch loaded the artifact, or has not finished: `fetch.state`; `code` says a decision
    other than none, such as store_fallback), untuned-at-start (the fetch init container failed
    open), refused-at-start (it failed closed), fetch-died (the fetch init container died
    without its outcome line: OOMKilled, killed, crashed; or the kubelet evicted the pod over
    fetch or one of tunefleet's volumes). A pod that runs untuned for a cause of
    tunefleet's gets a note with what the profile's Degraded condition says of it.
    """
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    ns = str(meta.get("namespace") or "")
    name = labels.get(naming.PROFILE_LABEL)
    p = _Pod(pod, profile, name or "", ns, recreate_hint(pod))
    a = Admission.read(pod)
    out = _report(p, labels.get(ADMISSION_LABEL))
    if name is None:
        out.update(
            verdict="not-requested",
            summary="not tuned: it never asked for tuning",
            reason=f"the pod has no label {naming.PROFILE_LABEL}, so the tunefleet webhook "
            "never sees it (its objectSelector) and nothing is injected",
            reasonSource="the pod's labels",
            fix=f"to tune it, add the label {naming.PROFILE_LABEL}=<TuningProfile> to the pod "
            f"(or its template) and recreate it: {p.recreate}",
        )
        return out
    out["events"] = recent_events(_pod_events(pod, events))
    if profile is None:
        out["notes"].append(f"TuningProfile {name!r} does not exist in namespace {ns} now")
    if a is None or labels.get(ADMISSION_LABEL) is None:
        return _unadmitted(p, out)
    if a.outcome == UNTUNED:
        return _untuned(p, a, out)
    return _injected(p, a, out)


def _gate_of(status: dict[str, Any], sha256: str) -> str:
    """What the promotion gate said of the pinned artifact, from status (shown as written:
    the operator judges it again each reconcile): "Passed: ...", "Unmeasured: not measured:
    <why>", "Rejected: <figure> failed with the artifact: <cause>", ...; "" when status
    keeps no verdict for it."""
    for entry in [*(status.get("artifacts") or []), *(status.get("history") or [])]:
        if sha256 and entry.get("sha256") == sha256:
            promotion = entry.get("promotion") or {}
            if promotion.get("verdict"):
                return f"{promotion['verdict']}: {promotion.get('message') or '-'}"
    return ""


def _cache_load_of(status: dict[str, Any], pod: str) -> str:
    """What the pod's capture sidecar reported of its served cache's start (status.capture[]
    .caches[].pods, the newest pods): "vllm: recompiled (key ...): <vLLM's reason>"; "" when
    the pod is not among them."""
    for entry in status.get("capture") or []:
        for c in entry.get("caches") or []:
            for p in c.get("pods") or []:
                if p.get("name") == pod:
                    key = f" (key {p['key']})" if p.get("key") else ""
                    said = f": {p['reason']}" if p.get("reason") else ""
                    return f"{c.get('kind')}: {p.get('path')}{key}{said}"
    return ""


def _artifact_rows(art: dict[str, Any] | None) -> list[tuple[str, str]]:
    """The candidates a pod picks among at its node, and the artifact it is pinned to."""
    rows = []
    if art and art.get("candidates"):
        offered = ", ".join(
            f"{m} ({short(sha) if sha else 'untuned there'})"
            for m, sha in art["candidates"].items()
        )
        rows.append(("Candidates:", f"picked at the node among {offered}"))
    if art and (art.get("uri") or art.get("sha256")):
        rows.append(
            (
                "Artifact:",
                f"{art.get('uri') or '?'} (sha256 {art.get('sha256') or '?'}, "
                f"GPU model {art.get('gpuModel') or '?'})",
            )
        )
    if art and art.get("gate"):
        rows.append(("Gate:", str(art["gate"])))
    if art and art.get("cacheLoad"):
        rows.append(("Cache:", str(art["cacheLoad"])))
    return rows


def _containers_text(containers: list[dict[str, Any]]) -> str:
    """Each serving container with the TunableOp settings it runs with."""
    return "; ".join(
        f"{c['name']} ("
        + ", ".join(f"{k.removeprefix('PYTORCH_TUNABLEOP_')}={v}" for k, v in c["env"].items())
        + ")"
        for c in containers
    )


def format_why(report: dict[str, Any], now: datetime.datetime | None = None) -> str:
    now = now or datetime.datetime.now(datetime.UTC)
    lines = [f"Pod {report['namespace']}/{report['pod']}: {report['summary']}"]
    rows: list[tuple[str, str]] = []
    if report["profile"] is not None:
        phase = report.get("profilePhase")
        where = (
            f" (phase {phase})"
            if phase
            else (" (exists)" if report["profileExists"] else " (does not exist)")
        )
        rows.append(("Profile:", f"{report['profile']}{where}"))
    if report["reason"]:
        quoted = report["verdict"] in ("untuned", "untuned-at-start", "refused-at-start")
        text = f'"{report["reason"]}"' if quoted else report["reason"]
        rows.append(("Reason:", f"{text} (from {report['reasonSource']})"))
    rows += _artifact_rows(report.get("artifact"))
    if report["containers"]:
        rows.append(("Containers:", _containers_text(report["containers"])))
    for w in report["imageWarnings"]:
        rows.append(("Image warning:", w))
    fetch = report.get("fetch")
    if fetch and report["reasonSource"].startswith("annotation"):
        rows.append(
            ("Fetch:", f"{fetch['state']}{': ' + fetch['message'] if fetch['message'] else ''}")
        )
    for note in report["notes"]:
        rows.append(("Note:", note))
    if report["fix"]:
        rows.append(("Fix:", report["fix"]))
    width = max((len(k) for k, _ in rows), default=0)
    lines += [f"  {k.ljust(width)}  {v}" for k, v in rows]
    if report["profile"] is not None and report["verdict"] != "not-requested":
        lines.append(f"Events on TuningProfile {report['profile']} about this pod (newest first):")
        lines += event_lines(report["events"], now)
    return "\n".join(lines) + "\n"
