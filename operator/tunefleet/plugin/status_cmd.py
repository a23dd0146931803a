"""`kubectl tunefleet status`: one screen about a TuningProfile, from its object and Events."""

from __future__ import annotations

import datetime
from typing import Any

from tunefleet import naming
from tunefleet.api.conditions import OPTIONAL_TYPES, TYPES, Phase
from tunefleet.capture.loop import model_revision
from tunefleet.contracts import pin as pins
from tunefleet.contracts.admission_record import ADMISSION_LABEL
from tunefleet.contracts.artifact_record import REJECTED, ArtifactRecord, verdict_of
from tuner_job.gain import Gain

from .report_parts import age, event_lines, gain_lines, recent_events, short, table

CONDITIONS = tuple(str(t) for t in TYPES)
# Artifact fields shown as "GEMMs: ..." counts, in this order, with their words.
COUNTS = (
    ("recorded", "recorded"),
    ("reused", "reused"),
    ("resumed", "resumed"),
    ("newlyTuned", "newly tuned"),
    ("shards", "shards"),
)
# What `-o json` keeps of each history entry: enough to name it, what it buys, and the gate's
# verdict (a rejected artifact is only ever seen here).
HISTORY_KEYS = ("gpuModel", "sha256", "revision", "tunedAt", "uri", "gain", "promotion")


def _artifact(art: dict[str, Any], revision: str) -> dict[str, Any]:
    """The artifact as status holds it, plus what the screen derives from it."""
    out = dict(art)
    out["shortSha256"] = short(art.get("sha256"))
    out["current"] = bool(revision) and art.get("revision") == revision
    record = ArtifactRecord.from_status(art)
    out["defaultOnly"] = record.default_only if record is not None else False
    return out


def status_report(profile: dict[str, Any], events: list[dict[str, Any]]) -> dict[str, Any]:
    """Everything `status` shows, as plain data (the `-o json` form)."""
    meta = profile.get("metadata") or {}
    spec = profile.get("spec") or {}
    st = profile.get("status") or {}
    revision = str(st.get("revision") or "")
    capture = [dict(e) for e in st.get("capture") or [] if isinstance(e, dict)]
    by_model = {str(e.get("gpuModel")): e for e in capture}
    models = [str(m) for m in (spec.get("gpu") or {}).get("models") or []]
    arts = {a.get("gpuModel"): a for a in st.get("artifacts") or [] if isinstance(a, dict)}
    # Models of the spec first, in its order; then any artifact of a model no longer there.
    order = models + [str(m) for m in arts if m not in models]
    conditions = {c.get("type"): c for c in st.get("conditions") or [] if isinstance(c, dict)}
    history = [h for h in st.get("history") or [] if isinstance(h, dict)]
    pinned = pins.read(meta.get("annotations"))  # what is asked; it differs from what is served
    return {
        "namespace": meta.get("namespace", ""),
        "name": meta.get("name", ""),
        "generation": meta.get("generation"),
        "observedGeneration": st.get("observedGeneration"),
        "phase": st.get("phase") or Phase.PENDING,
        "revision": revision,
        "conditions": [
            {
                "type": t,
                "status": str(conditions.get(t, {}).get("status") or "Unknown"),
                "reason": str(conditions.get(t, {}).get("reason") or ""),
                "message": str(conditions.get(t, {}).get("message") or ""),
                "lastTransitionTime": conditions.get(t, {}).get("lastTransitionTime"),
            }
            for t in CONDITIONS
            # Degraded came with 0.2.0: a status an older operator wrote has none to show;
            # FleetAdoption is there only while it says something.
            if t in conditions or t not in OPTIONAL_TYPES
        ],
        "models": [
            {
                "gpuModel": m,
                "inSpec": m in models,
                "pin": pinned[m].to_dict() if m in pinned else None,
                "artifact": (
                    _artifact(arts[m], model_revision(revision, by_model.get(m)))
                    if m in arts
                    else None
                ),
            }
            for m in order
        ],
        "jobs": [dict(j) for j in st.get("jobs") or [] if isinstance(j, dict)],
        "progress": str(st.get("progress") or ""),
        "unadmittedPods": int(st.get("unadmittedPods") or 0),
        "capture": capture,
        "captureEnabled": bool((spec.get("capture") or {}).get("enabled")),
        "coverage": str(st.get("coverage") or ""),
        "history": {
            "count": len(history),
            "artifacts": [{k: h.get(k) for k in HISTORY_KEYS} for h in history],
        },
        "events": recent_events(events),
    }


def _seconds(value: Any) -> str:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return f"{value:.1f}s" if value < 600 else f"{value / 60:.1f}m"
    return "?"


def _head(art: dict[str, Any]) -> str:
    """The artifact's one-line summary: what its GEMMs came out as."""
    outcomes = art.get("outcomes") or {}
    gemms = art.get("gemms")
    if art.get("kind") == "caches":
        return "caches only (no TunableOp results)"
    if isinstance(outcomes.get("tuned"), int):
        total = gemms if isinstance(gemms, int) else outcomes["tuned"] + outcomes.get("default", 0)
        return f"{outcomes['tuned']}/{total} GEMMs tuned ({outcomes.get('default', 0)} Default)"
    return f"{gemms if gemms is not None else '?'} GEMMs (outcomes not recorded)"


def _artifact_lines(
    entry: dict[str, Any], report: dict[str, Any], now: datetime.datetime
) -> list[str]:
    model, art = entry["gpuModel"], entry["artifact"]
    if art is None:
        return [f"  {model}  no artifact yet (phase {report['phase']})"]
    lines = [f"  {model}  {art['shortSha256']}  {_head(art)}"]
    rows = [["uri", str(art.get("uri") or "?")]]
    counts = [f"{words} {art[key]}" for key, words in COUNTS if isinstance(art.get(key), int)]
    if counts:
        rows.append(["GEMMs", ", ".join(counts)])
    tuned_at = art.get("tunedAt")
    when = f"{tuned_at} ({age(tuned_at, now)} ago)" if tuned_at else "?"
    rows.append(["tuned at", f"{when}, tuning {_seconds(art.get('tuningSeconds'))}"])
    image = art.get("image") or {}
    if image:
        rows.append(
            ["image", f"{image.get('reference') or '?'} (id {image.get('id') or 'unknown'})"]
        )
    rev = art.get("revision") or "?"
    if art["current"]:
        rows.append(["revision", f"{rev} (current)"])
    else:
        rows.append(["revision", f"{rev} (earlier; revision {report['revision'] or '?'} tunes)"])
    if art.get("manifestSha256"):
        rows.append(["manifest", f"sha256 {art['manifestSha256']}"])
    rows += _cache_rows(art)
    rows += _bundle_rows(art)
    if art.get("librarySkipped"):
        rows.append(
            [
                "library",
                f"{art['librarySkipped']} entr(y/ies) skipped: {art.get('librarySkippedReason')}",
            ]
        )
    if art["defaultOnly"]:
        rows.append(
            [
                "note",
                "no GEMM where a kernel beat Default: pods get it only with "
                "spec.serving.serveDefaultOnly",
            ]
        )
    rows += _gain_rows(art) + _pin_rows(entry, report, now)
    if not entry["inSpec"]:
        rows.append(["note", "this GPU model is no longer in spec.gpu.models"])
    return lines + table(rows, indent=4)


def _gain_rows(art: dict[str, Any]) -> list[list[str]]:
    """What the artifact buys, one row per figure, and the promotion gate's verdict on it."""
    rows = []
    gain = Gain.from_dict(art.get("gain"))
    if gain is not None:
        rows += [["gain" if i == 0 else "", g] for i, g in enumerate(gain_lines(gain))]
    promotion = art.get("promotion")
    if isinstance(promotion, dict) and promotion.get("verdict"):
        message = " ".join(str(promotion.get("message") or "").split())
        rows.append(["promotion", f"{promotion['verdict']}" + (f": {message}" if message else "")])
    return rows


def _pin_rows(
    entry: dict[str, Any], report: dict[str, Any], now: datetime.datetime
) -> list[list[str]]:
    """Served because of a pin (and how to undo it), or a pin the annotation asks that is not
    served: the operator has not acted on it yet, or cannot honour it."""
    art, pin = entry["artifact"], entry.get("pin")
    ns, name, model = report["namespace"], report["name"], entry["gpuModel"]
    undo = f"`kubectl tunefleet unpin {name} -n {ns} --gpu-model {model}`"
    rows = []
    pinned = art.get("pinned")
    if isinstance(pinned, dict):
        at = pinned.get("at")
        since = f", since {at} ({age(at, now)} ago)" if at else ""
        rows.append(
            [
                "pinned",
                f"{pinned.get('reason') or 'no reason given'}{since}: {undo} returns to the "
                "newest artifact that passed the gate",
            ]
        )
    if pin and pin.get("sha256") != art.get("sha256"):
        rows.append(
            [
                "pin",
                f"{short(pin['sha256'])} asked ({pin.get('reason') or 'no reason given'}) but "
                "not served: the operator serves a pin once it has seen it, and only an "
                "artifact this model served or keeps in history, of the revision it tunes now; "
                f"{undo} drops it",
            ]
        )
    return rows


def _bundle_rows(art: dict[str, Any]) -> list[list[str]]:
    """oci:// stores: the bundle and volume image by digest, whether signed, and how pods get
    it (docs/oci.md)."""
    bundle = art.get("bundle")
    if not isinstance(bundle, dict) or not bundle.get("digest"):
        return []
    signed = "signed" if bundle.get("signed") else "not signed"
    rows = [["bundle", f"{bundle['digest']} ({signed})"]]
    if bundle.get("volume"):
        rows.append(["volume image", str(bundle["volume"])])
    if art.get("delivery"):
        rows.append(["served by", str(art["delivery"])])
    return rows


def _cache_rows(art: dict[str, Any]) -> list[list[str]]:
    """One row per cache the artifact carries (kind, size, files, digest), and per cache that
    came out empty or failed, with why (docs/bundles.md)."""
    rows = []
    for c in art.get("caches") or []:
        if not isinstance(c, dict):
            continue
        size = c.get("size")
        mib = f"{size / (1 << 20):.1f} MiB" if isinstance(size, int) else "?"
        rows.append(
            [
                f"cache {c.get('name')}",
                f"{c.get('kind')}: {c.get('files')} file(s), {mib} packed, "
                f"sha256 {short(c.get('sha256'))}",
            ]
        )
    for c in art.get("cachesSkipped") or []:
        if isinstance(c, dict):
            rows.append([f"cache {c.get('name')}", f"not served: {c.get('reason')}"])
    return rows


def _cache_load_rows(caches: list[dict[str, Any]]) -> list[list[str]]:
    """status.capture[].caches: how many pods loaded, recompiled, missed each served cache (and
    loaded it empty)."""
    rows = []
    for c in caches:
        said = ", ".join(f"{c.get(p) or 0} {p}" for p in ("loaded", "recompiled", "missed"))
        said += f", {c['empty']} loaded empty" if c.get("empty") else ""
        keys = ", ".join(k[:16] for k in c.get("missedKeys") or [])
        rows.append(
            [
                f"{c.get('kind')} cache",
                f"pods: {said}"
                + (f"; missed keys: {keys}" if keys else "")
                + (f"; {c['message']}" if c.get("message") else ""),
            ]
        )
    return rows


def _capture_lines(report: dict[str, Any], now: datetime.datetime) -> list[str]:
    """Production misses per GPU model (status.capture), when capture is on or has data."""
    entries = report.get("capture") or []
    if not entries and not report.get("captureEnabled"):
        return []
    lines = ["Capture (production misses):"]
    if not entries:
        lines.append("  (nothing captured yet)")
    for e in entries:
        seen, tuned = int(e.get("seen") or 0), int(e.get("tuned") or 0)
        cov = f" ({e['coverage']}%)" if isinstance(e.get("coverage"), int) else ""
        head = f"  {e.get('gpuModel')}  {tuned}/{seen} captured shapes tuned{cov}"
        head += f", {int(e.get('untuned') or 0)} untuned"
        if e.get("lastCapture"):
            head += f"; last capture {age(e['lastCapture'], now)} ago"
        lines.append(head)
        rows = []
        retune = e.get("retune") or {}
        if retune:
            at = retune.get("requestedAt")
            rows.append(
                [
                    "retune",
                    f"{retune.get('state') or '?'}: {retune.get('shapes', '?')} shape(s) "
                    f"({retune.get('reason') or '?'}) under revision {retune.get('revision')}"
                    + (f", {age(at, now)} ago" if at else ""),
                ]
            )
        apart = e.get("apart") or {}
        if apart:
            rows.append(
                [
                    "apart",
                    f"{apart.get('seen', 0)} shape(s) from {apart.get('stores', 0)} other "
                    "identit(y/ies) (another image or artifact): not tuned here",
                ]
            )
        if e.get("notLoadedPods"):
            rows.append(
                [
                    "warning",
                    f"{e['notLoadedPods']} pod(s) recorded GEMMs their artifact has: they did "
                    "not load the results while recording (see docs/capture.md)",
                ]
            )
        rows += _cache_load_rows(e.get("caches") or [])
        if e.get("dropped"):
            rows.append(["dropped", f"{e['dropped']} shape(s) not kept (limits.maxShapes)"])
        if e.get("message"):
            rows.append(["note", str(e["message"])])
        lines += table(rows, indent=4)
    return lines


def _job_lines(jobs: list[dict[str, Any]]) -> list[str]:
    """The current revision's tuning Jobs: model, name, state, why (and shards), message."""
    lines = ["Tuning Jobs:"]
    if not jobs:
        lines.append("  (none for this revision)")
    rows = []
    for j in jobs:
        shards = f"shards {j['shards']}" if j.get("shards") else ""
        why = ", ".join(p for p in (str(j.get("reason") or ""), shards) if p) or "-"
        rows.append(
            [
                str(j.get("gpuModel") or "?"),
                str(j.get("name") or "?"),
                str(j.get("state") or "?"),
                why,
                " ".join(str(j.get("message") or "").split()),
            ]
        )
    return lines + table(rows, indent=2)


def _unadmitted(unadmitted: int, ns: str, name: str) -> str:
    """The count of labelled pods the webhook never saw, and how to find and fix them."""
    if not unadmitted:
        return str(unadmitted)
    return str(unadmitted) + (
        " (created while the webhook was unreachable; they run without the artifact: "
        f"kubectl get pods -n {ns} -l '{naming.PROFILE_LABEL}={name},"
        f"!{ADMISSION_LABEL}', then recreate them)"
    )


def _rejected_lines(history: list[dict[str, Any]]) -> list[str]:
    """The artifacts the promotion gate rejected (kept in history, never served), with why."""
    rows = []
    for h in history:
        if verdict_of(h) != REJECTED:
            continue
        promotion = h["promotion"]
        message = " ".join(str(promotion.get("message") or "no message").split())
        gain = Gain.from_dict(h.get("gain"))
        # The message quotes the figures: stand-in ones are labelled as everywhere else.
        if gain is not None and gain.stand_in and "stand-in" not in message:
            message += " (stand-in)"
        rows.append(
            [
                str(h.get("gpuModel") or "?"),
                short(h.get("sha256")),
                f"revision {h.get('revision') or '?'}",
                message,
            ]
        )
    if not rows:
        return []
    return [
        "Rejected by the promotion gate (kept in history, never served):",
        *table(rows, indent=2),
    ]


def format_status(report: dict[str, Any], now: datetime.datetime | None = None) -> str:
    now = now or datetime.datetime.now(datetime.UTC)
    ns, name = report["namespace"], report["name"]
    gen, observed = report.get("generation"), report.get("observedGeneration")
    head = f"TuningProfile {ns}/{name}: {report['phase']}"
    details = [f"revision {report['revision']}"] if report["revision"] else []
    if gen is not None:
        details.append(f"generation {gen}, observed {observed if observed is not None else '-'}")
    if details:
        head += f" ({'; '.join(details)})"
    lines = [head, "Conditions:"]
    lines += table(
        [[c["type"], c["status"], c["reason"] or "-", c["message"]] for c in report["conditions"]],
        indent=2,
    )
    lines.append("Artifacts:")
    if not report["models"]:
        lines.append("  (no GPU models)")
    for m in report["models"]:
        lines += _artifact_lines(m, report, now)
    lines += _capture_lines(report, now)
    lines += _job_lines(report["jobs"])
    count = report["history"]["count"]
    lines += table(
        [
            ["Progress:", report["progress"] or "-"],
            ["Unadmitted pods:", _unadmitted(report["unadmittedPods"], ns, name)],
            ["History:", f"{count} earlier artifact{'s' if count != 1 else ''}"],
        ]
    )
    lines += _rejected_lines(report["history"]["artifacts"])
    lines.append("Events (newest first):")
    lines += event_lines(report["events"], now)
    return "\n".join(lines) + "\n"
