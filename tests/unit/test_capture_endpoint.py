"""The capture endpoint's authentication and bounds (capture/endpoint.py), through aiohttp's
test server with the cluster stubbed: a forged token, a token of another audience or not bound
to a pod, a pod of another profile, a pod tunefleet did not inject, a deleted pod whose name
came back, an oversize body, a flood; and where accepted rows are attributed."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from testbed.builders.wrappers import make_artifact, make_pod, make_profile
from tunefleet.capture.endpoint import Deps, Endpoint, caller_of
from tunefleet.capture.retune_sets import StoreKey, StoreUnavailable
from tunefleet.contracts.admission_record import INJECTED, Admission, Code
from tunefleet.contracts.capture_upload import AUDIENCE, MAX_BODY_BYTES, MAX_ROWS, PATH, Upload

SHA = "c" * 64
ROW = "GemmTunableOp_BFloat16_TN,tn_96_4096_512_ld_512_512_96"
PROFILE = (
    make_profile()
    .uid("prof-uid")
    .image("registry.example.com/serve:1")
    .storage("s3://bucket/p")
    .spec(capture={"enabled": True, "limits": {"uploadIntervalSeconds": 4}})
    .artifacts(make_artifact("H100", SHA, base="s3://bucket/p").library_key("lib-1").revision("r1"))
)


def review(pod: str = "serve-1", uid: str = "pod-uid-1", ns: str = "ml") -> dict[str, Any]:
    return {
        "authenticated": True,
        "audiences": [AUDIENCE],
        "user": {
            "username": f"system:serviceaccount:{ns}:default",
            "extra": {
                "authentication.kubernetes.io/pod-name": [pod],
                "authentication.kubernetes.io/pod-uid": [uid],
            },
        },
    }


UNLABELLED = make_pod("serve-1").uid("pod-uid-1").labels({}).spec(serviceAccountName="default")
ADMITTED = Admission(INJECTED, Code.NONE, uri=f"s3://bucket/p/{SHA}", sha256=SHA, gpu_model="H100")
SERVE_POD = UNLABELLED.profile("p").admitted(ADMITTED)


class Cluster:
    def __init__(self) -> None:
        self.tokens: dict[str, dict[str, Any]] = {"good": review()}
        self.pods = {"serve-1": SERVE_POD.obj()}
        self.profiles = {"p": PROFILE.obj()}
        self.added: list[tuple[StoreKey, Upload]] = []
        self.reviews = 0
        self.fail_store: Exception | None = None

    def deps(self) -> Deps:
        async def do_review(token: str) -> dict[str, Any]:
            self.reviews += 1
            return self.tokens.get(token, {"authenticated": False, "error": "invalid bearer token"})

        async def read_pod(ns: str, name: str) -> dict[str, Any] | None:
            return self.pods.get(name)

        async def read_profile(ns: str, name: str) -> dict[str, Any] | None:
            return self.profiles.get(name)

        async def add(key: StoreKey, upload: Upload, max_shapes: int, pod: str) -> tuple[int, int]:
            if self.fail_store is not None:
                raise self.fail_store
            self.added.append((key, upload))
            return len(upload.rows), len(upload.rows)

        return Deps(do_review, read_pod, read_profile, add)


Call = Callable[..., Awaitable[tuple[int, dict[str, Any], dict[str, str]]]]


def serve(cluster: Cluster, test: Callable[[Call], Awaitable[None]]) -> None:
    async def main() -> None:
        now = [1000.0]
        endpoint = Endpoint(cluster.deps(), clock=lambda: now[0])
        client = TestClient(TestServer(endpoint.app()))
        await client.start_server()
        try:

            async def call(
                body: Any = None, token: str | None = "good", **headers: str
            ) -> tuple[int, dict[str, Any], dict[str, str]]:
                if token is not None:
                    headers["Authorization"] = f"Bearer {token}"
                data = body if body is not None else Upload((ROW,)).encode()
                resp = await client.post(PATH, data=data, headers=headers)
                return resp.status, json.loads(await resp.read() or b"{}"), dict(resp.headers)

            call.now = now  # type: ignore[attr-defined]
            await test(call)
        finally:
            await client.close()

    asyncio.run(main())


def test_a_pod_tunefleet_injected_is_attributed_from_the_pod_and_its_profile() -> None:
    c = Cluster()

    async def t(call: Call) -> None:
        # The body claims nothing: where rows go comes from the pod as admitted.
        status, reply, _ = await call()
        assert status == 200 and reply == {"accepted": 1, "new": 1}

    serve(c, t)
    ((key, upload),) = c.added
    assert key == StoreKey("ml", "p", "prof-uid", "H100", "lib-1", "")
    assert upload.rows == (ROW,)


@pytest.mark.parametrize(
    ("token", "status", "words"),
    [
        (None, 401, "no bearer token"),
        ("forged", 401, "invalid bearer token"),
        ("other-audience", 401, "not for audience"),
        ("not-pod-bound", 403, "not bound to a pod"),
        ("a-user", 403, "not a ServiceAccount"),
    ],
)
def test_tokens_that_are_not_a_pods_capture_token_are_refused(
    token: str | None, status: int, words: str
) -> None:
    c = Cluster()
    c.tokens["other-audience"] = {**review(), "audiences": ["https://kubernetes.default.svc"]}
    unbound = review()
    unbound["user"]["extra"] = {}
    c.tokens["not-pod-bound"] = unbound
    c.tokens["a-user"] = {**review(), "user": {"username": "alice"}}

    async def t(call: Call) -> None:
        got, reply, _ = await call(token=token)
        assert got == status and words in reply["message"]

    serve(c, t)
    assert c.added == []


def test_a_flood_of_forged_tokens_costs_one_review_per_token() -> None:
    c = Cluster()

    async def t(call: Call) -> None:
        for _ in range(20):
            assert (await call(token="forged"))[0] == 401

    serve(c, t)
    assert c.reviews == 1


def test_a_deleted_pod_whose_name_came_back_is_refused() -> None:
    c = Cluster()
    c.pods["serve-1"] = SERVE_POD.uid("pod-uid-2").obj()  # same name, another pod

    async def t(call: Call) -> None:
        status, reply, _ = await call()
        assert status == 403 and "no longer exists" in reply["message"]

    serve(c, t)
    c.pods.clear()
    serve(c, t)
    assert c.added == []


def test_a_pod_not_injected_by_tunefleet_or_without_the_label_is_refused() -> None:
    c = Cluster()
    bare = SERVE_POD.obj()
    bare["metadata"]["annotations"] = {}
    bare["metadata"]["labels"].pop("tunefleet.io/admission")
    c.pods["serve-1"] = bare

    async def t(call: Call) -> None:
        status, reply, _ = await call()
        assert status == 403 and "not injected" in reply["message"]

    serve(c, t)
    c.pods["serve-1"] = UNLABELLED.admitted(ADMITTED).obj()

    async def t2(call: Call) -> None:
        status, reply, _ = await call()
        assert status == 403 and "no tunefleet.io/profile" in reply["message"]

    serve(c, t2)


def test_a_pod_of_another_profile_feeds_that_profile_only_and_not_one_with_capture_off() -> None:
    c = Cluster()
    c.pods["serve-1"] = UNLABELLED.profile("q").admitted(ADMITTED).obj()
    c.profiles["q"] = PROFILE.name("q").uid("q-uid").spec(capture={"enabled": False}).obj()

    async def off(call: Call) -> None:
        status, reply, _ = await call()
        assert status == 403 and "capture is off" in reply["message"]

    serve(c, off)
    c.profiles["q"] = PROFILE.name("q").uid("q-uid").obj()

    async def on(call: Call) -> None:
        assert (await call())[0] == 200

    serve(c, on)
    ((key, _),) = c.added
    assert (key.profile, key.profile_uid) == ("q", "q-uid")  # never "p"'s tuning


def test_another_image_or_an_unknown_artifact_is_kept_apart() -> None:
    c = Cluster()
    c.pods["serve-1"] = (
        UNLABELLED.profile("p").admitted(replace(ADMITTED, code=Code.IMAGE_MISMATCH)).obj()
    )

    async def t(call: Call) -> None:
        assert (await call())[0] == 200

    serve(c, t)
    c.pods["serve-1"] = SERVE_POD.obj()
    c.profiles["p"]["status"]["artifacts"] = []  # the pinned artifact is not the profile's
    serve(c, t)
    (image, unknown) = (k for k, _ in c.added)
    assert image.apart == "another image than the artifact was tuned in"
    assert unknown.identity == f"sha256:{SHA}" and unknown.apart


def test_an_oversize_or_malformed_body_is_refused_before_it_is_kept() -> None:
    c = Cluster()

    async def t(call: Call) -> None:
        status, reply, _ = await call(body=b"x" * (MAX_BODY_BYTES + 1))
        assert status == 413

        async def chunks() -> Any:  # no Content-Length: bounded as it is read
            for _ in range(40):
                yield b"x" * 8192

        status, reply, _ = await call(body=chunks())
        assert status == 413
        status, reply, _ = await call(body=b"{not json")
        assert status == 400 and "not UTF-8 JSON" in reply["message"]
        too_many = json.dumps({"version": 1, "rows": [ROW] * (MAX_ROWS + 1)}).encode()
        status, reply, _ = await call(body=too_many)
        assert status == 400 and f"at most {MAX_ROWS} rows" in reply["message"]
        bad_row = json.dumps({"version": 1, "rows": ["not a row"]}).encode()
        assert (await call(body=bad_row))[0] == 400

    serve(c, t)
    assert c.added == []


def test_a_flood_from_one_pod_is_rate_limited_with_retry_after() -> None:
    c = Cluster()

    async def t(call: Call) -> None:
        codes = [(await call())[0] for _ in range(10)]
        assert codes[:6] == [200] * 6 and set(codes[6:]) == {429}
        status, reply, headers = await call()
        assert status == 429 and float(headers["Retry-After"]) >= 1 and reply["retryAfter"]
        call.now[0] += 2.0  # type: ignore[attr-defined]  # upload interval 4 s: one per 1 s
        assert (await call())[0] == 200

    serve(c, t)
    assert len(c.added) == 7


def test_a_store_that_cannot_be_written_now_asks_the_sidecar_to_retry() -> None:
    c = Cluster()
    c.fail_store = StoreUnavailable("ConfigMap kept changing")

    async def t(call: Call) -> None:
        status, _, headers = await call()
        assert status == 503 and "Retry-After" in headers

    serve(c, t)


def test_caller_of_reads_only_pod_bound_service_account_tokens() -> None:
    caller = caller_of(review())
    assert (caller.namespace, caller.service_account, caller.pod_name, caller.pod_uid) == (
        "ml",
        "default",
        "serve-1",
        "pod-uid-1",
    )
