"""The fetch init container's outcome: one line on its stream and as its termination message
(a fail-open start exits 0, where FallbackToLogsOnError would record nothing, so `kubectl
describe pod` still shows why the pod runs untuned). Written by artifacts/fetch.py, read by
`kubectl tunefleet why`.

A pod whose GPU model is known only where it lands gets its candidates on fetch's command
line (`--candidate`, a `Candidate` each, written by the webhook); the outcome then names the
model fetch picked and the node it picked it on: "... (GPU model M, node N)".
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

PROG = "tunefleet-fetch"
CONTAINER = "tunefleet-fetch"  # the init container's name in a model pod
LOADED, UNTUNED, REFUSED = "loaded", "untuned", "refused"
_UNTUNED_WORDS = "starting untuned:"
_REFUSED_WORDS = "refusing to start:"
# "with 412 GEMMs (400 tuned, 12 Default)": tuned and Default counted as status counts them
# (count_outcomes); fetch before that wrote "with 412 tuned GEMMs", counting every row.
_LOADED_RE = re.compile(
    r"wrote (?P<files>\d+) results file\(s\) with (?P<gemms>\d+) "
    r"(?:GEMMs \((?P<tuned>\d+) tuned, (?P<default>\d+) Default\)|tuned GEMMs) "
    r"\(sha256 (?P<sha>[0-9a-f]+)\) to (?P<dest>\S+)"
    r"(?: \(GPU model (?P<model>[^\s,()]+), node (?P<node>[^\s,()]+)\))?"
)
# "; caches a,b unpacked to DIR" or "; caches not served: why" after a loaded line whose
# artifact carries caches (artifacts/bundle.py).
_CACHES_RE = re.compile(r"; caches (?P<names>[a-z0-9,-]+) unpacked to (?P<dir>\S+)")
_CACHES_FAILED_RE = re.compile(r"; caches not served: (?P<why>.*)$")
# "... (GPU model M, node N)" after the reason of a pod whose model was picked at its node.
_PICKED_RE = re.compile(r" \(GPU model (?P<model>[^\s,()]+), node (?P<node>[^\s,()]+)\)$")


@dataclass(frozen=True)
class FetchOutcome:
    verdict: str  # LOADED, UNTUNED (fail open) or REFUSED (fail closed)
    reason: str = ""  # why not loaded
    files: int = 0
    gemms: int = 0
    sha256: str = ""
    dest: str = ""
    tuned: int | None = None  # GEMMs where a kernel other than Default won
    default: int | None = None  # GEMMs where Default won or was the only candidate
    # Picked where the pod landed (several candidates): the model and the node.
    gpu_model: str = ""
    node: str = ""
    caches: tuple[str, ...] = ()  # the caches unpacked, by name
    caches_dest: str = ""
    caches_failed: str = ""  # why the artifact's caches were not served (the results were)

    def _picked(self) -> str:
        return f" (GPU model {self.gpu_model}, node {self.node})" if self.gpu_model else ""

    def _caches(self) -> str:
        if self.caches:
            return f"; caches {','.join(self.caches)} unpacked to {self.caches_dest}"
        if self.caches_failed:
            return f"; caches not served: {self.caches_failed}"
        return ""

    def line(self) -> str:
        if self.verdict == LOADED:
            tuned, default = self.tuned or 0, self.default or 0
            return (
                f"{PROG}: wrote {self.files} results file(s) with {self.gemms} GEMMs "
                f"({tuned} tuned, {default} Default) (sha256 {self.sha256}) to {self.dest}"
                + self._picked()
                + self._caches()
            )
        words = _REFUSED_WORDS if self.verdict == REFUSED else _UNTUNED_WORDS
        return f"{PROG}: {words} {self.reason}{self._picked()}"

    @classmethod
    def parse(cls, message: str | None) -> FetchOutcome | None:
        text = " ".join((message or "").split())
        for words, verdict in ((_REFUSED_WORDS, REFUSED), (_UNTUNED_WORDS, UNTUNED)):
            if words in text:
                reason = text.split(words, 1)[1].strip()
                picked = _PICKED_RE.search(reason)
                if picked:
                    return cls(
                        verdict,
                        reason=reason[: picked.start()],
                        gpu_model=picked["model"],
                        node=picked["node"],
                    )
                return cls(verdict, reason=reason)
        m = _LOADED_RE.search(text)
        if m:
            caches = _CACHES_RE.search(text)
            failed = _CACHES_FAILED_RE.search(text)
            return cls(
                LOADED,
                caches=tuple(caches["names"].split(",")) if caches else (),
                caches_dest=caches["dir"] if caches else "",
                caches_failed=failed["why"] if failed else "",
                files=int(m["files"]),
                gemms=int(m["gemms"]),
                sha256=m["sha"],
                dest=m["dest"],
                tuned=int(m["tuned"]) if m["tuned"] is not None else None,
                default=int(m["default"]) if m["default"] is not None else None,
                gpu_model=m["model"] or "",
                node=m["node"] or "",
            )
        return None


@dataclass(frozen=True)
class Candidate:
    """One GPU model a pod may land on, as the webhook offers it to fetch (`--candidate`):
    its pinned artifact, or why the pod starts untuned there (`untuned`, refusing to start
    instead when `fail_closed`)."""

    gpu_model: str
    uri: str = ""
    sha256: str = ""
    manifest_sha256: str = ""
    untuned: str = ""
    fail_closed: bool = False
    bundle: str = ""  # an oci:// store's bundle digest (artifacts/ocibundle.py)

    def to_arg(self) -> str:
        raw: dict[str, Any] = {"gpuModel": self.gpu_model}
        if self.untuned:
            raw["untuned"] = self.untuned
            raw["failClosed"] = self.fail_closed
        else:
            raw.update(uri=self.uri, sha256=self.sha256)
            if self.manifest_sha256:
                raw["manifestSha256"] = self.manifest_sha256
            if self.bundle:
                raw["bundle"] = self.bundle
        return json.dumps(raw, separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_arg(cls, text: str) -> Candidate:
        """ValueError on anything but what to_arg writes."""
        try:
            raw = json.loads(text)
        except ValueError:
            raise ValueError(f"--candidate is not JSON: {text[:200]!r}") from None
        if not isinstance(raw, dict) or not isinstance(raw.get("gpuModel"), str):
            raise ValueError(f"--candidate needs a gpuModel: {text[:200]!r}")
        untuned = str(raw.get("untuned") or "")
        if not untuned and not (raw.get("uri") and raw.get("sha256")):
            raise ValueError(f"--candidate needs uri and sha256, or untuned: {text[:200]!r}")
        return cls(
            gpu_model=raw["gpuModel"],
            uri=str(raw.get("uri") or ""),
            sha256=str(raw.get("sha256") or ""),
            manifest_sha256=str(raw.get("manifestSha256") or ""),
            bundle=str(raw.get("bundle") or ""),
            untuned=untuned,
            fail_closed=bool(raw.get("failClosed")),
        )
