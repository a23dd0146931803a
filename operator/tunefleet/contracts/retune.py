"""Requests to retune a profile now, from its captured misses: an annotation on the profile.

Written by `kubectl tunefleet retune` (plugin/retune_cmd.py), read by the reconciler
(capture/loop.py). The value is JSON, one nonce per GPU model: ``{"<gpu model>": "<nonce>"}``.
A new nonce under a model is a new request for it; the reconciler records the nonce it acted
on per GPU model (status.capture[].retune.nonce), so a request is acted on once however often
the profile is reconciled, and a second request with the same nonce changes nothing. A retune
of every model writes its nonce under each.

One entry per model, not one value, so that two retunes of different models asked at once
both land: the plugin reads the annotation, adds its model's entry to the others and writes
it fenced by the resourceVersion it read (plugin/cluster.py update_profile, which reads and
merges again on a conflict). With one value, the later write dropped the other's request.

The value before, ``<nonce>[;<gpu model>]``, is still read (a request written by an older
plugin): without a model it asks every model. What cannot be read is dropped entry by entry.
"""

from __future__ import annotations

import json
import re
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

ANNOTATION = "tunefleet.io/retune"
_NONCE = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
_MODEL_LIMIT = 63  # a label value


def new_nonce() -> str:
    return f"{int(time.time())}-{secrets.token_hex(4)}"


@dataclass(frozen=True)
class RetuneRequest:
    """One request: a nonce, for one GPU model or (in the value before) every model."""

    nonce: str
    gpu_model: str = ""  # "": every model

    def applies_to(self, model: str) -> bool:
        return not self.gpu_model or self.gpu_model == model


@dataclass(frozen=True)
class Retunes:
    """What the annotation asks: a request per GPU model (and, read from the value before,
    perhaps one of every model)."""

    requests: tuple[RetuneRequest, ...] = ()

    def nonce_for(self, model: str) -> str:
        """The nonce asked of `model` ("" for none): its own entry, else one of every model."""
        own = [r.nonce for r in self.requests if r.gpu_model == model]
        every = [r.nonce for r in self.requests if not r.gpu_model]
        return (own or every or [""])[0]

    def asking(self, nonce: str, asked: Sequence[str], models: Sequence[str]) -> Retunes:
        """These requests and `nonce` of each model in `asked`, one entry per model of the
        profile's `models` (a request of every model spelled out per model; a model the
        profile no longer tunes dropped)."""
        kept = {m: self.nonce_for(m) for m in models}
        kept.update({m: nonce for m in asked})
        return Retunes(tuple(RetuneRequest(n, m) for m, n in sorted(kept.items()) if n))

    def value(self) -> str:
        doc = {r.gpu_model: r.nonce for r in self.requests if r.gpu_model}
        return json.dumps(doc, sort_keys=True, separators=(",", ":"))

    def patch(self) -> dict[str, Any]:
        """The merge patch that asks for them (metadata only: no new generation)."""
        return {"metadata": {"annotations": {ANNOTATION: self.value()}}}

    @classmethod
    def read(cls, profile: dict[str, Any]) -> Retunes:
        """The requests on a profile (none when absent or malformed: nothing is asked)."""
        raw = ((profile.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION)
        if not isinstance(raw, str):
            return cls()
        try:
            doc = json.loads(raw) if raw.lstrip().startswith("{") else None
        except ValueError:
            return cls()
        if doc is None:
            nonce, _, model = raw.strip().partition(";")  # the value before
            pairs = [(model, nonce)]
        else:
            pairs = [(m, n) for m, n in doc.items() if m] if isinstance(doc, dict) else []
        return cls(tuple(RetuneRequest(n, m) for m, n in pairs if _valid(n, m)))


def _valid(nonce: Any, model: Any) -> bool:
    return (
        isinstance(nonce, str)
        and isinstance(model, str)
        and bool(_NONCE.match(nonce))
        and len(model) <= _MODEL_LIMIT
    )
