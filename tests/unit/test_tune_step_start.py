"""How the tune step starts in the user's image: no shell, python3 by name, tunefleet's own words
when the image has no Python (issue 17).

The kubelet's messages are runc's as seen on the real node (containerd + runc): an image without
the command fails to start with `exec: "<cmd>": executable file not found in $PATH`.
"""

from __future__ import annotations

from typing import Any

from tunefleet import naming
from tunefleet.informers.views import pod_view
from tunefleet.reconciler.diagnose import pod_blocker
from tunefleet.reconciler.observe import observe_job

NOT_FOUND = (
    "failed to create containerd task: failed to create shim task: OCI runtime create failed: "
    "runc create failed: unable to start container process: error during container init: exec: "
    '"python3": executable file not found in $PATH: unknown'
)


def job(conditions: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "tune-x",
            "namespace": "ml",
            "uid": "u",
            "labels": {naming.REVISION_LABEL: "r"},
            "annotations": {naming.MODEL_ANNOTATION: "M"},
        },
        "status": {"conditions": conditions},
    }


def pod(state: dict[str, Any]) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "namespace": "ml", "creationTimestamp": "t"},
        "spec": {
            "initContainers": [{"name": "tune", "image": "registry.example.com/distroless:1"}]
        },
        "status": {"initContainerStatuses": [{"name": "tune", "state": state}]},
    }


def test_an_image_without_python_fails_with_tunefleets_own_message() -> None:
    """Defect: tried with an image without a shell, the profile failed with runc's words about
    /bin/sh; the 'no python3 or python in this image' check ran in that very shell."""
    failed = [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "message": ""}]
    terminated = {"terminated": {"exitCode": 128, "reason": "StartError", "message": NOT_FOUND}}
    obs = observe_job(job(failed), [pod(terminated)])
    assert obs.state == "Failed"
    assert "the image registry.example.com/distroless:1 has no python3 on its PATH" in obs.message
    # As the operator's cache holds the pod: no container specs, the image in its status.
    seen = pod(terminated)
    del seen["spec"]
    seen["status"]["initContainerStatuses"][0]["image"] = "registry.example.com/distroless:1"
    viewed = observe_job(job(failed), [pod_view(seen)])
    assert "the image registry.example.com/distroless:1 has no python3" in viewed.message
    assert (
        "without a shell" in obs.message
        and "runtime: failed to create containerd task" in obs.message
    )


def test_a_waiting_start_error_is_explained_too() -> None:
    waiting = {"waiting": {"reason": "RunContainerError", "message": NOT_FOUND}}
    reason, message = pod_blocker(pod(waiting), "M", hints=None) or ("", "")  # type: ignore[arg-type]
    assert "has no python3 on its PATH" in message and reason


def test_other_start_errors_keep_the_runtimes_words() -> None:
    waiting = {"waiting": {"reason": "RunContainerError", "message": "permission denied"}}
    blocked = pod_blocker(pod(waiting), "M", hints=None)  # type: ignore[arg-type]
    assert blocked is not None and "RunContainerError: permission denied" in blocked[1]
