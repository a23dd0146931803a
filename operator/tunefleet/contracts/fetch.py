"""The fetch init container's outcome: one line on its stream and as its termination message
(a fail-open start exits 0, where FallbackToLogsOnError would record nothing, so `kubectl
describe pod` still shows why the pod runs untuned). Written by artifacts/fetch.py, read by
`kubectl tunefleet why`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

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
)


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

    def line(self) -> str:
        if self.verdict == LOADED:
            tuned, default = self.tuned or 0, self.default or 0
            return (
                f"{PROG}: wrote {self.files} results file(s) with {self.gemms} GEMMs "
                f"({tuned} tuned, {default} Default) (sha256 {self.sha256}) to {self.dest}"
            )
        words = _REFUSED_WORDS if self.verdict == REFUSED else _UNTUNED_WORDS
        return f"{PROG}: {words} {self.reason}"

    @classmethod
    def parse(cls, message: str | None) -> FetchOutcome | None:
        text = " ".join((message or "").split())
        for words, verdict in ((_REFUSED_WORDS, REFUSED), (_UNTUNED_WORDS, UNTUNED)):
            if words in text:
                return cls(verdict, reason=text.split(words, 1)[1].strip())
        m = _LOADED_RE.search(text)
        if m:
            return cls(
                LOADED,
                files=int(m["files"]),
                gemms=int(m["gemms"]),
                sha256=m["sha"],
                dest=m["dest"],
                tuned=int(m["tuned"]) if m["tuned"] is not None else None,
                default=int(m["default"]) if m["default"] is not None else None,
            )
        return None
