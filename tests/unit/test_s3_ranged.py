"""A big S3 object comes down as ranged GETs, several in flight, hashed in order: the same
bytes and SHA-256 as one stream, whatever order the ranges land in; a version replaced midway
or a short range is refused, never mixed in. (The real server: tests/e2e/test_artifacts_s3.py.)"""

from __future__ import annotations

import hashlib
import os
import random
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tunefleet.storage import s3 as s3_store
from tunefleet.storage.store import Location, StoreError


class _Body:
    def __init__(self, data: bytes, delay: float = 0.0) -> None:
        self.data, self.delay = data, delay

    def iter_chunks(self, size: int) -> Any:
        for i in range(0, len(self.data), size):
            if self.delay:
                time.sleep(self.delay)
            yield self.data[i : i + size]

    def close(self) -> None:
        pass


class _Client:
    """get_object as S3 answers it: Range and If-Match honoured; `replace_after` ranged GETs,
    the object is another version; `short`: ranges come one byte short."""

    def __init__(self, data: bytes, replace_after: int | None = None, short: bool = False):
        self.data, self.etag = data, '"v1"'
        self.replace_after, self.short = replace_after, short
        self.ranged = 0
        self.lock = threading.Lock()

    def get_object(self, **kw: Any) -> dict[str, Any]:
        with self.lock:
            if "Range" in kw:
                self.ranged += 1
                if self.replace_after is not None and self.ranged > self.replace_after:
                    self.etag = '"v2"'
            etag = self.etag
        if kw.get("IfMatch") and kw["IfMatch"] != etag:
            raise ClientError(
                {
                    "Error": {"Code": "PreconditionFailed"},
                    "ResponseMetadata": {"HTTPStatusCode": 412},
                },
                "GetObject",
            )
        if "Range" not in kw:
            return {"ContentLength": len(self.data), "ETag": etag, "Body": _Body(self.data)}
        start, end = (int(x) for x in kw["Range"].removeprefix("bytes=").split("-"))
        part = self.data[start : end + 1]
        if self.short:
            part = part[:-1]
        # Ranges land out of order: each waits a little, at random.
        return {
            "ContentLength": len(part),
            "ETag": etag,
            "Body": _Body(part, random.random() / 500),
        }


@pytest.fixture
def small_ranges(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(s3_store, "RANGED_FROM", 1 << 20)
    monkeypatch.setattr(s3_store, "RANGE_BYTES", 64 << 10)
    monkeypatch.setattr(s3_store, "CHUNK", 16 << 10)


def _store(client: _Client) -> s3_store.S3Store:
    return s3_store.S3Store(Location("s3", "b", "p"), client=client, timeout_s=60)


def test_ranges_in_any_order_give_the_objects_bytes_and_sha256(
    small_ranges: None, tmp_path: Path
) -> None:
    data = os.urandom((3 << 20) + 12345)
    client = _Client(data)
    with open(tmp_path / "got", "w+b") as f:
        got = _store(client).get_file("p/k", f, len(data))
        assert f.tell() == len(data)
    assert (got.size, got.sha256) == (len(data), hashlib.sha256(data).hexdigest())
    assert (tmp_path / "got").read_bytes() == data
    assert client.ranged == -(-len(data) // s3_store.RANGE_BYTES)


def test_an_object_under_the_ranged_size_comes_as_one_stream(
    small_ranges: None, tmp_path: Path
) -> None:
    data = os.urandom(1 << 19)
    client = _Client(data)
    with open(tmp_path / "got", "w+b") as f:
        got = _store(client).get_file("p/k", f, len(data))
    assert got.sha256 == hashlib.sha256(data).hexdigest() and client.ranged == 0


def test_a_version_replaced_midway_is_refused(small_ranges: None, tmp_path: Path) -> None:
    client = _Client(os.urandom(2 << 20), replace_after=5)
    with open(tmp_path / "got", "w+b") as f, pytest.raises(StoreError, match="was replaced"):
        _store(client).get_file("p/k", f, 4 << 20)


def test_a_short_range_is_refused(small_ranges: None, tmp_path: Path) -> None:
    client = _Client(os.urandom(2 << 20), short=True)
    with open(tmp_path / "got", "w+b") as f, pytest.raises(StoreError, match="of range"):
        _store(client).get_file("p/k", f, 4 << 20)


def test_no_range_is_still_running_once_a_failed_download_returns(
    small_ranges: None, tmp_path: Path
) -> None:
    """The caller closes the file after a failure; a range still writing then could land in
    whatever file reuses its descriptor number."""
    client = _Client(os.urandom(2 << 20), replace_after=3)
    with open(tmp_path / "got", "w+b") as f, pytest.raises(StoreError):
        _store(client).get_file("p/k", f, 4 << 20)
    assert not [t for t in threading.enumerate() if t.name.startswith("s3-range")]


def test_a_file_open_only_to_write_comes_as_one_stream(small_ranges: None, tmp_path: Path) -> None:
    """Ranges are read back to be hashed in order: a write-only file cannot be."""
    data = os.urandom(2 << 20)
    client = _Client(data)
    with open(tmp_path / "got", "wb") as f:
        got = _store(client).get_file("p/k", f, len(data))
    assert got.sha256 == hashlib.sha256(data).hexdigest() and client.ranged == 0
