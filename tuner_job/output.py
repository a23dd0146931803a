"""The tuner's output directory, the contract between the tune and publish steps:
results.csv and the manifest.json that describes it (stdlib only).

Written here only, so every writer (the tuner, and the stand-ins that tests, the demo and the
benchmarks use where no GPU is present) produces the same canonical bytes and manifest.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from . import __version__
from .caches import INDEX_KIND, INDEX_NAME, Packed, Skipped, index_bytes
from .files import atomic_write_bytes, sha256_hex
from .manifest import ArtifactId, Manifest, ManifestExtra, rfc3339_utc
from .results import ResultsFile, count_outcomes, format_results

RESULTS_NAME = "results.csv"
MANIFEST_NAME = "manifest.json"


@dataclasses.dataclass(frozen=True)
class RunFacts:
    """What the run that made an artifact says of itself, beside its payload: the machine's
    identity, its seconds, the GEMMs it recorded, and the rest of the manifest's extras."""

    identity: dict[str, str]
    seconds: float
    recorded: int = 0
    extra: ManifestExtra | None = None
    tool_version: str = __version__


def build_output(
    results: ResultsFile, artifact: ArtifactId, run: RunFacts
) -> tuple[bytes, Manifest]:
    """results.csv's bytes (canonical form) and the manifest that describes them.

    The manifest's ``outcomes`` counts the rows by winner (see ``results.count_outcomes``).
    """
    data = format_results(results).encode("utf-8")
    manifest = Manifest(
        namespace=artifact.namespace,
        profile=artifact.profile,
        revision=artifact.revision,
        gpu_model=artifact.gpu_model,
        results_sha256=sha256_hex(data),
        gemms=results.gemms,
        recorded=run.recorded,
        validators=results.validators,
        identity=run.identity,
        tuning_seconds=round(run.seconds, 3),
        tuned_at=rfc3339_utc(),
        tool_version=run.tool_version,
        outcomes=count_outcomes(results),
        extra=_rounded(run.extra or ManifestExtra()),
    )
    return data, manifest


def write_output(
    out: Path,
    results: ResultsFile,
    artifact: ArtifactId,
    run: RunFacts,
    caches: tuple[list[Packed], list[Skipped]] = ([], []),
) -> Manifest:
    """Write results.csv and then its manifest (see build_output), listing the caches packed
    beside it; returns the manifest."""
    data, manifest = build_output(results, artifact, run)
    if caches[0] or caches[1]:
        packed = tuple(sorted(caches[0], key=lambda p: p.name))
        manifest = dataclasses.replace(manifest, caches=packed, caches_skipped=tuple(caches[1]))
    out.mkdir(parents=True, exist_ok=True)
    # results first: a manifest on disk always describes a complete results file.
    atomic_write_bytes(out / RESULTS_NAME, data)
    atomic_write_bytes(out / MANIFEST_NAME, manifest.to_json())
    return manifest


def write_caches_output(
    out: Path, packed: list[Packed], skipped: list[Skipped], artifact: ArtifactId, run: RunFacts
) -> Manifest:
    """A caches-only artifact (no TunableOp results): the index (caches.json) as its payload,
    then the manifest. The archives are in `out` already (caches.pack wrote them)."""
    data = index_bytes(packed)
    manifest = Manifest(
        namespace=artifact.namespace,
        profile=artifact.profile,
        revision=artifact.revision,
        gpu_model=artifact.gpu_model,
        results_sha256=sha256_hex(data),
        gemms=0,
        recorded=0,
        validators={},
        identity=run.identity,
        tuning_seconds=round(run.seconds, 3),
        tuned_at=rfc3339_utc(),
        tool_version=run.tool_version,
        extra=_rounded(run.extra or ManifestExtra()),
        kind=INDEX_KIND,
        caches=tuple(sorted(packed, key=lambda p: p.name)),
        caches_skipped=tuple(skipped),
    )
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(out / INDEX_NAME, data)
    atomic_write_bytes(out / MANIFEST_NAME, manifest.to_json())
    return manifest


def rewrite_manifest(out: Path, manifest: Manifest) -> Manifest:
    """manifest.json again, with what was learnt after the payload was written (the figures of
    tuner_job/measure.py): the payload and its SHA-256 are untouched."""
    atomic_write_bytes(out / MANIFEST_NAME, manifest.to_json())
    return manifest


def _rounded(extra: ManifestExtra) -> ManifestExtra:
    if extra.wall_seconds is None:
        return extra
    return dataclasses.replace(extra, wall_seconds=round(extra.wall_seconds, 3))
