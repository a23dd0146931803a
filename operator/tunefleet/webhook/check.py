"""tunefleet-webhook-check: ask the pod webhook to admit a probe pod, as the API server would.

`helm test` runs it in the cluster against the webhook Service (by its ClusterIP, verifying
the serving certificate against the webhook CA under the Service's DNS name, so no cluster
DNS is needed). The probe pod names a TuningProfile that does not exist: a working webhook
admits it untuned and labels it; anything else fails the check with what it got.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import socket
import ssl
import sys
import uuid
from collections.abc import Sequence
from typing import Any

PROG = "tunefleet-webhook-check"
PROBE_PROFILE = "tunefleet-helm-test-no-such-profile"


def review(namespace: str) -> dict[str, Any]:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": "tunefleet-probe-",
            "namespace": namespace,
            "labels": {"tunefleet.io/profile": PROBE_PROFILE},
        },
        "spec": {"containers": [{"name": "c", "image": "registry.example.com/probe:1"}]},
    }
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "operation": "CREATE",
            "namespace": namespace,
            "object": pod,
            "userInfo": {"username": PROG},
            "dryRun": True,
        },
    }


def call(address: str, port: int, server_name: str, ca: str, path: str, body: bytes) -> bytes:
    ctx = ssl.create_default_context(cafile=ca)
    with (
        socket.create_connection((address, port), timeout=10) as raw,
        ctx.wrap_socket(raw, server_hostname=server_name) as tls,
    ):
        tls.sendall(
            (
                f"POST {path} HTTP/1.1\r\nHost: {server_name}\r\n"
                "Content-Type: application/json\r\nConnection: close\r\n"
                f"Content-Length: {len(body)}\r\n\r\n"
            ).encode()
            + body
        )
        chunks = []
        while chunk := tls.recv(65536):
            chunks.append(chunk)
    head, _, payload = b"".join(chunks).partition(b"\r\n\r\n")
    status = head.split(b"\r\n", 1)[0].decode(errors="replace")
    if " 200 " not in f"{status} ":
        raise RuntimeError(f"webhook answered {status!r}")
    if b"transfer-encoding: chunked" in head.lower():
        payload = _dechunk(payload)
    return payload


def _dechunk(data: bytes) -> bytes:
    out, rest = b"", data
    while rest:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            break
        out, rest = out + rest[:size], rest[size + 2 :]
    return out


def check(address: str, port: int, server_name: str, ca: str, path: str, namespace: str) -> int:
    """One webhook address: 0 when it admits the probe pod untuned and labels it."""
    try:
        answer = json.loads(
            call(address, port, server_name, ca, path, json.dumps(review(namespace)).encode())
        )
        response = answer["response"]
        patch = json.loads(base64.b64decode(response.get("patch") or b"W10=")) or []
    except Exception as e:
        print(f"{PROG}: error: the webhook at {address}:{port} ({server_name}) did not answer: {e}")
        return 1
    labelled = any(
        "tunefleet.io/admission" in json.dumps(op.get("value")) or "admission" in op.get("path", "")
        for op in patch
    )
    if not response.get("allowed") or not labelled:
        print(f"{PROG}: error: unexpected answer from {server_name}: {json.dumps(response)[:2000]}")
        return 1
    print(
        f"{PROG}: ok: the webhook at {address}:{port} ({server_name}) admitted the "
        f"probe pod untuned and labelled it ({len(patch)} patch operation(s))"
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--address", help="IP or host to connect to")
    p.add_argument("--address-env", help="environment variable holding it (a Service's)")
    p.add_argument("--port", type=int, default=443)
    p.add_argument("--server-name", required=True, help="DNS name the certificate is for")
    p.add_argument(
        "--also",
        action="append",
        default=[],
        metavar="ADDRESS_ENV=SERVER_NAME",
        help="another Service to check the same way (each replica slot's; repeatable)",
    )
    p.add_argument("--ca", required=True, help="CA bundle that signed the webhook certificate")
    p.add_argument("--path", default="/pod-inject")
    p.add_argument("--namespace", default=os.environ.get("POD_NAMESPACE", "default"))
    args = p.parse_args(argv)
    targets = [(args.address or os.environ.get(args.address_env or "", ""), args.server_name)]
    for also in args.also:
        env, sep, name = also.partition("=")
        if not sep or not name:
            print(f"{PROG}: error: --also {also!r}: give ADDRESS_ENV=SERVER_NAME", file=sys.stderr)
            return 2
        targets.append((os.environ.get(env, ""), name))
    if not all(address for address, _ in targets):
        missing = [name for address, name in targets if not address]
        print(f"{PROG}: error: no address for {', '.join(missing)} (--address or --address-env, "
              "and each --also's variable)", file=sys.stderr)  # fmt: skip
        return 2
    worst = 0
    for address, name in targets:
        worst = max(worst, check(address, args.port, name, args.ca, args.path, args.namespace))
    return worst


if __name__ == "__main__":
    sys.exit(main())
