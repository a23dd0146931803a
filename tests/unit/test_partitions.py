"""GPU partitions (issue 17): the identity sees them, the library key splits on them, and the
webhook never serves an artifact of a whole GPU to a partition, or the reverse.

The stand-in torch stands in for the device: FAKE_TORCH_CUS is its multi_processor_count,
FAKE_TORCH_DEVICE_NAME its name (a MIG slice's name carries its profile), and TUNEFLEET_SYSFS
points the tuner at a made-up sysfs tree with the amdgpu driver's partition files.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from testbed.builders.wrappers import make_artifact, make_pod, make_profile
from tunefleet.config import Config
from tunefleet.contracts.admission_record import Code
from tunefleet.webhook.admission import admit
from tunefleet.webhook.partition import pod_partition
from tuner_job.library import library_key, partition_name

FAKE_TORCH = Path(__file__).parent / "data" / "fake_torch"
REPO = Path(__file__).resolve().parents[2]
SHA = "cd" * 32


def identify(tmp: Path, **env: str) -> dict[str, Any]:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("PYTORCH_", "FAKE_TORCH_"))}
    full.update(PYTHONPATH=os.pathsep.join([str(FAKE_TORCH), str(REPO)]), **env)
    done = subprocess.run(
        [sys.executable, "-m", "tuner_job", "--termination-log", str(tmp / "tl"), "identify"],
        env=full,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


def amd_sysfs(tmp: Path, compute: str, memory: str) -> Path:
    dev = tmp / "sys" / "module" / "amdgpu" / "drivers" / "pci:amdgpu" / "0000:05:00.0"
    dev.mkdir(parents=True)
    (dev / "current_compute_partition").write_text(compute + "\n")
    (dev / "current_memory_partition").write_text(memory + "\n")
    return tmp / "sys"


def test_a_cpx_partition_and_the_whole_mi300x_are_different_identities(tmp_path: Path) -> None:
    """Defect: the identity could not tell a compute-partitioned MI300X (CPX: 38 CUs a
    partition) from a whole one (304): same arch, validators and product label."""
    whole = identify(tmp_path, FAKE_TORCH_BACKEND="rocm", FAKE_TORCH_CUS="304")
    sysfs = amd_sysfs(tmp_path, "CPX", "NPS1")
    cpx = identify(
        tmp_path, FAKE_TORCH_BACKEND="rocm", FAKE_TORCH_CUS="38", TUNEFLEET_SYSFS=str(sysfs)
    )
    assert whole["identity"]["partition"] == "whole"
    assert whole["identity"]["multiProcessorCount"] == "304"
    assert cpx["identity"]["partition"] == "cpx_nps1"
    assert (cpx["identity"]["computePartition"], cpx["identity"]["memoryPartition"]) == (
        "cpx",
        "nps1",
    )
    assert cpx["validators"] == whole["validators"]
    model = "AMD_Instinct_MI300X_OAM"
    assert library_key(model, cpx["validators"], cpx["identity"]) != library_key(
        model, whole["validators"], whole["identity"]
    )


def test_a_mig_slice_is_its_own_identity(tmp_path: Path) -> None:
    name = "NVIDIA A100-SXM4-40GB MIG 1g.5gb"
    mig = identify(tmp_path, FAKE_TORCH_DEVICE_NAME=name, FAKE_TORCH_CUS="14")
    assert mig["identity"]["partition"] == "mig-1g.5gb"
    assert mig["identity"]["migProfile"] == "1g.5gb"
    assert identify(tmp_path)["identity"]["partition"] == "whole"


@pytest.mark.parametrize(
    ("compute", "memory", "name"),
    [
        ("", "", "whole"),
        ("spx", "nps1", "whole"),
        ("CPX", "NPS4", "cpx_nps4"),
        ("dpx", "", "dpx_nps1"),
    ],
)
def test_partition_names(compute: str, memory: str, name: str) -> None:
    assert partition_name(compute, memory) == name


# What the webhook reads of a profile: its spec and status (one published artifact of "M").
PROFILE = make_profile().gpu("amd", "M").phase("Ready")
ARTIFACT = make_artifact("M", SHA, profile="x", ns="ns")
# A model pod of profile "x" with one container "s" and no GPU request, no selector.
POD_BASE = make_pod().profile("x").annotations({}).selector({})
POD = POD_BASE.container("s", limits={})


WHOLE = {"partition": "whole", "multiProcessorCount": "304"}
CPX = {"partition": "cpx_nps1", "multiProcessorCount": "38"}
MIG = {"partition": "mig-1g.10gb", "multiProcessorCount": "16"}
CPX_LABEL = {"amd.com/gpu.compute-memory-partition": "cpx_nps1"}


@pytest.mark.parametrize(
    ("identity", "the_pod", "code"),
    [
        (WHOLE, POD.obj(), Code.NONE),
        (None, POD.obj(), Code.NONE),  # an artifact from before: a whole-GPU pod still gets it
        (WHOLE, POD.selector(CPX_LABEL).obj(), Code.PARTITION_MISMATCH),  # whole GPU -> partition: never
        (CPX, POD.obj(), Code.PARTITION_MISMATCH),  # partition -> whole GPU: never
        (CPX, POD.selector(CPX_LABEL).obj(), Code.NONE),
        (CPX, POD_BASE.container("s", limits={"amd.com/cpx_nps1": "1"}).obj(), Code.NONE),
        (None, POD.selector(CPX_LABEL).obj(), Code.PARTITION_MISMATCH),  # it cannot vouch for a partition
        (MIG, POD_BASE.container("s", limits={"nvidia.com/mig-1g.10gb": "1"}).obj(), Code.NONE),
        (WHOLE, POD_BASE.container("s", limits={"nvidia.com/mig-1g.10gb": "1"}).obj(), Code.PARTITION_MISMATCH),
        (MIG, POD.selector({"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb"}).obj(), Code.NONE),
        (WHOLE, POD.claim("gpu", "one-gpu").obj(), Code.PARTITION_UNKNOWN),  # DRA: chosen after admission
        (WHOLE, POD.claim("gpu", "one-gpu").annotations({"tunefleet.io/gpu-partition": "whole"}).obj(), Code.NONE),
        (WHOLE, POD.selector({"amd.com/gpu.cu-count": "38"}).obj(), Code.PARTITION_MISMATCH),
    ],
)  # fmt: skip
def test_the_webhook_never_serves_a_whole_gpu_artifact_to_a_partition_or_the_reverse(
    identity: dict[str, str] | None, the_pod: dict[str, Any], code: Code
) -> None:
    art = ARTIFACT if identity is None else ARTIFACT.identity(identity)
    d = admit(the_pod, "x", PROFILE.artifacts(art).obj(), Config(image="tunefleet:1"))
    assert d.code == code, d.reason
    assert d.injected == (code == Code.NONE)


def test_affinity_terms_say_the_partition_too() -> None:
    p = POD.obj()
    p["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "amd.com/gpu.compute-memory-partition",
                                           "operator": "In", "values": ["cpx_nps4"]}]}
                ]
            }
        }
    }  # fmt: skip
    assert pod_partition(p)[0] == "cpx_nps4"
