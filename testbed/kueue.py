"""A real Kueue beside the local cluster, for the e2e tests of spec.tuning.queueName.

`start_kueue(cluster)` runs the kueue manager that hack/build-tools.sh built from its Go module
(KUEUE_VERSION there) as a process on this machine, as Kueue's own ServiceAccount with Kueue's
own RBAC (config/components/rbac of that module), its CRDs applied, and a configuration that
manages batch/v1 Jobs only and nothing without a queue label (other tests' Jobs never meet
it). It runs without its webhooks: nothing registers them, so the API server never calls it and
pod or Job creation never depends on it; Kueue's Job reconciler admits Jobs created suspended
with the queue label, which is what tunefleet makes. Leader election is off; metrics, health and
the (unused) webhook listen on free loopback ports.

Kueue reads its metrics certificate from the fixed path /etc/kueue/metrics/certs (when its own
certificate management is off, as here): it runs in a mount namespace of its own where /etc is
an overlay with that directory added, so this machine's /etc is never written. That needs root,
as the local cluster's real node does.

`Kueue.queue(...)` makes a ResourceFlavor, ClusterQueue and LocalQueue for one test and removes
them while Kueue still runs (it holds finalizers on them); `stop()` ends the process by its PID.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from testbed.builders.objects import document, manifest, token_kubeconfig
from testbed.cluster import BUILD_TOOLS, ROOT, Cluster, wait_for
from testbed.operator import free_port
from testbed.poll import eventually

NAMESPACE = "kueue-system"
SERVICE_ACCOUNT = "kueue-controller-manager"
CLUSTER_ROLE = "tunefleet-e2e-kueue-manager"
SECRETS_ROLE = "tunefleet-e2e-kueue-secrets"
GROUP = "kueue.x-k8s.io"


def kueue_version() -> str:
    text = (ROOT / "hack" / "build-tools.sh").read_text()
    found = re.search(r'^KUEUE_VERSION="([^"]+)"', text, re.M)
    assert found, "hack/build-tools.sh names no KUEUE_VERSION"
    return found.group(1)


def kueue_binary() -> Path:
    out = subprocess.run(
        [str(BUILD_TOOLS), "--kueue"], capture_output=True, text=True, check=True, timeout=60
    )
    path = Path(out.stdout.strip().splitlines()[-1])
    if not os.access(path, os.X_OK):
        raise RuntimeError(
            f"kueue is not built ({path} missing): run `make tools` (hack/build-tools.sh builds "
            f"sigs.k8s.io/kueue {kueue_version()} from its Go module, about 5 minutes cold)"
        )
    return path


def kueue_module() -> Path:
    """Kueue's module sources (CRDs, RBAC): in the Go module cache, where the build put them."""
    done = subprocess.run(
        ["go", "mod", "download", "-json", f"sigs.k8s.io/kueue@{kueue_version()}"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "GOFLAGS": "-mod=mod"},
        cwd=tempfile.gettempdir(),
    )
    if done.returncode != 0:
        raise RuntimeError(f"go mod download sigs.k8s.io/kueue failed: {done.stderr[-2000:]}")
    return Path(json.loads(done.stdout)["Dir"])


def _rbac(module: Path) -> list[dict[str, Any]]:
    """Kueue's own manager role (cluster-wide) and its Secrets role, for its ServiceAccount."""
    rbac = module / "config" / "components" / "rbac"
    role = next(d for d in yaml.safe_load_all((rbac / "role.yaml").read_text()) if d)
    role["metadata"] = {"name": CLUSTER_ROLE}
    secrets_role = yaml.safe_load((rbac / "manager_secrets_role.yaml").read_text())
    secrets_role["metadata"] = {"name": SECRETS_ROLE, "namespace": NAMESPACE}
    subject = [{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": NAMESPACE}]
    ref = {"apiGroup": "rbac.authorization.k8s.io"}
    rbac_v1 = "rbac.authorization.k8s.io/v1"
    return [
        manifest("v1", "Namespace", NAMESPACE),
        manifest("v1", "ServiceAccount", SERVICE_ACCOUNT, NAMESPACE),
        role,
        manifest(
            rbac_v1, "ClusterRoleBinding", CLUSTER_ROLE,
            roleRef={**ref, "kind": "ClusterRole", "name": CLUSTER_ROLE}, subjects=subject,
        ),
        secrets_role,
        manifest(
            rbac_v1, "RoleBinding", SECRETS_ROLE, NAMESPACE,
            roleRef={**ref, "kind": "Role", "name": SECRETS_ROLE}, subjects=subject,
        ),
    ]  # fmt: skip


def _kubeconfig(cluster: Cluster, path: Path) -> Path:
    token = cluster.kubectl(
        "create", "token", SERVICE_ACCOUNT, "-n", NAMESPACE, "--duration", "6h"
    ).stdout.strip()
    admin = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    cfg = token_kubeconfig(admin["clusters"][0]["cluster"], "kueue", token)
    path.write_text(yaml.safe_dump(cfg))
    return path


@dataclass
class Kueue:
    cluster: Cluster
    proc: subprocess.Popen[bytes]
    work: Path
    log: Path
    made: list[tuple[str, str, str]] = field(default_factory=list)  # (kind, namespace, name)

    def logs(self) -> str:
        return self.log.read_text(errors="replace")

    def queue(
        self,
        namespace: str,
        *,
        gpus: int,
        resource: str = "nvidia.com/gpu",
        node_labels: dict[str, str] | None = None,
        tolerations: list[dict[str, Any]] | None = None,
    ) -> str:
        """A LocalQueue in `namespace` on a ClusterQueue of its own with `gpus` of quota
        (CPU and memory plenty); returns the LocalQueue's name. Waits until Kueue reports the
        ClusterQueue active: its controllers run."""
        suffix = secrets.token_hex(3)
        flavor, cq, lq = f"e2e-flavor-{suffix}", f"e2e-cq-{suffix}", "tuning"
        rf_spec: dict[str, Any] = {}
        if node_labels:
            rf_spec["nodeLabels"] = node_labels
        if tolerations:
            rf_spec["tolerations"] = tolerations
        quota = [
            {"name": "cpu", "nominalQuota": "1000"},
            {"name": "memory", "nominalQuota": "4Ti"},
            {"name": resource, "nominalQuota": str(gpus)},
        ]
        group = {
            "coveredResources": ["cpu", "memory", resource],
            "flavors": [{"name": flavor, "resources": quota}],
        }
        cq_spec = {"namespaceSelector": {}, "resourceGroups": [group]}
        docs = [
            manifest(f"{GROUP}/v1beta2", "ResourceFlavor", flavor, spec=rf_spec),
            manifest(f"{GROUP}/v1beta2", "ClusterQueue", cq, spec=cq_spec),
            manifest(f"{GROUP}/v1beta2", "LocalQueue", lq, namespace, spec={"clusterQueue": cq}),
        ]
        self.made += [
            ("localqueue", namespace, lq),
            ("clusterqueue", "", cq),
            ("resourceflavor", "", flavor),
        ]
        self.cluster.kubectl(
            "apply", "-f", "-", input="\n---\n".join(yaml.safe_dump(d) for d in docs)
        )

        def active() -> bool:
            got = self.cluster.kubectl_json("get", "clusterqueue", cq)
            conds = (got.get("status") or {}).get("conditions") or []
            return any(c.get("type") == "Active" and c.get("status") == "True" for c in conds)

        wait_for(active, timeout=120, interval=1, describe=f"Kueue to report {cq} Active")
        return lq

    def clean(self) -> None:
        """Remove what queue() made, while Kueue runs to drop its finalizers."""
        for kind, ns, name in reversed(self.made):
            args = ["delete", kind, name, "--ignore-not-found", "--wait=true", "--timeout=60s"]
            self.cluster.kubectl(*args, *(["-n", ns] if ns else []), check=False)
        self.made.clear()

    def stop(self) -> None:
        self.clean()
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)


def start_kueue(cluster: Cluster) -> Kueue:
    if os.geteuid() != 0:
        raise RuntimeError(
            "a real Kueue runs here in a mount namespace of its own (it reads its metrics "
            "certificate from /etc/kueue): that needs root, as the local cluster's node does"
        )
    binary, module = kueue_binary(), kueue_module()
    work = Path(tempfile.mkdtemp(prefix="tunefleet-kueue-"))
    crds = module / "config" / "components" / "crd" / "bases"
    # Server-side: the Workload CRD is over client-side apply's 256 KiB annotation.
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crds), timeout=300)
    # Polled, not `kubectl wait`: a CRD created a moment ago has no status.conditions yet, and
    # kubectl wait fails on that rather than waiting.
    established = '{.status.conditions[?(@.type=="Established")].status}'
    for crd in ("workloads", "clusterqueues", "localqueues", "resourceflavors"):
        eventually(
            lambda crd=crd: (
                cluster.kubectl(
                    "get", f"crd/{crd}.{GROUP}", "-o", f"jsonpath={established}", check=False
                ).stdout
            ),
            lambda out: out == "True",
            f"the {crd} CRD Established",
            timeout=60,
        )
    cluster.kubectl(
        "apply", "-f", "-", input="\n---\n".join(yaml.safe_dump(d) for d in _rbac(module))
    )
    kubeconfig = _kubeconfig(cluster, work / "kubeconfig")
    from tunefleet.webhook import tls

    _, cert, key = tls.generate(work / "certs", ["127.0.0.1"])
    health = free_port()
    config = document(
        "config.kueue.x-k8s.io/v1beta2",
        "Configuration",
        namespace=NAMESPACE,
        health={"healthProbeBindAddress": f"127.0.0.1:{health}"},
        metrics={"bindAddress": f"127.0.0.1:{free_port()}"},
        webhook={"host": "127.0.0.1", "port": free_port(), "certDir": str(work / "certs")},
        leaderElection={"leaderElect": False},
        internalCertManagement={"enable": False},
        manageJobsWithoutQueueName=False,
        integrations={"frameworks": ["batch/job"]},
    )
    (work / "config.yaml").write_text(yaml.safe_dump(config))
    for d in ("up", "work"):
        (work / "etc" / d).mkdir(parents=True)
    script = work / "run.sh"
    script.write_text(
        "#!/bin/sh\nset -e\n"
        f"mount -t overlay overlay -o lowerdir=/etc,upperdir={work}/etc/up,"
        f"workdir={work}/etc/work /etc\n"
        "mkdir -p /etc/kueue/metrics/certs\n"
        f"cp {cert} {key} /etc/kueue/metrics/certs/\n"
        f"exec {binary} --config {work}/config.yaml --kubeconfig {kubeconfig} "
        f"--visibility-server-port {free_port()} --feature-gates=VisibilityOnDemand=false\n"
    )
    script.chmod(0o755)
    log = work / "kueue.log"
    proc = subprocess.Popen(
        ["unshare", "--mount", "--propagation", "private", str(script)],
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    kueue = Kueue(cluster, proc, work, log)

    def ready() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"kueue exited {proc.returncode}:\n{log.read_text()[-3000:]}")
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{health}/readyz", timeout=2) as r:
            return bool(r.status == 200)

    try:
        wait_for(ready, timeout=60, interval=0.5, describe="kueue /readyz")
    except BaseException:
        kueue.stop()
        raise
    time.sleep(0.5)
    return kueue
