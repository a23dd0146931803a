"""spec.template: how it meets tunefleet's own pod (builders/template.py), what it may not name
(tunefleet.api.pod_template), what of it shapes the revision (naming), what the profile policy
refuses (policy.py) and how a refusal is reported (reconcile, status)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from testbed.builders.wrappers import make_job, make_profile
from tests.support.fake_kube import RECONCILE_WRITERS, FakeKube
from tunefleet import naming
from tunefleet.api import TuningProfileSpec
from tunefleet.api.conditions import Reason
from tunefleet.api.pod_template import RESERVED_MOUNT, RESERVED_VOLUME_PREFIX, RESERVED_VOLUMES
from tunefleet.api.policy import ProfilePolicy, refusals
from tunefleet.builders.job import Child, build_merge_job, build_tuning_job
from tunefleet.config import Config
from tunefleet.reconciler.memory import Memory
from tunefleet.reconciler.reconcile import Around, sync_profile
from tunefleet.watched.views import profile_view

ROOT = Path(__file__).resolve().parents[2]
MODEL = "NVIDIA-H100-80GB-HBM3"
CFG = Config(image="tunefleet:1")

WEIGHTS = {"name": "weights", "persistentVolumeClaim": {"claimName": "llama-70b", "readOnly": True}}
TEMPLATE: dict[str, Any] = {
    "metadata": {
        "labels": {"team": "inference", "app.kubernetes.io/part-of": "llama"},
        "annotations": {"cluster-autoscaler.kubernetes.io/safe-to-evict": "false"},
    },
    "spec": {
        "volumes": [WEIGHTS, {"name": "hf-cache", "emptyDir": {"sizeLimit": "20Gi"}}],
        "tolerations": [
            {"key": "dedicated", "operator": "Equal", "value": "inference", "effect": "NoSchedule"}
        ],
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {"key": "pool", "operator": "In", "values": ["inference"]}
                            ]
                        }
                    ]
                }
            },
            "podAntiAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 10,
                        "podAffinityTerm": {
                            "topologyKey": "kubernetes.io/hostname",
                            "labelSelector": {"matchLabels": {"app": "vllm"}},
                        },
                    }
                ]
            },
        },
        "nodeSelector": {"topology.kubernetes.io/zone": "z1"},
        "runtimeClassName": "nvidia",
        "serviceAccountName": "weights-reader",
        "priorityClassName": "batch-low",
        "securityContext": {"fsGroup": 1000, "supplementalGroups": [2000]},
    },
    "tune": {
        "volumeMounts": [
            {"name": "weights", "mountPath": "/models", "readOnly": True},
            {"name": "hf-cache", "mountPath": "/root/.cache/huggingface"},
        ],
        "envFrom": [{"secretRef": {"name": "hf-token"}}],
        "resources": {
            "requests": {"cpu": "16", "memory": "200Gi"},
            "limits": {"memory": "240Gi", "ephemeral-storage": "50Gi"},
        },
    },
    "shmSize": "16Gi",
}


BASE = (
    make_profile("llama")
    .image("registry.example.com/vllm:0.9")
    .gpu("nvidia", MODEL, count=8)
    .command("python3", "record.py")
    .storage("s3://bucket/p")
)
TEMPLATED = BASE.template(TEMPLATE)
TPL = ("spec", "template")  # where a field of the template is set: .set(*TPL, "shmSize", ...)
# The tuning Job's child of BASE; tests swap in their spec.
CHILD = Child(BASE.spec_model(), "ml", "llama", "uid-1", MODEL, CFG)
# A tuning Job started, with no pod yet, as the informer sees it.
STARTED = (
    make_job()
    .uid("ju")
    .revision("r")
    .gpu_model(MODEL)
    .status(startTime="2026-12-01T10:00:00Z", active=0, conditions=[])
)


def pod_of(job: dict[str, Any]) -> dict[str, Any]:
    pod: dict[str, Any] = job["spec"]["template"]["spec"]
    return pod


def container(pod: dict[str, Any], name: str) -> dict[str, Any]:
    found: dict[str, Any] = next(
        c for c in pod.get("initContainers", []) + pod["containers"] if c["name"] == name
    )
    return found


def unrevised(obj: Any, s: TuningProfileSpec) -> Any:
    """obj with its spec's revision (in names and arguments) blanked, to compare with another
    revision's."""
    return json.loads(json.dumps(obj).replace(naming.revision(s), "REV"))


# --- the builder -------------------------------------------------------------------------------


def test_no_template_no_change() -> None:
    plain = build_tuning_job(CHILD)
    assert build_tuning_job(replace(CHILD, spec=BASE.template({}).spec_model())) == plain
    assert "runtimeClassName" not in pod_of(plain) and "envFrom" not in container(
        pod_of(plain), "tune"
    )


def test_the_tuning_pod_gets_the_template_and_keeps_what_is_tunefleets() -> None:
    plain = unrevised(pod_of(build_tuning_job(CHILD)), BASE.spec_model())
    s = TEMPLATED.spec_model()
    job = unrevised(build_tuning_job(replace(CHILD, spec=s)), s)
    pod = pod_of(job)
    meta = job["spec"]["template"]["metadata"]
    # Labels beside tunefleet's (which win), annotations as given; the Job's own unchanged.
    assert meta["labels"] == {**TEMPLATE["metadata"]["labels"], **job["metadata"]["labels"]}
    assert meta["annotations"] == TEMPLATE["metadata"]["annotations"]
    assert "team" not in job["metadata"]["labels"]
    # Volumes added; tunefleet's first, untouched; /dev/shm memory-backed.
    names = [v["name"] for v in pod["volumes"]]
    assert names == [*(v["name"] for v in plain["volumes"]), "weights", "hf-cache", "tunefleet-shm"]
    assert pod["volumes"][-1] == {
        "name": "tunefleet-shm",
        "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"},
    }
    # Placement adds to the GPU's: its toleration and model selector stay.
    assert pod["tolerations"] == [*plain["tolerations"], *TEMPLATE["spec"]["tolerations"]]
    assert pod["nodeSelector"] == {
        "nvidia.com/gpu.product": MODEL,
        "topology.kubernetes.io/zone": "z1",
    }
    assert pod["affinity"] == TEMPLATE["spec"]["affinity"]
    assert pod["runtimeClassName"] == "nvidia"
    assert pod["serviceAccountName"] == "weights-reader"
    assert pod["priorityClassName"] == "batch-low"
    assert pod["automountServiceAccountToken"] is False  # the ServiceAccount's token stays out
    assert pod["securityContext"] == {
        "seccompProfile": {"type": "RuntimeDefault"},
        "fsGroup": 1000,
        "supplementalGroups": [2000],
    }
    tune = container(pod, "tune")
    assert tune["envFrom"] == [{"secretRef": {"name": "hf-token"}}]
    assert tune["resources"] == {
        "requests": {"cpu": "16", "memory": "200Gi", "nvidia.com/gpu": "8"},
        "limits": {"memory": "240Gi", "ephemeral-storage": "50Gi", "nvidia.com/gpu": "8"},
    }
    mounts = {m["mountPath"]: m["name"] for m in tune["volumeMounts"]}
    assert mounts["/models"] == "weights" and mounts["/dev/shm"] == "tunefleet-shm"
    assert all(
        p.startswith(RESERVED_MOUNT + "/") for p, n in mounts.items() if n in RESERVED_VOLUMES
    )
    # tunefleet's own containers keep exactly what they had.
    for name in ("bootstrap", "sync", "publish"):
        assert container(pod, name) == container(plain, name), name


def test_shares_keep_one_per_node_beside_the_users_anti_affinity() -> None:
    s = TEMPLATED.gpu("nvidia", MODEL, parallelism=4).spec_model()
    anti = pod_of(build_tuning_job(replace(CHILD, spec=s)))["affinity"]["podAntiAffinity"]
    (ours,) = anti["requiredDuringSchedulingIgnoredDuringExecution"]
    assert ours["topologyKey"] == "kubernetes.io/hostname"
    assert (
        anti["preferredDuringSchedulingIgnoredDuringExecution"]
        == (
            TEMPLATE["spec"]["affinity"]["podAntiAffinity"][
                "preferredDuringSchedulingIgnoredDuringExecution"
            ]
        )
    )
    # The user's own required anti-affinity terms come after tunefleet's.
    mine = {"topologyKey": "zone", "labelSelector": {"matchLabels": {"a": "b"}}}
    s = (
        TEMPLATED.set(
            *TPL,
            "spec",
            "affinity",
            value={"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [mine]}},
        )
        .gpu("nvidia", MODEL, parallelism=2)
        .spec_model()
    )
    terms = pod_of(build_tuning_job(replace(CHILD, spec=s)))["affinity"]["podAntiAffinity"]
    assert terms["requiredDuringSchedulingIgnoredDuringExecution"][1:] == [mine]


def test_the_merge_job_takes_labels_identity_and_priority_only() -> None:
    s = TEMPLATED.gpu("nvidia", MODEL, parallelism=2).spec_model()
    bare = BASE.gpu("nvidia", MODEL, parallelism=2).spec_model()
    plain = unrevised(build_merge_job(replace(CHILD, spec=bare)), bare)
    job = unrevised(build_merge_job(replace(CHILD, spec=s)), s)
    pod = pod_of(job)
    assert pod["serviceAccountName"] == "weights-reader"
    assert pod["priorityClassName"] == "batch-low"
    assert job["spec"]["template"]["metadata"]["labels"]["team"] == "inference"
    for key in (
        "volumes",
        "tolerations",
        "nodeSelector",
        "affinity",
        "securityContext",
        "containers",
    ):
        assert pod.get(key) == pod_of(plain).get(key), key
    assert "runtimeClassName" not in pod


def test_a_pvc_store_and_the_users_fs_group() -> None:
    """A pvc:// store asks for fsGroup 65532; the user's replaces it (the store's volume is
    then group-owned by it, and tunefleet's steps have it as a supplementary group)."""
    s = (
        TEMPLATED.set(*TPL, "spec", "securityContext", value={"fsGroup": 1000})
        .storage("pvc://store")
        .spec_model()
    )
    pod = pod_of(build_tuning_job(replace(CHILD, spec=s)))
    assert pod["securityContext"]["fsGroup"] == 1000
    pvc = BASE.storage("pvc://store").spec_model()
    assert pod_of(build_tuning_job(replace(CHILD, spec=pvc)))["securityContext"]["fsGroup"] == 65532


def test_every_volume_and_mount_of_tunefleets_is_reserved() -> None:
    """The reserved names cover what the builder makes, whatever the store or sharding."""
    for profile in (
        TEMPLATED,
        TEMPLATED.storage("pvc://store"),
        TEMPLATED.gpu("nvidia", MODEL, parallelism=2),
    ):
        s = profile.spec_model()
        pod = pod_of(build_tuning_job(replace(CHILD, spec=s)))
        users = {v["name"] for v in TEMPLATE["spec"]["volumes"]}
        for v in pod["volumes"]:
            if v["name"] not in users:
                assert v["name"] in RESERVED_VOLUMES or v["name"].startswith(RESERVED_VOLUME_PREFIX)
        for c in pod["initContainers"] + pod["containers"]:
            for m in c["volumeMounts"]:
                if m["name"] not in users and m["mountPath"] not in ("/tmp", "/dev/shm"):
                    assert m["mountPath"].startswith(RESERVED_MOUNT + "/"), (c["name"], m)


# --- what the models refuse --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (
            "spec.volumes",
            [{"name": "tools", "emptyDir": {}}],
            "one of tunefleet's own volume names",
        ),
        (
            "spec.volumes",
            [{"name": "tunefleet-x", "emptyDir": {}}],
            "one of tunefleet's own volume names",
        ),
        ("spec.volumes", [{"name": "w"}], "exactly one of"),
        (
            "spec.volumes",
            [{"name": "w", "emptyDir": {}, "secret": {"secretName": "s"}}],
            "exactly one of",
        ),
        (
            "spec.volumes",
            [{"name": "w", "emptyDir": {}}, {"name": "w", "emptyDir": {}}],
            "more than once",
        ),
        ("spec.volumes", [{"name": "w", "gitRepo": {"repository": "x"}}], "gitRepo"),
        (
            "tune.volumeMounts",
            [{"name": "weights", "mountPath": "/tunefleet/tools"}],
            "under /tunefleet/",
        ),
        (
            "tune.volumeMounts",
            [{"name": "weights", "mountPath": "/tunefleet"}],
            "under /tunefleet/",
        ),
        (
            "tune.volumeMounts",
            [{"name": "weights", "mountPath": "//tunefleet/out"}],
            "under /tunefleet/",
        ),
        (
            "tune.volumeMounts",
            [{"name": "weights", "mountPath": "/x/../tunefleet/config"}],
            "under /tunefleet/",
        ),
        ("tune.volumeMounts", [{"name": "tools", "mountPath": "/t"}], "does not have"),
        (
            "tune.volumeMounts",
            [{"name": "weights", "mountPath": "/dev/shm"}],
            "drop the tune.volumeMounts entry",
        ),
        (
            "tune.volumeMounts",
            [{"name": "weights", "mountPath": "/a"}, {"name": "hf-cache", "mountPath": "/a"}],
            "twice",
        ),
        ("metadata.labels", {"tunefleet.io/profile": "x"}, "reserved"),
        ("metadata.labels", {"x.tunefleet.io/a": "x"}, "reserved"),
        ("metadata.labels", {"app.kubernetes.io/managed-by": "me"}, "reserved"),
        ("metadata.labels", {"batch.kubernetes.io/job-name": "j"}, "reserved"),
        ("metadata.annotations", {"tunefleet.io/status": "x"}, "reserved"),
        ("metadata.labels", {"k" * 317: "x"}, "over 316"),
        ("tune.resources", {"limits": {"nvidia.com/gpu": 1}}, "the GPU resource"),
        ("tune.resources", {"requests": {"nvidia.com/gpu": "2"}}, "the GPU resource"),
        ("tune.resources", {"requests": {"cpu": "lots"}}, "String should match pattern"),
        ("spec.nodeSelector", {"nvidia.com/gpu.product": "other"}, "the GPU-model label"),
        ("spec.runtimeClassName", "Not_A_Name", "String should match pattern"),
        ("spec.securityContext", {"runAsUser": 0}, "Extra inputs are not permitted"),
        ("spec.hostNetwork", True, "Extra inputs are not permitted"),
    ],
)
def test_what_the_models_refuse(path: str, value: Any, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        TEMPLATED.set(*TPL, *path.split("."), value=value).spec_model()


def test_a_custom_gpu_resource_and_label_are_the_ones_kept() -> None:
    custom = TEMPLATED.gpu("nvidia", MODEL, resourceName="example.com/gpu", labelKey="gpu")
    custom.set(*TPL, "tune", "resources", value={"limits": {"nvidia.com/gpu": 1}}).spec_model()
    with pytest.raises(ValidationError, match=re.escape("example.com/gpu")):
        custom.set(*TPL, "tune", "resources", value={"limits": {"example.com/gpu": 1}}).spec_model()
    with pytest.raises(ValidationError, match="GPU-model label"):
        custom.set(*TPL, "spec", "nodeSelector", value={"gpu": "x"}).spec_model()


# --- the revision ------------------------------------------------------------------------------

SHAPING = {
    "spec.volumes": [
        {"name": "weights", "persistentVolumeClaim": {"claimName": "llama-8b"}},
        {"name": "hf-cache", "emptyDir": {}},
    ],
    "tune.volumeMounts": [{"name": "weights", "mountPath": "/weights"}],
    "tune.envFrom": [{"configMapRef": {"name": "vllm-args"}}],
    "tune.resources": {"limits": {"memory": "480Gi"}},
    "shmSize": "32Gi",
    "spec.runtimeClassName": "nvidia-cdi",
    "spec.serviceAccountName": "other",
    "spec.securityContext": {"fsGroup": 2000},
}
NOT_SHAPING = {
    "metadata": {"labels": {"cost-center": "42"}},
    "spec.tolerations": [{"key": "spot", "operator": "Exists"}],
    "spec.affinity": {"podAffinity": {}},
    "spec.nodeSelector": {"zone": "z2"},
    "spec.priorityClassName": "high",
}


def test_the_table_covers_every_template_field() -> None:
    from tunefleet.api.pod_template import PodTemplate, TemplatePodSpec, TuneContainer

    fields = {f"spec.{f.alias}" for f in TemplatePodSpec.model_fields.values()}
    fields |= {f"tune.{f.alias}" for f in TuneContainer.model_fields.values()}
    fields |= {"metadata", "shmSize"}
    assert {f.alias for f in PodTemplate.model_fields.values()} == {
        "metadata",
        "spec",
        "tune",
        "shmSize",
    }
    assert fields == set(SHAPING) | set(NOT_SHAPING)
    assert set(NOT_SHAPING) == set(naming.TEMPLATE_NOT_SHAPING)


@pytest.mark.parametrize("path", sorted(SHAPING))
def test_what_the_record_run_sees_makes_a_new_revision(path: str) -> None:
    shaped = TEMPLATED.set(*TPL, *path.split("."), value=SHAPING[path])
    if path == "tune.volumeMounts":
        shaped = shaped.set(
            *TPL,
            "spec",
            "volumes",
            value=[*TEMPLATE["spec"]["volumes"], {"name": "weights2", "emptyDir": {}}],
        ).set(*TPL, "tune", "volumeMounts", value=[{"name": "weights2", "mountPath": "/weights"}])
    assert naming.revision(shaped.spec_model()) != naming.revision(TEMPLATED.spec_model())


@pytest.mark.parametrize("path", sorted(NOT_SHAPING))
def test_where_and_how_it_is_labelled_does_not(path: str) -> None:
    where = (*TPL, *path.split("."))
    assert naming.revision(
        TEMPLATED.set(*where, value=NOT_SHAPING[path]).spec_model()
    ) == naming.revision(TEMPLATED.spec_model())
    assert naming.revision(TEMPLATED.without(*where).spec_model()) == naming.revision(
        TEMPLATED.spec_model()
    )


def test_a_profile_without_a_shaping_template_keeps_its_revision() -> None:
    before = naming.revision(BASE.spec_model())
    assert naming.revision(BASE.template({}).spec_model()) == before
    placement = {k: v for k, v in TEMPLATE.items() if k == "metadata"}
    placement["spec"] = {
        k: TEMPLATE["spec"][k]
        for k in ("tolerations", "affinity", "nodeSelector", "priorityClassName")
    }
    assert naming.revision(BASE.template(placement).spec_model()) == before
    empty = BASE.template({"spec": {"volumes": []}, "tune": {}})
    assert naming.revision(empty.spec_model()) == before
    assert naming.revision(TEMPLATED.spec_model()) != before


# --- the policy --------------------------------------------------------------------------------


def test_the_default_policy_refuses_host_paths_and_nfs_and_says_which_value_allows_them() -> None:
    t = TEMPLATED.set(
        *TPL,
        "spec",
        "volumes",
        value=[
            WEIGHTS,
            {"name": "nvme", "hostPath": {"path": "/mnt/nvme"}},
            {"name": "share", "nfs": {"server": "nfs", "path": "/models"}},
        ],
    ).set(*TPL, "tune", "volumeMounts", value=[{"name": "nvme", "mountPath": "/cache"}])
    out = refusals(t.spec_model(), ProfilePolicy())
    assert len(out) == 2
    assert "spec.template.spec.volumes[nvme]: hostPath volumes are not allowed" in out[0]
    assert "profilePolicy.allowedVolumeTypes" in out[0] and "persistentVolumeClaim" in out[0]
    assert "volumes[share]: nfs" in out[1]
    allowing = ProfilePolicy(allowed_volume_types=("hostPath", "nfs", "persistentVolumeClaim"))
    assert refusals(t.spec_model(), allowing) == []
    assert refusals(BASE.spec_model(), ProfilePolicy(allowed_volume_types=())) == []  # no template


def test_named_classes_and_service_accounts() -> None:
    strict = ProfilePolicy(
        allowed_runtime_classes=("nvidia",),
        allowed_priority_classes=(),
        allowed_service_accounts=("weights-reader", "other"),
    )
    out = refusals(TEMPLATED.spec_model(), strict)
    assert out == [
        "spec.template.spec.priorityClassName 'batch-low' is not allowed by the operator's "
        "profile policy (chart value profilePolicy.allowedPriorityClasses: none): add it there, "
        "or drop the field"
    ]
    assert refusals(TEMPLATED.spec_model(), ProfilePolicy()) == []


def test_the_policy_from_the_chart() -> None:
    values = yaml.safe_load((ROOT / "charts" / "tunefleet" / "values.yaml").read_text())
    chart = ProfilePolicy.from_json(json.dumps(values["profilePolicy"]))
    assert chart == ProfilePolicy(), "the chart's default profilePolicy and policy.py's differ"
    assert ProfilePolicy.from_json("") == ProfilePolicy()
    p = ProfilePolicy.from_json(
        '{"allowedVolumeTypes": ["hostPath"], "allowedServiceAccounts": null}'
    )
    assert p.allowed_volume_types == ("hostPath",) and p.allowed_service_accounts == ("*",)
    for raw, message in (
        ("{", "not JSON"),
        ("[]", "JSON object"),
        ('{"allowedVolumes": []}', "unknown field"),
        ('{"allowedVolumeTypes": "hostPath"}', "list of strings"),
        ('{"allowedVolumeTypes": ["gitRepo"]}', "gitRepo not among"),
    ):
        with pytest.raises(ValueError, match=message):
            ProfilePolicy.from_json(raw)


def test_config_reads_the_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TUNEFLEET_PROFILE_POLICY", '{"allowedRuntimeClasses": ["nvidia"]}')
    assert Config.from_env().profile_policy.allowed_runtime_classes == ("nvidia",)


def test_a_refused_template_makes_no_job_and_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    t = TEMPLATED.set(
        *TPL, "spec", "volumes", value=[{"name": "nvme", "hostPath": {"path": "/mnt/nvme"}}]
    ).set(*TPL, "tune", "volumeMounts", value=[{"name": "nvme", "mountPath": "/cache"}])
    raw = json.loads(t.spec_model().model_dump_json(by_alias=True, exclude_none=True))
    p = profile_view(make_profile().uid("uid-1").generation(3).spec_is(raw).obj())
    api = FakeKube(writers=RECONCILE_WRITERS)
    outcome = sync_profile(p, [], [], CFG, Memory(), Around(api))
    assert outcome.terminal and "hostPath" in str(outcome.error)
    assert api.created == []
    (status,) = api.patches
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", Reason.TEMPLATE_REFUSED)
    assert "profilePolicy.allowedVolumeTypes" in ready["message"]
    assert "spec.template.spec.volumes[nvme]" in ready["message"]
    assert ready["observedGeneration"] == 3 and status["phase"] == "Invalid"
    assert (Reason.TEMPLATE_REFUSED, ready["message"]) in api.events
    # The same profile under a policy that allows it gets its Job.
    allowing = Config(
        image="tunefleet:1", profile_policy=ProfilePolicy(allowed_volume_types=("hostPath",))
    )
    api = FakeKube(writers=RECONCILE_WRITERS)
    sync_profile(p, [], [], allowing, Memory(), Around(api))
    assert [k for k, _ in api.created] == ["ConfigMap", "Job"]


def test_every_example_profile_is_valid_and_allowed() -> None:
    docs = [
        d
        for f in sorted((ROOT / "examples").glob("*.yaml"))
        for d in yaml.safe_load_all(f.read_text())
        if d and d.get("kind") == "TuningProfile"
    ]
    assert any("template" in d["spec"] for d in docs)
    for doc in docs:
        s = TuningProfileSpec.model_validate(doc["spec"])
        assert naming.spec_problems(s) == []
        assert refusals(s, ProfilePolicy()) == [], doc["metadata"]["name"]


# --- what status says of a tuning pod the template keeps from running --------------------------


def test_a_taint_the_pod_does_not_tolerate_names_the_templates_tolerations() -> None:
    from tunefleet.reconciler.diagnose import Hints, explain_unschedulable
    from tunefleet.reconciler.gather import hints_for

    assert hints_for(TEMPLATED.spec_model(), CFG).tolerations == ("dedicated",)
    msg = "0/3 nodes are available: 3 node(s) had untolerated taint {spot: true}. preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling."
    hints = Hints(
        label_key="nvidia.com/gpu.product", resource="nvidia.com/gpu", tolerations=("dedicated",)
    )
    out = explain_unschedulable(msg, MODEL, hints)
    assert "it tolerates nvidia.com/gpu, dedicated" in out
    assert "add the taint to spec.template.spec.tolerations" in out


def gathered_and_observed(
    jobs: list[dict[str, Any]], job_events: Callable[[dict[str, Any]], list[dict[str, Any]]]
) -> list[Any]:
    """observe as the reconcile does: what it wants beyond the cache is read (job_events, the
    gather step), then it observes again with that; nothing is read when nothing is wanted."""
    from tunefleet.reconciler.diagnose import Hints
    from tunefleet.reconciler.observe import Gathered, observe, observe_wanting

    observations, wants = observe_wanting(jobs, [], Hints())
    if not wants:
        return observations
    assert {what for what, _ in wants} == {"job-events"}
    read = {o["metadata"]["uid"]: job_events(o) for _, o in wants}
    return observe(jobs, [], Hints(), None, Gathered(events=read))


def test_a_pod_the_api_server_refuses_is_named_with_the_field_to_fix() -> None:
    events = [
        {
            "reason": "FailedCreate",
            "lastTimestamp": "2026-12-01T10:00:05Z",
            "message": 'Error creating: pods "tune-x-0-abc" is forbidden: error looking up service '
            'account ml/weights-reader: serviceaccount "weights-reader" not found',
        },
        {"reason": "SuccessfulCreate", "lastTimestamp": "2026-12-01T09:00:00Z", "message": "x"},
    ]
    asked: list[str] = []

    def job_events(job: dict[str, Any]) -> list[dict[str, Any]]:
        asked.append(job["metadata"]["name"])
        return events

    (obs,) = gathered_and_observed([STARTED.obj()], job_events)
    assert (obs.state, obs.reason) == ("Pending", Reason.POD_CREATE_FAILED)
    assert 'serviceaccount "weights-reader" not found' in obs.message
    assert "fix spec.template.spec.serviceAccountName" in obs.message
    # A Job not started yet, or one with a pod, is not asked about.
    fresh = STARTED.without("status", "startTime").obj()
    (obs,) = gathered_and_observed([fresh], job_events)
    assert not obs.reason and asked == ["tune-x"]
    # Nor one the Job controller counts an active pod for (the pod watch trails the Job's).
    counted = STARTED.active(1).obj()
    (obs,) = gathered_and_observed([counted], job_events)
    assert not obs.reason and asked == ["tune-x"]
    runtime = [
        {
            **events[0],
            "message": 'pods "x" is forbidden: pod rejected: RuntimeClass "gpu" not found',
        }
    ]
    (obs,) = gathered_and_observed([STARTED.obj()], lambda job: runtime)
    assert "fix spec.template.spec.runtimeClassName" in obs.message


def test_reconcile_reads_a_podless_jobs_events_once_a_minute(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    s = TEMPLATED.set(*TPL, "spec", "serviceAccountName", value="missing").spec_model()
    raw = json.loads(s.model_dump_json(by_alias=True, exclude_none=True))
    p = profile_view(make_profile("llama").uid("uid-1").generation(1).spec_is(raw).obj())
    from tunefleet.watched.views import job_view

    job = build_tuning_job(replace(CHILD, spec=s))
    job["metadata"]["uid"] = "ju"
    job["status"] = {"startTime": "2026-12-01T10:00:00Z"}
    api = FakeKube(writers=RECONCILE_WRITERS, existing={job["metadata"]["name"]})
    api.events_of_jobs = [
        {"reason": "FailedCreate", "message": 'serviceaccount "missing" not found'}
    ]
    memory = Memory()
    status = sync_profile(p, [job_view(job)], [], CFG, memory, Around(api)).status.to_status()
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert "serviceaccount" in ready["message"] and "serviceAccountName" in ready["message"]
    progressing = next(c for c in status["conditions"] if c["type"] == "Progressing")
    assert progressing["reason"] == Reason.POD_CREATE_FAILED
    sync_profile(p, [job_view(job)], [], CFG, memory, Around(api))
    reads = [what for kind, verb, what in api.calls if (kind, verb) == ("events", "list")]
    assert reads == [("Job", "ml", job["metadata"]["name"])]  # the second came from memory
