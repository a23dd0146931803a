"""How tunefleet's containers in a pod reach the profile's artifact store: the one place where
the profile's storage settings meet the operator's defaults (credentials Secret, endpoint);
the backend (storage/registry.py) turns them into env, flags, volumes and mounts."""

from __future__ import annotations

from typing import Any

from tunefleet.api import TuningProfileSpec
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
    return registry.pod_storage(
        storage.uri,
        read_only=read_only,
        secret=secret,
        endpoint=storage.endpoint or config.default_s3_endpoint,
        region=storage.region or "",
    )


def with_storage(container: dict[str, Any], storage: PodStorage) -> dict[str, Any]:
    """The container, given the store: its flags after the command, env, mounts."""
    container["command"] = [*container["command"], *storage.args]
    if storage.env:
        container["env"] = [*(container.get("env") or []), *storage.env]
    container["volumeMounts"] = [*container.get("volumeMounts", []), *storage.mounts]
    return container
