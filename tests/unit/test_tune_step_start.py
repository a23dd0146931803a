"""How the tune step starts in the user's image: no shell, python3 by name, tunefleet's own words
when the image has no Python (issue 17).

The kubelet's messages are runc's as seen on the real node (containerd + runc): an image without
the command fails to start with `exec: "<cmd>": executable file not found in $PATH`.
"""

from __future__ import annotations

from testbed.builders.wrappers import make_job, make_pod
from tunefleet.reconciler.diagnose import pod_blocker
from tunefleet.reconciler.observe import observe_job
from tunefleet.watched.views import pod_view

NOT_FOUND = (
    "failed to create containerd task: failed to create shim task: OCI runtime create failed: "
    "runc create failed: unable to start container process: error during container init: exec: "
    '"python3": executable file not found in $PATH: unknown'
)


IMAGE = "registry.example.com/distroless:1"
# The tuning Job as its informer sees it, and its pod, whose tune step runs the user's IMAGE.
JOB = make_job().uid("u").revision("r").gpu_model("M")
POD = make_pod("p").created("t").container("tune", IMAGE, init=True)


def test_an_image_without_python_fails_with_tunefleets_own_message() -> None:
    """Defect: tried with an image without a shell, the profile failed with runc's words about
    /bin/sh; the 'no python3 or python in this image' check ran in that very shell."""
    failed = JOB.condition("Failed", reason="BackoffLimitExceeded", message="").obj()
    terminated = {"terminated": {"exitCode": 128, "reason": "StartError", "message": NOT_FOUND}}
    obs = observe_job(failed, [POD.container_state("tune", terminated, init=True).obj()])
    assert obs.state == "Failed"
    assert "the image registry.example.com/distroless:1 has no python3 on its PATH" in obs.message
    # As the operator's cache holds the pod: no container specs, the image in its status.
    seen = POD.without("spec").container_state("tune", terminated, init=True, image=IMAGE).obj()
    viewed = observe_job(failed, [pod_view(seen)])
    assert "the image registry.example.com/distroless:1 has no python3" in viewed.message
    assert (
        "without a shell" in obs.message
        and "runtime: failed to create containerd task" in obs.message
    )


def test_a_waiting_start_error_is_explained_too() -> None:
    waiting = {"waiting": {"reason": "RunContainerError", "message": NOT_FOUND}}
    pod = POD.container_state("tune", waiting, init=True).obj()
    reason, message = pod_blocker(pod, "M", hints=None) or ("", "")  # type: ignore[arg-type]
    assert "has no python3 on its PATH" in message and reason


def test_other_start_errors_keep_the_runtimes_words() -> None:
    waiting = {"waiting": {"reason": "RunContainerError", "message": "permission denied"}}
    pod = POD.container_state("tune", waiting, init=True).obj()
    blocked = pod_blocker(pod, "M", hints=None)  # type: ignore[arg-type]
    assert blocked is not None and "RunContainerError: permission denied" in blocked[1]
