"""tunefleet-publish: upload a tuner's results.csv + manifest.json under content-addressed keys.

Runs as the tuning Job's last container. Keys:
``<prefix>/<namespace>/<profile>/<gpu-model>/<sha256 of results.csv>/{results.csv,manifest.json}``.
results.csv goes first, so a manifest in the store always has its results. On success the
termination message (one JSON line, also on stdout) is what the operator reads.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuner_job._fs import sha256_hex, write_termination_log
from tuner_job.manifest import Manifest, ManifestError, loads
from tuner_job.output import MANIFEST_NAME, RESULTS_NAME
from tuner_job.results import CsvFormatError, parse_results

from .store import (
    ConflictError,
    Store,
    StoreError,
    check_key_parts,
    open_store,
    parse_uri,
)

PROG = "tunefleet-publish"
TERMINATION_LIMIT = 4096  # bytes Kubernetes keeps of a termination message


class PublishError(Exception):
    pass


@dataclass(frozen=True)
class Published:
    uri: str
    sha256: str
    manifest: Manifest
    created: bool  # False: the identical results were already there
    kept_existing_manifest: bool


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise PublishError(f"cannot read {path}: {exc.strerror or exc}") from None


def load_artifact(
    directory: Path, namespace: str, profile: str, gpu_model: str
) -> tuple[bytes, bytes, Manifest]:
    """Read and cross-check what the tuner wrote before anything leaves the pod."""
    results = _read(directory / RESULTS_NAME)
    manifest_bytes = _read(directory / MANIFEST_NAME)
    try:
        parsed = parse_results(
            results.decode("utf-8"), str(directory / RESULTS_NAME), require_rows=True
        )
        manifest = loads(manifest_bytes)
    except (CsvFormatError, ManifestError, UnicodeDecodeError) as exc:
        raise PublishError(str(exc)) from None
    sha = sha256_hex(results)
    checks = [
        (
            manifest.results_sha256 == sha,
            f"manifest resultsSha256 {manifest.results_sha256} "
            f"is not the SHA-256 of results.csv ({sha})",
        ),
        (
            manifest.gemms == parsed.gemms,
            f"manifest says {manifest.gemms} GEMMs, results.csv has {parsed.gemms}",
        ),
        (manifest.validators == parsed.validators, "manifest validators differ from results.csv"),
        (
            manifest.namespace == namespace,
            f"manifest namespace {manifest.namespace!r} is not {namespace!r}",
        ),
        (manifest.profile == profile, f"manifest profile {manifest.profile!r} is not {profile!r}"),
        (
            manifest.gpu_model == gpu_model,
            f"manifest gpuModel {manifest.gpu_model!r} is not {gpu_model!r}",
        ),
    ]
    for ok, message in checks:
        if not ok:
            raise PublishError(message)
    return results, manifest_bytes, manifest


def publish(
    directory: Path,
    uri: str,
    namespace: str,
    profile: str,
    gpu_model: str,
    *,
    store: Store | None = None,
    endpoint_url: str | None = None,
    region: str | None = None,
    timeout_s: float = 120.0,
) -> Published:
    try:
        location = parse_uri(uri)
        check_key_parts(namespace, profile, gpu_model)
    except ValueError as exc:
        raise PublishError(str(exc)) from None
    results, manifest_bytes, manifest = load_artifact(directory, namespace, profile, gpu_model)
    sha = manifest.results_sha256
    if store is None:
        store = open_store(location, endpoint_url=endpoint_url, region=region, timeout_s=timeout_s)
    base = location.key(namespace, profile, gpu_model, sha)
    created = store.put_if_absent(f"{base}/{RESULTS_NAME}", results, "text/csv")
    kept = False
    try:
        store.put_if_absent(f"{base}/{MANIFEST_NAME}", manifest_bytes, "application/json")
    except ConflictError:
        # Byte-identical results tuned again (another run, another revision): the artifact is
        # the results, and they are there. The stored manifest stays, if it describes them.
        existing = loads(store.get(f"{base}/{MANIFEST_NAME}", 1 << 20))
        if (existing.results_sha256, existing.namespace, existing.profile, existing.gpu_model) != (
            sha,
            namespace,
            profile,
            gpu_model,
        ):
            raise
        kept = True
    return Published(location.uri(base), sha, manifest, created, kept)


def termination_message(pub: Published, limit: int = TERMINATION_LIMIT) -> str:
    """One JSON line of at most `limit` bytes; identity is trimmed (longest values first)."""
    m = pub.manifest
    doc: dict[str, Any] = {
        "uri": pub.uri,
        "sha256": pub.sha256,
        "gemms": m.gemms,
        "tunedAt": m.tuned_at,
        "tuningSeconds": m.tuning_seconds,
        "revision": m.revision,
        "identity": dict(m.identity),
    }

    def encoded() -> bytes:
        return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode("utf-8")

    identity: dict[str, str] = doc["identity"]
    while len(encoded()) > limit and identity:
        del identity[max(identity, key=lambda k: (len(identity[k]), k))]
    if len(encoded()) > limit:
        raise PublishError("termination message over 4096 bytes even without identity")
    return encoded().decode("utf-8")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--dir", required=True, help="directory with results.csv and manifest.json")
    p.add_argument("--uri", required=True, help="s3://bucket/prefix (or file:///dir)")
    p.add_argument("--namespace", required=True)
    p.add_argument("--profile", required=True)
    p.add_argument("--gpu-model", required=True)
    p.add_argument("--endpoint-url", help="S3 endpoint (default: $AWS_ENDPOINT_URL_S3, else AWS)")
    p.add_argument("--region", help="S3 region (default: $AWS_REGION or us-east-1)")
    p.add_argument("--termination-log", default="/dev/termination-log")
    p.add_argument("--timeout-seconds", type=float, default=120.0, help="overall time limit")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        pub = publish(
            Path(args.dir),
            args.uri,
            args.namespace,
            args.profile,
            args.gpu_model,
            endpoint_url=args.endpoint_url,
            region=args.region,
            timeout_s=args.timeout_seconds,
        )
        message = termination_message(pub)
    except (PublishError, StoreError, ManifestError) as exc:
        line = " ".join(str(exc).split())
        print(f"{PROG}: error: {line}", file=sys.stderr)
        write_termination_log(args.termination_log, f"{PROG}: error: {line}"[:TERMINATION_LIMIT])
        return 1
    if not pub.created:
        print(f"{PROG}: {pub.uri} was already published: nothing uploaded", file=sys.stderr)
    if pub.kept_existing_manifest:
        print(f"{PROG}: kept the manifest already stored for these results", file=sys.stderr)
    write_termination_log(args.termination_log, message)
    print(message)
    return 0


if __name__ == "__main__":
    sys.exit(main())
