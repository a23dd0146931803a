"""Small helpers shared by the reports: times, ages, Events, tables."""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Sequence
from typing import Any

from tuner_job.gain import Figure, Gain

EVENT_LIMIT = 10


def parse_time(value: Any) -> datetime.datetime | None:
    """An RFC 3339 timestamp as the API server writes it, or None."""
    if not isinstance(value, str) or not value:
        return None
    try:
        when = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return when if when.tzinfo else when.replace(tzinfo=datetime.UTC)


def age(value: Any, now: datetime.datetime) -> str:
    """How long ago, the way kubectl prints ages: 45s, 3m, 5h, 2d; "?" when unknown."""
    when = parse_time(value)
    if when is None:
        return "?"
    seconds = max(0, int((now - when).total_seconds()))
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 2 * 3600:
        return f"{seconds // 60}m"
    if seconds < 2 * 86400:
        return f"{seconds // 3600}h"
    return f"{seconds // 86400}d"


def event_time(event: dict[str, Any]) -> str:
    """When an Event last happened: core/v1 Events fill one of these, depending on the poster."""
    meta = event.get("metadata") or {}
    for value in (
        event.get("lastTimestamp"),
        (event.get("series") or {}).get("lastObservedTime"),
        event.get("eventTime"),
        event.get("firstTimestamp"),
        meta.get("creationTimestamp"),
    ):
        if isinstance(value, str) and value:
            return value
    return ""


def recent_events(
    events: Iterable[dict[str, Any]], limit: int = EVENT_LIMIT
) -> list[dict[str, Any]]:
    """The newest `limit` Events, newest first, as short dicts (type, reason, message, ...)."""
    epoch = datetime.datetime.min.replace(tzinfo=datetime.UTC)
    ordered = sorted(events, key=lambda e: parse_time(event_time(e)) or epoch, reverse=True)
    out = []
    for ev in ordered[:limit]:
        out.append(
            {
                "type": str(ev.get("type") or ""),
                "reason": str(ev.get("reason") or ""),
                "message": " ".join(str(ev.get("message") or "").split()),
                "count": int(ev.get("count") or 1),
                "time": event_time(ev),
            }
        )
    return out


def event_lines(events: Sequence[dict[str, Any]], now: datetime.datetime) -> list[str]:
    if not events:
        return ["  (none)"]
    rows = []
    for ev in events:
        count = f" (x{ev['count']})" if ev.get("count", 1) > 1 else ""
        rows.append([age(ev.get("time"), now), ev["type"], ev["reason"], ev["message"] + count])
    return table(rows, indent=2)


def table(rows: Sequence[Sequence[str]], indent: int = 0) -> list[str]:
    """Left-aligned columns, two spaces apart; the last column is not padded."""
    if not rows:
        return []
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    out = []
    for r in rows:
        cells = [c.ljust(w) for c, w in zip(r, widths, strict=False)] + [r[-1]]
        out.append((" " * indent + "  ".join(cells)).rstrip())
    return out


def short(sha: Any) -> str:
    return str(sha or "")[:12] or "?"


def figure_text(f: Figure, stand_in: bool) -> str:
    """One figure in full: speed-up with its interval and pairs, the median seconds without and
    with the artifact, and what that saves per run."""
    saved = f.saved_s
    what = f"saves {saved:.4g}s" if saved >= 0 else f"costs {-saved:.4g}s more"
    text = (
        f"{f.name} {f.speedup:.2f}x ({f.low:.2f}-{f.high:.2f}, {f.repetitions} pairs): "
        f"{f.baseline_s:.4g}s -> {f.tuned_s:.4g}s, {what}"
    )
    # Stand-in timings are a test knob's: the label goes on every figure, so no line read on
    # its own passes for a measured gain.
    return text + (" (stand-in)" if stand_in else "")


def speedups(gain: Gain) -> str:
    """The figures in short (speed-up and interval each), as diff sets two artifacts side by
    side; "not measured" when there are none; a failure first, whatever else."""
    if gain.failed is not None:
        return f"{gain.failed.figure} failed with the artifact"
    if not gain.figures:
        return "not measured" + (f": {gain.note}" if gain.note else "")
    text = ", ".join(f"{f.name} {f.speedup:.2f}x ({f.low:.2f}-{f.high:.2f})" for f in gain.figures)
    return text + (" (stand-in)" if gain.stand_in else "")


def gain_lines(gain: Gain) -> list[str]:
    """An artifact's gain in full: a failure with the artifact first, one line per figure,
    then its timing mode and note."""
    failed = [f"{gain.failed.figure} FAILED with the artifact: {gain.failed.cause}"] if (
        gain.failed is not None
    ) else []  # fmt: skip
    if not gain.figures:
        return failed or ["not measured" + (f": {gain.note}" if gain.note else "")]
    lines = failed + [figure_text(f, gain.stand_in) for f in gain.figures]
    if gain.serving is not None:
        lines.append(f"served with/without it: {gain.serving.describe()}")
    if gain.mode != "Eager":
        lines.append(f"GEMMs timed as run under {gain.mode}")
    if gain.note:
        lines.append(f"note: {gain.note}")
    return lines
