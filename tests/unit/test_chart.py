"""The chart: values.schema.json covers every value and refuses bad ones by name; what it
renders agrees with the operator (webhook registration, leader election, RBAC)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tunefleet.builders.webhook import build_webhook_configuration

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "tunefleet"


def helm_bin() -> str:
    found = shutil.which("helm")
    if found:
        return found
    out = subprocess.run(
        [str(ROOT / "hack" / "build-tools.sh"), "--dir"], capture_output=True, text=True
    )
    candidate = Path(out.stdout.strip().splitlines()[-1]) / "helm" if out.stdout.strip() else None
    if candidate and candidate.exists():
        return str(candidate)
    pytest.skip("helm not built (make tools)")


def template(*sets: str) -> subprocess.CompletedProcess[str]:
    args = [helm_bin(), "template", "tf", str(CHART), "-n", "tf-system", "--kube-version", "1.36.3"]
    for s in sets:
        args += ["--set", s]
    return subprocess.run(args, capture_output=True, text=True, timeout=60)


def rendered(*sets: str) -> list[dict[str, Any]]:
    out = template(*sets)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def leaves(values: dict[str, Any], prefix: str = "") -> list[str]:
    out = []
    for k, v in values.items():
        path = f"{prefix}.{k}" if prefix else k
        if isinstance(v, dict) and v and k not in ("resources",):
            out += leaves(v, path)
        else:
            out.append(path)
    return out


def test_the_schema_describes_every_value() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    schema = json.loads((CHART / "values.schema.json").read_text())
    for path in leaves(values):
        node = schema
        for part in path.split("."):
            assert part in node.get("properties", {}), f"values.schema.json lacks {path}"
            node = node["properties"][part]
        assert node.get("description"), f"{path} has no description in values.schema.json"


def test_every_top_level_value_is_commented() -> None:
    lines = (CHART / "values.yaml").read_text().splitlines()
    for i, line in enumerate(lines):
        if line and not line.startswith((" ", "#")) and ":" in line:
            above = lines[i - 1] if i else ""
            assert above.startswith("#") or "#" in line, f"values.yaml: {line!r} has no comment"


@pytest.mark.parametrize(
    ("value", "named"),
    [
        ("operator.replicas=two", "/operator/replicas"),
        ("webhook.failurePolicy=Sometimes", "/webhook/failurePolicy"),
        ("operator.replcas=2", "replcas"),
        ("library.scope=everyone", "/library/scope"),
        ("webhook.timeoutSeconds=90", "/webhook/timeoutSeconds"),
    ],
)
def test_a_bad_value_is_refused_naming_it(value: str, named: str) -> None:
    out = template(value)
    assert out.returncode != 0 and named in out.stderr, out.stderr


def test_the_charts_webhook_registration_matches_the_operators() -> None:
    (hook,) = next(d for d in rendered() if d["kind"] == "MutatingWebhookConfiguration")["webhooks"]
    (ours,) = build_webhook_configuration("x", {"url": "https://x"})["webhooks"]
    for key in (
        "objectSelector",
        "rules",
        "sideEffects",
        "failurePolicy",
        "admissionReviewVersions",
    ):
        assert hook[key] == ours[key], key


def test_two_replicas_elect_a_leader_and_survive_drains() -> None:
    docs = rendered()
    deploy = next(d for d in docs if d["kind"] == "Deployment")
    assert deploy["spec"]["replicas"] == 2
    (container,) = deploy["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["TUNEFLEET_LEASE_NAMESPACE"] == "tf-system"
    assert container["readinessProbe"]["tcpSocket"]["port"] == "webhook"
    assert deploy["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    pdb = next(d for d in docs if d["kind"] == "PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == 1
    role = next(d for d in docs if d["kind"] == "Role")
    assert {r["resources"][0] for r in role["rules"]} == {"leases"}
    assert not any(d["kind"] == "PodDisruptionBudget" for d in rendered("operator.replicas=1"))


def test_optional_objects_appear_only_when_asked() -> None:
    kinds = {d["kind"] for d in rendered()}
    assert "NetworkPolicy" not in kinds and "ServiceMonitor" not in kinds
    kinds = {
        d["kind"]
        for d in rendered("networkPolicy.enabled=true", "metrics.serviceMonitor.enabled=true")
    }
    assert {"NetworkPolicy", "ServiceMonitor"} <= kinds
    test_pod = next(d for d in rendered() if d["kind"] == "Pod")
    assert test_pod["metadata"]["annotations"]["helm.sh/hook"] == "test"


def test_a_release_that_watches_namespaces_admits_and_binds_in_those_only() -> None:
    """Several releases split a cluster by namespace: each webhook is called for its own
    namespaces (as the operator registers itself: builders.webhook), its RBAC is bound there
    alone, and its ClusterRole says what it watches for the next release's overlap check."""
    from tunefleet.builders.webhook import namespace_selector

    docs = rendered("operator.watchNamespaces={ml,vision}")
    (hook,) = next(d for d in docs if d["kind"] == "MutatingWebhookConfiguration")["webhooks"]
    assert hook["namespaceSelector"] == namespace_selector(["vision", "ml"])
    bound = {
        d["metadata"]["namespace"]
        for d in docs
        if d["kind"] == "RoleBinding" and d["roleRef"]["name"] == "tf-tunefleet"
    }
    assert bound == {"ml", "vision"}
    assert not any(
        d["kind"] == "ClusterRoleBinding" and d["roleRef"]["name"] == "tf-tunefleet" for d in docs
    )
    role = next(
        d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "tf-tunefleet"
    )
    assert role["metadata"]["annotations"]["tunefleet.io/watch-namespaces"] == "ml,vision"
    deploy = next(d for d in docs if d["kind"] == "Deployment")
    env = {
        e["name"]: e.get("value")
        for e in deploy["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert env["TUNEFLEET_NAMESPACES"] == "ml,vision"
    assert env["TUNEFLEET_LEASE_NAME"] == "tf-tunefleet-operator"

    docs = rendered()
    (hook,) = next(d for d in docs if d["kind"] == "MutatingWebhookConfiguration")["webhooks"]
    assert "namespaceSelector" not in hook
    role = next(
        d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "tf-tunefleet"
    )
    assert role["metadata"]["annotations"]["tunefleet.io/watch-namespaces"] == "*"
