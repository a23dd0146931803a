"""Which backend serves a storage URI: one table, by scheme.

Every caller (the CLIs, the Job and webhook builders, the plugin) goes through here, so adding
a backend is one module with `SCHEMES`, `parse`, `open_store` and `pod_storage`, and one line
below. Backends are imported when first used: a ``pvc://`` fetch never loads boto3.
"""

from __future__ import annotations

import functools
from typing import Protocol
from urllib.parse import ParseResult, urlparse

from .store import Location, PodStorage, Store, StoreOptions

SCHEMES = ("s3", "pvc", "file", "oci")


class Backend(Protocol):
    SCHEMES: tuple[str, ...]

    def parse(self, uri: str, parsed: ParseResult) -> Location: ...

    def open_store(self, location: Location, options: StoreOptions) -> Store: ...

    def session(self, options: StoreOptions) -> StoreOptions: ...

    def pod_storage(
        self, location: Location, *, read_only: bool, secret: str, endpoint: str, region: str
    ) -> PodStorage: ...


def backend(scheme: str) -> Backend:
    if scheme == "s3":
        from . import s3

        return s3
    if scheme == "oci":
        from . import oci

        return oci
    if scheme in ("pvc", "file"):
        from . import filesystem

        return filesystem
    raise ValueError(f"no storage backend for {scheme}:// (known: {', '.join(SCHEMES)})")


def parse_uri(uri: str) -> Location:
    """s3://bucket[/prefix], pvc://claim[/prefix], oci://registry/repository, file:///abs/dir,
    or an absolute path."""
    if uri.startswith("/"):
        return Location("file", uri.rstrip("/") or "/", "")
    parsed = urlparse(uri)
    if parsed.scheme not in SCHEMES:
        raise ValueError(f"{uri!r} is not an {', '.join(s + '://' for s in SCHEMES)} URI")
    return backend(parsed.scheme).parse(uri, parsed)


def open_store(location: Location, options: StoreOptions | None = None) -> Store:
    options = options or StoreOptions()
    if options.broker is not None:
        opened: Store = options.broker.open(location, options.timeout_s)
        return opened
    return backend(location.scheme).open_store(location, options)


def session(location: Location, options: StoreOptions) -> StoreOptions:
    """Options for a long-running process that opens a store per operation (each with its own
    deadline): what can be reused between them (an S3 connection pool) is made once here."""
    if options.broker is not None:
        return options  # no client of its own: each operation asks the broker
    return backend(location.scheme).session(options)


def shared_session(location: Location, options: StoreOptions) -> StoreOptions:
    """session(), made once per process for each scheme and options: for a caller that opens
    the store on every reconcile (reconciler/gather.py), where a new boto3 client each time
    cost ~6.5 ms of CPU, more than the rest of the reconcile. botocore's clients are
    thread-safe, and read the process's credentials as they are refreshed."""
    return _shared_session(location.scheme, options)


@functools.lru_cache(maxsize=32)
def _shared_session(scheme: str, options: StoreOptions) -> StoreOptions:
    return backend(scheme).session(options)


def pod_storage(
    uri: str, *, read_only: bool = False, secret: str = "", endpoint: str = "", region: str = ""
) -> PodStorage:
    """What a tunefleet container in a pod needs to reach the store at `uri`."""
    location = parse_uri(uri)
    return backend(location.scheme).pod_storage(
        location, read_only=read_only, secret=secret, endpoint=endpoint, region=region
    )
