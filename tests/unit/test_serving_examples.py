"""examples/serving/: every pod the examples make opts in with the profile label (where the
label must go differs per stack), and what the e2e runs is what the documented object makes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tunefleet import naming

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "serving"


def docs(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((EXAMPLES / name).read_text()) if d]


def pod_templates(doc: dict[str, Any]) -> list[tuple[dict[str, Any] | None, dict[str, Any] | None]]:
    """The pod (metadata, spec) pairs an object makes, as its controller copies them."""
    kind, spec = doc["kind"], doc["spec"]
    if kind == "Pod":
        return [(doc["metadata"], spec)]
    if kind == "Deployment":
        templates = [spec["template"]]
    elif kind == "LeaderWorkerSet":
        t = spec["leaderWorkerTemplate"]
        templates = [t["leaderTemplate"], t["workerTemplate"]]
    elif kind == "InferenceService":
        predictor = spec["predictor"]
        return [({"labels": predictor.get("labels") or {}}, predictor)]
    else:
        raise AssertionError(f"no pod template known for {kind}")
    return [(t.get("metadata"), t.get("spec")) for t in templates]


@pytest.mark.parametrize("name", sorted(p.name for p in EXAMPLES.glob("*.yaml")))
def test_every_pod_an_example_makes_carries_the_profile_label(name: str) -> None:
    for doc in docs(name):
        for metadata, _spec in pod_templates(doc):
            labels = (metadata or {}).get("labels") or {}
            assert labels.get(naming.PROFILE_LABEL), (name, doc["kind"])


def test_the_reproduced_pods_match_the_objects_they_stand_for() -> None:
    (isvc,) = docs("kserve-inferenceservice.yaml")
    (predictor,) = docs("kserve-predictor-pod.yaml")
    pod = predictor["spec"]["template"]
    name = isvc["metadata"]["name"]
    assert pod["metadata"]["labels"]["serving.kserve.io/inferenceservice"] == name
    assert predictor["metadata"]["name"] == f"{name}-predictor"
    assert [c["name"] for c in pod["spec"]["initContainers"]] == ["storage-initializer"]
    assert [c["name"] for c in pod["spec"]["containers"]] == ["kserve-container"]
    uri = isvc["spec"]["predictor"]["model"]["storageUri"]
    assert pod["spec"]["initContainers"][0]["args"][0] == uri
    profile = isvc["spec"]["predictor"]["labels"][naming.PROFILE_LABEL]
    assert pod["metadata"]["labels"][naming.PROFILE_LABEL] == profile

    (lws,) = docs("leaderworkerset.yaml")
    leader, worker = docs("leaderworkerset-pods.yaml")
    size = lws["spec"]["leaderWorkerTemplate"]["size"]
    assert leader["metadata"]["annotations"]["leaderworkerset.sigs.k8s.io/size"] == str(size)
    assert (
        worker["metadata"]["annotations"]["leaderworkerset.sigs.k8s.io/leader-name"]
        == (leader["metadata"]["name"])
    )
    for pod_doc, template in zip(
        (leader, worker),
        (
            lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"],
            lws["spec"]["leaderWorkerTemplate"]["workerTemplate"],
        ),
        strict=True,
    ):
        assert (
            pod_doc["metadata"]["labels"]["leaderworkerset.sigs.k8s.io/name"]
            == (lws["metadata"]["name"])
        )
        for key, value in template["metadata"]["labels"].items():
            assert pod_doc["metadata"]["labels"][key] == value
        (c,) = pod_doc["spec"]["containers"]
        (t,) = template["spec"]["containers"]
        assert c["image"] == t["image"] and c["args"] == t["args"]
