"""What the parts of tunefleet-gc share: the command's name, its errors (one line each, saying
what to fix), the store's URI as the report names it, durations as a setting is written, and
how many store requests run at once.
"""

from __future__ import annotations

import re

from tunefleet.storage.store import Location

PROG = "tunefleet-gc"
WORKERS = 8  # concurrent store requests (reads of entries, deletions of groups)
SHA_RE = re.compile(r"^[0-9a-f]{64}$")


class GcError(Exception):
    """An expected failure: one line saying what happened and what to fix (exit 1)."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(message.split()))


class UsageError(GcError):
    """A bad argument (exit 2)."""


def store_uri(location: Location) -> str:
    """The store's own URI, prefix included (Location.uri() alone is the bucket's)."""
    return location.uri(location.prefix)


# A setting (duration_text) and an age (report.age_text) are written in the same units.
UNITS = (("d", 86400), ("h", 3600), ("m", 60))


def duration_text(seconds: float) -> str:
    """A setting, exactly: 6h, 90s."""
    for unit, scale in UNITS:
        if seconds >= scale and seconds % scale == 0:
            return f"{seconds / scale:.0f}{unit}"
    return f"{seconds:g}s"
