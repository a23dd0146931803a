"""The store broker (contracts/store_broker.py, signer/store_rules.py, signer/store_route.py,
artifacts/brokered.py): a tuning pod holds no credential of its store; its sync and publish
steps ask the operator for a URL presigned for one operation on one of the Job's own keys.

The rules are pure; the round trips run the operator's real route, with the API server's
answers given, against the real local S3 server (tests/conftest.py's `s3`), so what the store
does with a presigned URL (a missing If-None-Match, another body) is the store's own answer."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import threading
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar
from urllib.error import HTTPError

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from testbed.builders.signing import api_server_deps, credential_refs, profile_object
from testbed.builders.signing import job_and_pod as built_job_and_pod
from testbed.builders.signing import tuning_job as built_tuning_job
from testbed.builders.wrappers import make_profile
from testbed.cluster import S3Settings
from tests.support.routes import RouteThread
from tunefleet import naming
from tunefleet.artifacts.brokered import Broker, BrokeredStore
from tunefleet.config import Config
from tunefleet.contracts import store_broker as sb
from tunefleet.runtime.pod_tokens import Denied
from tunefleet.signer.judge import Seen, Vouched, the_job
from tunefleet.signer.store_route import Presigner, StoreEndpoint
from tunefleet.signer.store_rules import STORE, Scope, allowed, scope_of
from tunefleet.storage.registry import parse_uri
from tunefleet.storage.store import ConflictError, NotFoundError, StoreError

IMAGE = "ghcr.io/tunefleet/tunefleet:test"
MODEL = "NVIDIA-H100"
NS, NAME, PUID = "ml", "llama", "uid-profile-1"
SHA = "ab" * 32
PUBLIC = (
    ec.generate_private_key(ec.SECP256R1())
    .public_key()
    .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    .decode()
)
CONFIG = Config(
    image=IMAGE,
    signing_key_dir="/etc/tunefleet/signing",
    store_broker=True,
    capture_url="https://tunefleet-webhook.tunefleet-system.svc:8443",
    capture_ca="-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
)


def spec(uri: str = "s3://bucket/prefix", **storage: Any) -> Any:
    return (
        make_profile(NAME)
        .image("registry.example.com/serve:1")
        .gpu("nvidia", MODEL)
        .command("python3", "serve.py")
        .storage(uri, credentialsSecret={"name": "s3"}, signing={"publicKey": PUBLIC}, **storage)
        .spec_model()
    )


def tuning_job(uri: str = "s3://bucket/prefix", config: Config = CONFIG) -> dict[str, Any]:
    return built_tuning_job(spec(uri), NS, NAME, PUID, MODEL, config)


SCOPE = Scope(
    own=f"prefix/{NS}/{NAME}/{MODEL}", library=f"prefix/{NS}/_library/{MODEL}", revision="r1"
)


# --- the rules --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("op", "key"),
    [
        ("get", f"{SCOPE.own}/{SHA}/manifest.json"),
        ("get", f"{SCOPE.library}/k1/{SHA}.json"),
        ("list", SCOPE.library),
        ("list", f"{SCOPE.library}/k1"),
        ("create", f"{SCOPE.own}/{SHA}/results.csv"),
        ("create", f"{SCOPE.own}/{SHA}/caches/{SHA}.tar.zst"),
        ("create", f"{SCOPE.library}/k1/{SHA}.json"),
        ("put", f"{SCOPE.own}/_checkpoints/r1/0-of-1.json"),
        ("put", f"{SCOPE.own}/_shards/r1/0-of-2/results.csv"),
        ("put", f"{SCOPE.own}/{SHA}/manifest.json.sig"),
        ("put", f"{SCOPE.own}/{SHA}/manifest.json.att"),
    ],
)
def test_a_job_may_touch_its_own_keys(op: str, key: str) -> None:
    allowed(op, key, SCOPE)


@pytest.mark.parametrize(
    ("op", "key"),
    [
        # Another profile's, another namespace's, the cluster library, the fleet's records.
        ("get", f"prefix/{NS}/other/{MODEL}/{SHA}/manifest.json"),
        ("get", f"prefix/other-ns/{NAME}/{MODEL}/{SHA}/manifest.json"),
        ("list", f"prefix/_library/{MODEL}"),
        ("create", f"prefix/_fleet/published/{SHA}.json"),
        ("create", f"prefix/other-ns/_library/{MODEL}/k1/{SHA}.json"),
        # Its own folder, but not an artifact's object (no SHA-256 folder) or a prefix trick.
        ("create", f"{SCOPE.own}/notasha/results.csv"),
        ("create", f"{SCOPE.own}x/{SHA}/results.csv"),
        ("create", f"{SCOPE.own}/{SHA}"),
        # Replacing an artifact's objects, or another revision's scratch.
        ("put", f"{SCOPE.own}/{SHA}/results.csv"),
        ("put", f"{SCOPE.own}/{SHA}/manifest.json"),
        ("put", f"{SCOPE.own}/_checkpoints/r0/0-of-1.json"),
        ("put", f"{SCOPE.library}/k1/{SHA}.json"),
    ],
)
def test_a_job_may_not_touch_anything_else(op: str, key: str) -> None:
    with pytest.raises(Denied) as e:
        allowed(op, key, SCOPE)
    assert e.value.status == 403 and f"may not {op} {key}" in str(e.value)


def test_the_cluster_scope_library_is_the_jobs_library_there() -> None:
    v = Vouched(spec(), NAME, PUID, MODEL, "r1", "tune-x", "uid-job")
    there = scope_of(v, NS, parse_uri("s3://bucket/prefix"), "cluster")
    assert there.library == f"prefix/_library/{MODEL}" and there.own == SCOPE.own


@pytest.mark.parametrize(
    ("body", "said"),
    [
        ({"version": 2, "op": "get", "key": "a/b"}, "version must be 1"),
        ({"version": 1, "op": "delete", "key": "a/b"}, "op must be one of"),
        ({"version": 1, "op": "get", "key": "a/../b"}, "is not a store key"),
        ({"version": 1, "op": "get", "key": "/a/b"}, "is not a store key"),
        ({"version": 1, "op": "create", "key": "a/b"}, "names its body's checksumSha256"),
        ({"version": 1, "op": "list", "key": "a", "limit": 100000}, "limit must be"),
        ({"version": 1, "op": "list", "key": "a/b", "after": "a/c/d"}, "after must be a key"),
    ],
)
def test_a_bad_request_says_what_to_fix(body: dict[str, Any], said: str) -> None:
    with pytest.raises(sb.BodyError) as e:
        sb.Request.decode(json.dumps(body).encode())
    assert said in str(e.value)


# --- the tuning pod ---------------------------------------------------------------------------


def test_a_brokered_tuning_pod_holds_no_credential_and_only_sync_and_publish_the_store_token() -> (
    None
):
    pod = tuning_job()["spec"]["template"]["spec"]
    # Nothing but the two operator tokens, each good only for asking the operator.
    assert sorted(credential_refs(pod)) == [
        "volume tunefleet-sign-token: token tunefleet.io/sign",
        f"volume {sb.TOKEN_VOLUME}: token {sb.AUDIENCE}",
    ]
    holders = {
        c["name"]
        for c in [*pod["initContainers"], *pod["containers"]]
        if any(m["name"] == sb.TOKEN_VOLUME for m in c.get("volumeMounts") or [])
    }
    assert holders == {"sync", "publish"}
    sync = next(c for c in pod["initContainers"] if c["name"] == "sync")
    assert "--broker-url" in sync["command"] and "--endpoint-url" not in sync["command"]
    # Unbrokered (no publish identity in the operator), the profile's Secret is there as before.
    plain = tuning_job(config=Config(**{**CONFIG.__dict__, "store_broker": False}))
    assert any("from a Secret" in r for r in credential_refs(plain["spec"]["template"]["spec"]))
    # pvc:// is the tenant's own volume: not brokered.
    assert "--broker-url" not in json.dumps(tuning_job("pvc://claim/prefix"))


def test_a_profile_naming_another_endpoint_is_not_brokered_and_the_broker_refuses_it() -> None:
    """The publish identity is for the operator's endpoint: the operator never presigns for a
    host a profile chose. Such a profile's Job keeps its Secret; a request for it is a 409."""
    elsewhere = spec(endpoint="https://s3.elsewhere.example")
    job = built_tuning_job(elsewhere, NS, NAME, PUID, MODEL, CONFIG)
    assert "--broker-url" not in json.dumps(job) and "secretKeyRef" in json.dumps(job)
    job, pod = built_job_and_pod(tuning_job())
    deps = api_server_deps(pod, job, profile_object(elsewhere, NS, NAME, PUID), sb.AUDIENCE)
    endpoint = StoreEndpoint(deps, Presigner("a", "b"), IMAGE, "namespace")
    body = sb.Request("get", f"prefix/{NS}/{NAME}/{MODEL}/{SHA}/manifest.json").encode()

    async def ask() -> tuple[int, sb.Reply]:
        app = web.Application()
        app.add_routes(endpoint.routes())
        async with TestClient(TestServer(app)) as client:
            resp = await client.post(sb.PATH, data=body, headers={"Authorization": "Bearer good"})
            return resp.status, sb.Reply.decode(await resp.read())

    status, reply = asyncio.run(ask())
    assert status == 409, reply
    assert "names https://s3.elsewhere.example" in reply.message


def _seen(pod: dict[str, Any], job: dict[str, Any]) -> Seen:
    from tunefleet.runtime.pod_tokens import Caller

    caller = Caller(NS, "default", pod["metadata"]["name"], pod["metadata"]["uid"])
    return Seen(caller, pod, job, profile_object(spec(), NS, NAME, PUID))


def test_a_pod_whose_user_container_mounts_the_store_token_is_refused() -> None:
    job, pod = built_job_and_pod(tuning_job())
    the_job(_seen(pod, job), IMAGE, STORE)  # as built: vouched for
    tune = next(c for c in pod["spec"]["initContainers"] if c["name"] == "tune")
    tune["volumeMounts"].append({"name": sb.TOKEN_VOLUME, "mountPath": "/stolen"})
    with pytest.raises(Denied) as e:
        the_job(_seen(pod, job), IMAGE, STORE)
    assert "store token must be mounted by at most 2 of tunefleet's steps" in str(e.value)
    job, pod = built_job_and_pod(tuning_job())
    publish = pod["spec"]["containers"][0]
    publish["command"] = ["sh", "-c", "cat /var/run/secrets/tunefleet.io/store/token"]
    with pytest.raises(Denied) as e:
        the_job(_seen(pod, job), IMAGE, STORE)
    assert "is not tunefleet's sync or publish step" in str(e.value)


# --- round trips through the real route, against the real S3 server ----------------------------


class _Counted:
    """The API server's answers, counting the Job reads."""

    def __init__(self, deps: Any) -> None:
        self.deps, self.job_reads = deps, 0
        read_job = deps.read_job

        async def counted(ns: str, name: str) -> Any:
            self.job_reads += 1
            return await read_job(ns, name)

        deps.read_job = counted


@pytest.fixture
def brokered(s3: S3Settings, tmp_path: Path) -> Iterator[tuple[BrokeredStore, str]]:
    prefix = f"broker-{os.urandom(4).hex()}"
    uri = f"s3://{s3.bucket}/{prefix}"
    s = spec(uri)  # no endpoint: the operator's default (the presigner's), as in the chart
    job, pod = built_job_and_pod(tuning_job(uri))
    deps = api_server_deps(pod, job, profile_object(s, NS, NAME, PUID), sb.AUDIENCE)
    counted = _Counted(deps)
    presigner = Presigner(s3.access_key, s3.secret_key, s3.endpoint, 30.0)
    operator = RouteThread(
        StoreEndpoint(deps, presigner, IMAGE, "namespace").routes(), sb.MAX_BODY_BYTES
    )
    token = tmp_path / "token"
    token.write_text("good")
    store = BrokeredStore(parse_uri(uri), Broker(operator.url, str(token)), timeout_s=60)
    store.counted = counted  # type: ignore[attr-defined]
    try:
        yield store, prefix
    finally:
        operator.stop()


def test_a_brokered_pod_adds_its_artifact_once_and_replaces_nothing(
    brokered: tuple[BrokeredStore, str], tmp_path: Path
) -> None:
    store, prefix = brokered
    own = f"{prefix}/{NS}/{NAME}/{MODEL}"
    assert store.put_if_absent(f"{own}/{SHA}/results.csv", b"rows\n", "text/csv") is True
    assert store.put_if_absent(f"{own}/{SHA}/results.csv", b"rows\n", "text/csv") is False
    with pytest.raises(ConflictError):
        store.put_if_absent(f"{own}/{SHA}/results.csv", b"other\n", "text/csv")
    assert store.get(f"{own}/{SHA}/results.csv", 100) == b"rows\n"
    # Replacing an artifact's object, or writing another profile's, is refused by the operator.
    with pytest.raises(StoreError, match=r"refused to put .* 403 this Job may not put"):
        store.put(f"{own}/{SHA}/results.csv", b"other\n", "text/csv")
    with pytest.raises(StoreError, match="403 this Job may not create"):
        store.put_if_absent(f"{prefix}/{NS}/other/{MODEL}/{SHA}/results.csv", b"x", "text/csv")
    with pytest.raises(NotFoundError):
        store.get(f"{own}/{SHA}/manifest.json", 100)
    # Scratch is replaced; the library lists.
    checkpoint = f"{own}/_checkpoints/{naming.revision(spec(store.uri(prefix)))}/0-of-1.json"
    store.put(checkpoint, b"{}", "application/json")
    store.put(checkpoint, b"{ }", "application/json")
    assert store.get(checkpoint, 10) == b"{ }"
    library = f"{prefix}/{NS}/_library/{MODEL}"
    store.put_if_absent(f"{library}/k1/{SHA}.json", b"{}", "application/json")
    assert [o.key for o in store.list(library, 10)] == [f"{library}/k1/{SHA}.json"]
    # A file streams up and back: 24 MiB, hashed from disk, one PUT.
    big = tmp_path / "big"
    big.write_bytes(os.urandom(24 << 20))
    key = f"{own}/{SHA}/caches/{SHA}.tar.zst"
    assert store.put_file_if_absent(key, big, "application/zstd") is True
    assert store.put_file_if_absent(key, big, "application/zstd") is False
    with open(tmp_path / "back", "wb") as f:
        got = store.get_file(key, f, 32 << 20)
    assert got.sha256 == hashlib.sha256(big.read_bytes()).hexdigest()


def test_a_presigned_create_is_bound_to_its_body_and_to_writing_where_nothing_is(
    brokered: tuple[BrokeredStore, str],
) -> None:
    """What the URL itself allows, asked of the store with the URL alone: a pod that drops
    If-None-Match (to replace) or sends another body than the one named is refused by S3."""
    store, prefix = brokered
    key = f"{prefix}/{NS}/{NAME}/{MODEL}/{SHA}/manifest.json"
    body = b'{"a": 1}'
    reply = store._ask(
        sb.Request("create", key, "application/json", sb.checksum_of(hashlib.sha256(body).digest()))
    )

    def put(data: bytes, headers: dict[str, str]) -> int:
        req = urllib.request.Request(reply.url, data=data, method="PUT", headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                return int(resp.status)
        except HTTPError as e:
            return int(e.code)

    without = {k: v for k, v in reply.headers.items() if k != "If-None-Match"}
    assert put(body, without) == 403
    assert put(b'{"a": 2}', reply.headers) in (400, 403)
    assert put(body, reply.headers) == 200
    assert put(body, reply.headers) == 412  # there now: the same URL replaces nothing
    assert store.get(key, 100) == body


def test_a_long_listing_comes_in_pages_in_key_order_and_a_job_is_read_once_for_them(
    brokered: tuple[BrokeredStore, str], s3: S3Settings
) -> None:
    """A library of more entries than a page (the broker's LIST_CAP, 2 here) lists whole, in
    key order, page after page; the Job behind the many requests is read from the API server
    once (signer/route.JOB_TTL_S), not per request."""
    store, prefix = brokered
    library = f"{prefix}/{NS}/_library/{MODEL}/k1"
    keys = [f"{library}/{i:064x}.json" for i in range(5)]
    client = s3.client()
    for key in reversed(keys):
        client.put_object(Bucket=s3.bucket, Key=key, Body=b"{}")
    store.page_size = 2
    assert [o.key for o in store.list(library, 100)] == keys
    assert [o.key for o in store.list(library, 3)] == keys[:3]
    for key in keys:
        assert store.get(key, 10) == b"{}"
    assert store.counted.job_reads == 1  # type: ignore[attr-defined]


class _Flaky(BaseHTTPRequestHandler):
    """A store that answers each method's first request 503, then as a store would."""

    seen: ClassVar[dict[str, int]] = {}
    bodies: ClassVar[list[bytes]] = []

    def _first(self) -> bool:
        n = self.seen.get(self.command, 0)
        self.seen[self.command] = n + 1
        if n == 0:
            self.send_response(503)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return True
        return False

    def do_PUT(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if not self._first():
            self.bodies.append(body)
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

    def do_GET(self) -> None:
        if not self._first():
            self.send_response(200)
            self.send_header("Content-Length", "4")
            self.end_headers()
            self.wfile.write(b"rows")

    def log_message(self, *args: Any) -> None:
        pass


def test_a_store_that_fails_once_is_tried_again_with_the_file_read_from_its_start(
    tmp_path: Path,
) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Flaky)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/bucket/key"
        store = BrokeredStore(parse_uri("s3://bucket"), Broker("http://unused", "unused"), 30)
        store._ask = lambda req: sb.Reply(url=url)  # type: ignore[method-assign]
        f = tmp_path / "archive"
        f.write_bytes(b"x" * 100_000)
        assert store.put_file_if_absent("key", f, "application/zstd") is True
        assert _Flaky.bodies == [b"x" * 100_000]  # whole, once it was answered
        assert store.get("key", 10) == b"rows"
        assert _Flaky.seen == {"PUT": 2, "GET": 2}
    finally:
        server.shutdown()
