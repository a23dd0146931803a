"""``s3://bucket/prefix``: AWS S3 and S3-compatible stores (MinIO, Ceph RGW, SeaweedFS, ...),
via boto3.

Writes are conditional (If-None-Match: *) and carry a SHA-256 checksum the server verifies;
retries use botocore's standard mode; every call is bounded by connect/read timeouts and the
whole operation by a deadline. Pods get credentials by Secret reference only (or their cloud
identity, e.g. IRSA, when no Secret is named).
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import io
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO
from urllib.parse import ParseResult

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

from tuner_job.files import CHUNK, drop_cache, file_sha256

from .store import (
    ConflictError,
    Listed,
    Location,
    NotFoundError,
    PodStorage,
    Received,
    StoreError,
    StoreOptions,
    Tagged,
    TooLargeError,
    check_prefix,
    same_object,
    write_hashed,
)

SCHEMES: tuple[str, ...] = ("s3",)
CREDENTIAL_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

MAX_ATTEMPTS = 5
# Objects over one part go up as a multipart upload, PARTS_IN_FLIGHT parts at a time: memory
# stays at PART_BYTES x PARTS_IN_FLIGHT whatever the object's size (S3 takes up to 10,000
# parts of 5 MiB to 5 GiB: 16 MiB parts carry 156 GiB).
PART_BYTES = 16 << 20
PARTS_IN_FLIGHT = 4
# An object this large is downloaded as ranged GETs, RANGES_IN_FLIGHT at a time (one stream
# from S3 runs at tens of MB/s; several fill the link). Each range is written at its offset,
# then hashed in order as soon as every byte before it has been; a range is asked for only
# once the one RANGES_IN_FLIGHT before it is hashed, so at most that many sit in the page
# cache between their write and their hash: memory stays bounded.
RANGED_FROM = 64 << 20
RANGE_BYTES = 4 << 20
RANGES_IN_FLIGHT = 3
RANGE_READ = 64 << 10  # each range's reads: small, so no thread holds big buffers
# AWS answers 409 ConditionalRequestConflict while another conditional write to the key is in
# flight; botocore does not retry it, so we do, a few times.
CONFLICT_RETRIES = 3


def parse(uri: str, parsed: ParseResult) -> Location:
    if not parsed.netloc:
        raise ValueError(f"{uri!r} has no bucket (expected s3://bucket/prefix)")
    return Location("s3", parsed.netloc, check_prefix(uri, parsed.path.strip("/")))


def open_store(location: Location, options: StoreOptions) -> S3Store:
    return S3Store(
        location,
        endpoint_url=options.endpoint_url,
        region=options.region,
        timeout_s=options.timeout_s,
        client=options.client,
    )


def session(options: StoreOptions) -> StoreOptions:
    if options.client is not None:
        return options
    client = make_client(options.endpoint_url, options.region, options.timeout_s)
    return replace(options, client=client)


def pod_storage(
    location: Location, *, read_only: bool, secret: str, endpoint: str, region: str
) -> PodStorage:
    """The Secret's keys by reference (never their values), the endpoint and region as flags."""
    env: list[dict[str, Any]] = [
        {"name": key, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}
        for key in (CREDENTIAL_KEYS if secret else ())
    ]
    if region:
        env.append({"name": "AWS_REGION", "value": region})
    args = ["--endpoint-url", endpoint] if endpoint else []
    args += ["--region", region] if region else []
    keys = CREDENTIAL_KEYS if secret else ()
    return PodStorage(
        env=env,
        args=args,
        credentials_secret=secret,
        credentials_kind="S3 credentials",
        credential_keys=keys,
    )


def resolve_endpoint(endpoint_url: str | None) -> str | None:
    """--endpoint-url, else AWS_ENDPOINT_URL_S3, else AWS_ENDPOINT_URL (boto3's own order)."""
    return (
        endpoint_url or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    )


def make_client(
    endpoint_url: str | None = None, region: str | None = None, timeout_s: float = 60.0
) -> S3Client:
    endpoint = resolve_endpoint(endpoint_url)
    config = Config(
        retries={"mode": "standard", "max_attempts": MAX_ATTEMPTS},
        connect_timeout=max(1.0, min(10.0, timeout_s / 4)),
        read_timeout=max(1.0, min(30.0, timeout_s / 2)),
        # Self-hosted stores are reached by IP or a service name: virtual-host style would put
        # the bucket into the hostname.
        s3={"addressing_style": "path" if endpoint else "auto"},
    )
    region_name = region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    return boto3.client(
        "s3", endpoint_url=endpoint, region_name=region_name or "us-east-1", config=config
    )


def _file_descriptor(dest: BinaryIO) -> int | None:
    """dest's descriptor where it is a file on disk, open to read and write, with nothing
    written yet (ranges are written at their offsets and read back to be hashed), else None:
    it is then written as one stream."""
    try:
        dest.flush()
        if dest.tell() != 0:
            return None
        fd = dest.fileno()
        if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE != os.O_RDWR:
            return None
        return fd
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return None


def _hash_range(fd: int, start: int, end: int, digest: Any) -> None:
    """Bytes [start, end) of the file read back (from the page cache they were just written
    to) into digest; then synced and their cache handed back."""
    at = start
    while at < end:
        chunk = os.pread(fd, min(CHUNK, end - at), at)
        if not chunk:
            raise StoreError(f"the downloaded file ends at {at} bytes, before {end}")
        digest.update(chunk)
        at += len(chunk)
    drop_cache(fd, written=True, start=start, length=end - start)


def _code(exc: ClientError) -> tuple[str, int]:
    err = exc.response.get("Error", {})
    meta = exc.response.get("ResponseMetadata", {})
    return str(err.get("Code", "")), int(meta.get("HTTPStatusCode", 0))


def _describe(exc: Exception) -> str:
    if isinstance(exc, NoCredentialsError):
        return (
            "no S3 credentials (set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY from a Secret, "
            "or give the pod a cloud identity)"
        )
    if isinstance(exc, ClientError):
        code, status = _code(exc)
        message = exc.response.get("Error", {}).get("Message", "")
        return f"{code or 'error'} (HTTP {status}){': ' + message if message else ''}"
    return f"{type(exc).__name__}: {exc}"


class S3Store:
    page_size = 1000  # keys per ListObjectsV2 call (S3's own maximum)

    def __init__(
        self,
        location: Location,
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        timeout_s: float = 60.0,
        client: Any = None,
    ) -> None:
        self.location = location
        self.bucket = location.bucket
        self.deadline = time.monotonic() + timeout_s
        self.timeout_s = timeout_s
        self.client: S3Client = client or make_client(endpoint_url, region, timeout_s)

    def _check_deadline(self, what: str) -> None:
        if time.monotonic() > self.deadline:
            raise StoreError(f"gave up on {what}: over the {self.timeout_s:.0f}s time limit")

    def uri(self, key: str) -> str:
        return self.location.uri(key)

    def _put(self, key: str, data: bytes, content_type: str, **conditions: str) -> None:
        # A checksum the server recomputes and refuses on mismatch: no torn or flipped upload.
        checksum = base64.b64encode(hashlib.sha256(data).digest()).decode("ascii")
        self._check_deadline(f"uploading {self.uri(key)}")
        self.client.put_object(
            Bucket=self.bucket,
            Key=key,
            Body=data,
            ContentType=content_type,
            ChecksumAlgorithm="SHA256",
            ChecksumSHA256=checksum,
            **conditions,  # type: ignore[arg-type]
        )

    def put_if_absent(self, key: str, data: bytes, content_type: str) -> bool:
        for attempt in range(CONFLICT_RETRIES + 1):
            try:
                self._put(key, data, content_type, IfNoneMatch="*")
                return True
            except ClientError as exc:
                code, status = _code(exc)
                if status == 412 or code == "PreconditionFailed":
                    break  # something is there already: compare below
                if status == 409 and attempt < CONFLICT_RETRIES:
                    time.sleep(0.5 * (attempt + 1))
                    continue
                raise StoreError(f"uploading {self.uri(key)} failed: {_describe(exc)}") from None
            except BotoCoreError as exc:
                raise StoreError(f"uploading {self.uri(key)} failed: {_describe(exc)}") from None
        if not same_object(self, key, data):
            raise ConflictError(f"a different object already exists at {self.uri(key)}")
        return False

    def create(self, key: str, data: bytes, content_type: str) -> bool:
        return self._conditional(key, data, content_type, IfNoneMatch="*")

    def replace_if(self, key: str, data: bytes, content_type: str, tag: str) -> bool:
        return self._conditional(key, data, content_type, IfMatch=tag)

    def _conditional(self, key: str, data: bytes, content_type: str, **condition: str) -> bool:
        """A write under one precondition: False when the store refuses it on that ground: 412,
        409 (another conditional write to the key is in flight: it wins), or for If-Match 404
        (the object went)."""
        try:
            self._put(key, data, content_type, **condition)
            return True
        except ClientError as exc:
            code, status = _code(exc)
            if status in (412, 409) or code == "PreconditionFailed":
                return False
            if "IfMatch" in condition and (status == 404 or code == "NoSuchKey"):
                return False
            raise StoreError(f"uploading {self.uri(key)} failed: {_describe(exc)}") from None
        except BotoCoreError as exc:
            raise StoreError(f"uploading {self.uri(key)} failed: {_describe(exc)}") from None

    def read_tagged(self, key: str, max_bytes: int) -> Tagged:
        try:
            data, resp = self._get(key, max_bytes)
        except TooLargeError as e:
            if not e.tag:
                raise
            # The refused GET's own headers name the version (its body was closed unread):
            # no HEAD, and no window for another version to slip in between.
            return Tagged(b"", e.tag, e.size)
        return Tagged(data, str(resp.get("ETag") or ""))

    def put(self, key: str, data: bytes, content_type: str) -> None:
        try:
            self._put(key, data, content_type)
        except (ClientError, BotoCoreError) as exc:
            raise StoreError(f"uploading {self.uri(key)} failed: {_describe(exc)}") from None

    def list(self, prefix: str, limit: int) -> list[Listed]:
        out: list[Listed] = []
        token: str | None = None
        while len(out) < limit:
            self._check_deadline(f"listing {self.uri(prefix)}/")
            args: dict[str, Any] = {
                "Bucket": self.bucket,
                # "" is the whole bucket (tunefleet-gc on a URI without a prefix).
                "Prefix": prefix.rstrip("/") + "/" if prefix else "",
                "MaxKeys": min(self.page_size, limit - len(out)),
            }
            if token:
                args["ContinuationToken"] = token
            try:
                resp = self.client.list_objects_v2(**args)
            except (ClientError, BotoCoreError) as exc:
                raise StoreError(f"listing {self.uri(prefix)}/ failed: {_describe(exc)}") from None
            for obj in resp.get("Contents", []):
                out.append(Listed(obj["Key"], int(obj["Size"]), obj["LastModified"].timestamp()))
            if not resp.get("IsTruncated"):
                break
            token = resp.get("NextContinuationToken")
        return out[:limit]

    def delete(self, key: str) -> None:
        self._check_deadline(f"deleting {self.uri(key)}")
        try:
            self.client.delete_object(Bucket=self.bucket, Key=key)
        except (ClientError, BotoCoreError) as exc:
            raise StoreError(f"deleting {self.uri(key)} failed: {_describe(exc)}") from None

    # -- objects of any size (store.Streams) ------------------------------------------------

    def get_file(self, key: str, dest: BinaryIO, max_bytes: int) -> Received:
        """The object streamed into dest, hashed as it arrives; its stored whole-object
        checksum, where it has one, compared at the end (botocore checks it as well)."""
        return self._read(key, dest, max_bytes)[0]

    def _read(self, key: str, dest: BinaryIO, max_bytes: int) -> tuple[Received, dict[str, Any]]:
        """get_file, and the response's metadata (its ETag: read_tagged)."""
        self._check_deadline(f"downloading {self.uri(key)}")
        try:
            resp = self.client.get_object(Bucket=self.bucket, Key=key, ChecksumMode="ENABLED")
            size = int(resp.get("ContentLength", 0))
            if size > max_bytes:
                resp["Body"].close()
                raise TooLargeError(
                    f"{self.uri(key)} is {size} bytes, more than {max_bytes}",
                    size,
                    str(resp.get("ETag") or ""),
                )
            fd = _file_descriptor(dest) if size >= RANGED_FROM else None
            if fd is not None and resp.get("ETag"):
                resp["Body"].close()  # the same version again, a range at a time
                got = self._ranged(key, fd, size, str(resp["ETag"]))
                dest.seek(size)
            else:
                got = write_hashed(resp["Body"].iter_chunks(CHUNK), dest, max_bytes, self.uri(key))
        except ClientError as exc:
            code, status = _code(exc)
            if code in ("NoSuchKey", "404") or status == 404:
                raise NotFoundError(f"no object at {self.uri(key)}") from None
            if code == "PreconditionFailed" or status == 412:
                raise StoreError(
                    f"{self.uri(key)} was replaced while it downloaded (a range of another "
                    "version is never mixed in): fetch it again"
                ) from None
            raise StoreError(f"downloading {self.uri(key)} failed: {_describe(exc)}") from None
        except BotoCoreError as exc:
            # Includes botocore's own response checksum validation failing.
            raise StoreError(f"downloading {self.uri(key)} failed: {_describe(exc)}") from None
        if got.size != size:
            raise StoreError(f"{self.uri(key)}: {got.size} of its {size} bytes arrived")
        stored = resp.get("ChecksumSHA256")
        # A whole-object checksum (multipart uploads have "...-N" composites) must match.
        if stored and "-" not in stored:
            actual = base64.b64encode(bytes.fromhex(got.sha256)).decode("ascii")
            if actual != stored:
                raise StoreError(f"{self.uri(key)} does not match its stored SHA-256 checksum")
        return got, dict(resp)

    def _ranged(self, key: str, fd: int, size: int, etag: str) -> Received:
        """The object's `size` bytes into the file `fd` as ranged GETs of RANGE_BYTES, each of
        the version `etag` names (If-Match: one replaced midway fails, never mixes), several in
        flight; hashed in order as each range before it has arrived, the page cache of what
        was hashed handed back."""
        spans = [(a, min(a + RANGE_BYTES, size)) for a in range(0, size, RANGE_BYTES)]
        digest = hashlib.sha256()
        pool = ThreadPoolExecutor(RANGES_IN_FLIGHT, thread_name_prefix="s3-range")

        def ask(i: int) -> Any:
            return pool.submit(self._range, key, fd, *spans[i], etag)

        try:
            pending = {i: ask(i) for i in range(min(RANGES_IN_FLIGHT, len(spans)))}
            for i, (start, end) in enumerate(spans):
                pending.pop(i).result()
                _hash_range(fd, start, end, digest)
                if i + RANGES_IN_FLIGHT < len(spans):
                    pending[i + RANGES_IN_FLIGHT] = ask(i + RANGES_IN_FLIGHT)
        finally:
            # The ranges still running finish before the caller may close the file: a
            # descriptor number reused afterwards must never receive a stray write.
            pool.shutdown(wait=True, cancel_futures=True)
        return Received(size, digest.hexdigest())

    def _range(self, key: str, fd: int, start: int, end: int, etag: str) -> None:
        """Bytes [start, end) of the object's version `etag`, written at their offset."""
        self._check_deadline(f"downloading {self.uri(key)}")
        resp = self.client.get_object(
            Bucket=self.bucket, Key=key, Range=f"bytes={start}-{end - 1}", IfMatch=etag
        )
        at = start
        for chunk in resp["Body"].iter_chunks(RANGE_READ):
            if at + len(chunk) > end:
                raise StoreError(f"{self.uri(key)}: range {start}-{end - 1} sent more bytes")
            os.pwrite(fd, chunk, at)
            at += len(chunk)
        if at != end:
            raise StoreError(f"{self.uri(key)}: {at - start} of range {start}-{end - 1}'s bytes")

    def put_file_if_absent(self, key: str, path: Path, content_type: str) -> bool:
        """Write once from a file: one PUT for a small one, else a multipart upload whose
        parts each carry a SHA-256 the server checks, completed only where nothing is
        (If-None-Match). An object already there is compared by size and SHA-256, streamed."""
        size = path.stat().st_size
        if size <= PART_BYTES:
            return self.put_if_absent(key, path.read_bytes(), content_type)
        if self._exists(key) or not self._multipart(key, path, size, content_type):
            if not self._same_file(key, path, size):
                raise ConflictError(f"a different object already exists at {self.uri(key)}")
            return False
        return True

    def _exists(self, key: str) -> bool:
        try:
            self.client.head_object(Bucket=self.bucket, Key=key)
            return True
        except ClientError as exc:
            code, status = _code(exc)
            if status == 404 or code in ("NoSuchKey", "404", "NotFound"):
                return False
            raise StoreError(f"reading {self.uri(key)} failed: {_describe(exc)}") from None
        except BotoCoreError as exc:
            raise StoreError(f"reading {self.uri(key)} failed: {_describe(exc)}") from None

    def _same_file(self, key: str, path: Path, size: int) -> bool:
        class _Null:
            def write(self, data: bytes) -> int:
                return len(data)

            def flush(self) -> None:
                pass

        try:
            there = self.get_file(key, _Null(), size)  # type: ignore[arg-type]
        except TooLargeError:
            return False
        return there.size == size and there.sha256 == file_sha256(path)[1]

    def _multipart(self, key: str, path: Path, size: int, content_type: str) -> bool:
        """The upload; False where the store refused its completion because an object is
        there now (If-None-Match). Aborted on any failure, so no parts are left behind."""
        where = self.uri(key)
        self._check_deadline(f"uploading {where}")
        try:
            upload = self.client.create_multipart_upload(
                Bucket=self.bucket, Key=key, ContentType=content_type, ChecksumAlgorithm="SHA256"
            )
        except (ClientError, BotoCoreError) as exc:
            raise StoreError(f"uploading {where} failed: {_describe(exc)}") from None
        upload_id = upload["UploadId"]
        count = (size + PART_BYTES - 1) // PART_BYTES
        fd = os.open(path, os.O_RDONLY)

        def part(i: int) -> dict[str, Any]:
            self._check_deadline(f"uploading {where}")
            data = os.pread(fd, PART_BYTES, i * PART_BYTES)
            drop_cache(fd, written=False)
            checksum = base64.b64encode(hashlib.sha256(data).digest()).decode("ascii")
            resp = self.client.upload_part(
                Bucket=self.bucket,
                Key=key,
                UploadId=upload_id,
                PartNumber=i + 1,
                Body=data,
                ChecksumAlgorithm="SHA256",
                ChecksumSHA256=checksum,
            )
            return {"ETag": resp["ETag"], "PartNumber": i + 1, "ChecksumSHA256": checksum}

        try:
            with ThreadPoolExecutor(PARTS_IN_FLIGHT, thread_name_prefix="s3-part") as pool:
                parts = list(pool.map(part, range(count)))
            self.client.complete_multipart_upload(
                Bucket=self.bucket,
                Key=key,
                UploadId=upload_id,
                MultipartUpload={"Parts": parts},  # type: ignore[typeddict-item]
                IfNoneMatch="*",
            )
            return True
        except ClientError as exc:
            self._abort(key, upload_id)
            code, status = _code(exc)
            if status == 412 or code == "PreconditionFailed":
                return False
            raise StoreError(f"uploading {where} failed: {_describe(exc)}") from None
        except BaseException as exc:
            self._abort(key, upload_id)
            if isinstance(exc, BotoCoreError):
                raise StoreError(f"uploading {where} failed: {_describe(exc)}") from None
            raise
        finally:
            os.close(fd)

    def _abort(self, key: str, upload_id: str) -> None:
        # Best effort: the bucket's lifecycle rule for incomplete uploads is the backstop.
        with contextlib.suppress(ClientError, BotoCoreError):
            self.client.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id)

    def get(self, key: str, max_bytes: int) -> bytes:
        return self._get(key, max_bytes)[0]

    def _get(self, key: str, max_bytes: int) -> tuple[bytes, dict[str, Any]]:
        buf = io.BytesIO()
        _, resp = self._read(key, buf, max_bytes)  # type: ignore[arg-type]
        return buf.getvalue(), resp
