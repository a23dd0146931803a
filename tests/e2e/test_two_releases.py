"""Two releases split one cluster: each operator (its own release name, its own namespace, its
own `operator.watchNamespaces`) reconciles only the profiles of its namespaces and admits only
the pods of its namespaces; a namespace neither watches gets nothing; a third release that
would overlap either is refused at install. Both run as the chart's Deployment on the real
node, one replica each, and are uninstalled at the end (the release the other e2e tests use
is removed first and installed again by the next test that asks for it).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from testbed.builders.fleet import profile_doc
from testbed.builders.wrappers import make_model_pod
from testbed.cluster import (
    create_namespace,
    delete_namespace,
    ensure_images,
    namespace_name,
)
from testbed.operator import (
    RELEASE,
    ROOT,
    SERVING_SECRET,
    SYSTEM_NS,
    InCluster,
    carry_out_publish,
    create_s3_secret,
    install_in_cluster,
    uninstall_release,
    upgrade_release,
)
from testbed.poll import eventually
from tests.support.kube import apply, get_json, jobs_of, tuning_pods

pytestmark = pytest.mark.e2e

H100 = "NVIDIA-H100-80GB-HBM3"
CRD = "tuningprofiles.tunefleet.io"
CRD_FILE = ROOT / "crds" / "tunefleet.io_tuningprofiles.yaml"
# Pod m of profile p, on an H100 node: created in each namespace.
MODEL_POD = (
    make_model_pod("p", "m", image="registry.example.com/serve:1")
    .without("metadata", "namespace")
    .selector({"nvidia.com/gpu.product": H100})
)


@pytest.fixture
def spaces(cluster: Any, no_release: None) -> Iterator[dict[str, str]]:
    """a1, a2 for release A; b1 for release B; c1 for nobody."""
    api = cluster.api_client()
    made = {k: namespace_name(f"two-releases-{k}") for k in ("a1", "a2", "b1", "c1")}
    try:
        for ns in made.values():
            create_namespace(api, ns)
        yield made
    finally:
        for ns in made.values():
            delete_namespace(api, ns)
        api.close()


def crd_for_the_session_release(cluster: Any) -> None:
    """The CRD as the session's release owns it (README.md, "The CRD": handed to a release), so
    that neither release here creates it: one that did would own it after this test, and the
    session's release would then leave it alone for every later test on this cluster."""
    if cluster.kubectl("get", "crd", CRD, check=False).returncode != 0:
        cluster.kubectl("apply", "--server-side", "-f", str(CRD_FILE))
    cluster.kubectl(
        "annotate", "--overwrite", "crd", CRD, "helm.sh/resource-policy=keep",
        f"meta.helm.sh/release-name={RELEASE}", f"meta.helm.sh/release-namespace={SYSTEM_NS}",
    )  # fmt: skip
    cluster.kubectl("label", "--overwrite", "crd", CRD, "app.kubernetes.io/managed-by=Helm")


def admitted_namespaces(deployed: InCluster) -> set[str]:
    """The namespaces of the pods this release's webhook admitted, from its own log lines."""
    out: set[str] = set()
    for pod in deployed.pods():
        for m in re.finditer(r"admission pod ([^/\s]+)/", deployed.logs(pod["metadata"]["name"])):
            out.add(m.group(1))
    return out


def reconciled_namespaces(deployed: InCluster) -> set[str]:
    out: set[str] = set()
    for pod in deployed.pods():
        log = deployed.logs(pod["metadata"]["name"])
        out |= set(re.findall(r"created tuning Job ([^/\s]+)/", log))
    return out


def test_two_releases_own_disjoint_namespaces_and_never_touch_each_others(
    cluster: Any, s3: Any, spaces: dict[str, str]
) -> None:
    ensure_images()
    a_spaces, b_spaces = [spaces["a1"], spaces["a2"]], [spaces["b1"]]
    releases = {
        "a": ("tunefleet-a", "tunefleet-a-system"),
        "b": ("tunefleet-b", "tunefleet-b-system"),
    }
    crd_for_the_session_release(cluster)
    no_crd = ("--set", "crds.install=false")
    try:
        a = install_in_cluster(
            cluster, s3, replicas=1, release=releases["a"][0], namespace=releases["a"][1],
            extra=(*no_crd, "--set-json", f"operator.watchNamespaces={json.dumps(a_spaces)}"),
        )  # fmt: skip
        b = install_in_cluster(
            cluster, s3, replicas=1, release=releases["b"][0], namespace=releases["b"][1],
            extra=(*no_crd, "--set-json", f"operator.watchNamespaces={json.dumps(b_spaces)}"),
        )  # fmt: skip

        # A third release that would watch one of B's namespaces, or every namespace, is refused
        # before anything is installed.
        for watch in ([spaces["b1"], spaces["c1"]], []):
            with pytest.raises(AssertionError, match="overlaps tunefleet release tunefleet-"):
                upgrade_release(
                    cluster, "--set-json", f"operator.watchNamespaces={json.dumps(watch)}",
                    "--set", "operator.replicas=0", release="tunefleet-c",
                    namespace="tunefleet-c-system",
                )  # fmt: skip

        # Each webhook is called only for its own namespaces.
        for deployed, mine in ((a, a_spaces), (b, b_spaces)):
            hook = get_json(cluster, "mutatingwebhookconfiguration", deployed.name)["webhooks"][0]
            (expr,) = hook["namespaceSelector"]["matchExpressions"]
            assert expr["key"] == "kubernetes.io/metadata.name" and expr["values"] == sorted(mine)

        # RBAC: neither ServiceAccount may read or write the other's namespaces.
        def can(deployed: InCluster, *args: str) -> bool:
            sa = f"system:serviceaccount:{deployed.namespace}:{deployed.name}"
            out = cluster.kubectl("auth", "can-i", f"--as={sa}", *args, check=False)
            return bool(out.stdout.strip() == "yes")

        assert can(a, "create", "jobs", "-n", spaces["a1"])
        assert not can(a, "create", "jobs", "-n", spaces["b1"])
        assert not can(a, "list", "tuningprofiles.tunefleet.io", "-n", spaces["b1"])
        assert can(b, "list", "tuningprofiles.tunefleet.io", "-n", spaces["b1"])
        assert not can(b, "get", "tuningprofiles.tunefleet.io", "-n", spaces["a2"])
        assert not can(b, "list", "tuningprofiles.tunefleet.io", "-n", spaces["c1"])

        # A profile of the same name in each namespace; A's in a1 is made Ready.
        secret = create_s3_secret(cluster.kubectl, spaces["a1"], s3.access_key, s3.secret_key)
        create_s3_secret(
            cluster.kubectl, spaces["a1"], s3.reader_access_key, s3.reader_secret_key,
            SERVING_SECRET,
        )  # fmt: skip
        storage = {"uri": f"s3://{s3.bucket}/two-releases", "credentialsSecret": {"name": secret}}
        for ns in spaces.values():
            apply(cluster, ns, profile_doc("p", gpu={"vendor": "nvidia", "models": [H100]},
                                           storage=storage))  # fmt: skip
        for ns in (*a_spaces, *b_spaces):
            try:
                eventually(
                    lambda ns=ns: jobs_of(cluster, ns, "p"), lambda js: len(js) == 1, f"{ns}'s Job"
                )
            except AssertionError as e:
                said = {
                    p["metadata"]["name"]: d.logs(p["metadata"]["name"]).splitlines()[-30:]
                    for d in (a, b)
                    for p in d.pods()
                }
                raise AssertionError(
                    f"{e}\nthe operators' logs: {json.dumps(said, indent=1)}"
                ) from None
            eventually(
                lambda ns=ns: get_json(cluster, "tp", "-n", ns, "p"),
                lambda p: (p.get("status") or {}).get("jobs"),
                f"{ns}'s status",
            )
        (pod,) = eventually(
            lambda: tuning_pods(cluster, spaces["a1"], "p"),
            lambda ps: len(ps) == 1 and ps[0]["spec"].get("nodeName"),
            "a1's tuning pod",
        )
        carry_out_publish(cluster.kubectl, pod, s3.env())
        eventually(
            lambda: get_json(cluster, "tp", "-n", spaces["a1"], "p"),
            lambda p: (p.get("status") or {}).get("phase") == "Ready",
            "a1's profile Ready",
        )

        # Labelled model pods: A injects a1's, B admits b1's (untuned: no artifact there yet),
        # nobody sees c1's.
        for ns in (spaces["a1"], spaces["b1"], spaces["c1"]):
            cluster.kubectl("create", "-n", ns, "-f", "-", input=yaml.safe_dump(MODEL_POD.obj()))
        a1 = get_json(cluster, "pod", "-n", spaces["a1"], "m")
        assert a1["metadata"]["labels"].get("tunefleet.io/admission") == "injected"
        assert any(v["name"] == "tunefleet-results" for v in a1["spec"]["volumes"])
        b1 = get_json(cluster, "pod", "-n", spaces["b1"], "m")
        assert b1["metadata"]["labels"].get("tunefleet.io/admission") == "untuned"
        c1 = get_json(cluster, "pod", "-n", spaces["c1"], "m")
        assert "tunefleet.io/admission" not in c1["metadata"]["labels"]
        assert not any(v["name"] == "tunefleet-results" for v in c1["spec"].get("volumes") or [])

        # The profile nobody watches: no Job and no status, well after the others had theirs.
        time.sleep(5)
        assert jobs_of(cluster, spaces["c1"], "p") == []
        assert not get_json(cluster, "tp", "-n", spaces["c1"], "p").get("status")

        # Each operator's own word: what it made and admitted was in its namespaces only.
        assert reconciled_namespaces(a) == {spaces["a1"], spaces["a2"]}
        assert reconciled_namespaces(b) == {spaces["b1"]}
        assert admitted_namespaces(a) == {spaces["a1"]}
        assert admitted_namespaces(b) == {spaces["b1"]}
        # Each release elected its own leader, in its own namespace.
        assert a.leader() and b.leader() and a.leader() != b.leader()
        # Neither took the CRD from the session's release.
        crd = get_json(cluster, "crd", CRD)["metadata"]["annotations"]
        assert crd["meta.helm.sh/release-namespace"] == SYSTEM_NS
    finally:
        for release, ns in releases.values():
            uninstall_release(cluster, release, ns)
        for ns in (*(ns for _, ns in releases.values()), "tunefleet-c-system"):
            cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
