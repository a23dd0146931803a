"""A pin: serve this artifact of a GPU model, not the newest that passed the gate. An annotation
on the profile, written by `kubectl tunefleet rollback` and removed by `unpin`
(plugin/rollback_cmd.py), read by the reconciler (status.py) when it chooses what to serve.

An annotation, not a spec field: a pin changes what is served, never what is tuned, so it must
not bump the generation or the revision. The value is JSON, one entry per GPU model:
``{"<gpu model>": {"sha256": "<64 hex>", "reason": "...", "at": "<RFC 3339>"}}``. What cannot
be read is dropped entry by entry (a hand-edited or forged value pins nothing it does not
say); the reconciler honours a pin only when the artifact is one the profile served or keeps
in its history, of the revision its model tunes now.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

ANNOTATION = "tunefleet.io/pin"
REASON_LIMIT = 200
_SHA = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class Pin:
    gpu_model: str
    sha256: str
    reason: str = ""
    at: str = ""

    def to_dict(self) -> dict[str, str]:
        return {"sha256": self.sha256, "reason": self.reason, "at": self.at}


def read(annotations: Mapping[str, Any] | None) -> dict[str, Pin]:
    """The pins by GPU model; {} without the annotation or when it is not JSON."""
    raw = (annotations or {}).get(ANNOTATION)
    if not isinstance(raw, str):
        return {}
    try:
        doc = json.loads(raw)
    except ValueError:
        return {}
    if not isinstance(doc, dict):
        return {}
    pins: dict[str, Pin] = {}
    for model, entry in doc.items():
        if not isinstance(entry, dict) or not isinstance(entry.get("sha256"), str):
            continue
        if not _SHA.match(entry["sha256"]):
            continue
        reason, at = entry.get("reason"), entry.get("at")
        pins[str(model)] = Pin(
            str(model),
            entry["sha256"],
            reason[:REASON_LIMIT] if isinstance(reason, str) else "",
            at[:40] if isinstance(at, str) else "",
        )
    return pins


def value(pins: Mapping[str, Pin]) -> str | None:
    """The annotation's value for these pins; None (remove it) when there are none."""
    if not pins:
        return None
    return json.dumps({m: p.to_dict() for m, p in sorted(pins.items())}, sort_keys=True)


def patch(pins: Mapping[str, Pin]) -> dict[str, Any]:
    """The merge patch that sets these pins (metadata only: no new generation)."""
    return {"metadata": {"annotations": {ANNOTATION: value(pins)}}}


def pinned(current: Mapping[str, Pin], pin: Pin) -> dict[str, Pin]:
    """current with `pin` added (replacing its model's)."""
    return {**current, pin.gpu_model: pin}


def unpinned(current: Mapping[str, Pin], gpu_model: str = "") -> dict[str, Pin]:
    """current without the pin of gpu_model ("": without any)."""
    return {m: p for m, p in current.items() if gpu_model and m != gpu_model}


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
