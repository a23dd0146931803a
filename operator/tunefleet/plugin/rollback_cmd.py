"""`kubectl tunefleet rollback` and `unpin`: serve an earlier artifact of a GPU model instead of
the newest that passed the promotion gate, and undo that. Both only write the pin annotation
(contracts/pin.py, its one owner); the operator acts on it (status.py).

The choice is pure (`choose`, `unpin_request`: a profile in, a report out, PluginError for a
refusal) so it is tested without an API server; main.py reads and patches.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from tunefleet.capture.loop import model_revision
from tunefleet.contracts import pin as pins
from tunefleet.contracts.artifact_record import REJECTED, verdict_of
from tuner_job.gain import Gain

from .errors import PluginError
from .report_parts import gain_lines, short

DEFAULT_REASON = "rollback by kubectl tunefleet"
MIN_PREFIX = 7  # as git's short hashes: long enough that a typo matches nothing
_PREFIX = re.compile(rf"^[0-9a-f]{{{MIN_PREFIX},64}}$")


def sha_prefix(text: str) -> str:
    """--to's value, lower-cased; ValueError unless 7 to 64 hex digits."""
    prefix = text.strip().lower()
    if not _PREFIX.match(prefix):
        raise ValueError(f"want a SHA-256 or a prefix of {MIN_PREFIX}+ hex digits, got {text!r}")
    return prefix


def _names(profile: dict[str, Any]) -> tuple[str, str]:
    meta = profile.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def _served(profile: dict[str, Any], gpu_model: str) -> dict[str, Any]:
    """The model's served artifact; the model may be left out when only one is served."""
    ns, name = _names(profile)
    arts = {
        str(a.get("gpuModel")): a
        for a in (profile.get("status") or {}).get("artifacts") or []
        if isinstance(a, dict) and isinstance(a.get("sha256"), str)
    }
    if not arts:
        raise PluginError(
            f"TuningProfile {ns}/{name} serves no artifact yet: there is nothing to roll back "
            f"from; `kubectl tunefleet status {name} -n {ns}` shows why"
        )
    if not gpu_model:
        if len(arts) > 1:
            raise PluginError(
                f"TuningProfile {ns}/{name} serves several GPU models: name one with "
                f"--gpu-model ({', '.join(sorted(arts))})"
            )
        gpu_model = next(iter(arts))
    if gpu_model not in arts:
        raise PluginError(
            f"TuningProfile {ns}/{name} serves no artifact for GPU model {gpu_model!r}: use one "
            f"of {', '.join(sorted(arts))}"
        )
    return arts[gpu_model]


def _revisions(profile: dict[str, Any], model: str) -> set[str]:
    """The revisions a pin may name (the operator's rule, promotion.py): the one the model tunes
    now (a retune's, else the spec's) and the spec's; an artifact of an older spec may not fit
    the image served now."""
    st = profile.get("status") or {}
    base = str(st.get("revision") or "")
    capture = {str(e.get("gpuModel")): e for e in st.get("capture") or [] if isinstance(e, dict)}
    return {r for r in (base, model_revision(base, capture.get(model))) if r}


def _entries(profile: dict[str, Any], served: dict[str, Any]) -> list[dict[str, Any]]:
    """The served artifact, then the model's history, newest first."""
    model = served.get("gpuModel")
    history = (profile.get("status") or {}).get("history") or []
    return [served] + [
        h
        for h in history
        if isinstance(h, dict) and h.get("gpuModel") == model and isinstance(h.get("sha256"), str)
    ]


def _by_prefix(entries: Sequence[dict[str, Any]], prefix: str, allowed: set[str]) -> dict[str, Any]:
    """The one artifact whose SHA-256 starts with prefix. An artifact kept twice (served and in
    history, or under two revisions) counts once: its entry of a revision a pin may name
    first (the operator picks the same one)."""
    matches = [e for e in entries if str(e["sha256"]).startswith(prefix)]
    shas = sorted({str(e["sha256"]) for e in matches})
    model = entries[0].get("gpuModel")
    if not shas:
        raise PluginError(
            f"no artifact of {model} in status.artifacts or status.history has a SHA-256 "
            f"starting {prefix}: `kubectl tunefleet status` lists them (-o json for full SHAs)"
        )
    if len(shas) > 1:
        raise PluginError(
            f"{prefix} matches {len(shas)} artifacts of {model} "
            f"({', '.join(short(s) for s in shas)}): give more of the SHA-256"
        )
    matches.sort(key=lambda e: (e.get("revision") not in allowed, verdict_of(e) == REJECTED))
    return matches[0]


def _newest_other(entries: Sequence[dict[str, Any]], allowed: set[str]) -> dict[str, Any]:
    """The newest history entry of a revision the model may be pinned to, not the served
    artifact, that the gate did not reject."""
    served = entries[0]
    history = [e for e in entries[1:] if e["sha256"] != served["sha256"]]
    same = [e for e in history if e.get("revision") in allowed]
    fit = [e for e in same if verdict_of(e) != REJECTED]
    if fit:
        return fit[0]
    model, rev = served.get("gpuModel"), " or ".join(sorted(allowed)) or "?"
    rejected = len(same) - len(fit)
    raise PluginError(
        f"status.history keeps no earlier artifact of {model} of revision {rev} that passed the "
        f"gate ({len(history)} other artifact(s) kept: {len(history) - len(same)} of another "
        f"revision, {rejected} rejected): nothing to roll back to"
        + (": name a rejected one with --to SHA --force to serve it anyway" if rejected else "")
    )


def _check_target(
    target: dict[str, Any], served: dict[str, Any], force: bool, allowed: set[str]
) -> None:
    sha, model = short(target.get("sha256")), served.get("gpuModel")
    if (target["sha256"], target.get("revision")) == (served["sha256"], served.get("revision")):
        how = " (pinned)" if served.get("pinned") else ""
        raise PluginError(
            f"artifact {sha} is already served for {model}{how}: nothing to roll back; "
            "`kubectl tunefleet unpin` returns to the newest artifact that passed the gate"
        )
    if target.get("revision") not in allowed:
        raise PluginError(
            f"artifact {sha} is of revision {target.get('revision') or '?'}, not of revision "
            f"{' or '.join(sorted(allowed)) or '?'} that {model} tunes now: a rollback only "
            "serves an artifact of the same revision (an artifact tuned for another spec may not "
            "fit the image now served); roll the spec back to tune for that one"
        )
    if verdict_of(target) == REJECTED and not force:
        message = (target.get("promotion") or {}).get("message") or "no message"
        raise PluginError(
            f"artifact {sha} failed the promotion gate ({message}) and was never served: "
            "pass --force to serve it anyway"
        )


def choose(
    profile: dict[str, Any], gpu_model: str = "", to: str = "", force: bool = False
) -> dict[str, Any]:
    """The artifact a rollback pins, checked, as the report (the `-o json` form); PluginError
    with what to do when there is none to pin."""
    served = _served(profile, gpu_model)
    allowed = _revisions(profile, str(served.get("gpuModel")))
    entries = _entries(profile, served)
    target = _by_prefix(entries, to, allowed) if to else None
    target = target or _newest_other(entries, allowed)
    _check_target(target, served, force, allowed)
    ns, name = _names(profile)
    annotations = (profile.get("metadata") or {}).get("annotations")
    replaced = pins.read(annotations).get(str(served.get("gpuModel")))
    return {
        "namespace": ns,
        "name": name,
        "gpuModel": str(served.get("gpuModel")),
        "served": _about(served),
        "target": _about(target),
        "forced": verdict_of(target) == REJECTED,
        "replacedPin": replaced.to_dict() if replaced else None,
    }


def _about(entry: dict[str, Any]) -> dict[str, Any]:
    keys = ("sha256", "uri", "revision", "tunedAt", "gain", "promotion", "pinned")
    return {k: entry.get(k) for k in keys}


def rollback_pins(
    profile: dict[str, Any], report: dict[str, Any], reason: str, at: str
) -> dict[str, pins.Pin]:
    """The profile's pins with the report's target pinned for its model."""
    annotations = (profile.get("metadata") or {}).get("annotations")
    pin = pins.Pin(report["gpuModel"], report["target"]["sha256"], reason or DEFAULT_REASON, at)
    return pins.pinned(pins.read(annotations), pin)


def format_rollback(report: dict[str, Any]) -> str:
    """report: choose's, with "pin" (what was written) added."""
    ns, name, model = report["namespace"], report["name"], report["gpuModel"]
    target, served, pin = report["target"], report["served"], report["pin"]
    lines = [
        f"Pinned {model} of TuningProfile {ns}/{name} to artifact {short(target['sha256'])} "
        f"(revision {target.get('revision') or '?'}, tuned at {target.get('tunedAt') or '?'}), "
        f"instead of {short(served['sha256'])}.",
        f"  reason: {pin['reason']}",
    ]
    gain = Gain.from_dict(target.get("gain"))
    lines += [f"  gain:   {g}" for g in (gain_lines(gain) if gain is not None else [])]
    promotion = target.get("promotion") or {}
    if promotion.get("verdict"):
        lines.append(f"  gate:   {promotion['verdict']}: {promotion.get('message') or '-'}")
    if report["forced"]:
        lines.append("  note:   it failed the promotion gate: served because of --force")
    old = report.get("replacedPin")
    if old:
        lines.append(f"  note:   replaces the pin of {short(old['sha256'])} ({old['reason']})")
    lines += [
        "The operator serves it to pods admitted from now on; running pods keep the artifact "
        "they started with until they are recreated.",
        f"`kubectl tunefleet unpin {name} -n {ns}` returns to the newest artifact that passed the "
        "gate.",
        f"Follow it with: kubectl tunefleet status -n {ns} {name}",
    ]
    return "\n".join(lines) + "\n"


def unpin_request(
    profile: dict[str, Any], gpu_model: str = ""
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The report and the merge patch that removes the model's pin (every pin without a model);
    no patch when there is nothing to remove."""
    ns, name = _names(profile)
    annotations = (profile.get("metadata") or {}).get("annotations") or {}
    current = pins.read(annotations)
    removed = {m: p for m, p in current.items() if not gpu_model or m == gpu_model}
    report = {
        "namespace": ns,
        "name": name,
        "gpuModel": gpu_model,
        "unpinned": {m: p.to_dict() for m, p in sorted(removed.items())},
        "kept": sorted(m for m in current if m not in removed),
        # An annotation that pins nothing readable (hand-edited): removed with the rest, as a
        # leftover would only confuse whoever reads the profile next.
        "unreadable": pins.ANNOTATION in annotations and not current and not gpu_model,
    }
    if not removed and not report["unreadable"]:
        return report, None
    return report, pins.patch(pins.unpinned(current, gpu_model))


def format_unpin(report: dict[str, Any]) -> str:
    ns, name = report["namespace"], report["name"]
    lines = []
    for model, pin in report["unpinned"].items():
        lines.append(
            f"Unpinned {model} of TuningProfile {ns}/{name} (was {short(pin['sha256'])}: "
            f"{pin['reason'] or 'no reason given'}, since {pin['at'] or '?'})."
        )
    if report["unreadable"]:
        lines.append(f"Removed annotation {pins.ANNOTATION}: it pinned nothing readable.")
    if not lines:
        what = f" for {report['gpuModel']}" if report["gpuModel"] else ""
        return f"Nothing is pinned{what} on TuningProfile {ns}/{name}: nothing to do.\n"
    if report["kept"]:
        lines.append(f"Still pinned: {', '.join(report['kept'])}.")
    lines += [
        "The operator serves the newest artifact that passed the gate again, to pods admitted "
        "from now on.",
        f"Follow it with: kubectl tunefleet status -n {ns} {name}",
    ]
    return "\n".join(lines) + "\n"
