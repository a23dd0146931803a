"""tunefleet-fetch: the serving pod's init container. Download one pinned artifact, verify it,
and write DEST/tunableop_results<i>.csv for every device ordinal i in 0..N-1.

Verification before anything is written: SHA-256 of results.csv equals the pinned --sha256 (and
the URI's last segment), the manifest's SHA-256 equals the pinned --manifest-sha256 (when the
artifact's status records one), the manifest parses, is of a kind this tunefleet knows
(artifacts/kinds/: the kind checks the rest and names the files), names the same SHA-256
(and --gpu-model when given), GEMM count and outcomes, the CSV parses, and the artifact fits
its identity (fit.py: validators, solutions and torch of one backend, PT_VERSION the recorded
torch's; with --gpu-vendor / --stand-in-model, the model's vendor and stand-in output too).
Files appear atomically (temp file, then rename), all or none.

Policy on any problem: fail open (default) -> "starting untuned: <reason>", exit 0, the app runs
without tuned GEMMs; --fail-closed -> "refusing to start: <reason>", exit 1.

The time limit is wall-clock: an alarm ends whatever call is under way (a frozen store, a
half-open connection) when --timeout-seconds have passed since the start, so a pod waits at
most that long. A directory holding `results.csv.gz` instead of `results.csv` (a compressed
artifact ConfigMap, mounted) is read the same way, locally.

With --candidate (one per GPU model the pod may land on, instead of --uri and --sha256) the
artifact is picked where the pod runs: the node's name from $TUNEFLEET_NODE_NAME (the
Downward API), its model from the node map mounted at --node-map (contracts/nodemap.py). A
node the map does not list, or lists under several models, gets no artifact (the policy
above): a model is never guessed.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import signal
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import NoReturn, TextIO

from tunefleet.artifacts import bundle, fit, gz, kinds
from tunefleet.contracts import nodemap
from tunefleet.contracts.fetch_outcome import (
    LOADED,
    PROG,
    REFUSED,
    UNTUNED,
    Candidate,
    FetchOutcome,
)
from tunefleet.storage import cli_flags as storage_cli
from tunefleet.storage.registry import open_store, parse_uri
from tunefleet.storage.store import (
    Location,
    NotFoundError,
    Store,
    StoreError,
    StoreOptions,
    check_sha256,
)
from tuner_job import caches as cc
from tuner_job.files import sha256_hex, write_termination_log
from tuner_job.manifest import Manifest, ManifestError, loads
from tuner_job.output import MANIFEST_NAME
from tuner_job.results import Outcomes

MAX_RESULTS_BYTES = 256 << 20
MAX_MANIFEST_BYTES = 1 << 20
MAX_DEVICES = 256


class FetchError(Exception):
    pass


@dataclass(frozen=True)
class Fetched:
    paths: list[Path]
    gemms: int
    sha256: str
    outcomes: Outcomes | None = None  # tuned and Default rows, as the manifest and status count
    kind: str = kinds.DEFAULT  # the artifact's (kinds/): what the files written are
    caches: tuple[str, ...] = ()  # the caches unpacked (artifacts/bundle.py)
    caches_failed: str = ""  # why the caches were not served, where the results still were
    # The caches' sizes (packed, unpacked) and their download's and unpack's seconds.
    caches_cost: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class Pinned:
    """The artifact a pod is pinned to (its URI and SHA-256s: status's, through admission)
    and what it must fit: the GPU model the pod runs, and fit's target for it (fit.py)."""

    uri: str
    sha256: str
    manifest_sha256: str | None = None
    gpu_model: str | None = None
    target: fit.Target | None = None

    def checked(self) -> Pinned:
        """The pins in canonical form; FetchError when a SHA-256 is not one."""
        try:
            sha = check_sha256(self.sha256)
            manifest = check_sha256(self.manifest_sha256) if self.manifest_sha256 else None
        except ValueError as exc:
            raise FetchError(str(exc)) from None
        return replace(self, sha256=sha, manifest_sha256=manifest)


@dataclass(frozen=True)
class Serving:
    """How the pod serves what is fetched: one results file per device, the caches unpacked
    into a writable directory (none: not unpacked), and whether a cache that fails its check
    fails the fetch (else the results are served without it)."""

    devices: int = 1
    caches_dest: Path | None = None
    fail_closed: bool = False
    # The most the pod may hold in its caches volume (admission's sizeLimit, or the pod's
    # ephemeral-storage budget): a bundle that needs more is told, never unpacked (0: the
    # disk's free space is the only bound).
    caches_room: int = 0
    # Where the serving containers mount the pod's image volume: its caches' big files are
    # linked there rather than copied (ocibundle.copy_caches); None: every file copied.
    volume_served_at: Path | None = None


def _verify(
    results: bytes,
    manifest_bytes: bytes,
    pin: Pinned,
    key_parts: tuple[str, ...],
    payload: str = kinds.kind().PAYLOAD,
) -> tuple[kinds.ArtifactKind, Outcomes]:
    sha, manifest_sha, gpu_model = pin.sha256, pin.manifest_sha256, pin.gpu_model
    actual = sha256_hex(results)
    if actual != sha:
        raise FetchError(f"{payload} has SHA-256 {actual}, expected {sha} (corrupted or truncated)")
    if manifest_sha is not None and sha256_hex(manifest_bytes) != manifest_sha:
        raise FetchError(
            f"manifest.json has SHA-256 {sha256_hex(manifest_bytes)}, expected {manifest_sha} "
            "(changed after publishing)"
        )
    try:
        manifest = loads(manifest_bytes)
        kind = kinds.of(manifest)
    except (ManifestError, ValueError) as exc:
        raise FetchError(str(exc)) from None
    if manifest.results_sha256 != sha:
        raise FetchError(f"manifest describes results {manifest.results_sha256}, not {sha}")
    # The key is <prefix>/<namespace>/<profile>/<gpu-model>/<sha256>: the manifest must agree.
    described = (manifest.namespace, manifest.profile, manifest.gpu_model)
    if len(key_parts) >= 3 and tuple(key_parts[-3:]) != described:
        raise FetchError(
            f"manifest is for {'/'.join(described)}, the URI says {'/'.join(key_parts[-3:])}"
        )
    if gpu_model and manifest.gpu_model != gpu_model:
        raise FetchError(
            f"artifact was tuned on {manifest.gpu_model!r}, this pod runs {gpu_model!r}"
        )
    try:
        parsed = kind.parse(results, kind.PAYLOAD, require_rows=True)
    except kind.FormatError as exc:
        raise FetchError(f"{kind.PAYLOAD} does not parse: {exc}") from None
    # The first problem only: published payloads are canonical and agree with their manifest.
    problems = [kind.noncanonical(parsed, kind.PAYLOAD), *kind.disagreements(parsed, manifest)]
    for problem in problems:
        if problem:
            raise FetchError(problem)
    # What it must fit (fit.py): the caller's target, or what the model's name alone says (the
    # vendor unknown: the validators, solutions and torch must still hold together).
    model = manifest.gpu_model
    target = pin.target or fit.Target(
        model, stand_in=True if fit.is_stand_in_model(model) else None
    )
    found = kind.refusals(parsed, manifest, target)
    if found:
        raise FetchError(fit.summary(found, target))
    return kind, kind.outcomes(parsed)


def write_device_files(
    dest: Path, data: bytes, devices: int, kind: str = kinds.DEFAULT
) -> list[Path]:
    """One identical file per ordinal (the kind names them); temp files first, then renames,
    then none on failure."""
    dest.mkdir(parents=True, exist_ok=True)
    temps: list[tuple[str, Path]] = []
    done: list[Path] = []
    try:
        for _, name in kinds.kind(kind).device_files(devices):
            fd, tmp = tempfile.mkstemp(prefix=".tunableop_results.", suffix=".tmp", dir=dest)
            temps.append((tmp, dest / name))
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, 0o444)
        for tmp, final in temps:
            os.replace(tmp, final)
            done.append(final)
    except OSError as exc:
        for tmp, _ in temps:
            Path(tmp).unlink(missing_ok=True)
        for final in done:
            final.unlink(missing_ok=True)
        raise FetchError(f"cannot write into {dest}: {exc.strerror or exc}") from None
    return done


@dataclass(frozen=True)
class Verified:
    """An artifact's bytes, checked against its pins."""

    results: bytes
    manifest: bytes
    gemms: int
    sha256: str
    outcomes: Outcomes | None = None  # tuned and Default rows, as the manifest and status count
    kind: str = kinds.DEFAULT  # the manifest's
    parsed: Manifest | None = None


def _payload_name(manifest_bytes: bytes) -> str:
    """The payload the manifest's kind names (results.csv, caches.json); _verify checks the
    manifest whole afterwards."""
    try:
        return kinds.of(loads(manifest_bytes)).PAYLOAD
    except (ManifestError, ValueError) as exc:
        raise FetchError(str(exc)) from None


def _results(store: Store, location: Location, name: str) -> bytes:
    """The payload, or <payload>.gz where only that is there (a compressed ConfigMap)."""
    try:
        return store.get(location.key(name), MAX_RESULTS_BYTES)
    except NotFoundError:
        if location.scheme != "file":
            raise
    packed = store.get(location.key(name + ".gz"), MAX_RESULTS_BYTES)
    try:
        return gz.gunzip(packed, MAX_RESULTS_BYTES, f"{name}.gz")
    except ValueError as exc:
        raise FetchError(str(exc)) from None


def download_verified(
    pin: Pinned,
    *,
    store: Store | None = None,
    options: StoreOptions | None = None,
    signature: Signature | None = None,
) -> Verified:
    """Download one pinned artifact and verify it (see the module docstring), and, in a store
    of objects, its manifest's signature as `signature` asks (check_manifest_signature);
    nothing is written. Used by the fetch init container, the operator's delivery and fleet
    adoption."""
    pin = pin.checked()
    uri, sha = pin.uri, pin.sha256
    try:
        location = parse_uri(uri)
    except ValueError as exc:
        raise FetchError(str(exc)) from None
    last = (location.prefix or location.bucket).rstrip("/").rsplit("/", 1)[-1]
    if last != sha:
        raise FetchError(f"URI {uri} does not end in the pinned SHA-256 {sha}")
    if store is None:
        store = open_store(location, options or StoreOptions(timeout_s=60.0))
    try:
        manifest_bytes = store.get(location.key(MANIFEST_NAME), MAX_MANIFEST_BYTES)
        if signature is not None and location.scheme != "oci":
            check_manifest_signature(store, location, manifest_bytes, signature)
        payload = _payload_name(manifest_bytes)
        results = _results(store, location, payload)
    except StoreError as exc:
        raise FetchError(str(exc)) from None
    path = (location.prefix or location.bucket).strip("/").split("/")
    kind, outcomes = _verify(results, manifest_bytes, pin, tuple(path[:-1]), payload)
    return Verified(
        results, manifest_bytes, outcomes.gemms, sha, outcomes, kind.NAME, loads(manifest_bytes)
    )


def fetch(
    pin: Pinned,
    dest: Path,
    serving: Serving = Serving(),
    *,
    store: Store | None = None,
    options: StoreOptions | None = None,
    signature: Signature | None = None,
) -> Fetched:
    if not 1 <= serving.devices <= MAX_DEVICES:
        raise FetchError(f"--devices must be 1..{MAX_DEVICES}, got {serving.devices}")
    try:
        location = parse_uri(pin.uri)
    except ValueError as exc:
        raise FetchError(str(exc)) from None
    store = store or open_store(location, options or StoreOptions(timeout_s=60.0))
    if location.scheme == "oci":
        store = serving_store(store, signature or Signature())
    got = download_verified(pin, store=store, options=options, signature=signature)
    # Caches first: a cache-only artifact that cannot serve them serves nothing.
    caches, failed, cost = _caches(store, location, got, serving)
    paths = write_device_files(dest, got.results, serving.devices, got.kind)
    return Fetched(paths, got.gemms, got.sha256, got.outcomes, got.kind, caches, failed, cost)


def from_volume(root: Path, pin: Pinned, serving: Serving = Serving()) -> Fetched:
    """The artifact as an image volume mounted it at `root` (the operator verified its
    signature and pins before any pod could mount it): checked again here as a fetched one
    is, and its caches copied into the pod's writable directory. The results stay where the
    volume is mounted in the serving containers; nothing is written for them."""
    from . import ocibundle

    try:
        pin = pin.checked()
    except FetchError as exc:
        raise FetchError(f"the image volume at {root}: {exc}") from None
    try:
        location = parse_uri(pin.uri)
        meta = root / ocibundle.META_DIR
        manifest_bytes = (meta / MANIFEST_NAME).read_bytes()
        payload = _payload_name(manifest_bytes)
        results = (meta / payload).read_bytes()
    except (ValueError, OSError) as exc:
        raise FetchError(f"the image volume at {root}: {exc}") from None
    path = (location.prefix or location.bucket).strip("/").split("/")
    kind, outcomes = _verify(results, manifest_bytes, pin, tuple(path[:-1]), payload)
    manifest = loads(manifest_bytes)
    caches: tuple[str, ...] = ()
    cost: tuple[tuple[str, float], ...] = ()
    failed = ""
    if manifest.caches and serving.caches_dest is not None:
        try:
            # The pod's room holds for a copy out of the volume as for a download: one that
            # cannot fit is never copied (the kubelet would evict the pod over it).
            bundle.Room(serving.caches_dest, serving.caches_room).check(manifest)
            t0 = time.monotonic()
            copied = ocibundle.copy_caches(
                root, manifest, serving.caches_dest, serving.volume_served_at
            )
            caches = copied.names
            cost = (
                ("unpacked", float(copied.copied + copied.linked)),
                ("copied", float(copied.copied)),
                ("linked", float(copied.linked)),
                ("copy", time.monotonic() - t0),
            )
        except (ocibundle.VolumeError, bundle.NoRoom) as exc:
            if serving.fail_closed or kind.NAME != kinds.DEFAULT:
                raise FetchError(f"caches not served: {exc}") from None
            failed = " ".join(str(exc).split())
    files = [root / name for _, name in kind.device_files(serving.devices)]
    return Fetched(files, outcomes.gemms, pin.sha256, outcomes, kind.NAME, caches, failed, cost)


@dataclass(frozen=True)
class Signature:
    """What an artifact must show before it is read (spec.storage.signing): the key its
    signature must verify with, and whether one is required; for an oci:// one, its bundle's
    digest (from the profile's status, via the webhook)."""

    bundle: str = ""
    key_file: Path | None = None
    required: bool = False
    key_pem: bytes = b""  # the key itself (spec.storage.signing.publicKey, from admission)

    @classmethod
    def asked(cls, public_key: str, policy: str | None) -> Signature | None:
        """What a profile's spec.storage.signing asks of its artifacts in the operator (its
        publicKey and signing_policy); None where the profile signs nothing."""
        if policy is None:
            return None
        return cls(required=policy == "Required", key_pem=public_key.encode())


def check_manifest_signature(
    store: Store, location: Location, manifest_bytes: bytes, sig: Signature
) -> None:
    """A store of objects (s3://, pvc://): FetchError unless the artifact's manifest is signed
    as the profile asks (signing.sign_blob, manifest.json.sig beside it). A signature that is
    there but does not verify is refused under either policy: it is forged or altered. One
    that is missing is refused only where a signature is required."""
    try:
        pem = sig.key_file.read_bytes() if sig.key_file is not None else sig.key_pem
    except OSError as exc:
        raise FetchError(f"not served: the verification key: {exc}") from None
    if not pem.strip():
        if sig.required:
            raise FetchError(
                "not served: a signature is required, and the profile gives no key to verify "
                "it: set spec.storage.signing.publicKey (the PEM of cosign.pub)"
            )
        return
    from . import signing  # cryptography: only where there is a key (fetch's memory)

    key_of_signature = location.key(MANIFEST_NAME + signing.BLOB_SIGNATURE_SUFFIX)
    where = location.uri(key_of_signature)
    try:
        key = signing.load_public_key(pem)
    except signing.SigningError as exc:
        raise FetchError(f"not served: the verification key: {exc}") from None
    try:
        signature = store.get(key_of_signature, signing.MAX_BLOB_SIGNATURE)
    except NotFoundError:
        if sig.required:
            raise FetchError(
                f"not served: {where} is missing (published unsigned), and a signature is required"
            ) from None
        return
    verdict = signing.verify_blob(manifest_bytes, signature, key)
    if not verdict.ok:
        raise FetchError(f"not served: {where}: {verdict.reason}")


def serving_store(store: Store, sig: Signature) -> Store:
    """The artifact as its bundle, by digest, once its signature verifies; the store's objects
    by key (their pins still checked) only where no bundle is named and none is required."""
    from tunefleet.storage.oci import OciStore

    from . import ocibundle, signing

    if not isinstance(store, OciStore):
        return store
    if not sig.bundle:
        if sig.required:
            raise FetchError(
                "bundle not served: the profile's status names no signed bundle for this "
                "artifact (published before signing, or by hand), and a signature is required"
            )
        return store
    try:
        pem = sig.key_file.read_bytes() if sig.key_file is not None else sig.key_pem
        if pem.strip():
            key = signing.load_public_key(pem)
            verdict = signing.verify(store, sig.bundle, key)
            if not verdict.ok and sig.required:
                raise FetchError(f"bundle not served: {verdict.reason}")
        elif sig.required:
            raise FetchError(
                "bundle not served: a signature is required, and the profile gives no key to "
                "verify it: set spec.storage.signing.publicKey (the PEM of cosign.pub)"
            )
        return ocibundle.BundleView(store, sig.bundle)
    except (OSError, signing.SigningError) as exc:
        raise FetchError(f"bundle not served: the verification key: {exc}") from None


def _caches(
    store: Store, location: Location, got: Verified, serving: Serving
) -> tuple[tuple[str, ...], str, tuple[tuple[str, float], ...]]:
    """Download, check and unpack the artifact's caches into dest/<name> (artifacts/bundle.py):
    (names unpacked, why not, what it cost). A cache that fails its check, or a bundle that
    cannot fit, is never unpacked: the stack compiles as it would without; the results, if any,
    still serve, unless the pod must not start without everything (fail closed) or the caches
    are all the artifact is. Whatever was unpacked before a failure is removed: all caches or
    none."""
    manifest, dest = got.parsed, serving.caches_dest
    if manifest is None or not manifest.caches or dest is None:
        return (), "", ()
    clock: dict[str, float] = {}
    try:
        bundle.fetch_into(
            store, location.key(), manifest, bundle.Room(dest, serving.caches_room), clock
        )
    except (bundle.BundleError, StoreError) as exc:
        for entry in manifest.caches:
            cc.remove_tree(dest / entry.name)
        if serving.fail_closed or got.kind != kinds.DEFAULT:
            raise FetchError(f"caches not served: {exc}") from None
        return (), " ".join(str(exc).split()), ()
    cost = {
        "packed": float(sum(c.size for c in manifest.caches)),
        "unpacked": float(sum(c.bytes for c in manifest.caches)),
        **clock,
    }
    return tuple(c.name for c in manifest.caches), "", tuple(sorted(cost.items()))


def _said_cost(got: Fetched) -> None:
    """One line on stderr (the init container's log) with what the caches cost: their sizes,
    the download's and the unpack's seconds, and the container's peak memory as its cgroup
    saw it (what bench/ and the real-size e2e read)."""
    if not got.caches_cost:
        return
    cost = dict(got.caches_cost)
    peak = peak_memory()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss << 10  # KiB on Linux
    if "copy" in cost:  # out of an image volume: nothing downloaded, copied or linked
        work = (
            f"{int(cost.get('unpacked', 0))} bytes in the image volume: "
            f"{int(cost.get('copied', 0))} copied, {int(cost.get('linked', 0))} linked in "
            f"{cost.get('copy', 0.0):.2f} s"
        )
    else:
        work = (
            f"{int(cost.get('packed', 0))} bytes packed, "
            f"{int(cost.get('unpacked', 0))} unpacked; download and verify "
            f"{cost.get('download', 0.0):.2f} s, unpack {cost.get('unpack', 0.0):.2f} s"
        )
    print(
        f"{PROG}: caches {work}; "
        f"memory peak {peak if peak is not None else 'unknown'} bytes (the process's own "
        f"peak RSS {rss} bytes)",
        file=sys.stderr,
        flush=True,
    )


# The container's own memory cgroup, as runc mounts it: cgroup v2's memory.peak, or v1's
# max_usage_in_bytes (the same high-water mark, page cache included).
_PEAK_FILES = (
    Path("/sys/fs/cgroup/memory.peak"),
    Path("/sys/fs/cgroup/memory/memory.max_usage_in_bytes"),
)


def peak_memory(files: Sequence[Path] = _PEAK_FILES) -> int | None:
    """This container's peak memory in bytes, from its cgroup; None where none is readable."""
    for path in files:
        try:
            return int(path.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue
    return None


class _OverTime(BaseException):
    """Not an Exception: the store's libraries catch those broadly (and retry)."""


@contextlib.contextmanager
def wall_clock(seconds: float) -> Iterator[None]:
    """End whatever runs when `seconds` have passed (SIGALRM: the handler's exception stops
    a blocked socket call too, PEP 475), as FetchError. Main thread only."""

    def over(signum: int, frame: object) -> None:
        raise _OverTime()

    previous = signal.signal(signal.SIGALRM, over)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.01))
    try:
        yield
    except _OverTime:
        raise FetchError(f"gave up: over the {seconds:.0f}s time limit") from None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@dataclass(frozen=True)
class Picked:
    candidate: Candidate
    node: str

    def mark(self, outcome: FetchOutcome) -> FetchOutcome:
        """The outcome, naming the model picked and the node."""
        return replace(outcome, gpu_model=self.candidate.gpu_model, node=self.node)


def pick(raw: list[str], node_map: str | None, map_name: str = "") -> Picked:
    """The candidate of the node this pod runs on, by the mounted node map; FetchError when
    the map cannot say (never a guess)."""
    try:
        candidates = [Candidate.from_arg(c) for c in raw]
    except ValueError as exc:
        raise FetchError(f"bad arguments: {exc}") from None
    node = os.environ.get(nodemap.NODE_ENV, "").strip()
    if not node:
        raise FetchError(
            f"${nodemap.NODE_ENV} is not set: this pod cannot tell which node it runs on"
        )
    if not node_map:
        raise FetchError("bad arguments: --candidate needs --node-map")
    models = [c.gpu_model for c in candidates]
    lists = nodemap.read_lists(Path(node_map), models)
    found = nodemap.models_of(node, lists)
    where = f"tunefleet's node map{f' (ConfigMap {map_name})' if map_name else ''}"
    if len(found) == 1:
        return Picked(next(c for c in candidates if c.gpu_model == found[0]), node)
    if found:
        raise FetchError(
            f"node {node} is listed under several GPU models in {where} ({', '.join(found)}): "
            "it was relabelled moments ago; no artifact is picked for an unsure model"
        )
    if all(v is None for v in lists.values()):
        raise FetchError(
            f"{where} was not there when this pod started (the operator makes it for each "
            "namespace with TuningProfiles): its GPU model cannot be told"
        )
    raise FetchError(
        f"node {node} is not listed under any of the GPU models this pod can be served for "
        f"({', '.join(models)}) in {where}: it joined moments ago (the map follows the "
        "nodes within seconds), or its GPU model is another"
    )


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # A bad command line must follow the fail-open/closed policy too, not block the pod.
        raise FetchError(f"bad arguments: {message}")


def _oci_arguments(p: argparse.ArgumentParser) -> None:
    """oci:// stores: the bundle or volume to read, and the signature it must carry."""
    p.add_argument(
        "--bundle", default="", help="oci:// stores: the bundle's digest (sha256:...) to read"
    )
    p.add_argument(
        "--from-volume",
        type=Path,
        help="oci:// stores: the artifact is this mounted image volume (check it, copy caches)",
    )
    p.add_argument(
        "--volume-served-at",
        type=Path,
        help="with --from-volume: where the serving containers mount that volume; the caches' "
        "big files are linked there instead of copied",
    )
    p.add_argument(
        "--verify-key",
        type=Path,
        help="cosign public key the bundle (oci://) or manifest (s3://, pvc://) verifies with",
    )
    p.add_argument(
        "--verify-key-env",
        default="",
        help="the variable holding that key's PEM (admission passes the spec's "
        "spec.storage.signing.publicKey so, its one source)",
    )
    p.add_argument(
        "--require-signature",
        action="store_true",
        help="serve only an artifact signed by --verify-key",
    )


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--uri", help="s3://bucket/prefix/ns/profile/model/<sha256>")
    p.add_argument("--sha256", help="the pinned SHA-256 of results.csv")
    p.add_argument(
        "--candidate",
        action="append",
        default=[],
        help="a GPU model the pod may land on (JSON: contracts.fetch_outcome.Candidate);"
        " picked by node",
    )
    p.add_argument("--node-map", help="directory of the node map's lists, one file per model")
    p.add_argument("--node-map-name", default="", help="the node map's ConfigMap, for messages")
    p.add_argument("--manifest-sha256", help="the pinned SHA-256 of manifest.json")
    p.add_argument("--dest", required=True, help="directory for tunableop_results<i>.csv")
    p.add_argument(
        "--caches-dest",
        help="directory to unpack the artifact's caches into, one directory each (writable)",
    )
    p.add_argument(
        "--caches-room",
        type=int,
        default=0,
        help="bytes the pod may hold in --caches-dest: a bundle that needs more is not unpacked",
    )
    p.add_argument("--devices", required=True, type=int, help="GPUs the pod uses (files 0..N-1)")
    p.add_argument("--gpu-model", help="refuse an artifact tuned on another GPU model")
    p.add_argument("--fail-closed", action="store_true", help="exit 1 instead of starting untuned")
    _oci_arguments(p)
    p.add_argument("--gpu-vendor", choices=sorted(fit.VENDORS), help="the GPU model's vendor")
    p.add_argument(
        "--stand-in-model",
        action="store_true",
        help="the GPU model names no real GPU (tests, demos): stand-in torch output fits it",
    )
    storage_cli.add_arguments(p, timeout_s=60.0)
    p.add_argument(
        "--credentials-secret",
        default="",
        help="the Secret the store's credentials come from (referenced as optional): when it is "
        "missing, say so and follow the policy instead of failing on the first request",
    )
    p.add_argument(
        "--termination-log",
        default="/dev/termination-log",
        help="where the outcome line also goes (the pod status shows it)",
    )
    return p


def _say(line: str, termination_log: str | None, stream: TextIO) -> None:
    """Print the outcome and leave it as the container's termination message: a fail-open
    start exits 0, where FallbackToLogsOnError would record nothing, so `kubectl describe pod`
    still shows why the pod runs untuned."""
    print(line, file=stream)
    write_termination_log(termination_log, line)


def _target(args: argparse.Namespace, gpu_model: str | None) -> fit.Target | None:
    """What the artifact must fit (vendor, stand-in), when the pod's admission said."""
    if not (gpu_model and (args.gpu_vendor or args.stand_in_model)):
        return None
    stand_in = args.stand_in_model or fit.is_stand_in_model(gpu_model)
    return fit.Target(gpu_model, args.gpu_vendor or "", stand_in)


def _failed(exc: Exception, fail_closed: bool, picked: Picked | None, log_path: str | None) -> int:
    """The policy's answer to any failure: start untuned (0) or refuse to start (1), said in
    one outcome line on the termination log."""
    known = isinstance(exc, FetchError | StoreError)
    reason = " ".join(
        (str(exc) if known else f"internal error: {type(exc).__name__}: {exc}").split()
    )
    verdict = REFUSED if fail_closed else UNTUNED
    outcome = FetchOutcome(verdict, reason)
    if picked is not None:
        outcome = picked.mark(outcome)
    _say(outcome.line(), log_path, sys.stderr)
    return 1 if fail_closed else 0


def main(argv: Sequence[str] | None = None) -> int:
    raw = list(sys.argv[1:] if argv is None else argv)
    fail_closed = "--fail-closed" in raw
    # Read before parsing: a bad-arguments failure must still reach the termination log.
    log_path: str | None = "/dev/termination-log"
    if "--termination-log" in raw[:-1]:
        log_path = raw[raw.index("--termination-log") + 1]
    picked: Picked | None = None
    try:
        args = _parser().parse_args(raw)
        uri, sha, gpu_model, manifest_sha, bundle = (
            args.uri, args.sha256, args.gpu_model, args.manifest_sha256, args.bundle,
        )  # fmt: skip
        if args.candidate:
            picked = pick(args.candidate, args.node_map, args.node_map_name)
            chosen = picked.candidate
            if chosen.untuned:
                # The node's model is one the pod could land on, with nothing to serve.
                verdict = REFUSED if chosen.fail_closed else UNTUNED
                outcome = picked.mark(FetchOutcome(verdict, chosen.untuned))
                _say(outcome.line(), log_path, sys.stderr)
                return 1 if verdict == REFUSED else 0
            uri, sha, gpu_model = chosen.uri, chosen.sha256, chosen.gpu_model
            manifest_sha = chosen.manifest_sha256 or None
            bundle = chosen.bundle
        elif not (uri and sha):
            raise FetchError("bad arguments: --uri and --sha256 (or --candidate) are required")
        pin = Pinned(uri, sha, manifest_sha, gpu_model, _target(args, gpu_model))
        if problem := credentials_problem(args, os.environ):
            raise FetchError(problem)
        with wall_clock(args.timeout_seconds):
            got = _fetch_or_volume(args, pin, bundle)
    except Exception as exc:  # any problem at all follows the policy: that is its point
        return _failed(exc, fail_closed, picked, log_path)
    return _loaded(args, got, picked, log_path)


def credentials_problem(args: argparse.Namespace, env: Mapping[str, str]) -> str:
    """Why the credentials Secret the admission referenced (optional) did not reach this
    container ("" when it did, or none was referenced): a docker config file for oci://, the
    S3 keys otherwise."""
    name = args.credentials_secret
    if not name or args.from_volume:
        return ""
    if args.oci_config:
        if (Path(args.oci_config) / ".dockerconfigjson").is_file():
            return ""
        missing = ".dockerconfigjson"
    else:
        absent = [k for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY") if not env.get(k)]
        if not absent:
            return ""
        missing = ", ".join(absent)
    return (
        f"the Secret {name} with the store's read credentials does not exist in this pod's "
        f"namespace, or lacks {missing}: create it there (read-only credentials), or name "
        "another in spec.serving.credentialsSecret"
    )


def _fetch_or_volume(args: argparse.Namespace, pin: Pinned, bundle: str) -> Fetched:
    caches_dest = Path(args.caches_dest) if args.caches_dest else None
    serving = Serving(
        args.devices,
        caches_dest,
        args.fail_closed,
        max(args.caches_room, 0),
        args.volume_served_at,
    )
    if args.from_volume:
        return from_volume(args.from_volume, pin, serving)
    return fetch(
        pin,
        Path(args.dest),
        serving,
        options=storage_cli.options(args),
        signature=Signature(
            bundle,
            args.verify_key,
            args.require_signature,
            os.environ.get(args.verify_key_env, "").encode() if args.verify_key_env else b"",
        ),
    )


def _loaded(
    args: argparse.Namespace, got: Fetched, picked: Picked | None, log_path: str | None
) -> int:
    loaded = FetchOutcome(
        LOADED,
        files=len(got.paths),
        gemms=got.gemms,
        sha256=got.sha256,
        dest=str(Path(args.dest) / kinds.kind(got.kind).FILES),
        tuned=got.outcomes.tuned if got.outcomes else None,
        default=got.outcomes.default if got.outcomes else None,
        caches=got.caches,
        caches_dest=args.caches_dest or "",
        caches_failed=got.caches_failed,
    )
    if picked is not None:
        loaded = picked.mark(loaded)
    _said_cost(got)
    _say(loaded.line(), log_path, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
