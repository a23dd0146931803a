"""The chart: values.schema.json covers every value and refuses bad ones by name; what it
renders agrees with the operator (webhook registration, leader election, RBAC)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from tests.support.chart import CHART, rendered, template
from tunefleet.builders.webhook import build_webhook_configuration


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


def hooks(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return list(next(d for d in docs if d["kind"] == "MutatingWebhookConfiguration")["webhooks"])


def test_the_charts_webhook_registration_matches_the_operators() -> None:
    (ours,) = build_webhook_configuration("x", {"url": "https://x"})["webhooks"]
    for hook in hooks(rendered()):
        for key in ("objectSelector", "rules", "sideEffects", "admissionReviewVersions"):
            assert hook[key] == ours[key], (hook["name"], key)
    assert hooks(rendered())[-1]["failurePolicy"] == ours["failurePolicy"]


def test_each_replica_is_its_own_webhook_entry_called_before_the_shared_one() -> None:
    """A pod created while one replica is dead or frozen: the API server calls the entries in
    turn, so the next replica admits it (a shared Service alone sends some calls to the dead
    one). Slot entries fail open whatever the policy; the last carries webhook.failurePolicy."""
    docs = rendered("webhook.failurePolicy=Fail", "operator.replicas=3")
    got = [
        (h["name"], h["clientConfig"]["service"]["name"], h["failurePolicy"]) for h in hooks(docs)
    ]
    assert got == [
        ("slot-0.pods.tunefleet.io", "tf-tunefleet-webhook-0", "Ignore"),
        ("slot-1.pods.tunefleet.io", "tf-tunefleet-webhook-1", "Ignore"),
        ("slot-2.pods.tunefleet.io", "tf-tunefleet-webhook-2", "Ignore"),
        ("pods.tunefleet.io", "tf-tunefleet-webhook", "Fail"),
    ]
    deployments = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Deployment"}
    # Slot 0 keeps the release's name (and its selector, immutable): an upgrade rolls it.
    assert sorted(deployments) == ["tf-tunefleet", "tf-tunefleet-1", "tf-tunefleet-2"]
    services = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
    for slot in range(3):
        name = "tf-tunefleet" if slot == 0 else f"tf-tunefleet-{slot}"
        deploy = deployments[name]
        assert deploy["spec"]["replicas"] == 1
        pod_labels = deploy["spec"]["template"]["metadata"]["labels"]
        selector = services[f"tf-tunefleet-webhook-{slot}"]["spec"]["selector"]
        # The slot's Service selects this Deployment's pod and no other slot's.
        assert selector.items() <= pod_labels.items()
        for other in set(deployments) - {name}:
            other_labels = deployments[other]["spec"]["template"]["metadata"]["labels"]
            assert not selector.items() <= other_labels.items(), (slot, other)
        # A Deployment's selector picks its own pods (slot 0's also others': it predates slots).
        assert deploy["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    secret = next(d for d in docs if d["kind"] == "Secret" and d["type"] == "kubernetes.io/tls")
    hosts = secret["metadata"]["annotations"]["tunefleet.io/hosts"].split(",")
    assert hosts == [
        f"{s}.tf-system.svc"
        for s in ["tf-tunefleet-webhook", *[f"tf-tunefleet-webhook-{i}" for i in range(3)]]
    ]


def test_the_certificate_names_every_webhook_service() -> None:
    import base64

    from cryptography import x509

    docs = rendered()
    secret = next(d for d in docs if d["kind"] == "Secret" and d["type"] == "kubernetes.io/tls")
    cert = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    names = set(
        cert.extensions.get_extension_for_class(
            x509.SubjectAlternativeName
        ).value.get_values_for_type(x509.DNSName)
    )
    for hook in hooks(docs):
        svc = hook["clientConfig"]["service"]
        # The API server checks the certificate against <service>.<namespace>.svc.
        assert f"{svc['name']}.{svc['namespace']}.svc" in names, hook["name"]
    cm = rendered("webhook.certManager.enabled=true")
    certificate = next(d for d in cm if d["kind"] == "Certificate")
    for hook in hooks(cm):
        svc = hook["clientConfig"]["service"]
        assert f"{svc['name']}.{svc['namespace']}.svc" in certificate["spec"]["dnsNames"]


def test_two_replicas_elect_a_leader_and_survive_drains() -> None:
    docs = rendered()
    deploys = [d for d in docs if d["kind"] == "Deployment"]
    assert [d["spec"]["replicas"] for d in deploys] == [1, 1]
    deploy = deploys[0]
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
    for hook in hooks(docs):
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
    assert not any("namespaceSelector" in hook for hook in hooks(docs))
    role = next(
        d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "tf-tunefleet"
    )
    assert role["metadata"]["annotations"]["tunefleet.io/watch-namespaces"] == "*"


def test_the_operator_gets_a_registry_identity_only_when_one_is_named() -> None:
    def operator(*sets: str) -> dict[str, Any]:
        dep = next(d for d in rendered(*sets) if d["kind"] == "Deployment")
        pod: dict[str, Any] = dep["spec"]["template"]["spec"]
        return pod

    plain = operator()
    env = {e["name"]: e.get("value") for e in plain["containers"][0]["env"]}
    assert env["TUNEFLEET_IMAGE_VOLUMES"] == "auto" and "TUNEFLEET_OCI_CONFIG" not in env
    named = operator(
        "delivery.oci.credentialsSecret=registry-pull", "delivery.oci.imageVolumes=false"
    )
    env = {e["name"]: e.get("value") for e in named["containers"][0]["env"]}
    assert env["TUNEFLEET_OCI_CONFIG"] == "/etc/tunefleet/oci"
    assert env["TUNEFLEET_IMAGE_VOLUMES"] == "false"
    (vol,) = [v for v in named["volumes"] if v["name"] == "oci"]
    assert vol["secret"]["secretName"] == "registry-pull"
    # `helm upgrade --reuse-values` from 0.1.0 carries a delivery without oci: still renders.
    old = operator("delivery.oci=null")
    env = {e["name"]: e.get("value") for e in old["containers"][0]["env"]}
    assert env["TUNEFLEET_IMAGE_VOLUMES"] == "auto"


def test_per_profile_metrics_are_off_unless_asked_for_or_the_dashboard_reads_them() -> None:
    def profile_metrics(*sets: str) -> str:
        deploy = next(d for d in rendered(*sets) if d["kind"] == "Deployment")
        env = deploy["spec"]["template"]["spec"]["containers"][0]["env"]
        return str(next(e["value"] for e in env if e["name"] == "TUNEFLEET_PROFILE_METRICS"))

    assert profile_metrics() == "false"
    assert profile_metrics("metrics.perProfile=true") == "true"
    assert profile_metrics("dashboard.enabled=true") == "true"


def test_fleet_mode_is_off_by_default_and_when_on_gets_its_store_identity_and_kube_system() -> None:
    def operator(*sets: str) -> tuple[dict[str, Any], dict[str, str]]:
        docs = rendered(*sets)
        deploy = next(d for d in docs if d["kind"] == "Deployment")
        env = deploy["spec"]["template"]["spec"]["containers"][0]["env"]
        secrets = {
            e["name"]: e["valueFrom"]["secretKeyRef"]["name"] for e in env if "valueFrom" in e
        }
        role = next(
            d
            for d in docs
            if d["kind"] == "ClusterRole" and not d["metadata"]["name"].endswith("-kopf")
        )
        values = {e["name"]: e["value"] for e in env if "value" in e}
        return {"role": role, "env": values}, secrets

    off, secrets = operator("delivery.credentialsSecret=read-only")
    assert off["env"]["TUNEFLEET_FLEET"] == "false"
    assert secrets["AWS_ACCESS_KEY_ID"] == "read-only"
    kopf = next(
        d
        for d in rendered()
        if d["metadata"]["name"].endswith("-kopf") and d["kind"] == "ClusterRole"
    )
    names_kube_system = [
        r
        for d in (off["role"], kopf)
        for r in d["rules"]
        if r.get("resourceNames") == ["kube-system"]
    ]
    assert names_kube_system == []  # off: no read of kube-system
    on, secrets = operator(
        "fleet.enabled=true", "fleet.claimSeconds=900", "fleet.credentialsSecret=fleet-writer",
        "delivery.credentialsSecret=read-only",
    )  # fmt: skip
    assert on["env"]["TUNEFLEET_FLEET"] == "true"
    assert on["env"]["TUNEFLEET_FLEET_CLAIM_SECONDS"] == "900"
    assert secrets == {"AWS_ACCESS_KEY_ID": "fleet-writer", "AWS_SECRET_ACCESS_KEY": "fleet-writer"}
    assert on["env"]["TUNEFLEET_DELIVERY_CREDENTIALS_SECRET"] == "read-only"  # still delivers
    kopf = next(
        d for d in rendered("fleet.enabled=true")
        if d["metadata"]["name"].endswith("-kopf") and d["kind"] == "ClusterRole"
    )  # fmt: skip
    (rule,) = [r for r in kopf["rules"] if r.get("resourceNames") == ["kube-system"]]
    assert rule["verbs"] == ["get"] and rule["resources"] == ["namespaces"]
    # `helm upgrade --reuse-values` from a release without fleet: still renders, off.
    old, _ = operator("fleet=null")
    assert old["env"]["TUNEFLEET_FLEET"] == "false"


def test_fleet_mode_on_a_registry_mounts_its_push_identity_and_says_the_settle_window() -> None:
    def operator(*sets: str) -> tuple[dict[str, str], list[str], list[str]]:
        deploy = next(d for d in rendered(*sets) if d["kind"] == "Deployment")
        pod = deploy["spec"]["template"]["spec"]
        container = pod["containers"][0]
        env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
        mounts = [m["mountPath"] for m in container["volumeMounts"]]
        secrets = [v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v]
        return env, mounts, secrets

    env, mounts, secrets = operator(
        "fleet.enabled=true", "fleet.ociCredentialsSecret=fleet-pusher", "fleet.settleSeconds=8"
    )
    assert env["TUNEFLEET_FLEET_OCI_CONFIG"] == "/etc/tunefleet/fleet-oci"
    assert env["TUNEFLEET_FLEET_SETTLE_SECONDS"] == "8"
    assert "/etc/tunefleet/fleet-oci" in mounts and "fleet-pusher" in secrets
    # Off, the Secret is neither mounted nor named: fleet mode alone pushes to a registry.
    env, mounts, secrets = operator("fleet.ociCredentialsSecret=fleet-pusher")
    assert "TUNEFLEET_FLEET_OCI_CONFIG" not in env and "fleet-pusher" not in secrets
    assert env["TUNEFLEET_FLEET_SETTLE_SECONDS"] == "5"
    refused = template("fleet.settleSeconds=0")
    assert refused.returncode != 0 and "settleSeconds" in refused.stderr


def test_the_operators_signing_key_is_mounted_in_the_operator_alone_and_needs_capture() -> None:
    def operator(*sets: str) -> dict[str, Any]:
        dep = next(d for d in rendered(*sets) if d["kind"] == "Deployment")
        pod: dict[str, Any] = dep["spec"]["template"]["spec"]
        return pod

    plain = operator()
    assert "TUNEFLEET_SIGNING_KEY_DIR" not in {e["name"] for e in plain["containers"][0]["env"]}
    assert all(v["name"] != "signing" for v in plain["volumes"])
    signs = operator("signing.secret=operator-signing")
    env = {e["name"]: e.get("value") for e in signs["containers"][0]["env"]}
    assert env["TUNEFLEET_SIGNING_KEY_DIR"] == "/etc/tunefleet/signing"
    (vol,) = [v for v in signs["volumes"] if v["name"] == "signing"]
    # The key pair alone, readable by the operator's group only.
    assert vol["secret"]["secretName"] == "operator-signing"
    assert [i["key"] for i in vol["secret"]["items"]] == ["cosign.key", "cosign.password"]
    assert vol["secret"]["defaultMode"] == 0o440
    # No other object of the release mounts it.
    others = [
        d
        for d in rendered("signing.secret=operator-signing", "gc.enabled=true", "gc.uri=s3://b/p")
        if d["kind"] != "Deployment" and "operator-signing" in json.dumps(d)
    ]
    assert others == []
    # The attestation names the cluster: kube-system's uid, read at start.
    rules = [
        r
        for d in rendered("signing.secret=operator-signing")
        if d["kind"] == "ClusterRole"
        for r in d.get("rules") or []
    ]
    assert any(
        r["resources"] == ["namespaces"] and r.get("resourceNames") == ["kube-system"]
        for r in rules
    )
    # `helm upgrade --reuse-values` from a release without signing still renders.
    assert operator("signing=null")["containers"]
    refused = template("signing.secret=operator-signing", "capture.enabled=false")
    assert refused.returncode != 0 and "signing.secret needs capture.enabled" in refused.stderr


def test_the_store_brokers_publish_identity_is_in_the_operator_alone_and_needs_signing() -> None:
    def operator_env(*sets: str) -> dict[str, Any]:
        dep = next(d for d in rendered(*sets) if d["kind"] == "Deployment")
        return {e["name"]: e for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}

    assert "TUNEFLEET_STORE_BROKER" not in operator_env("signing.secret=operator-signing")
    env = operator_env("signing.secret=operator-signing", "signing.storeCredentialsSecret=pub")
    assert env["TUNEFLEET_STORE_BROKER"]["value"] == "true"
    for name, key in (
        ("TUNEFLEET_STORE_ACCESS_KEY_ID", "AWS_ACCESS_KEY_ID"),
        ("TUNEFLEET_STORE_SECRET_ACCESS_KEY", "AWS_SECRET_ACCESS_KEY"),
    ):
        assert env[name]["valueFrom"]["secretKeyRef"] == {"name": "pub", "key": key}
    # Not the AWS_* names: those stay the operator's read identity's.
    assert "pub" not in json.dumps([env.get("AWS_ACCESS_KEY_ID"), env.get("AWS_SECRET_ACCESS_KEY")])
    others = [
        d
        for d in rendered(
            "signing.secret=s", "signing.storeCredentialsSecret=pub", "gc.enabled=true",
            "gc.uri=s3://b/p",
        )
        if d["kind"] != "Deployment" and '"pub"' in json.dumps(d)
    ]  # fmt: skip
    assert others == []
    refused = template("signing.storeCredentialsSecret=pub")
    assert refused.returncode != 0 and "needs signing.secret" in refused.stderr


def test_the_registry_proxys_push_identity_is_mounted_in_the_operator_alone() -> None:
    sets = (
        "signing.secret=s", "delivery.oci.credentialsSecret=reader",
        "signing.registryCredentialsSecret=pusher", "gc.enabled=true", "gc.uri=s3://b/p",
    )  # fmt: skip
    docs = rendered(*sets)
    dep = next(d for d in docs if d["kind"] == "Deployment")
    pod = dep["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert env["TUNEFLEET_REGISTRY_BROKER_CONFIG"] == "/etc/tunefleet/registry-broker"
    (volume,) = [v for v in pod["volumes"] if v["name"] == "registry-broker"]
    assert volume["secret"]["secretName"] == "pusher"
    mounts = {m["name"]: m for m in pod["containers"][0]["volumeMounts"]}
    assert mounts["registry-broker"]["mountPath"] == "/etc/tunefleet/registry-broker"
    others = [d for d in docs if d["kind"] != "Deployment" and '"pusher"' in json.dumps(d)]
    assert others == []
    for missing in (sets[0], sets[1]):
        refused = template(*[x for x in sets if x != missing])
        assert refused.returncode != 0, missing
        assert "registryCredentialsSecret needs signing.secret and delivery.oci" in refused.stderr
