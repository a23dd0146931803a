"""`kubectl tunefleet why <pod>`: whether a pod got its artifact, why (not), and the fix.

The evidence, in the order it is trusted:
- the label tunefleet.io/profile: without it the pod never asked for tuning;
- the label tunefleet.io/admission, which the webhook sets on every pod it admits: without it
  the webhook never saw the pod (created while it was unreachable, or labelled afterwards);
- the webhook's annotations: tunefleet.io/status ("injected" or "untuned: <reason>"), the
  artifact's URI and SHA-256, the GPU model, image warnings;
- the fetch init container's termination message: a fail-open start ("starting untuned: ...")
  or a fail-closed refusal, after admission injected the pod;
- the profile now (its phase, current artifacts) and its Events about the pod.
"""

from __future__ import annotations

import datetime
import re
from typing import Any

from tunefleet import naming
from tunefleet.builders.webhook import (
    ANN_IMAGE_WARNING,
    ANN_MODEL,
    ANN_SHA,
    ANN_STATUS,
    ANN_URI,
    FETCH_CONTAINER,
    FILENAME,
    RESULTS_DIR,
)

from .common import event_lines, recent_events, short

TUNABLEOP_ENV = (
    "PYTORCH_TUNABLEOP_ENABLED",
    "PYTORCH_TUNABLEOP_TUNING",
    "PYTORCH_TUNABLEOP_RECORD_UNTUNED",
    "PYTORCH_TUNABLEOP_FILENAME",
)

# The webhook's reasons (builders/webhook.py inject), by its metrics code.
REASONS = (
    ("no_profile", re.compile(r"TuningProfile '.*' does not exist in this namespace")),
    ("invalid_profile", re.compile(r"TuningProfile '.*' has an invalid spec")),
    ("no_model_selector", re.compile(r"^pod has no nodeSelector on (?P<key>\S+), and")),
    (
        "model_not_tuned",
        re.compile(r"^pod selects (?P<key>[^=\s]+)=(?P<model>\S+), which TuningProfile"),
    ),
    ("no_artifact", re.compile(r"has no artifact for (?P<model>\S+) yet")),
    (
        "default_only",
        re.compile(r"for (?P<model>\S+) has no GEMM where a kernel beat Default"),
    ),
)
FELL_BACK = "starting untuned:"  # tunefleet-fetch's fail-open line (artifacts/fetch.py)
REFUSED = "refusing to start:"  # ... and its fail-closed one
LOADED = re.compile(r"wrote (\d+) results file\(s\) with (\d+) tuned GEMMs")


def classify(reason: str) -> tuple[str, dict[str, str]]:
    """(code, named parts) of a webhook reason; ("unknown", {}) for one we do not know."""
    for code, pattern in REASONS:
        m = pattern.search(reason)
        if m:
            return code, {k: v for k, v in m.groupdict().items() if v}
    return "unknown", {}


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


def explain(
    pod: dict[str, Any],
    profile: dict[str, Any] | None,
    events: list[dict[str, Any]],
) -> dict[str, Any]:
    """The verdict on one pod, as plain data (the `-o json` form).

    verdict: not-requested, unadmitted, untuned (the webhook's reason in `code`), injected
    (fetch loaded the artifact, or has not finished: `fetch.state`), untuned-at-start (the
    fetch init container failed open), refused-at-start (it failed closed).
    """
    meta = pod.get("metadata") or {}
    ns, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    labels = meta.get("labels") or {}
    anns = meta.get("annotations") or {}
    profile_name = labels.get(naming.PROFILE_LABEL)
    admission = labels.get(naming.ADMISSION_LABEL)
    recreate = recreate_hint(pod)
    out: dict[str, Any] = {
        "namespace": ns,
        "pod": name,
        "profile": profile_name,
        "profileExists": profile is not None,
        "profilePhase": ((profile or {}).get("status") or {}).get("phase"),
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
    if profile_name is None:
        out.update(
            verdict="not-requested",
            summary="not tuned: it never asked for tuning",
            reason=f"the pod has no label {naming.PROFILE_LABEL}, so the tunefleet webhook never "
            "sees it (its objectSelector) and nothing is injected",
            reasonSource="the pod's labels",
            fix=f"to tune it, add the label {naming.PROFILE_LABEL}=<TuningProfile> to the pod "
            f"(or its template) and recreate it: {recreate}",
        )
        return out
    out["events"] = recent_events(_pod_events(pod, events))
    pstatus = (profile or {}).get("status") or {}
    pspec = (profile or {}).get("spec") or {}
    models = [str(m) for m in (pspec.get("gpu") or {}).get("models") or []]
    status_cmd = f"kubectl tunefleet status {profile_name} -n {ns}"
    if profile is None:
        out["notes"].append(f"TuningProfile {profile_name!r} does not exist in namespace {ns} now")

    if admission is None:
        out.update(
            verdict="unadmitted",
            summary="not tuned: the tunefleet webhook never saw this pod",
            reason=f"it has the label {naming.PROFILE_LABEL}={profile_name} but not "
            f"{naming.ADMISSION_LABEL}, which the webhook sets on every pod it admits: it was "
            "created while the webhook was unreachable (failurePolicy Ignore lets pods through "
            "untouched), or the label was added after it was created",
            reasonSource="the pod's labels",
            fix=f"recreate it while the tunefleet webhook is up: {recreate}",
        )
        if pstatus.get("unadmittedPods"):
            out["notes"].append(
                f"TuningProfile {profile_name!r} counts {pstatus['unadmittedPods']} such pod(s)"
            )
        return out

    status_ann = str(anns.get(ANN_STATUS) or "")
    if admission == "untuned" or status_ann.startswith("untuned"):
        reason = status_ann.removeprefix("untuned:").strip() or "(no reason recorded)"
        code, parts = classify(reason)
        model = parts.get("model", "")
        arts = {a.get("gpuModel"): a for a in pstatus.get("artifacts") or []}
        if code == "no_profile":
            if profile is not None:
                fix = (
                    f"TuningProfile {profile_name!r} exists now: once `{status_cmd}` shows Ready, "
                    f"recreate the pod: {recreate}"
                )
            else:
                fix = (
                    f"create TuningProfile {profile_name!r} in namespace {ns} (or fix the pod's "
                    f"label {naming.PROFILE_LABEL}), wait until `{status_cmd}` shows Ready, then "
                    f"recreate the pod: {recreate}"
                )
        elif code == "invalid_profile":
            fix = (
                f"fix the profile's spec (its Ready condition says what: `{status_cmd}`), wait "
                f"for Ready, then recreate the pod: {recreate}"
            )
        elif code == "no_model_selector":
            key = parts.get("key") or "<GPU model label>"
            choices = ", ".join(models) or "the profile's spec.gpu.models"
            fix = (
                f"add nodeSelector {{{key}: <one of {choices}>}} to the pod (or its template), "
                f"then recreate it: {recreate}"
            )
        elif code == "model_not_tuned":
            fix = (
                f"add {model} to TuningProfile {profile_name!r}'s spec.gpu.models, or select one "
                f"of {', '.join(models) or 'its models'}; then recreate the pod: {recreate}"
            )
        elif code == "no_artifact":
            now_art = arts.get(model)
            if now_art:
                fix = (
                    f"the profile has an artifact for {model} now ({short(now_art.get('sha256'))})"
                    f": recreate the pod to get it (pods are pinned at admission): {recreate}"
                )
            elif pstatus.get("phase") == "Failed":
                fix = (
                    f"tuning failed (see `{status_cmd}`): fix it, wait for Ready, then recreate "
                    f"the pod: {recreate}"
                )
            else:
                fix = f"wait until `{status_cmd}` shows Ready, then recreate the pod: {recreate}"
        elif code == "default_only":
            fix = (
                f"nothing to gain from this artifact; to switch TunableOp on anyway, set "
                f"spec.serving.serveDefaultOnly: true on TuningProfile {profile_name!r}, or "
                "retune where kernels can beat Default (the reason says why none did); then "
                f"recreate the pod: {recreate}"
            )
        else:
            fix = (
                "the reason above says what is missing; fix it, then recreate the pod: " + recreate
            )
        out.update(
            verdict="untuned",
            code=code,
            summary="not tuned: the webhook admitted it untuned",
            reason=reason,
            reasonSource=f"annotation {ANN_STATUS}",
            fix=fix,
        )
        if profile is not None and pstatus.get("phase"):
            ready: dict[str, Any] = next(
                (c for c in pstatus.get("conditions") or [] if c.get("type") == "Ready"), {}
            )
            out["notes"].append(
                f"TuningProfile {profile_name!r} is {pstatus['phase']} now"
                + (f": {ready['message']}" if ready.get("message") else "")
            )
        return out

    # Injected: the webhook pinned an artifact; the fetch init container says how start-up went.
    model = str(anns.get(ANN_MODEL) or "")
    out["artifact"] = {
        "uri": anns.get(ANN_URI),
        "sha256": anns.get(ANN_SHA),
        "gpuModel": model or None,
    }
    out["containers"] = _containers(pod)
    warning = str(anns.get(ANN_IMAGE_WARNING) or "")
    out["imageWarnings"] = [w.strip() for w in warning.split("; ") if w.strip()]
    fetch = _fetch_state(pod)
    out["fetch"] = fetch
    # The Job that published the pinned artifact, if status still lists it.
    pinned_job = next(
        (
            str(a.get("job") or "")
            for a in [*(pstatus.get("artifacts") or []), *(pstatus.get("history") or [])]
            if a.get("sha256") == anns.get(ANN_SHA)
        ),
        "",
    )
    sha = short(anns.get(ANN_SHA))
    message = (fetch or {}).get("message", "")
    if fetch is None:
        out.update(
            verdict="injected",
            summary=f"injected: pinned to artifact {sha}, but the pod has no {FETCH_CONTAINER} "
            "init container (its spec was changed after admission?)",
            reason="the webhook's annotations say injected",
            reasonSource=f"annotation {ANN_STATUS}",
            fix=f"recreate the pod: {recreate}",
        )
    elif FELL_BACK in message or REFUSED in message:
        refused = REFUSED in message
        marker = REFUSED if refused else FELL_BACK
        reason = message.split(marker, 1)[1].strip()
        out.update(
            verdict="refused-at-start" if refused else "untuned-at-start",
            summary=(
                "not started: injected, but the fetch init container refused to start it "
                "(spec.serving.failClosed)"
                if refused
                else "not tuned: injected, but the fetch init container started it untuned "
                "(fail open)"
            ),
            reason=reason,
            reasonSource=f"{FETCH_CONTAINER}'s termination message",
            fix=_fix_for_fetch(reason, profile_name, model, ns, recreate, pinned_job),
        )
    elif fetch["state"] == "terminated" and LOADED.search(message):
        out.update(
            tuned=True,
            verdict="injected",
            summary=f"tuned: injected, artifact {sha} loaded" + (f" for {model}" if model else ""),
            reason=message,
            reasonSource=f"{FETCH_CONTAINER}'s termination message",
        )
    elif fetch["state"] == "terminated":
        out.update(
            tuned=None,  # fetch did not say: unknown
            verdict="injected",
            summary=f"injected: pinned to artifact {sha}; {FETCH_CONTAINER} ended "
            f"(exit {fetch.get('exitCode')}) without saying what it wrote",
            reason=message
            or f"{FETCH_CONTAINER} exited {fetch.get('exitCode')} and left no termination message",
            reasonSource=f"{FETCH_CONTAINER}'s termination message" if message else "pod status",
            fix=f"look at its log: kubectl logs -n {ns} {name} -c {FETCH_CONTAINER}",
        )
    else:
        out.update(
            tuned=None,  # not known until fetch has run
            verdict="injected",
            summary=f"injected: pinned to artifact {sha}; {FETCH_CONTAINER} has not finished "
            f"yet ({fetch['state']}{': ' + message if message else ''})",
            reason="the webhook's annotations say injected",
            reasonSource=f"annotation {ANN_STATUS}",
        )
    if out["verdict"] == "injected" and not out["containers"]:
        out["notes"].append("no app container has TunableOp's environment and results mount")
    for c in out["containers"]:
        for note in c["notes"]:
            out["notes"].append(f"container {c['name']} {note}")
    current = next((a for a in pstatus.get("artifacts") or [] if a.get("gpuModel") == model), None)
    if current and anns.get(ANN_SHA) and current.get("sha256") != anns.get(ANN_SHA):
        out["notes"].append(
            f"TuningProfile {profile_name!r} has a newer artifact for {model} now "
            f"({short(current.get('sha256'))}); pods keep the one pinned at admission: "
            f"recreate the pod to get it: {recreate}"
        )
    return out


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
    art = report.get("artifact")
    if art:
        rows.append(
            (
                "Artifact:",
                f"{art.get('uri') or '?'} (sha256 {art.get('sha256') or '?'}, "
                f"GPU model {art.get('gpuModel') or '?'})",
            )
        )
    if report["containers"]:
        rows.append(
            (
                "Containers:",
                "; ".join(
                    f"{c['name']} ("
                    + ", ".join(
                        f"{k.removeprefix('PYTORCH_TUNABLEOP_')}={v}" for k, v in c["env"].items()
                    )
                    + ")"
                    for c in report["containers"]
                ),
            )
        )
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
