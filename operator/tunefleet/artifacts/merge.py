"""tunefleet-merge: one artifact from the N shards of a sharded tuning Job.

Runs once every index of the Indexed Job has completed (its own pod, tunefleet's image, no GPU).
Downloads each shard's output from
``<prefix>/<ns>/<profile>/<gpu-model>/_shards/<revision>/<i>-of-<N>/{results.csv,manifest.json}``,
verifies it (the manifest names this namespace, profile, GPU model, revision and shard; the
results hash to the manifest's SHA-256 and agree with it; every shard has the same validators and
library key), merges the results (merge_results' rule) and publishes the artifact exactly as
tunefleet-publish does (same keys, checks and termination message), then adds it to the GEMM
library. A missing or inconsistent shard is refused with one line naming it.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tunefleet.artifacts.remote_sign import RemoteSigner
from tunefleet.storage import cli_flags as storage_cli
from tunefleet.storage.registry import open_store, parse_uri
from tunefleet.storage.store import Location, NotFoundError, Store, StoreOptions, check_key_parts
from tuner_job.manifest import (
    ArtifactId,
    ImageRef,
    LibraryInfo,
    Manifest,
    ManifestError,
    ManifestExtra,
    ResumeInfo,
    loads,
)
from tuner_job.output import MANIFEST_NAME, RESULTS_NAME, RunFacts, build_output
from tuner_job.results import ResultsFile, decode, merge_results, parse_results

from . import cli, fit, kinds
from .library import SCOPES, check_revision, check_scope, check_shard, shard_base
from .publish import (
    Published,
    PublishError,
    Whose,
    add_remote_signing,
    add_to_library,
    check_artifact,
    remote_signer,
    sign_manifest,
    termination_message,
    upload_artifact,
)

PROG = "tunefleet-merge"
MAX_RESULTS_BYTES = 256 << 20
MAX_MANIFEST_BYTES = 1 << 20
REASON_LIMIT = 1000


class MergeError(Exception):
    pass


def _log(message: str) -> None:
    print(f"{PROG}: {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Shard:
    index: int
    uri: str
    manifest: Manifest
    results: ResultsFile


@dataclass(frozen=True)
class MergeJob:
    """What a merge Job is told (its command line): where the shards are, whose artifact they
    make, how many there are, the library they add to, the image they were tuned in and what
    they must fit (fit.py; None: an older Job's command, which says nothing of it)."""

    uri: str
    artifact: ArtifactId
    shards: int
    library_scope: str = "namespace"
    image_reference: str = ""
    target: fit.Target | None = None
    # What the artifact is tuned for (naming.identity_document, from the tuning ConfigMap):
    # into the manifest. None: an older Job's command, or a retune's.
    identity: dict[str, Any] | None = None


def read_shard(store: Store, location: Location, job: MergeJob, shard: int) -> Shard:
    a, shards = job.artifact, job.shards
    revision = a.revision
    base = shard_base(location, a, shard, shards)
    uri = store.uri(base)
    where = f"shard {shard} of {shards}"
    try:
        manifest_bytes = store.get(f"{base}/{MANIFEST_NAME}", MAX_MANIFEST_BYTES)
        results_bytes = store.get(f"{base}/{RESULTS_NAME}", MAX_RESULTS_BYTES)
    except NotFoundError:
        raise MergeError(
            f"{where} has no output at {uri}/ (did index {shard} complete and publish?)"
        ) from None
    try:
        manifest = loads(manifest_bytes)
        whose = Whose(a.namespace, a.profile, a.gpu_model)
        check_artifact(results_bytes, manifest, whose, uri, require_rows=False)
    except (ManifestError, PublishError) as exc:
        raise MergeError(f"{where} at {uri}/: {exc}") from None
    got = (manifest.revision, manifest.extra.shard, manifest.extra.shards)
    if got != (revision, shard, shards):
        raise MergeError(
            f"{where} at {uri}/ describes revision {got[0]!r} shard {got[1]} of {got[2]}, "
            f"not revision {revision!r} shard {shard} of {shards}"
        )
    results = parse_results(decode(results_bytes), uri)
    return Shard(shard, uri, manifest, results)


def _check_consistent(shards: list[Shard]) -> None:
    first = shards[0]
    for s in shards[1:]:
        if s.manifest.validators != first.manifest.validators:
            diff = "; ".join(
                f"{k} {first.manifest.validators.get(k)!r} vs {s.manifest.validators.get(k)!r}"
                for k in sorted(set(first.manifest.validators) | set(s.manifest.validators))
                if first.manifest.validators.get(k) != s.manifest.validators.get(k)
            )
            raise MergeError(
                f"shard {s.index} was tuned under other validators than shard 0 ({diff}): "
                "TunableOp would load neither file's rows with the other's"
            )
        if s.manifest.extra.settings != first.manifest.extra.settings:
            raise MergeError(
                f"shard {s.index} was tuned with other settings than shard 0: one revision "
                "tunes with one set"
            )
        if s.manifest.extra.library_key != first.manifest.extra.library_key:
            raise MergeError(
                f"shard {s.index} ran on another software identity than shard 0 (library key "
                f"{s.manifest.extra.library_key} vs {first.manifest.extra.library_key})"
            )


def _image(shards: list[Shard], image_reference: str) -> ImageRef | None:
    """The shards' image, when they agree on it (each publish waited for its imageID)."""
    ids = {s.manifest.image.id for s in shards if s.manifest.image is not None}
    ids.discard("")
    if len(ids) > 1:
        _log(f"warning: the shards ran different image IDs ({', '.join(sorted(ids))})")
    image_id = ids.pop() if len(ids) == 1 else ""
    refs = {s.manifest.image.reference for s in shards if s.manifest.image is not None}
    reference = image_reference or (refs.pop() if len(refs) == 1 else "")
    return ImageRef(reference, image_id) if reference else None


def _library(shards: list[Shard]) -> LibraryInfo | None:
    infos = [(s.index, s.manifest.extra.library) for s in shards if s.manifest.extra.library]
    if not infos:
        return None
    skipped: dict[str, str] = {}
    for _, info in infos:
        assert info is not None
        for obj, reason in info.skipped:
            skipped.setdefault(obj, reason)
    errors = [f"shard {i}: {info.error}" for i, info in infos if info is not None and info.error]
    return LibraryInfo(
        entries=max(info.entries for _, info in infos if info is not None),
        skipped=tuple(sorted(skipped.items())[: LibraryInfo.MAX_SKIPPED]),
        skipped_count=max(info.skipped_count for _, info in infos if info is not None),
        error="; ".join(errors)[:REASON_LIMIT] if errors else None,
    )


def _resume(shards: list[Shard]) -> ResumeInfo | None:
    infos = [(s.index, s.manifest.extra.resume) for s in shards if s.manifest.extra.resume]
    if not infos:
        return None
    statuses = {info.status for _, info in infos if info is not None}
    status = "resumed" if "resumed" in statuses else "ignored" if "ignored" in statuses else "none"
    reason = "; ".join(
        f"shard {i}: {info.reason}" for i, info in infos if info is not None and info.reason
    )
    return ResumeInfo(status, reason[:REASON_LIMIT])


def merge_shards(
    shards: list[Shard],
    artifact: ArtifactId,
    image_reference: str,
    log: Callable[[str], None] = _log,
) -> tuple[bytes, Manifest]:
    """The merged results.csv and its manifest (counts summed over the disjoint shares)."""
    _check_consistent(shards)
    merged = merge_results([s.results for s in shards])
    ms = [s.manifest for s in shards]
    recorded = max(m.recorded for m in ms)
    if len({m.recorded for m in ms}) > 1:
        counts = ", ".join(f"shard {s.index}: {s.manifest.recorded}" for s in shards)
        log(
            f"warning: the shards recorded different numbers of GEMMs ({counts}): the workload "
            "does not record the same GEMMs every time; counts below use the largest"
        )
    overlap = sum(m.gemms for m in ms) - merged.gemms
    if overlap:
        log(f"warning: {overlap} GEMM(s) came from more than one shard (the faster row kept)")

    def total(get: Callable[[ManifestExtra], int | None]) -> int:
        return sum(get(m.extra) or 0 for m in ms)

    walls = [m.extra.wall_seconds or m.tuning_seconds for m in ms]
    extra = ManifestExtra(
        reused=total(lambda x: x.reused),
        resumed=total(lambda x: x.resumed),
        newly_tuned=total(lambda x: x.newly_tuned),
        library_key=ms[0].extra.library_key,
        shards=len(shards),
        library=_library(shards),
        resume=_resume(shards),
        wall_seconds=max(walls),
        settings=ms[0].extra.settings,
    )
    data, manifest = build_output(
        merged,
        artifact,
        RunFacts(
            recorded=recorded,
            identity=dict(ms[0].identity),
            seconds=sum(m.tuning_seconds for m in ms),
            extra=extra,
        ),
    )
    image = _image(shards, image_reference)
    if image is not None:
        manifest = dataclasses.replace(manifest, image=image)
    log(
        f"merged {len(shards)} shard(s): {merged.gemms} of {recorded} recorded GEMM(s) "
        f"({extra.reused} reused, {extra.resumed} resumed, {extra.newly_tuned} newly tuned; "
        f"{recorded - merged.gemms} left untuned)"
    )
    return data, manifest


def merge(
    job: MergeJob,
    *,
    store: Store | None = None,
    options: StoreOptions | None = None,
    remote: RemoteSigner | None = None,
) -> Published:
    a, shards, library_scope, target = job.artifact, job.shards, job.library_scope, job.target
    try:
        location = parse_uri(job.uri)
        check_key_parts(a.namespace, a.profile, a.gpu_model)
        check_revision(a.revision)
        check_shard(0, shards)
        check_scope(library_scope)
    except ValueError as exc:
        raise MergeError(str(exc)) from None
    if store is None:
        store = open_store(location, options or StoreOptions(timeout_s=300.0))
    parts = [read_shard(store, location, job, i) for i in range(shards)]
    data, manifest = merge_shards(parts, a, job.image_reference)
    if not manifest.gemms:
        raise MergeError(f"the {shards} shards hold no tuned GEMM at all: nothing to publish")
    if target is not None:
        # Before anything is uploaded: what the shards tuned must fit the model (fit.py).
        kind = kinds.of(manifest)  # the merge's own: build_output wrote it
        found = kind.refusals(kind.parse(data, "<results>", require_rows=False), manifest, target)
        if found:
            raise MergeError(fit.summary(found, target))
    if job.identity is not None:
        manifest = dataclasses.replace(manifest, fleet_identity=job.identity)
    pub = upload_artifact(store, location, data, manifest)
    # Signed by the operator when it signs (the merge Job holds no key): the sharded
    # profile's artifact is then adoptable like any other.
    pub = sign_manifest(store, location, pub, None, remote)
    return add_to_library(store, location, library_scope, pub, data, PROG)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0] if __doc__ else None)
    cli.add_where(p)
    cli.add_fit(p)
    p.add_argument("--revision", required=True)
    p.add_argument("--shards", required=True, type=int)
    p.add_argument("--library-scope", choices=SCOPES, default="namespace")
    p.add_argument("--image-reference", default="", help="the image the shards were tuned in")
    cli.add_identity(p)
    add_remote_signing(p)
    cli.add_common(p, timeout_s=300.0)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)

    def run() -> str:
        pub = merge(
            MergeJob(
                args.uri,
                ArtifactId(args.namespace, args.profile, args.revision, args.gpu_model),
                args.shards,
                library_scope=args.library_scope,
                image_reference=args.image_reference,
                target=cli.target(args),
                identity=cli.identity(args.identity_file, PROG),
            ),
            options=storage_cli.options(args),
            remote=remote_signer(args),
        )
        if not pub.created:
            print(f"{PROG}: {pub.uri} was already published: nothing uploaded", file=sys.stderr)
        return termination_message(pub)

    return cli.finish(PROG, args.termination_log, run, (MergeError, PublishError))


if __name__ == "__main__":
    sys.exit(main())
