"""The tuning Job manifest: names, scheduling, the three steps, no inline credentials."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from testbed.builders.wrappers import make_profile
from tunefleet import naming
from tunefleet.api import TuningProfileSpec
from tunefleet.builders.job import (
    Child,
    build_merge_job,
    build_tuning_config_map,
    build_tuning_job,
)
from tunefleet.config import Config

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
MI300X = "AMD_Instinct_MI300X_OAM"
BASE = (
    make_profile("llama")
    .image("registry.example.com/serve:1")
    .gpu("amd", MI300X, "AMD_Instinct_MI325X_OAM")
    .command("python3", "serve.py", env=[{"name": "HF_HOME", "value": "/x"}])
    .storage("s3://bucket/prefix", credentialsSecret={"name": "s3"})
)
# The tuning Job's child of BASE on its MI300X; tests swap in their spec, model or profile.
CHILD = Child(BASE.spec_model(), "ml", "llama", "uid-1", MI300X, Config(image="tf:1"))


def step(pod: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in pod["initContainers"] + pod["containers"] if c["name"] == name)


def test_job_is_scheduled_on_its_model_with_gpus_and_deadline() -> None:
    s = BASE.gpu("amd", MI300X, count=4).spec_model()
    j = build_tuning_job(replace(CHILD, spec=s))
    pod = j["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"amd.com/gpu.product-name": "AMD_Instinct_MI300X_OAM"}
    tune = next(c for c in pod["initContainers"] if c["name"] == "tune")
    assert tune["image"] == "registry.example.com/serve:1"
    assert tune["resources"]["limits"] == {"amd.com/gpu": "4"}
    assert j["spec"]["activeDeadlineSeconds"] == 7200
    assert j["spec"]["backoffLimitPerIndex"] == 1
    assert j["spec"]["completionMode"] == "Indexed" and j["spec"]["completions"] == 1
    assert [c["name"] for c in pod["initContainers"]] == ["bootstrap", "sync", "tune"]
    assert pod["initContainers"][1]["restartPolicy"] == "Always"  # a native sidecar
    assert [c["name"] for c in pod["containers"]] == ["publish"]


def test_nvidia_defaults_and_overrides() -> None:
    s = BASE.gpu(
        "nvidia", "NVIDIA-H200", labelKey="gpu.example/model", resourceName="example.com/gpu"
    ).spec_model()
    pod = build_tuning_job(replace(CHILD, spec=s, model="NVIDIA-H200"))["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"gpu.example/model": "NVIDIA-H200"}
    assert "example.com/gpu" in step(pod, "tune")["resources"]["limits"]
    plain = BASE.gpu("nvidia", "NVIDIA-H200").spec_model()
    pod = build_tuning_job(replace(CHILD, spec=plain, model="NVIDIA-H200"))["spec"]["template"][
        "spec"
    ]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H200"}


def test_owned_labelled_and_deterministic() -> None:
    s = BASE.spec_model()
    a, b = build_tuning_job(replace(CHILD, spec=s)), build_tuning_job(replace(CHILD, spec=s))
    assert a == b
    meta = a["metadata"]
    assert meta["ownerReferences"][0]["uid"] == "uid-1"
    assert meta["ownerReferences"][0]["controller"] is True
    assert meta["labels"][naming.PROFILE_UID_LABEL] == "uid-1"
    assert meta["labels"][naming.REVISION_LABEL] == naming.revision(s)
    other = build_tuning_job(replace(CHILD, spec=s, model="AMD_Instinct_MI325X_OAM"))
    assert other["metadata"]["name"] != meta["name"]


@pytest.mark.parametrize("name", ["a", "x" * 63, "my.dotted.profile-name", "a-" * 31 + "b"])
def test_job_names_are_dns_labels_for_any_profile_name(name: str) -> None:
    n = build_tuning_job(replace(CHILD, profile=name))["metadata"]["name"]
    assert len(n) <= 63 and DNS_LABEL.match(n), n


def test_revision_follows_tuning_inputs_only() -> None:
    base = BASE.spec_model()
    assert naming.revision(base) == naming.revision(BASE.storage("s3://other-bucket").spec_model())
    assert naming.revision(base) == naming.revision(BASE.gpu("amd", MI300X).spec_model())
    assert naming.revision(base) != naming.revision(
        BASE.image("registry.example.com/serve:2").spec_model()
    )
    assert naming.revision(base) != naming.revision(BASE.tuning(maxIterations=5).spec_model())


def test_credentials_by_reference_and_tuning_config() -> None:
    s = BASE.spec(
        workload={
            **BASE.spec_model().workload.model_dump(by_alias=True, exclude_none=True),
            "args": ["--x"],
        }
    ).spec_model()
    j = build_tuning_job(replace(CHILD, spec=s))
    pod = j["spec"]["template"]["spec"]
    publish = pod["containers"][0]
    refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in publish["env"] if "valueFrom" in e}
    assert refs["AWS_ACCESS_KEY_ID"] == {"name": "s3", "key": "AWS_ACCESS_KEY_ID"}
    assert all("value" not in e for e in publish["env"] if e["name"].startswith("AWS_SECRET"))
    tune = step(pod, "tune")
    env = {e["name"]: e.get("value") for e in tune["env"]}
    assert env["HF_HOME"] == "/x"
    # No configuration in the environment (one string may not pass 128 KiB): a ConfigMap file,
    # and the workload command as the tune container's own argv.
    assert not any(e["name"] == "TUNEFLEET_TUNING_CONFIG" for e in tune["env"])
    assert tune["args"] == ["python3", "serve.py", "--x"]
    assert tune["command"][-1] == "--"  # the workload's argv follows, verbatim
    (vol,) = [v for v in pod["volumes"] if v["name"] == "config"]
    cm = build_tuning_config_map(Child(s, "ml", "llama", "uid-1", "AMD_Instinct_MI300X_OAM"))
    assert vol["configMap"]["name"] == cm["metadata"]["name"] == j["metadata"]["name"]
    assert cm["metadata"]["ownerReferences"] == j["metadata"]["ownerReferences"]
    cfg = json.loads(cm["data"]["config.json"])
    assert cfg["gpuModel"] == "AMD_Instinct_MI300X_OAM"
    assert "command" not in cfg["workload"] and "args" not in cfg["workload"]
    assert cfg["tuning"]["budgetSeconds"] == 3600
    assert "--uri" in publish["command"] and "s3://bucket/prefix" in publish["command"]


def test_a_profile_made_again_under_the_same_name_gets_other_jobs() -> None:
    s = BASE.spec_model()
    first = build_tuning_job(replace(CHILD, spec=s))["metadata"]["name"]
    again = build_tuning_job(
        Child(s, "ml", "llama", "uid-2", "AMD_Instinct_MI300X_OAM", Config(image="tf:1"))
    )["metadata"]["name"]
    assert first != again


def test_hardened_containers() -> None:
    pod = build_tuning_job(CHILD)["spec"]["template"]["spec"]
    for c in pod["initContainers"] + pod["containers"]:
        ctx = c["securityContext"]
        assert ctx["allowPrivilegeEscalation"] is False
        assert ctx["capabilities"] == {"drop": ["ALL"]}
    for c in (pod["initContainers"][0], pod["containers"][0]):
        assert c["securityContext"]["runAsNonRoot"] is True
        assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["automountServiceAccountToken"] is False


def test_spec_problems_catch_what_the_schema_cannot() -> None:
    bad = BASE.gpu("amd", "MI300X OAM").spec_model()
    problems = naming.spec_problems(bad)
    assert len(problems) == 1 and "can't be a node label value" in problems[0]
    assert naming.spec_problems(BASE.spec_model()) == []


def test_parallelism_makes_one_share_per_node_and_a_merge_job() -> None:
    s = BASE.gpu("amd", MI300X, parallelism=3).spec_model()
    j = build_tuning_job(replace(CHILD, spec=s))
    assert j["spec"]["completions"] == j["spec"]["parallelism"] == 3
    pod = j["spec"]["template"]["spec"]
    (term,) = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"] == j["spec"]["template"]["metadata"]["labels"]
    publish = step(pod, "publish")["command"]
    assert publish[publish.index("--shards") + 1] == "3"
    sync = step(pod, "sync")["command"]
    assert sync[sync.index("--shards") + 1] == "3" and "--library-scope" in sync
    merge = build_merge_job(
        Child(
            s,
            namespace="ml",
            profile="llama",
            uid="uid-1",
            model="AMD_Instinct_MI300X_OAM",
            config=Config(image="tf:1"),
        )
    )
    assert merge["metadata"]["name"] != j["metadata"]["name"]
    assert merge["metadata"]["labels"][naming.ROLE_LABEL] == "merge"
    (c,) = merge["spec"]["template"]["spec"]["containers"]
    assert c["command"][0] == "tunefleet-merge" and "resources" in c
    assert not any("gpu" in k for k in c["resources"].get("limits", {}))


def test_parallelism_and_checkpoints_do_not_change_the_revision() -> None:
    base = BASE.spec_model()
    more = (
        BASE.spec(gpu={**base.gpu.model_dump(by_alias=True), "parallelism": 4})
        .tuning(checkpoint={"everyGemms": 1})
        .spec_model()
    )
    assert naming.revision(base) == naming.revision(more)


def test_a_v0_1_spec_keeps_its_revision() -> None:
    """Revisions name Jobs and artifacts: an upgrade that changed them would retune every
    profile. The expected value is what tunefleet 0.1 (commit 78f2856) computed."""
    old = TuningProfileSpec.model_validate(
        {
            "image": "registry.example.com/ml/llama-serve:2.4.0-rocm6.4",
            "gpu": {"vendor": "amd", "models": ["AMD_Instinct_MI300X_OAM"], "count": 1},
            "workload": {
                "command": ["python3", "-m", "serve", "--warmup-only"],
                "args": ["--max-batch-size", "32"],
                "env": [
                    {"name": "HF_HOME", "value": "/x"},
                    {
                        "name": "TOKEN",
                        "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}},
                    },
                ],
                "shapes": [
                    {"mnk": [4096, 4096, 4096], "dtype": "bfloat16", "transB": True},
                    {"mnk": [128, 14336, 4096], "batch": 4},
                ],
            },
            "tuning": {
                "maxDurationMs": 30,
                "maxIterations": 100,
                "rotatingBufferMB": 256,
                "budgetSeconds": 3600,
                "activeDeadlineSeconds": 7200,
            },
            "storage": {
                "uri": "s3://tunefleet/artifacts",
                "credentialsSecret": {"name": "s3-credentials"},
            },
        }
    )
    assert naming.revision(old) == "78cdb2e08b"


def test_the_tune_step_needs_no_shell_and_leaves_pythonpath_alone() -> None:
    """Defects: the tune step ran /bin/sh (an image without a shell failed with runc's 'exec:
    "/bin/sh": stat /bin/sh: no such file or directory'), and set PYTHONPATH, which replaced the
    image's own (the workload was recorded without it) and which a user's PYTHONPATH in
    workload.env replaced in turn (the import of tuner_job then failed)."""
    s = BASE.command("serve", env=[{"name": "PYTHONPATH", "value": "/app"}]).spec_model()
    tune = step(build_tuning_job(replace(CHILD, spec=s))["spec"]["template"]["spec"], "tune")
    assert tune["command"][:2] == ["python3", "/tunefleet/tools/tuner_job"]
    assert not any(Path(part).name == "sh" for part in tune["command"])
    names = [e["name"] for e in tune["env"]]
    assert names.count("PYTHONPATH") == 1  # the user's, as given
    assert {e["name"]: e.get("value") for e in tune["env"]}["PYTHONPATH"] == "/app"


DIGEST_IMAGE = "registry.example.com/serve@sha256:" + "a" * 64


def test_the_identity_document_travels_in_the_tuning_config_map_to_publish_and_merge() -> None:
    """What the artifact is tuned for reaches publish (the tuning ConfigMap, mounted) and the
    merge Job (that ConfigMap's one key), which write it into the manifest they sign."""
    spec = BASE.image(DIGEST_IMAGE).gpu("amd", MI300X, parallelism=2).spec_model()
    c = replace(CHILD, spec=spec)
    cm = build_tuning_config_map(c)
    assert json.loads(cm["data"]["fleet-identity.json"]) == naming.identity_document(spec, MI300X)
    publish = step(build_tuning_job(c)["spec"]["template"]["spec"], "publish")
    at = publish["command"].index("--identity-file")
    assert publish["command"][at + 1] == "/tunefleet/config/fleet-identity.json"
    merge_pod = build_merge_job(c)["spec"]["template"]["spec"]
    (merge,) = merge_pod["containers"]
    assert merge["command"][merge["command"].index("--identity-file") + 1] == (
        "/tunefleet/config/fleet-identity.json"
    )
    (config,) = [v for v in merge_pod["volumes"] if v["name"] == "config"]
    assert config["configMap"] == {
        "name": c.name(),
        "optional": True,
        "items": [{"key": "fleet-identity.json", "path": "fleet-identity.json"}],
    }
    assert {"name": "config", "mountPath": "/tunefleet/config", "readOnly": True} in merge[
        "volumeMounts"
    ]


@pytest.mark.parametrize("retune", [False, True], ids=["image-by-tag", "retune"])
def test_no_identity_document_for_an_image_by_tag_or_a_retune(retune: bool) -> None:
    c = CHILD
    if retune:
        c = replace(
            CHILD, spec=BASE.image(DIGEST_IMAGE).spec_model(), revision_override="abcdef0123"
        )
    assert "fleet-identity.json" not in build_tuning_config_map(c)["data"]
    publish = step(build_tuning_job(c)["spec"]["template"]["spec"], "publish")
    assert "--identity-file" not in publish["command"]
    assert (
        "--identity-file"
        not in build_merge_job(c)["spec"]["template"]["spec"]["containers"][0]["command"]
    )
