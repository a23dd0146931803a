"""The storage flags every artifact CLI takes (publish, fetch, sync, merge), declared once."""

from __future__ import annotations

import argparse
from typing import Any

from .store import StoreOptions


def add_arguments(p: argparse.ArgumentParser, *, timeout_s: float) -> None:
    p.add_argument("--endpoint-url", help="S3 endpoint (default: $AWS_ENDPOINT_URL_S3, else AWS)")
    p.add_argument("--region", help="S3 region (default: $AWS_REGION or us-east-1)")
    p.add_argument(
        "--pvc-root",
        default=StoreOptions.pvc_root,
        help="where a pvc:// store's claim is mounted (default: %(default)s)",
    )
    p.add_argument(
        "--oci-config",
        help="oci:// stores: a directory with the registry's docker config (.dockerconfigjson) "
        "and optionally ca.crt (default: $TUNEFLEET_OCI_CONFIG, else $DOCKER_CONFIG)",
    )
    p.add_argument(
        "--broker-url",
        help="s3:// stores: the operator's store broker; every operation on a URL it presigns, "
        "with no credential here (contracts/store_broker.py; the CLIs that take it: "
        "artifacts/brokered.with_broker)",
    )
    p.add_argument("--broker-token-file", help="the projected token the broker takes")
    p.add_argument("--broker-ca-env", help="an env var holding the broker's CA (PEM)")
    p.add_argument("--broker-address", help="the broker's address where its name won't resolve")
    p.add_argument(
        "--timeout-seconds",
        type=float,
        default=timeout_s,
        help="overall time limit of the store's operations (default: %(default)s)",
    )


def options(args: argparse.Namespace, **override: Any) -> StoreOptions:
    fields: dict[str, Any] = {
        "endpoint_url": args.endpoint_url,
        "region": args.region,
        "timeout_s": args.timeout_seconds,
        "pvc_root": args.pvc_root,
        "oci_config": getattr(args, "oci_config", None),
    }
    fields.update(override)
    return StoreOptions(**fields)
