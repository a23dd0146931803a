"""Whether a store honours the conditional writes claims rest on (issue 54), asked once per
store and remembered for the process.

A claim (claims.py) is only as good as the store's If-None-Match and If-Match: an S3-compatible
server that accepts the headers and ignores them lets two clusters both "win" one claim, and
both tune. So before fleet mode takes its first claim through a store (an endpoint and a
bucket), reconciler/apply.py (`probe`, where every store write of a reconcile is) writes a
probe object at `<prefix>/_fleet/.probe/<random>` with the very calls claims make:

1. create it (If-None-Match: *): must succeed;
2. create it again: must be refused (412), and the object must still be the first;
3. replace it on the version read (If-Match, the tag read_tagged gave): must succeed;
4. replace it again on that (now stale) version: must be refused, and change nothing;

then deletes it. A store that fails a step is refused: fleet mode does not coordinate through
it (its profiles neither adopt nor claim there, and tune their own), and says so. A store
error (the network, a refusal for rights) is no verdict: it is probed again on the next pass.
Each verdict is trusted for a while (HONOURED_TTL_S, IGNORED_TTL_S), then asked again: a
server may be upgraded, or replaced under its name.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

CONTENT_TYPE = "application/json"
HONOURED_TTL_S = 6 * 3600.0  # a store that honoured every step is probed again after this
IGNORED_TTL_S = 3600.0  # one that failed a step (a fixed or replaced server is seen sooner)
# The probe object's versions, in the order the steps write them.
VERSIONS = (b'{"probe":1}', b'{"probe":2}', b'{"probe":3}', b'{"probe":4}')

# What a store did wrong, by step (the words a refusal gives).
REFUSED_CREATE = "it refused to create an object where none was (PutObject with If-None-Match: *)"
IGNORED_IF_NONE_MATCH = (
    "it let a second create of one key through (it ignores If-None-Match: *, so two clusters "
    "could both create one claim)"
)
REFUSED_IF_MATCH = (
    "it refused to replace the very version read (If-Match with the ETag it gave), so no claim "
    "could be renewed, released or taken over"
)
IGNORED_IF_MATCH = (
    "it let a replace of a version that was no longer there through (it ignores If-Match, so "
    "two clusters could both take over one claim)"
)


def store_key(scheme: str, bucket: str, endpoint: str) -> str:
    """A store as the verdicts are kept: its endpoint and bucket (every prefix in it)."""
    return f"{endpoint}|{scheme}://{bucket}"


def store_words(uri: str, endpoint: str) -> str:
    """A store as a message names it: its URI and endpoint."""
    return f"{uri} at {endpoint}" if endpoint else f"{uri} (the default endpoint)"


@dataclass(frozen=True)
class Verdict:
    """What a probe found of a store: `fault` is "" when it honoured every step, else what it
    did wrong; `at` is when (time.monotonic())."""

    store: str  # in words (store_words)
    fault: str
    at: float

    @property
    def honours(self) -> bool:
        return not self.fault

    def fresh(self, now: float) -> bool:
        return now - self.at < (HONOURED_TTL_S if self.honours else IGNORED_TTL_S)

    @property
    def mark(self) -> str:
        """This verdict, as a profile remembers having said it (once per verdict)."""
        return f"{self.store}@{self.at}"

    def refusal(self) -> str:
        """Why fleet mode does not coordinate through the store, and what to do."""
        return (
            f"fleet mode does not coordinate through {self.store}: probing its conditional "
            f"writes, {self.fault}. Profiles on it neither adopt nor claim there: each tunes "
            "its own. Use a store that honours If-None-Match and If-Match on PutObject (AWS S3 "
            "does), or turn fleet mode off (fleet.enabled: false); the store is probed again "
            "within the hour (docs/fleet.md)"
        )


class Probes:
    """The verdicts of this process, by store (store_key), and one lock per store, held while
    it is probed: of the reconciles that find one store unprobed at once, one probes and the
    others take its verdict."""

    def __init__(self) -> None:
        self._verdicts: dict[str, Verdict] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    def verdict(self, key: str, now: float) -> Verdict | None:
        """The store's verdict while it is fresh; None when it must be probed."""
        found = self._verdicts.get(key)
        return found if found is not None and found.fresh(now) else None

    def record(self, key: str, verdict: Verdict) -> None:
        self._verdicts[key] = verdict

    def lock(self, key: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(key, threading.Lock())
