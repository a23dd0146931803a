"""Fleet mode probes a store's conditional writes before its first claim through it
(fleet/probe.py, apply.probe; issue 54): a store that honours If-None-Match and If-Match is
coordinated through, one that ignores either is refused (its profiles tune their own, and say
why), a store error is no verdict, and each verdict is kept for the process. The store is a
directory standing where the profiles' s3:// bucket is (as in test_fleet.py), or S3Store over
an in-memory S3 client that answers conditional writes as S3 does."""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from testbed.builders.wrappers import make_profile
from tests.support.artifacts import KEYED
from tests.support.fake_kube import RECONCILE_WRITERS, FakeKube
from tunefleet.config import Config
from tunefleet.contracts import fleet as contract
from tunefleet.fleet import probe
from tunefleet.reconciler import apply
from tunefleet.reconciler.memory import Memory
from tunefleet.reconciler.reconcile import Around, sync_profile
from tunefleet.storage.filesystem import DirStore
from tunefleet.storage.registry import parse_uri
from tunefleet.storage.s3 import S3Store
from tunefleet.storage.store import Location, Store, StoreError, StoreOptions
from tunefleet.watched.views import profile_view

MODEL = "AMD_Instinct_MI300X_OAM"
IMAGE = "registry.example.com/serve@sha256:" + "a" * 64
CLUSTER = "11111111-aaaa-4aaa-8aaa-111111111111"
FLEET = Config(image="tunefleet:1", fleet=True, fleet_cluster=CLUSTER)
BASE = (
    make_profile("p", "ml").uid("uid-p").generation(1)
    .image(IMAGE).gpu("amd", MODEL).storage("s3://bkt/fleet", signing=KEYED)
)  # fmt: skip
LOCATION = parse_uri("s3://bkt/fleet")


class Counted(DirStore):
    """The bucket as a directory, counting the probe's creates."""

    probes = 0

    def create(self, key: str, data: bytes, content_type: str) -> bool:
        if "/.probe/" in key:
            Counted.probes += 1
        return super().create(key, data, content_type)


class IgnoresIfNoneMatch(DirStore):
    """A server that takes If-None-Match and writes anyway."""

    def create(self, key: str, data: bytes, content_type: str) -> bool:
        self.put(key, data, content_type)
        return True


class IgnoresIfMatch(DirStore):
    """A server that takes If-Match and writes anyway."""

    def replace_if(self, key: str, data: bytes, content_type: str, tag: str) -> bool:
        self.put(key, data, content_type)
        return True


class Unreachable(DirStore):
    """A server out of reach for the first `down` writes."""

    down = 1

    def create(self, key: str, data: bytes, content_type: str) -> bool:
        if type(self).down > 0:
            type(self).down -= 1
            raise StoreError("uploading: EndpointConnectionError: could not connect")
        return super().create(key, data, content_type)


def sync(
    p: dict[str, Any], tmp_path: Path, memory: Memory, kind: type[DirStore] = DirStore
) -> tuple[dict[str, Any], FakeKube]:
    def open_store(location: Location, options: StoreOptions) -> Store:
        return kind(location, tmp_path / location.bucket)

    api = FakeKube(writers=RECONCILE_WRITERS)
    out = sync_profile(p, [], [], FLEET, memory, Around(api, open_store=open_store))
    return out.status.to_status(), api


def jobs(api: FakeKube) -> list[str]:
    return [n for k, n in api.created if k == "Job"]


def fleet_objects(tmp_path: Path) -> list[str]:
    root = tmp_path / "bkt" / "fleet" / "_fleet"
    # Not the directory store's lock files (".<name>.lock"): its objects.
    found = [p.name for p in root.rglob("*") if p.is_file() and not p.name.startswith(".")]
    return sorted(found)


def test_a_store_that_honours_conditional_writes_is_claimed_through(tmp_path: Path) -> None:
    memory = Memory()
    status, api = sync(profile_view(BASE.obj()), tmp_path, memory)
    assert len(jobs(api)) == 1 and status["phase"] != "Queued"
    assert fleet_objects(tmp_path) == ["claim.json"]  # the probe object went
    verdict = memory.probes.verdict(probe.store_key("s3", "bkt", ""), time.monotonic())
    assert (
        verdict is not None
        and verdict.honours
        and verdict.store == "s3://bkt (the default endpoint)"
    )
    assert not any(r == "FleetStoreRefused" for r, _ in api.events)


def test_a_store_that_ignores_if_none_match_is_refused_at_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The operator's first reconcile of a profile (at start) probes its store: one that
    lets a second create through never holds a claim; the profile tunes its own and says
    why, naming the store and the fix."""
    caplog.set_level(logging.ERROR)
    memory = Memory()
    status, api = sync(profile_view(BASE.obj()), tmp_path, memory, IgnoresIfNoneMatch)
    assert len(jobs(api)) == 1  # its own, with no claim
    assert fleet_objects(tmp_path) == []
    said = [m for r, m in api.events if r == "FleetStoreRefused"]
    assert len(said) == 1
    assert "s3://bkt" in said[0] and probe.IGNORED_IF_NONE_MATCH in said[0]
    assert "fleet.enabled: false" in said[0]
    assert "does not coordinate through s3://bkt" in caplog.text
    # Said once a verdict; the verdict is kept: no probe on the next pass.
    p = profile_view(BASE.obj())
    _, api = sync({**p, "status": status}, tmp_path, memory, IgnoresIfNoneMatch)
    assert not any(r == "FleetStoreRefused" for r, _ in api.events)
    assert fleet_objects(tmp_path) == []


def test_a_store_that_ignores_if_match_is_refused(tmp_path: Path) -> None:
    memory = Memory()
    _, api = sync(profile_view(BASE.obj()), tmp_path, memory, IgnoresIfMatch)
    assert len(jobs(api)) == 1 and fleet_objects(tmp_path) == []
    (said,) = [m for r, m in api.events if r == "FleetStoreRefused"]
    assert probe.IGNORED_IF_MATCH in said


def test_a_store_error_is_no_verdict_and_is_probed_again(tmp_path: Path) -> None:
    Unreachable.down = 1
    memory = Memory()
    p = profile_view(BASE.obj())
    status, api = sync(p, tmp_path, memory, Unreachable)
    assert jobs(api) == [] and status["phase"] == "Queued"
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert "could not check that the store honours conditional writes" in ready["message"]
    assert memory.probes.verdict(probe.store_key("s3", "bkt", ""), time.monotonic()) is None
    # The store is back: the next pass probes, claims and tunes.
    status, api = sync({**p, "status": status}, tmp_path, memory, Unreachable)
    assert len(jobs(api)) == 1 and fleet_objects(tmp_path) == ["claim.json"]


def test_a_verdict_is_kept_for_the_process_and_asked_again_after_a_while(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    Counted.probes = 0
    memory = Memory()
    sync(profile_view(BASE.obj()), tmp_path, memory, Counted)
    assert Counted.probes == 2  # one probe: its create, and the create it must refuse
    # Another profile on the same store (bucket and endpoint), another prefix: no probe.
    q = BASE.name("q").uid("uid-q").storage("s3://bkt/other", signing=KEYED).obj()
    _, api = sync(profile_view(q), tmp_path, memory, Counted)
    assert Counted.probes == 2 and len(jobs(api)) == 1
    # Later it is probed again (HONOURED_TTL_S). it is probed again.
    key = probe.store_key("s3", "bkt", "")
    old = memory.probes.verdict(key, time.monotonic())
    assert old is not None
    memory.probes.record(key, replace(old, at=old.at - probe.HONOURED_TTL_S - 1))
    r = BASE.name("r").uid("uid-r").storage("s3://bkt/third", signing=KEYED).obj()
    sync(profile_view(r), tmp_path, memory, Counted)
    assert Counted.probes == 4


def test_of_reconciles_finding_one_store_unprobed_at_once_one_probes(tmp_path: Path) -> None:
    class Slow(Counted):
        def create(self, key: str, data: bytes, content_type: str) -> bool:
            time.sleep(0.2 if "/.probe/" in key else 0)
            return super().create(key, data, content_type)

    Counted.probes = 0
    memory = Memory()
    profiles = [
        BASE.name(n).uid(f"uid-{n}").storage(f"s3://bkt/{n}", signing=KEYED).obj() for n in "pq"
    ]
    threads = [
        threading.Thread(target=sync, args=(profile_view(p), tmp_path, memory, Slow))
        for p in profiles
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert Counted.probes == 2  # one probe (its two creates), its verdict taken by the other


def test_a_profile_that_never_adopts_probes_nothing(tmp_path: Path) -> None:
    """spec.tuning.adopt: Never takes no claim: its store is not probed for it (publishing
    what it tuned needs no verdict)."""
    Counted.probes = 0
    _, api = sync(profile_view(BASE.tuning(adopt="Never").obj()), tmp_path, Memory(), Counted)
    assert Counted.probes == 0 and len(jobs(api)) == 1


def test_each_endpoint_is_its_own_store() -> None:
    assert probe.store_key("s3", "bkt", "https://a") != probe.store_key("s3", "bkt", "https://b")
    assert "at https://a" in probe.store_words("s3://bkt", "https://a")


# --- the probe over S3's own calls ---------------------------------------------------------------


class S3:
    """An in-memory S3 client answering PutObject's If-None-Match and If-Match as S3 does
    (412 PreconditionFailed), or ignoring either, as some S3-compatible servers do."""

    def __init__(self, if_none_match: bool = True, if_match: bool = True) -> None:
        self.objects: dict[str, tuple[bytes, str]] = {}
        self.if_none_match, self.if_match = if_none_match, if_match

    @staticmethod
    def _refuse(status: int, code: str) -> ClientError:
        return ClientError(
            {"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}, "PutObject"
        )

    def put_object(self, **kw: Any) -> dict[str, Any]:
        key, there = kw["Key"], self.objects.get(kw["Key"])
        if self.if_none_match and kw.get("IfNoneMatch") == "*" and there is not None:
            raise self._refuse(412, "PreconditionFailed")
        if self.if_match and "IfMatch" in kw:
            if there is None:
                raise self._refuse(404, "NoSuchKey")
            if there[1] != kw["IfMatch"]:
                raise self._refuse(412, "PreconditionFailed")
        etag = f'"{hashlib.md5(kw["Body"]).hexdigest()}"'
        self.objects[key] = (kw["Body"], etag)
        return {"ETag": etag}

    def get_object(self, **kw: Any) -> dict[str, Any]:
        if kw["Key"] not in self.objects:
            raise ClientError(
                {"Error": {"Code": "NoSuchKey"}, "ResponseMetadata": {"HTTPStatusCode": 404}},
                "GetObject",
            )
        data, etag = self.objects[kw["Key"]]

        class Body:
            def iter_chunks(self, size: int) -> Any:
                yield data

            def close(self) -> None:
                pass

        return {"ContentLength": len(data), "ETag": etag, "Body": Body()}

    def delete_object(self, **kw: Any) -> dict[str, Any]:
        self.objects.pop(kw["Key"], None)
        return {}


@pytest.mark.parametrize(
    ("client", "fault"),
    [
        (S3(), ""),
        (S3(if_none_match=False), probe.IGNORED_IF_NONE_MATCH),
        (S3(if_match=False), probe.IGNORED_IF_MATCH),
    ],
)
def test_the_probe_judges_an_s3_server_by_the_calls_claims_make(client: S3, fault: str) -> None:
    store = S3Store(LOCATION, client=client)
    key = contract.probe_key(LOCATION, "f" * 32)
    assert key == "fleet/_fleet/.probe/" + "f" * 32
    assert apply.probe_store(store, key) == fault
    assert client.objects == {}  # the probe object is deleted, whatever the verdict


def test_a_probe_object_that_cannot_be_deleted_leaves_the_verdict(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    class NoDelete(DirStore):
        def delete(self, key: str) -> None:
            raise StoreError("AccessDenied (HTTP 403)")

    store = NoDelete(LOCATION, tmp_path / "bkt")
    assert apply.probe_store(store, contract.probe_key(LOCATION, "1" * 32)) == ""
    assert "stays" in caplog.text and "AccessDenied" in caplog.text


def test_a_probe_key_is_random_hex_only() -> None:
    with pytest.raises(ValueError):
        contract.probe_key(LOCATION, "../claim")
