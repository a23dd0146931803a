"""The operator's store broker: a route beside signing's on the operator's HTTPS server, on
every replica (contracts/store_broker.py is the protocol).

The caller is vouched for as for a signature (signer/judge.the_job, with the store token's
rule), signer/store_rules.py decides which keys its Job may touch, and the answer is a URL
presigned for that one operation with the publish identity the operator holds (the chart's
signing.storeCredentialsSecret, in its own namespace), or, for a list, the listing itself.
Presigning is local (no call to the store); a list is one bounded call.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from botocore.exceptions import BotoCoreError, ClientError

from tunefleet import metrics
from tunefleet.contracts import store_broker as sb
from tunefleet.runtime.pod_tokens import Denied
from tunefleet.signer.judge import the_job
from tunefleet.signer.route import Calls, Deps, respond
from tunefleet.signer.store_rules import STORE, allowed, scope_of
from tunefleet.storage.registry import parse_uri
from tunefleet.storage.store import Location, StoreError

log = logging.getLogger(__name__)

# The publish identity: keys the chart puts in the operator's environment from
# signing.storeCredentialsSecret (never the AWS_* names, which are its read identity's).
ACCESS_KEY_ENV = "TUNEFLEET_STORE_ACCESS_KEY_ID"
SECRET_KEY_ENV = "TUNEFLEET_STORE_SECRET_ACCESS_KEY"
# A publish step asks for each object (a GB cache is one); sync for each checkpoint and, at
# its start, each GEMM library entry (up to artifacts/library.MAX_ENTRIES: 500).
BURST, REFILL_S = 200, 0.05


@dataclass
class Presigner:
    """Presigned URLs and listings with the publish identity, one boto3 client per endpoint
    and region (clients are thread-safe); `timeout_s` bounds a list."""

    access_key: str
    secret_key: str
    default_endpoint: str = ""
    timeout_s: float = 30.0
    _clients: dict[tuple[str, str], Any] = field(default_factory=dict)

    @classmethod
    def from_env(cls, default_endpoint: str, timeout_s: float) -> Presigner:
        return cls(
            os.environ.get(ACCESS_KEY_ENV, ""),
            os.environ.get(SECRET_KEY_ENV, ""),
            default_endpoint,
            timeout_s,
        )

    def client(self, endpoint: str, region: str) -> Any:
        key = (endpoint or self.default_endpoint, region or "us-east-1")
        if key not in self._clients:
            import boto3
            from botocore.config import Config as BotoConfig

            self._clients[key] = boto3.client(
                "s3",
                endpoint_url=key[0] or None,
                region_name=key[1],
                aws_access_key_id=self.access_key,
                aws_secret_access_key=self.secret_key,
                config=BotoConfig(
                    signature_version="s3v4",
                    connect_timeout=5,
                    read_timeout=self.timeout_s,
                    retries={"max_attempts": 2},
                ),
            )
        return self._clients[key]

    def answer(self, req: sb.Request, location: Location, client: Any) -> sb.Reply:
        if req.op == "list":
            return self._list(req, location, client)
        params: dict[str, Any] = {"Bucket": location.bucket, "Key": req.key}
        headers: dict[str, str] = {}
        method = "get_object"
        if req.op in ("create", "put"):
            method = "put_object"
            if req.content_type:
                params["ContentType"] = headers["Content-Type"] = req.content_type
            if req.checksum_sha256:
                params["ChecksumSHA256"] = headers["x-amz-checksum-sha256"] = req.checksum_sha256
            if req.op == "create":
                # Signed into the URL: without the header the store refuses the request.
                params["IfNoneMatch"] = headers["If-None-Match"] = "*"
        url = client.generate_presigned_url(method, Params=params, ExpiresIn=sb.URL_SECONDS)
        return sb.Reply(url=str(url), headers=headers)

    def _list(self, req: sb.Request, location: Location, client: Any) -> sb.Reply:
        """One page of the listing, in key order, after `req.after`; StoreError when the store
        fails."""
        args: dict[str, Any] = {
            "Bucket": location.bucket,
            "Prefix": req.key + "/",
            "MaxKeys": req.limit,
        }
        if req.after:
            args["StartAfter"] = req.after
        try:
            resp = client.list_objects_v2(**args)
        except (ClientError, BotoCoreError) as e:
            raise StoreError(f"listing {location.uri(req.key)}/ failed: {e}") from None
        listed = tuple(
            sb.Listed(o["Key"], int(o["Size"]), o["LastModified"].timestamp())
            for o in resp.get("Contents", [])[: req.limit]
        )
        return sb.Reply(listed=listed, capped=bool(resp.get("IsTruncated")))


class StoreEndpoint:
    def __init__(
        self,
        deps: Deps,
        presigner: Presigner,
        image: str,
        library_scope: str,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.presigner, self.image, self.library_scope = presigner, image, library_scope
        self.calls = Calls(deps, sb.AUDIENCE, clock, burst=BURST, refill_s=REFILL_S)

    async def handle(self, request: web.Request) -> web.Response:
        try:
            reply = await self._handle(request)
            outcome, status, retry = "presigned", 200, None
        except Denied as d:
            reply = sb.Reply(message=str(d), retry_after=d.retry_after)
            outcome, status, retry = d.outcome, d.status, d.retry_after
        metrics.STORE_BROKER_REQUESTS.labels(outcome).inc()
        return respond(reply.encode(), status, retry)

    async def _handle(self, request: web.Request) -> sb.Reply:
        seen, body = await self.calls.seen(request, sb.MAX_BODY_BYTES)
        try:
            req = sb.Request.decode(body)
        except sb.BodyError as e:
            raise Denied(400, "bad_request", str(e)) from None
        v = the_job(seen, self.image, STORE)
        storage = v.spec.storage
        try:
            location = parse_uri(storage.uri)
        except ValueError as e:
            raise Denied(409, "conflict", f"the profile's storage.uri: {e}") from None
        if location.scheme != "s3":
            raise Denied(409, "conflict", f"the broker serves s3:// stores, not {storage.uri}")
        default = self.presigner.default_endpoint
        if not sb.presigns_for(storage.endpoint, default):
            ours = default or "the default S3 endpoint"
            why = f"the broker presigns for {ours}, and the profile names {storage.endpoint}"
            raise Denied(409, "conflict", why)
        allowed(req.op, req.key, scope_of(v, seen.caller.namespace, location, self.library_scope))
        client = self.presigner.client("", storage.region or "")
        try:
            reply = await asyncio.to_thread(self.presigner.answer, req, location, client)
        except StoreError as e:
            raise Denied(503, "unavailable", f"the store could not be listed now: {e}", 5) from None
        if req.op != "get":
            log.info(f"store broker: {req.op} {req.key} for Job {seen.caller.namespace}/{v.job}")
        return reply

    def routes(self) -> list[web.RouteDef]:
        return [web.post(sb.PATH, self.handle)]
