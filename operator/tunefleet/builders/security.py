"""Security contexts shared by every container tunefleet adds."""

from __future__ import annotations

from typing import Any

from tunefleet.config import Config

# The tunefleet image runs as this non-root user (see Dockerfile).
TUNEFLEET_UID = 65532


def hardened(
    read_only_root: bool = True, run_as_user: int | None = TUNEFLEET_UID
) -> dict[str, Any]:
    ctx: dict[str, Any] = {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": read_only_root,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    if run_as_user is not None:
        ctx.update(runAsNonRoot=True, runAsUser=run_as_user, runAsGroup=run_as_user)
    return ctx


SMALL_RESOURCES: dict[str, Any] = {
    "requests": {"cpu": "50m", "memory": "64Mi"},
    "limits": {"memory": "256Mi"},
}


def tunefleet_container(
    name: str,
    command: list[str],
    config: Config,
    *,
    mounts: list[dict[str, Any]],
    env: list[dict[str, Any]] | None = None,
    resources: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A step in tunefleet's own image (the operator's settings name it and its pull
    policy): hardened, small, its last words kept for status."""
    container: dict[str, Any] = {
        "name": name,
        "image": config.image,
        "imagePullPolicy": config.image_pull_policy,
        "command": command,
        "volumeMounts": mounts,
        "securityContext": hardened(),
        "resources": resources or SMALL_RESOURCES,
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    if env:
        container["env"] = env
    return container
