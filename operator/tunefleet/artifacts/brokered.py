"""An s3:// store reached with no credential: each operation on a URL the operator presigned
for it (contracts/store_broker.py); an oci:// one is the registry client pointed at the
operator's proxy (Broker.open). What tuning pods' sync and publish steps open when the
operator brokers their profile's store (builders/storage.broker_storage: their --broker-*
flags); every caller sees the plain `Store` and `Streams` contract (storage/registry.py opens
it through StoreOptions.broker).

Writes are checksummed: the body's SHA-256 is signed into the URL, so the store refuses a body
that is not the one asked for. A GB archive is hashed from disk, then streamed in one PUT (S3
takes up to 5 GiB in one; bundle.MAX_ARCHIVE_BYTES is 4 GiB), in bounded memory.
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import io
import os
import random
import tempfile
import time
import urllib.parse
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, BinaryIO

from tunefleet import pod_https
from tunefleet.contracts import store_broker as sb
from tunefleet.storage.store import (
    ConflictError,
    Listed,
    Location,
    NotFoundError,
    Received,
    StoreError,
    StoreOptions,
    TooLargeError,
    write_hashed,
)
from tuner_job.files import file_sha256


@dataclass(frozen=True)
class Broker:
    """Where the operator's broker is: its URL, the projected token's file, its CA (PEM) and
    the Service's address for clusters without pod DNS. StoreOptions.broker's opener."""

    url: str
    token_file: str
    ca_pem: str = ""
    address: str = ""

    def open(self, location: Location, timeout_s: float) -> Any:
        if location.scheme == "oci":
            # The registry client itself, pointed at the operator (contracts/store_broker.py).
            from tunefleet.storage.oci import OciStore, Via

            parts = urllib.parse.urlsplit(self.url)
            base = f"{parts.scheme}://{parts.netloc}"  # the distribution API is at the root
            via = Via(base, self._ca_file(), self.token, self.address)
            return OciStore(location, timeout_s=timeout_s, via=via)
        if location.scheme != "s3":
            raise StoreError(
                f"the operator's broker serves s3:// and oci:// stores, not {location.uri()}"
            )
        return BrokeredStore(location, self, timeout_s)

    def token(self) -> str:
        """The projected token, read at each request (the kubelet rotates it)."""
        try:
            return Path(self.token_file).read_text().strip()
        except OSError as e:
            raise StoreError(f"cannot read the store token {self.token_file}: {e}") from None

    def _ca_file(self) -> str:
        """The CA as a file (what the registry client takes), written once per content."""
        if not self.ca_pem:
            return ""
        digest = hashlib.sha256(self.ca_pem.encode()).hexdigest()[:16]
        path = Path(tempfile.gettempdir()) / f"tunefleet-broker-ca-{digest}.pem"
        if not path.is_file():
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(self.ca_pem)
            tmp.replace(path)
        return str(path)


def with_broker(args: argparse.Namespace, options: StoreOptions) -> StoreOptions:
    """The CLIs' options with the broker their --broker-* flags name (storage/cli_flags.py),
    where they name one."""
    if not getattr(args, "broker_url", None):
        return options
    ca_env = args.broker_ca_env
    broker = Broker(
        args.broker_url,
        args.broker_token_file or "",
        os.environ.get(ca_env, "") if ca_env else "",
        args.broker_address or "",
    )
    return replace(options, broker=broker)


# Tries of one presigned request (the URL is good for all of them: URL_SECONDS).
TRIES = 3


class BrokeredStore:
    page_size = sb.LIST_CAP  # keys a list asks for at once

    def __init__(self, location: Location, broker: Broker, timeout_s: float = 60.0) -> None:
        import urllib3

        self.location, self.broker, self.timeout_s = location, broker, timeout_s
        self.deadline = time.monotonic() + timeout_s
        self._endpoint = pod_https.Endpoint(broker.url, broker.ca_pem, broker.address, 20.0)
        self._http = urllib3.PoolManager(
            retries=False,
            timeout=urllib3.Timeout(connect=10.0, read=120.0),
            ca_certs=os.environ.get("AWS_CA_BUNDLE") or None,
        )

    def uri(self, key: str) -> str:
        return self.location.uri(key)

    # -- the broker --------------------------------------------------------------------------

    def _ask(self, req: sb.Request) -> sb.Reply:
        """The operator's answer; retried while it says to (429, 503) or is unreachable,
        within the deadline; StoreError with its words when it refuses."""
        body, attempt, last = req.encode(), 0, ""
        while True:
            token = self.broker.token()
            retry: float | None = None
            try:
                got = self._endpoint.post(sb.PATH, body, token, sb.MAX_REPLY_BYTES)
                reply = sb.Reply.decode(got.body)
                if got.status == 200:
                    return reply
                last = f"{got.status} {reply.message or got.reason}"
                if got.status not in (429, 503):
                    raise StoreError(
                        f"the operator refused to {req.op} {self.uri(req.key)}: {last}"
                    )
                retry = reply.retry_after
            except (OSError, http.client.HTTPException) as e:
                last = f"cannot reach the operator at {self.broker.url}: {e}"
            except sb.BodyError as e:
                last = f"the operator's answer does not read: {e}"
            attempt += 1
            wait = (
                retry
                if retry is not None
                else min(10.0, 0.5 * 2.0**attempt) * random.uniform(0.5, 1)
            )
            if time.monotonic() + wait > self.deadline:
                raise StoreError(f"gave up on {req.op} {self.uri(req.key)}: {last}")
            time.sleep(wait)

    def _send(self, method: str, reply: sb.Reply, body: Any = None, size: int = 0) -> Any:
        """The store's answer to the presigned request, retried (TRIES in all, within the
        deadline) while it fails to answer or answers 5xx: a file body is read again from its
        start. A create whose answer was lost finds its object there (412) and compares it."""
        headers = dict(reply.headers)
        if method == "PUT":
            headers["Content-Length"] = str(size)
        last = ""
        for attempt in range(TRIES):
            if time.monotonic() > self.deadline:
                break
            if hasattr(body, "seek"):
                body.seek(0)
            try:
                resp = self._http.request(
                    method, reply.url, body=body, headers=headers, preload_content=False
                )
            except Exception as e:  # urllib3's errors: the store is unreachable
                last = f"the store could not be reached: {e}"
            else:
                if int(resp.status) < 500:
                    return resp
                last = f"the store answered HTTP {resp.status}"
                resp.release_conn()
            time.sleep(min(0.5 * 2**attempt, max(0.0, self.deadline - time.monotonic())))
        raise StoreError(f"gave up after {attempt + 1} tries: {last or 'over the time limit'}")

    def _put(self, op: str, key: str, body: Any, size: int, sha256: bytes, ctype: str) -> int:
        reply = self._ask(sb.Request(op, key, ctype, sb.checksum_of(sha256)))
        resp = self._send("PUT", reply, body, size)
        try:
            status = int(resp.status)
            if status in (200, 201, 204, 412):
                return status
            detail = resp.read(2048).decode("utf-8", "replace")
            raise StoreError(f"uploading {self.uri(key)} failed: HTTP {status} {detail}")
        finally:
            resp.release_conn()

    # -- Store -------------------------------------------------------------------------------

    def put_if_absent(self, key: str, data: bytes, content_type: str) -> bool:
        digest = hashlib.sha256(data).digest()
        if self._put("create", key, data, len(data), digest, content_type) != 412:
            return True
        if self._same(key, len(data), digest.hex()):
            return False
        raise ConflictError(f"a different object already exists at {self.uri(key)}")

    def put(self, key: str, data: bytes, content_type: str) -> None:
        digest = hashlib.sha256(data).digest()
        if self._put("put", key, data, len(data), digest, content_type) == 412:
            raise StoreError(f"uploading {self.uri(key)} failed: the store refused it (412)")

    def get(self, key: str, max_bytes: int) -> bytes:
        buf = io.BytesIO()
        self.get_file(key, buf, max_bytes)
        return buf.getvalue()

    def list(self, prefix: str, limit: int) -> list[Listed]:
        """In key order, a page (the broker's LIST_CAP) per request, up to `limit`."""
        out: list[Listed] = []
        after = ""
        while len(out) < limit:
            page = min(limit - len(out), self.page_size)
            reply = self._ask(sb.Request("list", prefix, limit=page, after=after))
            got = [Listed(o.key, o.size, o.modified) for o in reply.listed or ()]
            out += got
            if not reply.capped or not got:
                break
            after = got[-1].key
        return out[:limit]

    def delete(self, key: str) -> None:
        raise StoreError(f"a tuning pod deletes nothing ({self.uri(key)})")

    # -- Streams -----------------------------------------------------------------------------

    def get_file(self, key: str, dest: BinaryIO, max_bytes: int) -> Received:
        resp = self._send("GET", self._ask(sb.Request("get", key)))
        try:
            status = int(resp.status)
            if status == 404:
                raise NotFoundError(f"no object at {self.uri(key)}")
            if status != 200:
                detail = resp.read(2048).decode("utf-8", "replace")
                raise StoreError(f"downloading {self.uri(key)} failed: HTTP {status} {detail}")
            size = int(resp.headers.get("Content-Length") or 0)
            if size > max_bytes:
                raise TooLargeError(
                    f"{self.uri(key)} is {size} bytes, over the {max_bytes}-byte limit",
                    size,
                    str(resp.headers.get("ETag") or ""),
                )
            return write_hashed(resp.stream(1 << 20), dest, max_bytes, self.uri(key))
        finally:
            resp.release_conn()

    def put_file_if_absent(self, key: str, path: Path, content_type: str) -> bool:
        size, sha = file_sha256(path)
        with open(path, "rb") as f:
            status = self._put("create", key, f, size, bytes.fromhex(sha), content_type)
        if status != 412:
            return True
        if self._same(key, size, sha):
            return False
        raise ConflictError(f"a different object already exists at {self.uri(key)}")

    def _same(self, key: str, size: int, sha: str) -> bool:
        """Whether the object at key has this size and SHA-256 (streamed, not kept)."""

        class _Null(io.RawIOBase):
            def writable(self) -> bool:
                return True

            def write(self, data: Any) -> int:
                return len(data)

        try:
            there = self.get_file(key, _Null(), size)  # type: ignore[arg-type]
        except TooLargeError:
            return False
        return there.size == size and there.sha256 == sha
