"""How tunefleet's containers in a pod reach the profile's artifact store: the one place where
the profile's storage settings meet the operator's defaults (credentials Secret, endpoint);
the backend (storage/registry.py) turns them into env, flags, volumes and mounts."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from tunefleet.api import TuningProfileSpec
from tunefleet.artifacts import signing
from tunefleet.config import Config
from tunefleet.storage import registry
from tunefleet.storage.store import PodStorage


def pod_storage(
    spec: TuningProfileSpec, config: Config, *, read_only: bool = False, serving: bool = False
) -> PodStorage:
    """`serving`: for a model pod's fetch: the read-only credentials (spec.serving's, else the
    operator's default serving Secret, else the pod's cloud identity), never the publish ones."""
    storage = spec.storage
    if serving:
        chosen = spec.serving.credentials_secret
        secret = chosen.name if chosen else config.default_serving_credentials_secret
    else:
        chosen = storage.credentials_secret
        secret = chosen.name if chosen else config.default_credentials_secret
    got = registry.pod_storage(
        storage.uri,
        read_only=read_only,
        secret=secret,
        endpoint=storage.endpoint or config.default_s3_endpoint,
        region=storage.region or "",
    )
    if not serving:
        return got
    extra = signing_storage(spec, serving=True)
    return replace(
        got,
        args=[*got.args, *extra.args],
        volumes=[*got.volumes, *extra.volumes],
        mounts=[*got.mounts, *extra.mounts],
    )


# Where a pod's tunefleet container finds the signing Secret's keys (artifacts/signing.py).
SIGNING_VOLUME = "tunefleet-signing"
SIGNING_DIR = "/tunefleet/signing"


def signing_storage(spec: TuningProfileSpec, *, serving: bool) -> PodStorage:
    """oci:// stores' signing Secret, as a volume, its mount and the CLI's flags: model pods'
    fetch gets the public key alone (and whether a signature is required); the tuning Job's
    publish step the key pair, to sign with. Empty where nothing is signed."""
    policy, secret = spec.storage.signing_policy, spec.storage.signing_secret
    if policy is None or not secret:
        return PodStorage()
    if serving:
        items = [{"key": signing.PUBLIC_KEY, "path": signing.PUBLIC_KEY}]
        args = ["--verify-key", f"{SIGNING_DIR}/{signing.PUBLIC_KEY}"]
        args += ["--require-signature"] if policy == "Required" else []
    else:
        items = [{"key": k, "path": k} for k in (signing.PRIVATE_KEY, signing.PASSWORD)]
        args = ["--signing-key-dir", SIGNING_DIR]
    volume = {
        "name": SIGNING_VOLUME,
        "secret": {"secretName": secret, "items": items, "defaultMode": 0o444},
    }
    mount = {"name": SIGNING_VOLUME, "mountPath": SIGNING_DIR, "readOnly": True}
    return PodStorage(args=args, volumes=[volume], mounts=[mount])


def with_storage(container: dict[str, Any], storage: PodStorage) -> dict[str, Any]:
    """The container, given the store: its flags after the command, env, mounts."""
    container["command"] = [*container["command"], *storage.args]
    if storage.env:
        container["env"] = [*(container.get("env") or []), *storage.env]
    container["volumeMounts"] = [*container.get("volumeMounts", []), *storage.mounts]
    return container
