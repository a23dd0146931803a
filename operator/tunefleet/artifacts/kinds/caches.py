"""A caches-only artifact: no TunableOp results, its payload the index (caches.json) that pins
every cache archive of the bundle by SHA-256 (tuner_job/caches.py owns the format).

The archives themselves travel beside it, under their SHA-256s, and are checked and unpacked
by fetch (artifacts/bundle.py); the caches TunableOp results may also carry are handled the
same way. What makes an entry valid inside a cache is the stack's own key (torch, Triton, the
device, the graph, vLLM's config hash): a cache made elsewhere misses, it does not mislead.
So the fit of a caches artifact is its record's: the torch build against the model's vendor,
and the stand-in rule (fit.record_refusals).
"""

from __future__ import annotations

from tunefleet.artifacts import fit
from tuner_job import caches as cc
from tuner_job.manifest import Manifest
from tuner_job.results import Outcomes

NAME = cc.INDEX_KIND
PAYLOAD = cc.INDEX_NAME
CONTENT_TYPE = "application/json"
MOUNT_DIR = "/tunefleet/caches"
FILES = ""  # no per-device files: each cache is a directory under MOUNT_DIR
FormatError: type[Exception] = cc.CacheError


def parse(payload: bytes, source: str, *, require_rows: bool) -> list[cc.Packed]:
    return cc.parse_index(payload, source)


def noncanonical(parsed: list[cc.Packed], source: str) -> str | None:
    return None  # parse_index refuses an index that is not canonical


def disagreements(parsed: list[cc.Packed], manifest: Manifest) -> list[str]:
    if list(manifest.caches) != parsed:
        return [f"manifest caches differ from {PAYLOAD}'s"]
    return []


def outcomes(parsed: list[cc.Packed]) -> Outcomes:
    return Outcomes(tuned=0, default=0)


def refusals(parsed: list[cc.Packed], manifest: Manifest, target: fit.Target) -> list[str]:
    return fit.record_refusals(manifest.identity, target)


def device_files(devices: int) -> list[tuple[str, str]]:
    return []


def pod_env(*, capture: bool) -> dict[str, str]:
    return {}  # each cache's variables come from its spec (tuner_job/caches.py), not the kind
