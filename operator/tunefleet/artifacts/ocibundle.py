"""An artifact as one OCI bundle: what an oci:// store adds to the objects every store holds.

publish pushes, after the artifact's objects (storage/oci.py), one image manifest whose layers
are those objects' blobs (the manifest, the payload, each cache archive), by digest, with
tunefleet's media types per kind and annotations for its identity; then signs it
(signing.py). The record names the bundle by digest; fetch reads the artifact through
`BundleView`, which only ever resolves that digest: no tag is read to serve a pod.

Where the field has names for the same things, they are written too (docs/oci.md says what
that buys): the OCI image annotations, and KServe's kernel-cache keys (io.kserve.km/*) on each
cache layer. GKM's cache images are a different layout (one image per Triton cache, its own
media type), which tunefleet does not produce.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from tunefleet.storage.oci import (
    KEY_ANNOTATION,
    MANIFEST_MEDIA_TYPE,
    OciStore,
    Part,
    bundle_tag,
    volume_tag,
)
from tunefleet.storage.store import (
    Listed,
    NotFoundError,
    Received,
    StoreError,
    TooLargeError,
)
from tuner_job import caches as cc
from tuner_job.files import HashingWriter, copy_file
from tuner_job.manifest import Manifest
from tuner_job.output import MANIFEST_NAME

from . import bundle as archives_in_store
from . import gz, kinds

ARTIFACT_TYPE = "application/vnd.tunefleet.bundle.v1"
MANIFEST_LAYER = "application/vnd.tunefleet.manifest.v1+json"
PAYLOAD_LAYERS = {
    "results.csv": "application/vnd.tunefleet.tunableop.results.v1+csv",
    cc.INDEX_NAME: "application/vnd.tunefleet.caches.index.v1+json",
}
PREFIX = "io.tunefleet."


def cache_media_type(kind: str) -> str:
    return f"application/vnd.tunefleet.informers.cache.{kind.lower()}.v1.tar+gzip"


def bundle_annotations(manifest: Manifest, manifest_sha256: str) -> dict[str, str]:
    """What the bundle is, for people and tools browsing the registry: never trusted by
    tunefleet (the signed manifest object inside is)."""
    out = {
        "org.opencontainers.image.title": f"{manifest.profile} {manifest.gpu_model}",
        "org.opencontainers.image.created": manifest.tuned_at,
        "org.opencontainers.image.vendor": "tunefleet",
        f"{PREFIX}namespace": manifest.namespace,
        f"{PREFIX}profile": manifest.profile,
        f"{PREFIX}gpu-model": manifest.gpu_model,
        f"{PREFIX}revision": manifest.revision,
        f"{PREFIX}kinds": ",".join(
            (["tunableop"] if manifest.kind == kinds.DEFAULT else [])
            + [c.name for c in manifest.caches]
        ),
        f"{PREFIX}results-sha256": manifest.results_sha256,
        f"{PREFIX}manifest-sha256": manifest_sha256,
    }
    for name, value in sorted(manifest.identity.items()):
        out[f"{PREFIX}identity.{name}"] = str(value)[:256]
    for name, value in sorted(manifest.validators.items()):
        out[f"{PREFIX}validator.{name}"] = str(value)[:256]
    if manifest.caches:
        # KServe's kernel-cache keys, where one is the same thing.
        out["io.kserve.km/framework"] = "pytorch"
    return {k: v for k, v in out.items() if v}


def parts(base: str, manifest: Manifest) -> list[Part]:
    payload = kinds.of(manifest).PAYLOAD
    out = [
        Part(f"{base}/{MANIFEST_NAME}", MANIFEST_LAYER, {}),
        Part(f"{base}/{payload}", PAYLOAD_LAYERS.get(payload, "application/octet-stream"), {}),
    ]
    for entry in manifest.caches:
        variables = cc.KINDS.get(entry.kind, ())
        notes = {
            f"{PREFIX}cache.name": entry.name,
            f"{PREFIX}cache.kind": entry.kind,
            "io.kserve.km/cache-type": entry.kind,
            "io.kserve.km/cache-hash": entry.sha256,
        }
        if variables:
            notes["io.kserve.km/cache-root-env"] = variables[0][0]
        out.append(Part(archives_in_store.key(base, entry), cache_media_type(entry.kind), notes))
    return out


def push(store: OciStore, base: str, manifest: Manifest, manifest_sha256: str) -> str:
    """The bundle of the artifact stored under `base`; its digest. Pushing it again gives the
    same digest only if nothing in it changed (annotations are derived from the manifest)."""
    return store.push_bundle(
        parts(base, manifest),
        bundle_annotations(manifest, manifest_sha256),
        ARTIFACT_TYPE,
        bundle_tag(base),
    )


@dataclass(frozen=True)
class _Layer:
    digest: str
    size: int


class BundleView:
    """A read-only Store over one bundle, resolved by its digest: get(key) reads the layer the
    bundle lists under that key, by the layer's digest (checked as it arrives)."""

    def __init__(self, store: OciStore, digest: str) -> None:
        self.store = store
        self.digest = digest
        self.location = store.location
        found = store.manifest(digest)
        if found is None:
            raise NotFoundError(f"{store.location.bucket}@{digest}: no such bundle in the registry")
        doc = found[0]
        if doc.get("artifactType") != ARTIFACT_TYPE or doc.get("mediaType") not in (
            None,
            MANIFEST_MEDIA_TYPE,
        ):
            raise StoreError(f"{store.location.bucket}@{digest} is not a tunefleet bundle")
        self.layers: dict[str, _Layer] = {}
        for layer in doc.get("layers") or []:
            if not isinstance(layer, dict):
                continue
            key = (layer.get("annotations") or {}).get(KEY_ANNOTATION)
            if isinstance(key, str):
                self.layers[key] = _Layer(str(layer.get("digest", "")), int(layer.get("size", 0)))

    def uri(self, key: str) -> str:
        return f"{self.location.uri(key)} (bundle {self.digest[:19]})"

    def get(self, key: str, max_bytes: int) -> bytes:
        layer = self.layers.get(key)
        if layer is None:
            raise NotFoundError(f"the bundle {self.digest[:19]} holds no {key}")
        if layer.size > max_bytes:
            raise TooLargeError(f"{self.uri(key)} is {layer.size} bytes, more than {max_bytes}")
        return self.store.blob(layer.digest, max_bytes, self.uri(key))

    def get_file(self, key: str, dest: BinaryIO, max_bytes: int) -> Received:
        layer = self.layers.get(key)
        if layer is None:
            raise NotFoundError(f"the bundle {self.digest[:19]} holds no {key}")
        if layer.size > max_bytes:
            raise TooLargeError(f"{self.uri(key)} is {layer.size} bytes, more than {max_bytes}")
        return self.store.blob_to(layer.digest, dest, max_bytes, self.uri(key))

    def _read_only(self, *_: Any) -> Any:
        raise StoreError("a bundle is read-only")

    def put_if_absent(self, key: str, data: bytes, content_type: str) -> bool:
        return bool(self._read_only())

    def put(self, key: str, data: bytes, content_type: str) -> None:
        self._read_only()

    def delete(self, key: str) -> None:
        self._read_only()

    def list(self, prefix: str, limit: int) -> list[Listed]:
        want = prefix.rstrip("/") + "/" if prefix else ""
        found = [
            Listed(k, v.size, 0.0) for k, v in sorted(self.layers.items()) if k.startswith(want)
        ]
        return found[:limit]


# --- the volume image: what a Kubernetes image volume mounts --------------------------------

IMAGE_CONFIG = "application/vnd.oci.image.config.v1+json"
LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
VOLUME_ARTIFACT_TYPE = "application/vnd.tunefleet.volume.v1"
# The results file once per GPU ordinal (hard links in the layer: one copy of the bytes), as
# a mounted ConfigMap projects it: TunableOp reads tunableop_results<ordinal>.csv.
VOLUME_DEVICES = 256
META_DIR = ".tunefleet"
CACHES_DIR = f"{META_DIR}/caches"  # each cache's files under <this>/<name>/, as fetch lays them
MAX_VOLUME_LAYER = 64 << 20
# What the first layer (manifest, payload, a results file per GPU ordinal) may unpack to, and
# the ordinals checked: a results file is at most a few MB, and fetch serves 256 GPUs at most.
MAX_VOLUME_UNPACKED = 256 << 20
MAX_VOLUME_DEVICES = 256


class VolumeError(Exception):
    """A volume image that is not the artifact it is said to be."""


def _gzip_tar(add: Any) -> bytes:
    """A layer, byte for byte the same for the same content: entries in the order `add`
    writes them, fixed times, owners and modes, gzip without a timestamp."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        add(tar)
    return gzip.compress(buf.getvalue(), compresslevel=6, mtime=0)


def volume_layer(manifest_bytes: bytes, payload_name: str, payload: bytes, results: bool) -> bytes:
    """The first layer: the manifest and payload under .tunefleet/, and with TunableOp results
    the results file once per GPU ordinal at the root."""
    from tunefleet.artifacts.kinds import kind

    def add(tar: tarfile.TarFile) -> None:
        tar.addfile(_entry(META_DIR, tarfile.DIRTYPE, 0o555))
        for name, data in ((MANIFEST_NAME, manifest_bytes), (payload_name, payload)):
            info = _entry(f"{META_DIR}/{name}", tarfile.REGTYPE, 0o444, len(data))
            tar.addfile(info, io.BytesIO(data))
        if not results:
            return
        files = kind().device_files(VOLUME_DEVICES)
        first = files[0][1]
        tar.addfile(_entry(first, tarfile.REGTYPE, 0o444, len(payload)), io.BytesIO(payload))
        for _, path in files[1:]:
            link = _entry(path, tarfile.LNKTYPE, 0o444)
            link.linkname = first
            tar.addfile(link)

    return _gzip_tar(add)


def cache_layer_file(
    name: str, archive: Path, target: Path, max_bytes: int = cc.DEFAULT_MAX_BYTES
) -> str:
    """One cache's archive (checked and deterministic: tuner_job/caches.py) as a layer under
    .tunefleet/caches/<name>/, written to `target` a member at a time: its members in their
    order, read-only (fetch copies them into the pod's writable directory), read to no more
    than its files' max_bytes (the manifest's word) allow. Returns the layer's diff_id (the
    SHA-256 of its tar, hashed as it is written)."""
    with open(target, "wb") as raw:
        packed = HashingWriter(raw)
        with gzip.GzipFile(fileobj=packed, mode="wb", compresslevel=6, mtime=0) as gz:
            plain: Any = HashingWriter(gz)  # a writer, as tarfile takes one
            with tarfile.open(fileobj=plain, mode="w", format=tarfile.PAX_FORMAT) as tar:
                tar.addfile(_entry(f"{CACHES_DIR}/{name}", tarfile.DIRTYPE, 0o555))
                with open(archive, "rb") as f, cc.members(f, f"cache {name}", max_bytes) as src:
                    for member in src:
                        path = f"{CACHES_DIR}/{name}/{member.name}"
                        if member.isdir():
                            tar.addfile(_entry(path, tarfile.DIRTYPE, 0o555))
                            continue
                        data = src.extractfile(member)
                        if data is None:
                            raise VolumeError(f"cache {name}: cannot read {member.name}")
                        mode = 0o555 if member.mode & 0o111 else 0o444
                        tar.addfile(_entry(path, tarfile.REGTYPE, mode, member.size), data)
        packed.drop()
    return "sha256:" + str(plain.hexdigest())


def cache_layer(name: str, archive: bytes) -> bytes:
    """cache_layer_file's layer as bytes (small caches, tests)."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "archive").write_bytes(archive)
        cache_layer_file(name, Path(tmp) / "archive", Path(tmp) / "layer")
        return (Path(tmp) / "layer").read_bytes()


def _entry(name: str, kind: bytes, mode: int, size: int = 0) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.size, info.mtime = kind, mode, size, 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def read_volume_layer(layer: bytes, payload_name: str, results: bool) -> tuple[bytes, bytes]:
    """(manifest.json, payload) of a volume's first layer, every device file (one per GPU
    ordinal, whatever its number) checked to be the results or a hard link to the first: what
    the operator compares with the artifact's pins before pods mount it."""
    try:
        raw = gz.gunzip(layer, MAX_VOLUME_UNPACKED, "the volume layer")
    except ValueError as exc:
        raise VolumeError(str(exc)) from None
    try:
        with tarfile.open(fileobj=io.BytesIO(raw), mode="r:") as tar:
            members = {m.name: m for m in tar.getmembers()}
            manifest = _read_member(tar, members, f"{META_DIR}/{MANIFEST_NAME}")
            payload = _read_member(tar, members, f"{META_DIR}/{payload_name}")
            from tunefleet.artifacts.kinds import kind

            first = kind().device_files(1)[0][1]
            if results and _read_member(tar, members, first) != payload:
                raise VolumeError(f"{first} is not the artifact's results")
            devices = {f for _, f in kind().device_files(MAX_VOLUME_DEVICES)}
            for m in members.values():
                if (m.islnk() and m.linkname != first) or m.issym() or m.isdev():
                    raise VolumeError(f"{m.name} links elsewhere or is a device")
                other = results and m.name in devices and m.isfile() and m.name != first
                if other and _read_member(tar, members, m.name) != payload:
                    raise VolumeError(f"{m.name} is not the artifact's results")
    except (OSError, EOFError, tarfile.TarError) as exc:
        raise VolumeError(f"the volume layer does not unpack: {exc}") from None
    return manifest, payload


def _read_member(tar: tarfile.TarFile, members: dict[str, tarfile.TarInfo], name: str) -> bytes:
    member = members.get(name)
    if member is None or not member.isfile():
        raise VolumeError(f"the volume image holds no {name}")
    f = tar.extractfile(member)
    assert f is not None
    return f.read()


def push_volume(
    store: OciStore,
    base: str,
    manifest_bytes: bytes,
    manifest: Manifest,
    payload: bytes,
    archives: dict[str, Path],
) -> str:
    """The artifact as an image a pod mounts read-only (volumes[].image): TunableOp results
    once per GPU ordinal at its root, each cache under .tunefleet/caches/<name>/ (a layer of
    its own, made on disk beside its archive and pushed from there); its digest."""
    import tempfile

    kind = kinds.of(manifest)
    first = volume_layer(manifest_bytes, kind.PAYLOAD, payload, manifest.kind == kinds.DEFAULT)
    # Our own layer, but read with the bound check_volume reads it with: one it would refuse
    # is refused here, before it is pushed.
    try:
        diff_ids = [
            "sha256:"
            + hashlib.sha256(gz.gunzip(first, MAX_VOLUME_UNPACKED, "the volume layer")).hexdigest()
        ]
    except ValueError as exc:
        raise VolumeError(str(exc)) from None
    layers = [{"mediaType": LAYER, "digest": store.push_blob(first), "size": len(first)}]
    for c in manifest.caches:
        archive = archives[c.name]
        with tempfile.TemporaryDirectory(prefix=".layer-", dir=archive.parent) as tmp:
            target = Path(tmp) / "layer"
            diff_ids.append(cache_layer_file(c.name, archive, target, c.bytes))
            digest, size = store.push_blob_file(target)
        layers.append({"mediaType": LAYER, "digest": digest, "size": size})
    config = json.dumps(
        {"architecture": "amd64", "os": "linux", "config": {},
         "rootfs": {"type": "layers", "diff_ids": diff_ids}},
        sort_keys=True, separators=(",", ":"),
    ).encode()  # fmt: skip
    manifest_doc = {
        "schemaVersion": 2,
        "mediaType": MANIFEST_MEDIA_TYPE,
        "artifactType": VOLUME_ARTIFACT_TYPE,
        "config": {
            "mediaType": IMAGE_CONFIG,
            "digest": store.push_blob(config),
            "size": len(config),
        },
        "layers": layers,
        "annotations": {"org.opencontainers.image.title": base.rsplit("/", 1)[-1]},
    }
    digest = store.push_manifest(manifest_doc, "")
    store.push_manifest(manifest_doc, volume_tag(base))
    return digest


def check_volume(
    store: OciStore, digest: str, sha256: str, manifest_sha256: str, record_kind: str, caches: int
) -> None:
    """The volume image at `digest` holds exactly the artifact's manifest and payload (its
    pins) and a layer per cache, or VolumeError. The caches' own bytes are bound by the
    signature (the operator does not download them)."""
    found = store.manifest(digest)
    if found is None:
        raise VolumeError(f"{store.location.bucket}@{digest}: no such image in the registry")
    layers = found[0].get("layers") or []
    if found[0].get("artifactType") != VOLUME_ARTIFACT_TYPE or len(layers) != 1 + caches:
        raise VolumeError(f"{store.location.bucket}@{digest} is not this artifact's volume image")
    layer = store.blob(
        str(layers[0].get("digest", "")), MAX_VOLUME_LAYER, f"the volume layer of {digest}"
    )
    kind = kinds.kind(record_kind)
    manifest, payload = read_volume_layer(layer, kind.PAYLOAD, record_kind == kinds.DEFAULT)
    if hashlib.sha256(payload).hexdigest() != sha256:
        raise VolumeError(f"the volume image's {kind.PAYLOAD} is not the artifact {sha256[:12]}")
    if manifest_sha256 and hashlib.sha256(manifest).hexdigest() != manifest_sha256:
        raise VolumeError(
            f"the volume image's manifest is not the artifact's {manifest_sha256[:12]}"
        )


# A file this large or larger in a mounted volume image is served as a link into the image
# (read-only, on the node once for every pod) rather than copied into the pod's writable
# directory: the bytes of a big cache are kernels and graphs that stacks read and replace
# (write a new file, rename it over the old one: a link is replaced the same way), never
# rewrite in place. Smaller files, where the index files and counters that stacks do rewrite
# in place live, are copied; their bytes are a small share of a big cache.
LINK_MIN_BYTES = 1 << 20
_ELF = b"\x7fELF"


@dataclass(frozen=True)
class Copied:
    """What copy_caches did: the caches served, and their bytes copied and linked."""

    names: tuple[str, ...]
    copied: int = 0
    linked: int = 0


def mounted_noexec(path: Path, mountinfo: Path = Path("/proc/self/mountinfo")) -> bool:
    """Whether the mount holding `path` forbids running its files (a runtime may mount image
    volumes noexec): a library there cannot be mapped executable, so it is copied, not
    linked. Unknown (no mountinfo): True, the safe answer."""
    try:
        lines = mountinfo.read_text().splitlines()
    except OSError:
        return True
    best, options = "", ""
    target = str(path.resolve())
    for line in lines:
        fields = line.split()
        if len(fields) < 6:
            continue
        point = fields[4].replace("\\040", " ")
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, options = point, fields[5]
    return not best or "noexec" in options.split(",")


def _runnable(path: Path) -> bool:
    """A file a stack may map executable: its mode says so, or it is an ELF object."""
    if path.stat().st_mode & 0o111:
        return True
    with open(path, "rb") as f:
        return f.read(4) == _ELF


def copy_caches(
    root: Path, manifest: Manifest, dest: Path, served_at: Path | None = None
) -> Copied:
    """Each cache of a mounted volume image (root/.tunefleet/caches/<name>) into dest/<name>: a
    pod-local writable directory, as fetch unpacks an archive. Its files and bytes must be what
    the manifest lists; a link or device is refused. VolumeError says what is wrong.

    `served_at`: where the serving containers mount the same volume. Given, a file of
    LINK_MIN_BYTES or more becomes a symbolic link to its place there instead of a copy (every
    pod on the node then shares the one pulled image's bytes), but one a stack may run where
    the volume is mounted noexec."""
    noexec = served_at is not None and mounted_noexec(root)
    copied = linked = 0
    for entry in manifest.caches:
        src, target = root / CACHES_DIR / entry.name, dest / entry.name
        files = total = 0
        for path in sorted(src.rglob("*")) if src.is_dir() else []:
            if path.is_symlink() or not (path.is_dir() or path.is_file()):
                raise VolumeError(f"cache {entry.name}: {path.relative_to(src)} is not a file")
            if path.is_file():
                files, total = files + 1, total + path.stat().st_size
        if not src.is_dir() or (files, total) != (entry.files, entry.bytes):
            raise VolumeError(
                f"cache {entry.name} in the volume holds {files} file(s), {total} bytes; its "
                f"manifest lists {entry.files}, {entry.bytes}"
            )
        try:
            for path in [src, *sorted(src.rglob("*"))]:
                rel = path.relative_to(src)
                out = target / rel
                if path.is_dir():
                    out.mkdir(parents=True, exist_ok=True)
                    os.chmod(out, 0o777)
                    continue
                size = path.stat().st_size
                if (
                    served_at is not None
                    and size >= LINK_MIN_BYTES
                    and not (noexec and _runnable(path))
                ):
                    out.symlink_to(served_at / CACHES_DIR / entry.name / rel)
                    linked += size
                    continue
                copied += copy_file(path, out)
                os.chmod(out, 0o777 if path.stat().st_mode & 0o111 else 0o666)
            cc.kind_directories(entry.kind, target)
        except OSError as exc:
            raise VolumeError(f"cannot copy cache {entry.name} to {target}: {exc}") from None
    return Copied(tuple(c.name for c in manifest.caches), copied, linked)


def names_manifest(store: OciStore, digest: str, manifest_bytes: bytes) -> str:
    """Why the image at `digest` is neither the bundle nor the volume image of the artifact
    whose stored manifest is `manifest_bytes`; "" when it is one. What the operator checks
    before it signs an image for a tuning pod: the bundle by its manifest layer (the very
    bytes, by digest), the volume image as delivery checks it (check_volume)."""
    from tuner_job.manifest import ManifestError, loads

    found = store.manifest(digest)
    if found is None:
        return f"{store.location.bucket}@{digest}: no such image in the registry"
    doc, sha = found[0], hashlib.sha256(manifest_bytes).hexdigest()
    if doc.get("artifactType") == ARTIFACT_TYPE:
        ours = {"mediaType": MANIFEST_LAYER, "digest": f"sha256:{sha}"}
        for layer in doc.get("layers") or []:
            if isinstance(layer, dict) and all(layer.get(k) == v for k, v in ours.items()):
                return ""
        return f"{store.location.bucket}@{digest} is a bundle of another manifest"
    if doc.get("artifactType") == VOLUME_ARTIFACT_TYPE:
        try:
            m = loads(manifest_bytes)
            check_volume(store, digest, m.results_sha256, sha, m.kind, len(m.caches))
        except (ManifestError, VolumeError, StoreError) as e:
            return str(e)
        return ""
    return f"{store.location.bucket}@{digest} is neither a tunefleet bundle nor a volume image"
