"""Artifacts on this machine: download + verify through tunefleet-fetch's own code, and the
sides of a diff (an artifact in a store, a local directory or file, a profile's current one).

S3 settings: --endpoint-url, else AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL, else the profile's
spec.storage.endpoint (what pods use: it may be a name only the cluster resolves, so this
machine's own settings come first); credentials as boto3 finds them (AWS_* variables,
~/.aws, a cloud identity). Secrets in the cluster are never read. A pvc:// store is read where
its claim is mounted on this machine (--pvc-root).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tunefleet.artifacts import kinds
from tunefleet.artifacts.fetch import FetchError, Pinned, Serving, fetch
from tunefleet.storage.registry import open_store, parse_uri
from tunefleet.storage.s3 import resolve_endpoint
from tunefleet.storage.store import (
    Listed,
    NotFoundError,
    Store,
    StoreError,
    StoreOptions,
    check_sha256,
)
from tuner_job.files import sha256_hex
from tuner_job.manifest import ManifestError, loads
from tuner_job.output import MANIFEST_NAME, RESULTS_NAME
from tuner_job.results import CsvFormatError, ResultsFile, parse_results, read_results

from .cluster import Cluster
from .diff_cmd import Ref
from .errors import PluginError

LOCAL_NAMES = (RESULTS_NAME, kinds.kind().FILES % 0)  # publish's name, then fetch's (GPU 0's)
REMOTE_KINDS = ("s3", "pvc")  # diff sides in a store (plugin/diff_cmd.py parse_ref)


@dataclass(frozen=True)
class S3Options:
    """The plugin's storage flags (the profile fills in what they leave out)."""

    endpoint_url: str | None = None
    region: str | None = None
    timeout_s: float = 60.0
    pvc_root: str = StoreOptions.pvc_root


@dataclass
class Recording:
    """A Store that keeps what fetch read (to save the verified manifest without reading it
    twice) and the store's own failure (to tell "cannot reach S3" from "does not verify")."""

    inner: Store
    objects: dict[str, bytes] = field(default_factory=dict)
    error: StoreError | None = None

    def get(self, key: str, max_bytes: int) -> bytes:
        try:
            data = self.inner.get(key, max_bytes)
        except StoreError as e:
            self.error = e
            raise
        self.objects[key.rsplit("/", 1)[-1]] = data
        return data

    def put_if_absent(self, key: str, data: bytes, content_type: str) -> bool:
        raise StoreError("the plugin only reads artifacts")

    def put(self, key: str, data: bytes, content_type: str) -> None:
        raise StoreError("the plugin only reads artifacts")

    def list(self, prefix: str, limit: int) -> list[Listed]:
        return self.inner.list(prefix, limit)

    def delete(self, key: str) -> None:
        raise StoreError("the plugin only reads artifacts")

    def uri(self, key: str) -> str:
        return self.inner.uri(key)


def endpoint_for(opts: S3Options, profile: dict[str, Any] | None) -> str | None:
    storage = ((profile or {}).get("spec") or {}).get("storage") or {}
    return opts.endpoint_url or resolve_endpoint(None) or storage.get("endpoint") or None


def region_for(opts: S3Options, profile: dict[str, Any] | None) -> str | None:
    storage = ((profile or {}).get("spec") or {}).get("storage") or {}
    return opts.region or storage.get("region") or None


def store_options(opts: S3Options, profile: dict[str, Any] | None) -> StoreOptions:
    return StoreOptions(
        endpoint_url=endpoint_for(opts, profile),
        region=region_for(opts, profile),
        timeout_s=opts.timeout_s,
        pvc_root=opts.pvc_root,
    )


def pick_artifact(profile: dict[str, Any], gpu_model: str | None) -> dict[str, Any]:
    """The profile's current artifact for gpu_model (may be omitted for one-model profiles)."""
    meta = profile.get("metadata") or {}
    ns, name = meta.get("namespace", ""), meta.get("name", "")
    st = profile.get("status") or {}
    models = [str(m) for m in ((profile.get("spec") or {}).get("gpu") or {}).get("models") or []]
    arts = {a.get("gpuModel"): a for a in st.get("artifacts") or [] if isinstance(a, dict)}
    known = models + [str(m) for m in arts if m not in models]
    if gpu_model is None:
        if len(known) != 1:
            raise PluginError(
                f"TuningProfile {name!r} tunes several GPU models ({', '.join(known)}): name "
                f"one with --gpu-model (or {ns}/{name}:<model> in diff)"
            )
        gpu_model = known[0]
    if gpu_model not in known:
        raise PluginError(
            f"TuningProfile {name!r} does not tune GPU model {gpu_model!r}: use one of "
            f"{', '.join(known) or '(none)'}"
        )
    art = arts.get(gpu_model)
    if art is None or not art.get("uri") or not art.get("sha256"):
        raise PluginError(
            f"TuningProfile {name!r} has no artifact for {gpu_model} yet (phase "
            f"{st.get('phase') or 'Pending'}): wait until `kubectl tunefleet status {name} -n "
            f"{ns}` shows Ready"
        )
    return dict(art)


def _s3_hint(endpoint: str | None) -> str:
    where = f"endpoint {endpoint}" if endpoint else "AWS's default endpoint"
    return (
        f"check the S3 endpoint ({where}: --endpoint-url or AWS_ENDPOINT_URL_S3) and "
        "credentials (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)"
    )


@dataclass(frozen=True)
class Verified:
    paths: list[Path]
    gemms: int
    sha256: str
    manifest: bytes
    caches: tuple[str, ...] = ()  # unpacked under <dest>/caches/<name>


def fetch_verified(pin: Pinned, dest: Path, devices: int, options: StoreOptions) -> Verified:
    """tunefleet-fetch's download and checks, with errors as one line that says what to do."""
    endpoint = options.endpoint_url
    uri = pin.uri
    try:
        location = parse_uri(uri)
        store = Recording(open_store(location, options))
    except ValueError as e:
        raise PluginError(f"{uri}: {e}") from None
    try:
        # A local copy is all or nothing: a cache that fails its check fails the download.
        got = fetch(pin, dest, Serving(devices, dest / "caches", fail_closed=True), store=store)
    except FetchError as e:
        if store.error is not None:
            missing = isinstance(store.error, NotFoundError)
            raise PluginError(
                f"cannot download the artifact ({store.error}): "
                + ("is this the right endpoint and bucket? " if missing else "")
                + _s3_hint(endpoint)
            ) from None
        if str(e).startswith("cannot write into"):
            raise PluginError(f"{e}: pick another --dest") from None
        raise PluginError(
            f"artifact {uri} failed verification, nothing was written: {e}: pods that fetch it "
            "start untuned; publish a good one (retune)"
        ) from None
    manifest = store.objects.get(MANIFEST_NAME, b"")
    return Verified(got.paths, got.gemms, got.sha256, manifest, got.caches)


def write_atomically(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o444)  # as fetch leaves the results files: a verified copy, read-only
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)


def download(
    profile: dict[str, Any],
    gpu_model: str | None,
    dest: Path,
    devices: int,
    opts: S3Options,
) -> dict[str, Any]:
    """Fetch and verify the profile's current artifact into dest, plus its manifest.json."""
    art = pick_artifact(profile, gpu_model)
    model = str(art["gpuModel"])
    if dest.exists() and not dest.is_dir():
        raise PluginError(f"--dest {dest} exists and is not a directory: pick another")
    pin = Pinned(str(art["uri"]), str(art["sha256"]), art.get("manifestSha256") or None, model)
    got = fetch_verified(pin, dest, devices, store_options(opts, profile))
    manifest_path = dest / MANIFEST_NAME
    try:
        write_atomically(manifest_path, got.manifest)
    except OSError as e:
        raise PluginError(f"cannot write {manifest_path}: {e.strerror or e}") from None
    meta = profile.get("metadata") or {}
    return {
        "namespace": meta.get("namespace", ""),
        "profile": meta.get("name", ""),
        "gpuModel": model,
        "uri": art["uri"],
        "sha256": got.sha256,
        "manifestSha256": sha256_hex(got.manifest),
        "manifestPinned": bool(art.get("manifestSha256")),
        "gemms": got.gemms,
        "files": [str(p) for p in got.paths],
        "caches": [str(dest / "caches" / name) for name in got.caches],
        "manifest": str(manifest_path),
        "filename": str(dest / "tunableop_results%d.csv"),
    }


def format_download(report: dict[str, Any]) -> str:
    pinned = (
        "manifest SHA-256 as pinned in status"
        if report["manifestPinned"]
        else "manifest not pinned in status (an artifact from before manifestSha256)"
    )
    lines = [
        f"Verified {report['uri']}",
        f"  {report['gemms']} GEMMs, GPU model {report['gpuModel']}, sha256 {report['sha256']};"
        f" {pinned}",
        "Wrote:",
        *(f"  {p}" for p in [*report["files"], *report.get("caches", []), report["manifest"]]),
    ]
    if report["files"]:
        lines.append(f"Load it with PYTORCH_TUNABLEOP_FILENAME={report['filename']}")
    if report.get("caches"):
        lines.append(
            "Each cache is a directory its stack's variable can point at (docs/bundles.md)"
        )
    return "\n".join(lines) + "\n"


def _manifest_about(data: bytes) -> dict[str, Any]:
    try:
        m = loads(data)
    except ManifestError:
        return {}
    return {"gpuModel": m.gpu_model, "profile": f"{m.namespace}/{m.profile}", "tunedAt": m.tuned_at}


def load_local(text: str) -> tuple[ResultsFile, dict[str, Any]]:
    path = Path(text.removeprefix("file://")).expanduser()
    if path.is_dir():
        found = next((path / n for n in LOCAL_NAMES if (path / n).is_file()), None)
        if found is None:
            raise PluginError(
                f"{text}: no {' or '.join(LOCAL_NAMES)} in this directory: pass a directory "
                "that `kubectl tunefleet download` wrote, or a results CSV"
            )
        file = found
    elif path.is_file():
        file = path
    else:
        raise PluginError(
            f"{text}: no such file or directory (an artifact is s3://.../<sha256>, a profile "
            "[namespace/]profile[:gpuModel])"
        )
    try:
        data = file.read_bytes()
        results = read_results(file)
    except CsvFormatError as e:
        raise PluginError(f"{file} is not a TunableOp results file: {e}") from None
    except OSError as e:
        raise PluginError(f"cannot read {file}: {e.strerror or e}") from None
    side: dict[str, Any] = {
        "kind": "local",
        "source": str(file),
        "gemms": results.gemms,
        "sha256": sha256_hex(data),
    }
    manifest = file.parent / MANIFEST_NAME
    if manifest.is_file():
        side.update(_manifest_about(manifest.read_bytes()))
    return results, side


def load_remote(
    uri: str,
    *,
    sha256: str,
    gpu_model: str | None,
    manifest_sha256: str | None,
    options: StoreOptions,
) -> tuple[ResultsFile, dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="kubectl-tunefleet-") as tmp:
        pin = Pinned(uri, sha256, manifest_sha256, gpu_model)
        got = fetch_verified(pin, Path(tmp), 1, options)
        text = got.paths[0].read_text(encoding="utf-8")
    kind = parse_uri(uri).scheme
    side: dict[str, Any] = {"kind": kind, "source": uri, "gemms": got.gemms, "sha256": got.sha256}
    side.update(_manifest_about(got.manifest))
    return parse_results(text, uri), side


def load_side(
    ref: Ref, cluster: Callable[[], Cluster], opts: S3Options
) -> tuple[ResultsFile, dict[str, Any]]:
    """The results file a diff side names, verified as fetch verifies it where it is remote."""
    if ref.kind == "local":
        return load_local(ref.text)
    if ref.kind in REMOTE_KINDS:
        last = ref.text.rstrip("/").rsplit("/", 1)[-1]
        try:
            sha = check_sha256(last)
        except ValueError:
            raise PluginError(
                f"{ref.text} does not end in a SHA-256: name an artifact directory as "
                "status.artifacts[].uri shows it (s3://bucket/.../<gpu-model>/<sha256>)"
            ) from None
        return load_remote(
            ref.text.rstrip("/"),
            sha256=sha,
            gpu_model=None,
            manifest_sha256=None,
            options=store_options(opts, None),
        )
    kube = cluster()
    ns = ref.namespace or kube.namespace
    profile = kube.profile(ns, ref.name)
    if profile is None:
        raise not_found_profile(ref.name, ns)
    art = pick_artifact(profile, ref.gpu_model)
    results, side = load_remote(
        str(art["uri"]),
        sha256=str(art["sha256"]),
        gpu_model=str(art["gpuModel"]),
        manifest_sha256=art.get("manifestSha256") or None,
        options=store_options(opts, profile),
    )
    side.update(kind="profile", source=f"{ns}/{ref.name}:{art['gpuModel']}", uri=art["uri"])
    return results, side


def not_found_profile(name: str, namespace: str) -> PluginError:
    return PluginError(
        f"TuningProfile {name!r} not found in namespace {namespace!r}: list them with "
        f"`kubectl get tp -n {namespace}`"
    )
