"""TuningProfiles and model pods on the kwok fleet (fake GPU nodes, no containers run), for e2e
tests: `profile_doc(name, **spec_over)` (one NVIDIA-H200 model, s3://tunefleet/e2e) and
`pod_doc(...)` (a model pod). The e2e tests' flows that play a tuning pod's publish step
apply them."""

from __future__ import annotations

from typing import Any

from testbed.builders.wrappers import make_pod, make_profile

# The kwok fleet's profile: one NVIDIA-H200 model, one 64x64x64 GEMM, no retries.
FLEET_PROFILE = (
    make_profile("p", "").image("registry.example.com/serve:1").gpu("nvidia", "NVIDIA-H200")
    .shapes((64, 64, 64)).storage("s3://tunefleet/e2e").tuning(backoffLimit=0)
)  # fmt: skip


def profile_doc(name: str, **spec_over: Any) -> dict[str, Any]:
    """FLEET_PROFILE named `name`, with these spec fields set whole."""
    return FLEET_PROFILE.name(name).spec(**spec_over).obj()


def pod_doc(
    name: str,
    profile: str | None,
    selector: dict[str, str] | None = None,
    gpus: int = 2,
    image: str = "registry.example.com/serve:1",
) -> dict[str, Any]:
    """A model pod (app=model) asking for `gpus` NVIDIA GPUs; opted in to `profile` if given."""
    pod = make_pod(name, "").label("app", "model")
    if profile:
        pod = pod.profile(profile)
    return pod.selector(selector or {}).container("server", image, gpus=gpus).obj()
