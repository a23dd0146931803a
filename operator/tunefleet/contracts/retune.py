"""A request to retune a profile now, from its captured misses: an annotation on the profile.

Written by `kubectl tunefleet retune` (plugin/retune_cmd.py), read by the reconciler
(capture/loop.py). The value is ``<nonce>[;<gpu model>]``: a new nonce is a new request; the
reconciler records the nonce it acted on per GPU model (status.capture[].retune.nonce), so a
request is acted on once however often the profile is reconciled, and a second request with
the same nonce changes nothing. Without a model, every GPU model of the profile is asked.
"""

from __future__ import annotations

import re
import secrets
import time
from dataclasses import dataclass
from typing import Any

ANNOTATION = "tunefleet.io/retune"
_NONCE = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


@dataclass(frozen=True)
class RetuneRequest:
    nonce: str
    gpu_model: str = ""  # "": every model

    def applies_to(self, model: str) -> bool:
        return not self.gpu_model or self.gpu_model == model

    def value(self) -> str:
        return f"{self.nonce};{self.gpu_model}" if self.gpu_model else self.nonce

    def patch(self) -> dict[str, Any]:
        """The merge patch that asks for it (metadata only: no new generation)."""
        return {"metadata": {"annotations": {ANNOTATION: self.value()}}}

    @classmethod
    def new(cls, gpu_model: str = "") -> RetuneRequest:
        return cls(f"{int(time.time())}-{secrets.token_hex(4)}", gpu_model)

    @classmethod
    def read(cls, profile: dict[str, Any]) -> RetuneRequest | None:
        """The request on a profile, or None (absent or malformed: nothing is asked)."""
        raw = ((profile.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION)
        if not isinstance(raw, str):
            return None
        nonce, _, model = raw.strip().partition(";")
        if not _NONCE.match(nonce) or len(model) > 63:
            return None
        return cls(nonce, model)
