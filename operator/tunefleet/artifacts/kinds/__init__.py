"""Which kind of artifact a manifest describes: one table, by name.

An artifact is one payload (a file, in the store next to manifest.json, and in the artifact's
ConfigMap) and its manifest, and, beside them, any cache archives the manifest lists
(artifacts/bundle.py; tuner_job/caches.py owns their format). What the payload is, how it is
checked against its manifest and its GPU model, and how a serving container is made to load
it, depends on its kind: those callers (fetch, publish, merge, delivery, the webhook's
builders) ask the kind, never the format itself. Kinds are imported when first used; the
manifest's ``kind`` field names one (absent means ``tunableop``):

  tunableop  TunableOp results (results.csv), with or without caches beside them
  caches     caches alone: the payload is the index (caches.json) that pins every archive

Left alone, as TunableOp's own: merge's row-level sharding (a profile with caches is not
sharded), the GEMM library and its sync and gc, capture (misses TunableOp records).

Imports neither builders/ nor the CLIs (fetch, publish, merge), which all import this.
"""

from __future__ import annotations

from typing import Any, Protocol

from tunefleet.artifacts import fit
from tuner_job.manifest import DEFAULT_KIND, Manifest
from tuner_job.results import Outcomes

KINDS = ("tunableop", "caches")
DEFAULT = DEFAULT_KIND

# What a kind's parse returns: its own form of the payload, handed back to the same kind only
# (callers never look inside), so each kind has its own type and the table stays untyped here.
Parsed = Any


class ArtifactKind(Protocol):
    NAME: str  # as the manifest's kind field says it
    PAYLOAD: str  # its name in the output directory, the store and the ConfigMap (+".gz" packed)
    CONTENT_TYPE: str  # the payload's, in the store
    MOUNT_DIR: str  # where a serving container finds the device files
    FILES: str  # the device files under a directory, as one name: %d is the GPU ordinal
    FormatError: type[Exception]  # what parse raises for a payload that is not of the kind

    def parse(self, payload: bytes, source: str, *, require_rows: bool) -> Parsed:
        """The payload read as its consumer reads it; FormatError, naming `source`, for what
        the consumer would refuse whole (and, with require_rows, for one holding nothing)."""
        ...

    def noncanonical(self, parsed: Parsed, source: str) -> str | None:
        """Why these bytes are not what a tuner writes (parts the consumer would skip or read
        twice), or None: only canonical payloads are published and served."""
        ...

    def disagreements(self, parsed: Parsed, manifest: Manifest) -> list[str]:
        """Where the payload and the manifest that describes it disagree (its SHA-256 and names
        aside: the callers check those); empty when they agree."""
        ...

    def outcomes(self, parsed: Parsed) -> Outcomes:
        """What fetch's outcome line and the status count: tuned and Default GEMMs."""
        ...

    def refusals(self, parsed: Parsed, manifest: Manifest, target: fit.Target) -> list[str]:
        """Why it must not be served to `target` (its GPU model's vendor, torch, stand-in
        status: fit.py); empty when it fits."""
        ...

    def device_files(self, devices: int) -> list[tuple[str, str]]:
        """(payload key, file name under MOUNT_DIR) for each device ordinal 0..devices-1: what
        fetch writes and what a mounted ConfigMap projects."""
        ...

    def pod_env(self, *, capture: bool) -> dict[str, str]:
        """The environment that makes a serving container load it (with capture: and record
        what it misses); a value the user set on a container wins (the webhook's rule)."""
        ...


def kind(name: str = DEFAULT) -> ArtifactKind:
    if name == "tunableop":
        from . import tunableop

        return tunableop
    if name == "caches":
        from . import caches

        return caches
    raise ValueError(f"no artifact kind {name} (known: {', '.join(KINDS)})")


def of(manifest: Manifest) -> ArtifactKind:
    """The kind of the artifact `manifest` describes; ValueError for one not known here (a
    newer tunefleet's artifact, or a forged manifest): nothing is served that is not checked."""
    return kind(manifest.kind)
