"""Trust the API server, not labels (local control plane, kwok fleet, the operator here):
forged Jobs and pods with a victim profile's labels, in another namespace and in its own
without an owner reference, never become its children and their records never reach status or
a model pod; deleting a Ready profile's completed tuning pods keeps it Ready; a new revision
stops the old one's Jobs; a failed attempt of a retrying Job shows; an Invalid profile shows
no stale figure.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from testbed.builders.fleet import profile_doc
from testbed.builders.wrappers import make_job, make_pod
from testbed.cluster import create_namespace, delete_namespace, namespace_name
from testbed.operator import Operator, carry_out_publish, set_pod_outcome
from testbed.poll import eventually
from tests.support.fleet import publish_first_revision
from tests.support.kube import apply, condition, get_json, jobs_of, tuning_pods
from tunefleet import naming
from tunefleet.api import TuningProfileSpec
from tunefleet.contracts.admission_record import ARTIFACT_URI_ANNOTATION

pytestmark = pytest.mark.e2e

MODEL = "NVIDIA-H200"
EVIL = "s3://tunefleet/evil/ml/victim/NVIDIA-H200/" + "e" * 64
# A Job that runs once (named, placed and labelled per forgery: .labels(forged_labels(...)))
# and the template of its pods (labelled the same; its spec: forged_pod_spec()).
FORGED_JOB = make_job().without("status").set("spec", "backoffLimit", value=0)
FORGED_TEMPLATE = make_pod().without("apiVersion").without("kind").without("metadata")


def events(cluster: Any, namespace: str, reason: str) -> list[dict[str, Any]]:
    items = get_json(cluster, "events", "-n", namespace)["items"]
    return [e for e in items if e.get("reason") == reason]


@pytest.fixture
def other_namespace(cluster: Any) -> Iterator[str]:
    name = namespace_name("attacker")
    api = cluster.api_client()
    try:
        create_namespace(api, name)
        yield name
        delete_namespace(api, name)
    finally:
        api.close()


def forged_labels(uid: str, rev: str) -> dict[str, str]:
    return {
        naming.MANAGED_KEY: naming.MANAGED_VALUE,
        naming.TUNING_PROFILE_LABEL: "victim",
        naming.PROFILE_UID_LABEL: uid,
        naming.MODEL_LABEL: MODEL,
        naming.REVISION_LABEL: rev,
        naming.ROLE_LABEL: "tune",
    }


def forged_pod_spec() -> dict[str, Any]:
    return {
        "restartPolicy": "Never",
        "nodeSelector": {"nvidia.com/gpu.product": MODEL},
        "containers": [
            {
                "name": "publish",
                "image": "evil.example.com/backdoor:1",
                "resources": {"limits": {"nvidia.com/gpu": "1"}},
            }
        ],
    }


def evil_record() -> str:
    return json.dumps(
        {
            "uri": EVIL,
            "sha256": "e" * 64,
            "gemms": 1,
            "identity": {},
            "image": {"reference": "evil.example.com/backdoor:1", "id": ""},
        }
    )


def test_forged_jobs_and_pods_never_become_a_profiles_children(
    cluster: Any, operator: Operator, s3: Any, namespace: str, other_namespace: str
) -> None:
    operator.stop()  # the forgeries are in place before the operator sees the profile
    doc = profile_doc("victim")
    apply(cluster, namespace, doc)
    victim = get_json(cluster, "tp", "-n", namespace, "victim")
    uid = victim["metadata"]["uid"]
    rev = naming.revision(TuningProfileSpec.model_validate(doc["spec"]))
    real_name = naming.job_name("victim", MODEL, rev, uid)
    labels = forged_labels(uid, rev)
    template = FORGED_TEMPLATE.labels(labels).set("spec", value=forged_pod_spec())
    job = FORGED_JOB.labels(labels).set("spec", "template", value=template.obj())
    forged = [
        job.name("forged-elsewhere").namespace(other_namespace).obj(),
        job.name("forged-here").namespace(namespace).obj(),
    ]
    bare = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "forged-pod", "labels": forged_labels(uid, rev)},
        "spec": forged_pod_spec(),
    }
    # A ConfigMap of someone else's under the name the forged Job chose: never to be patched.
    foreign_cm = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "forged-here", "namespace": namespace},
        "data": {"k": "v"},
    }
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all([*forged, foreign_cm]))
    cluster.kubectl("create", "-n", namespace, "-f", "-", input=yaml.safe_dump(bare))
    forged_pods = eventually(
        lambda: [
            p
            for ns in (namespace, other_namespace)
            for p in get_json(cluster, "pods", "-n", ns, "-l", f"{naming.PROFILE_UID_LABEL}={uid}")[
                "items"
            ]
            if p["metadata"]["name"].startswith("forged")
        ],
        lambda ps: len(ps) == 3 and all(p["spec"].get("nodeName") for p in ps),
        "the forged pods scheduled",
    )
    for pod in forged_pods:
        set_pod_outcome(
            cluster.kubectl, pod, succeeded=True, container_name="publish", message=evil_record()
        )
    cm_before = get_json(cluster, "configmap", "-n", namespace, "forged-here")["metadata"][
        "resourceVersion"
    ]
    operator.start()

    # The real Job is made, controlled by the profile, whatever claims to be present.
    (real,) = eventually(
        lambda: [
            j for j in jobs_of(cluster, namespace, "victim") if j["metadata"]["name"] == real_name
        ],
        lambda js: len(js) == 1,
        "the profile's own tuning Job",
    )
    assert real["metadata"]["ownerReferences"][0]["uid"] == uid
    reported = eventually(
        lambda: events(cluster, namespace, "UntrustedObject"),
        lambda es: len({e["message"].split()[1] for e in es}) >= 2,
        "the forgeries reported on the victim",
    )
    assert all("is ignored" in e["message"] for e in reported)
    time.sleep(3)  # a forged record would have reached status by now
    status = get_json(cluster, "tp", "-n", namespace, "victim").get("status") or {}
    assert not any(a.get("uri") == EVIL for a in status.get("artifacts") or []), status

    (pod,) = eventually(
        lambda: [
            p
            for p in tuning_pods(cluster, namespace, "victim")
            if p["metadata"]["name"].startswith(real_name)
        ],
        lambda ps: len(ps) == 1 and ps[0]["spec"].get("nodeName"),
        "the real tuning pod",
    )
    published = carry_out_publish(cluster.kubectl, pod, s3.env())
    ready = eventually(
        lambda: get_json(cluster, "tp", "-n", namespace, "victim"),
        lambda p: (p.get("status") or {}).get("phase") == "Ready",
        "victim Ready with its own artifact",
    )
    assert [a["uri"] for a in ready["status"]["artifacts"]] == [published["uri"]]
    model_pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "model", "labels": {naming.PROFILE_LABEL: "victim"}},
        "spec": {"containers": [{"name": "server", "image": "registry.example.com/serve:1"}]},
    }
    cluster.kubectl("create", "-n", namespace, "-f", "-", input=yaml.safe_dump(model_pod))
    anns = get_json(cluster, "pod", "-n", namespace, "model")["metadata"]["annotations"]
    assert anns[ARTIFACT_URI_ANNOTATION] == published["uri"]
    cm_after = get_json(cluster, "configmap", "-n", namespace, "forged-here")
    assert cm_after["metadata"]["resourceVersion"] == cm_before and cm_after["data"] == {"k": "v"}


def test_deleting_a_ready_profiles_completed_tuning_pods_keeps_it_ready(
    cluster: Any, operator: Operator, s3: Any, namespace: str
) -> None:
    _, published, _ = publish_first_revision(cluster, s3, namespace, "kept")
    (job,) = jobs_of(cluster, namespace, "kept")
    kept = eventually(
        lambda: (
            get_json(cluster, "job", "-n", namespace, job["metadata"]["name"])["metadata"].get(
                "annotations"
            )
            or {}
        ),
        lambda a: naming.RECORD_ANNOTATION in a,
        "the record kept on the Job",
    )
    assert json.loads(kept[naming.RECORD_ANNOTATION])["sha256"] == published["sha256"]
    cluster.kubectl(
        "delete", "pod", "-n", namespace, "-l", f"job-name={job['metadata']['name']}", "--wait=true"
    )
    time.sleep(4)  # the old reconcile turned this Failed within 3 s
    prof = get_json(cluster, "tp", "-n", namespace, "kept")
    assert prof["status"]["phase"] == "Ready", prof["status"]
    assert condition(prof, "Failed")["status"] == "False"
    assert events(cluster, namespace, "TuningFailed") == []


def test_a_new_revision_stops_the_old_ones_jobs(
    cluster: Any, operator: Operator, namespace: str
) -> None:
    apply(cluster, namespace, profile_doc("moving"))
    (old,) = eventually(
        lambda: jobs_of(cluster, namespace, "moving"), lambda js: len(js) == 1, "revision 1's Job"
    )
    apply(cluster, namespace, profile_doc("moving", image="registry.example.com/serve:2"))
    (new,) = eventually(
        lambda: jobs_of(cluster, namespace, "moving"),
        lambda js: len(js) == 1 and js[0]["metadata"]["uid"] != old["metadata"]["uid"],
        "only revision 2's Job",
        timeout=60,
    )
    assert (
        new["metadata"]["labels"][naming.REVISION_LABEL]
        != old["metadata"]["labels"][naming.REVISION_LABEL]
    )
    eventually(
        lambda: get_json(cluster, "configmaps", "-n", namespace)["items"],
        lambda cms: old["metadata"]["name"] not in {c["metadata"]["name"] for c in cms},
        "revision 1's ConfigMap gone",
    )
    assert events(cluster, namespace, "TuningJobSuperseded")


def test_a_failed_attempt_of_a_retrying_job_shows_in_status(
    cluster: Any, operator: Operator, namespace: str
) -> None:
    apply(cluster, namespace, profile_doc("flaky", tuning={"backoffLimit": 2}))
    (pod,) = eventually(
        lambda: tuning_pods(cluster, namespace, "flaky"),
        lambda ps: len(ps) == 1 and ps[0]["spec"].get("nodeName"),
        "the first attempt",
    )
    cause = "tunefleet-publish: error: uploading s3://tunefleet/x failed: InternalError (HTTP 500)"
    set_pod_outcome(cluster.kubectl, pod, succeeded=False, container_name="publish", message=cause)
    prof = eventually(
        lambda: get_json(cluster, "tp", "-n", namespace, "flaky"),
        lambda p: condition(p, "Progressing").get("reason") == "AttemptFailed",
        "the failed attempt in status",
    )
    message = condition(prof, "Progressing")["message"]
    assert "attempt 1 of 3 failed" in message and "InternalError (HTTP 500)" in message
    assert prof["status"]["jobs"][0]["failedAttempts"] == 1
    assert len(events(cluster, namespace, "AttemptFailed")) == 1


def test_an_invalid_profile_shows_no_stale_figures(
    cluster: Any, operator: Operator, s3: Any, namespace: str
) -> None:
    _, _, ready = publish_first_revision(cluster, s3, namespace, "gone-bad")
    assert ready["status"]["tunedGemms"] and ready["status"]["revision"]
    broken = profile_doc("gone-bad", gpu={"vendor": "nvidia", "models": ["NVIDIA H200"]})
    apply(cluster, namespace, broken)
    prof = eventually(
        lambda: get_json(cluster, "tp", "-n", namespace, "gone-bad"),
        lambda p: (p.get("status") or {}).get("phase") == "Invalid",
        "Invalid",
    )
    for stale in ("tunedGemms", "gemms", "note", "revision", "progress", "shortSha256"):
        assert stale not in prof["status"], (stale, prof["status"])
    assert prof["status"]["artifacts"] == ready["status"]["artifacts"]  # still served
    columns = "PHASE:.status.phase,GEMMS:.status.tunedGemms,REVISION:.status.revision"
    row = cluster.kubectl(
        "get", "tp", "-n", namespace, "gone-bad", "--no-headers", "-o", f"custom-columns={columns}"
    ).stdout.split()
    assert row == ["Invalid", "<none>", "<none>"]  # no stale GEMMs column
