"""tunefleet-publish: upload a tuner's results.csv + manifest.json under content-addressed keys.

Runs as the tuning Job's last container. Keys:
``<prefix>/<namespace>/<profile>/<gpu-model>/<sha256 of results.csv>/{results.csv,manifest.json}``.
results.csv goes first, so a manifest in the store always has its results. The manifest gets
the tune step's image (reference and the kubelet's imageID): the operator writes the imageID
into the Job's ConfigMap once the tune step has ended, and publish waits for it, bounded,
while results.csv uploads. Then the artifact is added to the GEMM library of its identity
(library.py). On success the termination message (one JSON line, also on stdout) is what the
operator reads; it pins the manifest too (its SHA-256).

With ``--shards N`` (N > 1, this pod's index in $JOB_COMPLETION_INDEX) it publishes no artifact:
it uploads the shard's output to scratch keys for tunefleet-merge, and its termination message
describes the shard.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric import ec

from tunefleet.artifacts.brokered import with_broker
from tunefleet.artifacts.remote_sign import RemoteSigner, RemoteSignError
from tunefleet.contracts.artifact_record import ArtifactRecord, ShardRecord
from tunefleet.contracts.sign_request import ATTESTATION_SUFFIX
from tunefleet.storage import cli_flags as storage_cli
from tunefleet.storage.registry import open_store, parse_uri
from tunefleet.storage.store import (
    ConflictError,
    Location,
    NotFoundError,
    Store,
    StoreError,
    StoreOptions,
    check_key_parts,
    get_file,
)
from tuner_job.config import SHARD_ENV
from tuner_job.files import sha256_hex
from tuner_job.manifest import ArtifactId, ImageRef, Manifest, ManifestError, loads
from tuner_job.output import MANIFEST_NAME

from . import bundle, cli, fit, kinds
from .library import SCOPES, Added, add_entry, check_revision, check_scope, check_shard, shard_base

PROG = "tunefleet-publish"
TERMINATION_LIMIT = cli.TERMINATION_LIMIT


class PublishError(Exception):
    pass


@dataclass(frozen=True)
class Published:
    uri: str
    sha256: str
    manifest: Manifest  # this run's (the stored one may be an earlier run's: see kept)
    created: bool  # False: the identical results were already there
    kept_existing_manifest: bool
    manifest_sha256: str = ""
    library: Added | None = None  # the library entry; None if it could not be added
    library_error: str = ""
    bundle: str = ""  # oci:// stores: the bundle's digest (ocibundle.py)
    signed: bool = False
    volume: str = ""  # oci:// stores: the volume image's digest


@dataclass(frozen=True)
class ShardPublished:
    uri: str  # the shard's scratch prefix
    sha256: str
    manifest: Manifest
    shard: int
    shards: int


def wait_for_image_id(path: Path | None, timeout_s: float, poll_s: float = 1.0) -> str:
    """The tune step's imageID, from the file the operator fills in; "" if it never comes."""
    if path is None:
        return ""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            value = path.read_text(encoding="utf-8").strip()
        except OSError:
            value = ""
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(poll_s)


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise PublishError(f"cannot read {path}: {exc.strerror or exc}") from None


@dataclass(frozen=True)
class Whose:
    """Whose artifact a tuner's output must say it is: the profile's namespace and name and the
    GPU model (the store's key parts; the revision is the manifest's own)."""

    namespace: str
    profile: str
    gpu_model: str


def load_artifact(
    directory: Path,
    whose: Whose,
    *,
    require_rows: bool = True,
    target: fit.Target | None = None,
) -> tuple[bytes, bytes, Manifest]:
    """Read and cross-check what the tuner wrote before anything leaves the pod: the manifest
    first, since its kind names the payload (results.csv, or caches.json for caches alone)."""
    manifest_bytes = _read(directory / MANIFEST_NAME)
    try:
        manifest = loads(manifest_bytes)
        payload_name = kinds.of(manifest).PAYLOAD
    except (ManifestError, ValueError) as exc:
        raise PublishError(str(exc)) from None
    results = _read(directory / payload_name)
    check_artifact(
        results,
        manifest,
        whose,
        str(directory / payload_name),
        require_rows=require_rows,
        target=target,
    )
    return results, manifest_bytes, manifest


def check_artifact(
    results: bytes,
    manifest: Manifest,
    whose: Whose,
    source: str,
    *,
    require_rows: bool = True,
    target: fit.Target | None = None,
) -> None:
    """results.csv against its manifest (SHA-256, GEMMs, validators, outcomes, names), and,
    with a target, both against what they are for (fit.py: vendor, torch, stand-in). What the
    payload is and how it is checked is its kind's (kinds/, by the manifest's kind)."""
    try:
        kind = kinds.of(manifest)
    except ValueError as exc:
        raise PublishError(str(exc)) from None
    try:
        parsed = kind.parse(results, source, require_rows=require_rows)
    except kind.FormatError as exc:
        raise PublishError(str(exc)) from None
    sha = sha256_hex(results)
    other_sha = (
        f"manifest resultsSha256 {manifest.results_sha256} "
        f"is not the SHA-256 of {kind.PAYLOAD} ({sha})"
    )
    # The first problem found, in this order: canonical bytes, the SHA-256, the kind's own
    # agreement with the manifest, then the names.
    problems = [
        kind.noncanonical(parsed, source),
        None if manifest.results_sha256 == sha else other_sha,
        *kind.disagreements(parsed, manifest),
    ]
    names = [
        (manifest.namespace, whose.namespace, "namespace"),
        (manifest.profile, whose.profile, "profile"),
        (manifest.gpu_model, whose.gpu_model, "gpuModel"),
    ]
    problems += [
        f"manifest {what} {got!r} is not {want!r}" for got, want, what in names if got != want
    ]
    for problem in problems:
        if problem:
            raise PublishError(problem)
    if target is not None:
        found = kind.refusals(parsed, manifest, target)
        if found:
            raise PublishError(fit.summary(found, target))


@dataclass(frozen=True)
class Output:
    """The tuner's output directory, and where its artifact goes."""

    directory: Path
    uri: str
    namespace: str
    profile: str
    gpu_model: str
    # The model's vendor and whether it is a stand-in (the Job's --gpu-vendor, --stand-in-model):
    # what the output must fit. None: an older Job's command, which says neither.
    target: fit.Target | None = None
    # What the artifact is tuned for (the operator's naming.identity_document, from the tuning
    # ConfigMap): into the manifest. None: an older Job's command, a retune, an image by tag.
    identity: dict[str, Any] | None = None

    def checked(
        self, *, require_rows: bool, check: Callable[[], object] = lambda: None
    ) -> tuple[Location, bytes, Manifest]:
        """The arguments and the tuner's output, checked, before anything leaves the pod."""
        try:
            location = parse_uri(self.uri)
            check_key_parts(self.namespace, self.profile, self.gpu_model)
            check()
        except ValueError as exc:
            raise PublishError(str(exc)) from None
        whose = Whose(self.namespace, self.profile, self.gpu_model)
        results, _, manifest = load_artifact(
            self.directory, whose, require_rows=require_rows, target=self.target
        )
        return location, results, manifest


@dataclass(frozen=True)
class TuneImage:
    """The image the tune step ran: the reference asked for, and the file where the operator
    puts the kubelet's imageID once it knows it (waited for, bounded)."""

    reference: str = ""
    id_file: Path | None = None
    timeout_s: float = 120.0

    @property
    def waits(self) -> float:
        return self.timeout_s if self.reference and self.id_file else 0.0

    def ref(self) -> ImageRef | None:
        if not self.reference:
            return None
        image_id = wait_for_image_id(self.id_file, self.timeout_s)
        if not image_id and self.id_file is not None:
            print(
                f"{PROG}: the tune step's imageID did not arrive within {self.timeout_s:.0f}s: "
                "the manifest records the reference only",
                file=sys.stderr,
            )
        return ImageRef(self.reference, image_id)

    def open(self, location: Location, options: StoreOptions | None) -> Store:
        # The wait for the imageID is not store time: the store's deadline leaves room for it.
        options = options or StoreOptions(timeout_s=120.0)
        return open_store(location, replace(options, timeout_s=options.timeout_s + self.waits))


@dataclass(frozen=True)
class Signing:
    """How publish signs: by the operator (`remote`), else with a mounted key pair
    (`key_dir`), else not at all."""

    key_dir: Path | None = None
    remote: RemoteSigner | None = None


def publish(
    out: Output,
    *,
    store: Store | None = None,
    options: StoreOptions | None = None,
    image: TuneImage | None = None,
    library_scope: str = "namespace",
    signing: Signing | None = None,
) -> Published:
    """Upload the tuner's output as the profile's artifact; its manifest gets the tune step's
    image and the output's identity (what it was tuned for) before it is signed, so the
    signature binds both."""
    directory = out.directory
    location, results, manifest = out.checked(
        require_rows=True, check=lambda: check_scope(library_scope)
    )
    if (manifest.extra.shards or 1) > 1:
        # One share published as the profile's artifact would serve most GEMMs untuned.
        raise PublishError(
            f"the tuner's output is shard {manifest.extra.shard} of {manifest.extra.shards}: "
            f"publish it with --shards {manifest.extra.shards}, for tunefleet-merge"
        )
    try:
        archives = bundle.read_local(directory, manifest)
    except bundle.BundleError as exc:
        raise PublishError(str(exc)) from None
    image = image or TuneImage()
    store = store or image.open(location, options)

    def with_image(m: Manifest) -> Manifest:
        ref = image.ref()
        m = replace(m, image=ref) if ref is not None else m
        return replace(m, fleet_identity=out.identity) if out.identity is not None else m

    pub = upload_artifact(store, location, results, manifest, with_image, archives)
    signing = signing or Signing()
    pub = sign_manifest(store, location, pub, signing.key_dir, signing.remote)
    pub = push_bundle(store, location, pub, signing.key_dir, signing.remote)
    if manifest.kind != kinds.DEFAULT:
        return pub  # the GEMM library holds TunableOp rows; caches are per identity already
    return add_to_library(store, location, library_scope, pub, results)


def upload_artifact(
    store: Store,
    location: Location,
    results: bytes,
    manifest: Manifest,
    finish: Callable[[Manifest], Manifest] | None = None,
    archives: dict[str, Path] | None = None,
) -> Published:
    """The cache archives, results.csv (or the caches' index), then the manifest (``finish``
    completes it meanwhile: the image), under ``<prefix>/<ns>/<profile>/<model>/<sha256>/``;
    publish and merge both end here."""
    sha = manifest.results_sha256
    namespace, profile, gpu_model = manifest.namespace, manifest.profile, manifest.gpu_model
    base = location.key(namespace, profile, gpu_model, sha)
    kind = kinds.of(manifest)  # a known one: check_artifact or the merge made it
    if archives:
        started = time.monotonic()
        bundle.upload(store, base, manifest, archives)
        size = sum(c.size for c in manifest.caches)
        print(
            f"{PROG}: caches uploaded, {size} bytes in {time.monotonic() - started:.2f} s",
            file=sys.stderr,
        )
    created = store.put_if_absent(f"{base}/{kind.PAYLOAD}", results, kind.CONTENT_TYPE)
    if finish is not None:
        manifest = finish(manifest)
    manifest_bytes = manifest.to_json()
    kept = False
    try:
        store.put_if_absent(f"{base}/{MANIFEST_NAME}", manifest_bytes, "application/json")
    except ConflictError:
        # Byte-identical results tuned again (another run, another revision): the artifact is
        # the results, and they are there. The stored manifest stays, if it describes them.
        manifest_bytes = store.get(f"{base}/{MANIFEST_NAME}", 1 << 20)
        existing = loads(manifest_bytes)
        if (existing.results_sha256, existing.namespace, existing.profile, existing.gpu_model) != (
            sha,
            namespace,
            profile,
            gpu_model,
        ):
            raise
        kept = True  # the message still speaks for this run; the pin is the stored manifest
    return Published(location.uri(base), sha, manifest, created, kept, sha256_hex(manifest_bytes))


def _signing_key(directory: Path, what: str) -> ec.EllipticCurvePrivateKey:
    """The private key of the mounted signing Secret; PublishError (the Job fails) if it
    cannot be read."""
    from . import signing

    try:
        return signing.read_key_dir(directory)
    except signing.SigningError as exc:
        raise PublishError(f"cannot sign {what}: {exc}") from None


def _stored_manifest(store: Store, location: Location, pub: Published) -> tuple[str, bytes]:
    """The artifact's key prefix, and its manifest as the store holds it."""
    base = location.key(
        pub.manifest.namespace, pub.manifest.profile, pub.manifest.gpu_model, pub.sha256
    )
    return base, store.get(f"{base}/{MANIFEST_NAME}", 1 << 20)


def _signed_already(store: Store, where: str, manifest: bytes, public_key: str) -> bool:
    """Whether the signature at `where` is one of `manifest` by `public_key`, with the
    operator's attestation beside it."""
    from . import signing

    try:
        there = store.get(where, signing.MAX_BLOB_SIGNATURE)
        store.get(where.removesuffix(signing.BLOB_SIGNATURE_SUFFIX) + ATTESTATION_SUFFIX, 1 << 16)
        key = signing.load_public_key(public_key.encode())
    except (NotFoundError, signing.SigningError):
        return False
    return signing.verify_blob(manifest, there, key).ok


def sign_manifest(
    store: Store,
    location: Location,
    pub: Published,
    signing_key: Path | None,
    remote: RemoteSigner | None = None,
) -> Published:
    """Stores of objects (s3://, pvc://): sign the artifact's stored manifest, as
    manifest.json.sig beside it (signing.sign_blob's form): by the operator when `remote` is
    given (the key stays in its namespace; its attestation goes beside, manifest.json.att),
    else with the key pair in `signing_key` (a mounted Secret) when given. Its manifest settled
    first (this run's, or the one kept for identical results), so the signature is of the bytes
    readers get; one already there that this key made of them is kept. A failure here fails
    the Job: no record names the artifact yet."""
    if location.scheme == "oci" or (signing_key is None and remote is None):
        return pub
    from . import signing

    base, manifest_bytes = _stored_manifest(store, location, pub)
    if sha256_hex(manifest_bytes) != pub.manifest_sha256:
        raise PublishError(f"the manifest at {location.uri(base)} changed while publishing")
    where = f"{base}/{MANIFEST_NAME}{signing.BLOB_SIGNATURE_SUFFIX}"
    if remote is not None:
        if remote.public_key and _signed_already(store, where, manifest_bytes, remote.public_key):
            # Byte-identical results published again: the kept manifest was signed then.
            print(f"{PROG}: {location.uri(base)}/{MANIFEST_NAME} signed already", file=sys.stderr)
            return replace(pub, signed=True)
        try:
            signed = remote.sign(manifest_bytes)
        except RemoteSignError as e:
            raise PublishError(f"cannot sign the manifest: {e}") from None
        # The attestation first: a signature is never stored without what it attests.
        attestation = json.dumps(signed.attestation, sort_keys=True).encode()
        store.put(f"{base}/{MANIFEST_NAME}{ATTESTATION_SUFFIX}", attestation, "application/json")
        store.put(where, signed.signature, "text/plain")
        print(
            f"{PROG}: {location.uri(base)}/{MANIFEST_NAME} signed by the operator", file=sys.stderr
        )
        return replace(pub, signed=True)
    key = _signing_key(signing_key, "the manifest") if signing_key is not None else None
    assert key is not None
    try:
        there: bytes | None = store.get(where, signing.MAX_BLOB_SIGNATURE)
    except NotFoundError:
        there = None
    if there is None or not signing.verify_blob(manifest_bytes, there, key.public_key()).ok:
        # Replaced: a signature of these bytes by another key (or of none) says nothing of
        # this profile's key, and its model pods verify with this key's public half.
        store.put(where, signing.sign_blob(manifest_bytes, key), "text/plain")
    print(f"{PROG}: {location.uri(base)}/{MANIFEST_NAME} signed", file=sys.stderr)
    return replace(pub, signed=True)


def push_bundle(
    store: Store,
    location: Location,
    pub: Published,
    signing_key: Path | None,
    remote: RemoteSigner | None = None,
) -> Published:
    """oci:// stores: the artifact as one bundle, then signed by the operator (`remote`: the
    key stays in its namespace) or with the key pair in `signing_key` (a mounted Secret) when
    given. A failure here fails the Job: the objects pushed so far are never served, since no
    record names them."""
    if location.scheme != "oci":
        return pub
    from tunefleet.storage.oci import OciStore

    from . import ocibundle, signing

    assert isinstance(store, OciStore)
    key = _signing_key(signing_key, "the bundle") if signing_key is not None else None
    base, manifest_bytes = _stored_manifest(store, location, pub)
    stored = loads(manifest_bytes)
    digest = ocibundle.push(store, base, stored, pub.manifest_sha256)
    payload = store.get(f"{base}/{kinds.of(stored).PAYLOAD}", 64 << 20)
    # In $TMPDIR (the publish step's writable /tmp): the output directory is read-only there.
    with tempfile.TemporaryDirectory(prefix="tunefleet-volume-") as tmp:
        archives: dict[str, Path] = {}
        for c in stored.caches:
            # The stored archives (a kept manifest's may be another run's), streamed to disk.
            archives[c.name] = Path(tmp) / c.payload
            with open(archives[c.name], "wb") as f:
                get_file(store, bundle.key(base, c), f, bundle.MAX_ARCHIVE_BYTES)
        volume = ocibundle.push_volume(store, base, manifest_bytes, stored, payload, archives)
    images = tuple(filter(None, (digest, volume)))
    if remote is not None:
        _attach_operators(store, location, manifest_bytes, images, remote)
    elif key is not None:
        for signed in images:
            signing.sign(store, signed, key)
    signs = key is not None or remote is not None
    said = " signed" if signs else ""
    print(f"{PROG}: bundle {location.bucket}@{digest}{said}", file=sys.stderr)
    if volume:
        print(f"{PROG}: volume image {location.bucket}@{volume}{said}", file=sys.stderr)
    return replace(pub, bundle=digest, signed=signs, volume=volume)


def _attach_operators(
    store: Any, location: Location, manifest: bytes, images: tuple[str, ...], remote: RemoteSigner
) -> None:
    """The operator's signatures of the images, pushed in both of cosign's formats (the
    tuning pod holds no key: its operator read each image before it signed)."""
    from . import signing

    try:
        signed = remote.sign(manifest, images, location.bucket)
        key = signing.load_public_key(remote.public_key.encode())
    except (RemoteSignError, signing.SigningError) as e:
        raise PublishError(f"cannot sign the bundle: {e}") from None
    for image in signed.images:
        signing.attach(store, image, key)


def add_to_library(
    store: Store,
    location: Location,
    scope: str,
    pub: Published,
    results: bytes,
    prog: str = PROG,
) -> Published:
    """Add the published artifact to its library. The artifact is what serving needs; a library
    that refuses the entry costs later reuse only, so that is said, not failed."""
    try:
        added = add_entry(store, location, scope, pub.manifest, results)
    except (StoreError, UnicodeDecodeError) as exc:
        reason = " ".join(str(exc).split())
        print(f"{prog}: warning: not added to the GEMM library: {reason}", file=sys.stderr)
        return replace(pub, library_error=reason)
    verb = "added to" if added.created else "already in"
    print(f"{prog}: {verb} the GEMM library: {added.uri}", file=sys.stderr)
    return replace(pub, library=added)


def publish_shard(
    out: Output,
    shard: int,
    shards: int,
    *,
    store: Store | None = None,
    options: StoreOptions | None = None,
    image: TuneImage | None = None,
) -> ShardPublished:
    """Upload one shard's output for tunefleet-merge (scratch keys: a retried index replaces
    them). A shard may hold no GEMM at all (more shards than work)."""
    location, results, manifest = out.checked(
        require_rows=False, check=lambda: check_shard(shard, shards)
    )
    got = (manifest.extra.shard, manifest.extra.shards)
    if got != (shard, shards):
        raise PublishError(
            f"the tuner's manifest is for shard {got[0]} of {got[1]}, this pod is shard {shard} "
            f"of {shards} (${SHARD_ENV} and the config's shards must agree)"
        )
    try:
        check_revision(manifest.revision)
    except ValueError as exc:
        raise PublishError(str(exc)) from None
    image = image or TuneImage()
    ref = image.ref()
    if ref is not None:
        manifest = replace(manifest, image=ref)
    store = store or image.open(location, options)
    rev = manifest.revision
    base = shard_base(
        location, ArtifactId(out.namespace, out.profile, rev, out.gpu_model), shard, shards
    )
    # results first: a manifest in the store describes results that are there.
    kind = kinds.of(manifest)  # a known one: out.checked checked it
    store.put(f"{base}/{kind.PAYLOAD}", results, kind.CONTENT_TYPE)
    store.put(f"{base}/{MANIFEST_NAME}", manifest.to_json(), "application/json")
    return ShardPublished(location.uri(base), manifest.results_sha256, manifest, shard, shards)


def shard_message(pub: ShardPublished) -> str:
    m = pub.manifest
    return ShardRecord(
        shard=pub.shard,
        shards=pub.shards,
        uri=pub.uri,
        sha256=pub.sha256,
        gemms=m.gemms,
        recorded=m.recorded,
        reused=m.extra.reused or 0,
        resumed=m.extra.resumed or 0,
        newly_tuned=m.extra.newly_tuned or 0,
    ).to_message()


def termination_message(pub: Published, limit: int = TERMINATION_LIMIT) -> str:
    """The artifact record (contracts/artifact_record.py) as one JSON line of at most `limit`
    bytes."""
    record = ArtifactRecord.from_manifest(
        pub.manifest,
        uri=pub.uri,
        manifest_sha256=pub.manifest_sha256,
        bundle=pub.bundle,
        signed=pub.signed,
        volume=pub.volume,
    )
    try:
        return record.to_message(limit)
    except ValueError as exc:
        raise PublishError(str(exc)) from None


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--dir", required=True, help="directory with results.csv and manifest.json")
    cli.add_where(p)
    cli.add_fit(p)
    cli.add_common(p, timeout_s=120.0)
    p.add_argument("--image-reference", default="", help="the image the tune step ran in")
    p.add_argument(
        "--image-id-file",
        type=Path,
        help="file where the operator puts the tune step's imageID (waited for, bounded)",
    )
    p.add_argument("--image-id-timeout-seconds", type=float, default=120.0)
    p.add_argument(
        "--library-scope",
        choices=SCOPES,
        default="namespace",
        help="whose GEMM library the artifact joins (default: %(default)s)",
    )
    p.add_argument(
        "--shards",
        type=int,
        default=1,
        help=f"N > 1: upload this shard's output (index in ${SHARD_ENV}) for tunefleet-merge",
    )
    p.add_argument(
        "--signing-key-dir",
        type=Path,
        help="a directory with cosign.key (and cosign.password) to sign the artifact with",
    )
    add_remote_signing(p)
    cli.add_identity(p)
    return p


def add_remote_signing(p: argparse.ArgumentParser) -> None:
    """Signing by the operator (artifacts/remote_sign.py): where it listens and the token."""
    p.add_argument("--sign-url", default="", help="the operator's endpoint that signs manifests")
    p.add_argument("--sign-token-file", type=Path, help="the projected token for --sign-url")
    p.add_argument("--sign-address", default="", help="where to connect if its host won't resolve")
    p.add_argument(
        "--sign-ca-env", default="", help="environment variable with the endpoint's CA (PEM)"
    )
    p.add_argument(
        "--sign-public-key-env",
        default="",
        help="environment variable with the profile's public key: the operator's answers are "
        "checked with it",
    )


def remote_signer(args: argparse.Namespace) -> RemoteSigner | None:
    if not args.sign_url:
        return None
    if args.sign_token_file is None:
        raise PublishError("--sign-url needs --sign-token-file")
    return RemoteSigner(
        args.sign_url,
        args.sign_token_file,
        ca_pem=os.environ.get(args.sign_ca_env, "") if args.sign_ca_env else "",
        address=args.sign_address,
        public_key=(
            os.environ.get(args.sign_public_key_env, "") if args.sign_public_key_env else ""
        ),
    )


def shard_index() -> int:
    raw = os.environ.get(SHARD_ENV, "").strip() or "0"
    if not raw.isdigit():
        raise PublishError(f"{SHARD_ENV}={raw!r} is not a shard index")
    return int(raw)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    options = with_broker(args, storage_cli.options(args))
    image = TuneImage(args.image_reference, args.image_id_file, args.image_id_timeout_seconds)
    out = Output(
        Path(args.dir),
        args.uri,
        args.namespace,
        args.profile,
        args.gpu_model,
        cli.target(args),
        cli.identity(args.identity_file, PROG),
    )

    def run() -> str:
        if args.shards > 1:
            shard = publish_shard(out, shard_index(), args.shards, options=options, image=image)
            return shard_message(shard)
        pub = publish(
            out,
            options=options,
            image=image,
            library_scope=args.library_scope,
            signing=Signing(args.signing_key_dir, remote_signer(args)),
        )
        if not pub.created:
            print(f"{PROG}: {pub.uri} was already published: nothing uploaded", file=sys.stderr)
        if pub.kept_existing_manifest:
            print(f"{PROG}: kept the manifest already stored for these results", file=sys.stderr)
        return termination_message(pub)

    return cli.finish(PROG, args.termination_log, run, (PublishError,))


if __name__ == "__main__":
    sys.exit(main())
