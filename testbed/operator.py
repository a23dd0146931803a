"""Run tunefleet on the local control plane as users run it.

Two ways, one at a time (both are the release "tunefleet" in tunefleet-system):
- `install()`: the chart installed without replicas and the operator as a process on this
  machine with the chart's ServiceAccount token, webhook reached by URL on 127.0.0.1. Fast to
  kill and restart (kill storms, scale benchmarks), and what the kwok-fleet tests use.
- `install_in_cluster()`: the chart's Deployment, from the image `make images` built, on the
  real node: ServiceAccount token, webhook through the chart's Service via kube-proxy, leader
  election between replicas. Tuning Jobs and model pods for the real node's GPU model run
  every step in real containers.

Containers do not run on kwok's fake nodes, so for those `carry_out_publish` plays a tuning
pod's last step itself: the real publish CLI uploads a stand-in results file to the real S3
server, and the pod's status gets the termination message the real step would have left.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import yaml

from testbed.builders.objects import token_kubeconfig
from testbed.cluster import (
    LOCAL_CLUSTER_VALUES,
    REAL_NODE_IP,
    TUNEFLEET_IMAGE,
    create_namespace,
    delete_namespace,
    state_dir,
    wait_for,
)

ROOT = Path(__file__).resolve().parents[1]
RELEASE = "tunefleet"
SYSTEM_NS = "tunefleet-system"
SA = "tunefleet"
# What the operator logs once its reconciler runs (handlers/startup.py).
STARTED = "tunefleet operator started"


class Kubectl(Protocol):
    def __call__(self, *args: str, check: bool = ..., input: str | None = ...) -> Any: ...


OPERATOR_KEY_SECRET = "tunefleet-e2e-operator-signing"
PUBLISHER_SECRET = "tunefleet-e2e-store-publisher"
REGISTRY_PUSHER_SECRET = "tunefleet-e2e-registry-pusher"


@contextlib.contextmanager
def operator_signing(cluster: Any, s3: Any) -> Iterator[str]:
    """The in-cluster release upgraded, for the block, with signing.secret (a key pair cosign
    made in the operator's namespace, under a name of its own each time: a replica of an
    earlier block still terminating holds that block's key), signing.storeCredentialsSecret
    (the store's writer, there too) and signing.registryCredentialsSecret (the registry's
    writer): the public key's PEM; then the release as it was."""
    from testbed.registry import Registry, cosign

    key_secret = f"{OPERATOR_KEY_SECRET}-{os.urandom(3).hex()}"
    reg = Registry.from_state()
    env = {**reg.tool_env(reg.reader), "COSIGN_PASSWORD": "e2e-operator-password"}
    env["KUBECONFIG"] = cluster.kubeconfig
    made = cosign(["generate-key-pair", f"k8s://{SYSTEM_NS}/{key_secret}"], env)
    assert made.returncode == 0, made.stderr
    raw = json.loads(
        cluster.kubectl("get", "secret", "-n", SYSTEM_NS, key_secret, "-o", "json").stdout
    )
    public = base64.b64decode(raw["data"]["cosign.pub"]).decode()
    create_s3_secret(cluster.kubectl, SYSTEM_NS, s3.access_key, s3.secret_key, PUBLISHER_SECRET)
    pusher = reg.secret(REGISTRY_PUSHER_SECRET, reg.writer)
    cluster.kubectl("apply", "-n", SYSTEM_NS, "-f", "-", input=json.dumps(pusher))
    extra: tuple[str, ...] = ("--set", f"signing.secret={key_secret}")
    extra += ("--set", f"signing.storeCredentialsSecret={PUBLISHER_SECRET}")
    extra += ("--set", f"signing.registryCredentialsSecret={REGISTRY_PUSHER_SECRET}")
    install_in_cluster(cluster, s3, extra=extra)
    _only_replicas_with(cluster, key_secret)
    try:
        yield public
    finally:
        install_in_cluster(cluster, s3)
        # Until no replica of the block's configuration is left: one still leading would build
        # the next test's Jobs for the signer and the proxies the new replicas no longer serve.
        _only_replicas_with(cluster, key_secret, without=True)
        for name in (key_secret, PUBLISHER_SECRET, REGISTRY_PUSHER_SECRET):
            cluster.kubectl("delete", "secret", "-n", SYSTEM_NS, name, check=False)


def _only_replicas_with(
    cluster: Any, secret: str, timeout: float = 120, without: bool = False
) -> None:
    """Until every operator pod of the release (terminating ones too) mounts `secret` (with
    `without`: none does): helm's --wait sees the new replicas Ready while an old one may still
    lead, and reconcile what a test applies next with the old configuration."""

    def pods() -> list[dict[str, Any]]:
        out = cluster.kubectl(
            "get", "pods", "-n", SYSTEM_NS, "-l", f"app.kubernetes.io/instance={RELEASE}",
            "-o", "json",
        ).stdout  # fmt: skip
        items = json.loads(out)["items"]
        owned = [
            p for p in items
            if any(o.get("kind") == "ReplicaSet" for o in p["metadata"].get("ownerReferences") or [])
        ]  # fmt: skip
        return owned

    def configured(items: list[dict[str, Any]]) -> bool:
        return bool(items) and all(
            without
            != any(
                (v.get("secret") or {}).get("secretName") == secret for v in p["spec"]["volumes"]
            )
            for p in items
        )

    which = "without" if without else "with"
    wait_for(
        lambda: configured(pods()), timeout, describe=f"every operator replica {which} {secret}"
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def helm(bin_dir: str, kubeconfig: str, *args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [f"{bin_dir}/helm", "--kubeconfig", kubeconfig, *args],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if done.returncode != 0:
        raise AssertionError(f"helm {' '.join(args[:2])} failed: {done.stderr.strip()}")
    return done


def upgrade_release(
    cluster: Any, *args: str, release: str = RELEASE, namespace: str = SYSTEM_NS
) -> subprocess.CompletedProcess[str]:
    """helm upgrade --install the chart as the release both ways of running use (or another
    release, in a namespace of its own: tests/e2e/test_two_releases.py)."""
    return helm(
        cluster.bin_dir,
        cluster.kubeconfig,
        "upgrade",
        "--install",
        release,
        str(ROOT / "charts" / "tunefleet"),
        "--namespace",
        namespace,
        "--create-namespace",
        *args,
    )


def uninstall_release(cluster: Any, release: str = RELEASE, namespace: str = SYSTEM_NS) -> None:
    """helm uninstall the release (if there is one) and wait until its pods are gone. The CRD
    stays (crds.keep) and with it every TuningProfile; a later `helm install` as the README
    writes it then finds the name free.

    The replicas are stopped first: a replica gives up the leader Lease as it stops, which
    needs the RBAC that `helm uninstall` deletes alongside the Deployment. Stopped by the
    uninstall itself, the leader would leave its name in the Lease, and the next install's
    replicas would wait out its duration (and show a dead leader meanwhile)."""
    done = subprocess.run(
        [f"{cluster.bin_dir}/helm", "--kubeconfig", cluster.kubeconfig, "status", release,
         "-n", namespace],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    if done.returncode != 0:
        return
    InCluster(cluster, 0, release, namespace).uninstall()
    helm(cluster.bin_dir, cluster.kubeconfig, "uninstall", release, "-n", namespace, "--wait")


def sa_kubeconfig(kubectl: Kubectl, admin_kubeconfig: str, path: Path) -> Path:
    """A kubeconfig that authenticates as the chart's ServiceAccount."""
    token = kubectl("create", "token", SA, "-n", SYSTEM_NS, "--duration", "6h").stdout.strip()
    admin = yaml.safe_load(Path(admin_kubeconfig).read_text())
    cluster = admin["clusters"][0]["cluster"]
    path.write_text(yaml.safe_dump(token_kubeconfig(cluster, SA, token)))
    return path


@dataclass
class Operator:
    """The operator process; restartable, so tests can kill it mid-way."""

    kubeconfig: Path
    env: dict[str, str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    _offset: int = 0  # where the log of the last start began

    def start(self, wait: bool = True, timeout: float = 30.0, listening_only: bool = False) -> None:
        """Start the process; with wait, return once its webhook port listens and (unless
        listening_only) its reconciler has started: the webhook listens while the caches are
        still being listed (handlers/startup.py)."""
        out = self.log.open("ab")
        self._offset = self.log.stat().st_size
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tunefleet"],
            env={**os.environ, **self.env, "KUBECONFIG": str(self.kubeconfig)},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        if not wait:
            return
        deadline = time.monotonic() + timeout
        port = int(self.env["TUNEFLEET_WEBHOOK_PORT"])
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"operator exited {self.proc.returncode}:\n{self.log.read_text()[-3000:]}"
                )
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    if not listening_only:
                        self.wait_started(max(0.0, deadline - time.monotonic()))
                    return
            time.sleep(0.2)
        raise RuntimeError(f"operator did not start:\n{self.log.read_text()[-3000:]}")

    def wait_started(self, timeout: float = 30.0) -> None:
        """After start(listening_only=True): until the reconciler has started."""
        deadline = time.monotonic() + timeout
        while not self._said(STARTED, self._offset):
            if time.monotonic() > deadline or (self.proc and self.proc.poll() is not None):
                raise RuntimeError(f"operator did not start:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.2)

    def _said(self, line: str, offset: int) -> bool:
        with self.log.open("rb") as f:
            f.seek(offset)
            return line.encode() in f.read()

    def kill(self) -> None:
        """SIGKILL: no graceful shutdown, as a crash or an evicted pod would be."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()

    def logs(self, since: int = 0) -> str:
        """The log, from byte offset `since` (see log_size) on."""
        with self.log.open("rb") as f:
            f.seek(since)
            return f.read().decode(errors="replace")

    def log_size(self) -> int:
        return self.log.stat().st_size if self.log.exists() else 0

    def rss_mib(self) -> float:
        assert self.proc is not None
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return float("nan")


def fleet_mode(cluster: Any, op: Operator, s3: Any, claim_seconds: int = 60) -> Operator:
    """`op` stopped and the same operator started in fleet mode (docs/fleet.md): the release
    upgraded with fleet.enabled (its ServiceAccount may then read kube-system), the store's
    publish identity in its environment (it writes under _fleet/), claims of `claim_seconds`.
    `leave_fleet_mode` undoes it."""
    op.stop()
    upgrade_release(cluster, "--reuse-values", "--set", "fleet.enabled=true", "--wait")
    # The registry's push identity (oci:// stores: bids and entries), where one runs.
    pusher = state_dir() / "oci" / "writer"
    fleet = replace(
        op,
        env={
            **op.env,
            "TUNEFLEET_FLEET": "true",
            "TUNEFLEET_FLEET_CLAIM_SECONDS": str(claim_seconds),
            "AWS_ACCESS_KEY_ID": s3.access_key,
            "AWS_SECRET_ACCESS_KEY": s3.secret_key,
            "AWS_REGION": s3.region,
            **({"TUNEFLEET_FLEET_OCI_CONFIG": str(pusher)} if pusher.is_dir() else {}),
        },
        proc=None,
    )
    fleet.start()
    return fleet


def operator_signs_mode(op: Operator, s3: Any, keys: Path, password: str) -> Operator:
    """`op` stopped and the same operator started as the chart's signing.secret and
    signing.storeCredentialsSecret make it (docs/trust.md): it signs with the key pair in
    `keys` (cosign.key, with `password`) and presigns tuning pods' store operations with the
    store's publish identity; the real node's pods reach its endpoint on REAL_NODE_IP. Start
    `op` again to leave it."""
    op.stop()
    key_dir = Path(tempfile.mkdtemp(prefix="tunefleet-e2e-signing-"))
    (key_dir / "cosign.key").write_bytes((keys / "cosign.key").read_bytes())
    (key_dir / "cosign.password").write_text(password)
    port = free_port()
    signs = replace(
        op,
        env={
            **op.env,
            "TUNEFLEET_WEBHOOK_ADDR": "0.0.0.0",
            "TUNEFLEET_CAPTURE_PORT": str(port),
            "TUNEFLEET_CAPTURE_URL": f"https://{REAL_NODE_IP}:{port}",
            "TUNEFLEET_SIGNING_KEY_DIR": str(key_dir),
            "TUNEFLEET_STORE_BROKER": "true",
            "TUNEFLEET_STORE_ACCESS_KEY_ID": s3.access_key,
            "TUNEFLEET_STORE_SECRET_ACCESS_KEY": s3.secret_key,
        },
        proc=None,
    )
    signs.start()
    return signs


def leave_fleet_mode(cluster: Any, fleet: Operator, op: Operator) -> None:
    fleet.stop()
    upgrade_release(cluster, "--reuse-values", "--set", "fleet.enabled=false", "--wait")
    op.start()


def install(cluster: Any, s3_endpoint: str) -> Operator:
    """helm install the chart, then start the operator as its ServiceAccount."""
    from tunefleet.webhook import tls

    work = Path(tempfile.mkdtemp(prefix="tunefleet-e2e-"))
    # The real node's pods reach this process on REAL_NODE_IP (the capture endpoint, and the
    # signing and store broker routes beside it: operator_signs_mode).
    ca, cert, key = tls.generate(work / "webhook", ["127.0.0.1", REAL_NODE_IP])
    port = free_port()
    upgrade_release(
        cluster,
        # The operator runs on this machine (containers don't run on kwok nodes): no replica
        # in the cluster, and the API server calls the webhook by URL.
        "--set",
        "operator.replicas=0",
        "--set",
        f"webhook.url=https://127.0.0.1:{port}",
        "--set-file",
        f"webhook.caBundle={ca}",
        "--set",
        "webhook.enabled=true",
        "--wait",
        "--timeout",
        "120s",
    )
    op = Operator(
        kubeconfig=sa_kubeconfig(cluster.kubectl, cluster.kubeconfig, work / "sa.kubeconfig"),
        env={
            "TUNEFLEET_IMAGE": TUNEFLEET_IMAGE,
            "TUNEFLEET_IMAGE_PULL_POLICY": "Never",
            "TUNEFLEET_METRICS_PORT": str(free_port()),
            "TUNEFLEET_WEBHOOK_PORT": str(port),
            "TUNEFLEET_WEBHOOK_ADDR": "127.0.0.1",
            "TUNEFLEET_WEBHOOK_HOST": "127.0.0.1",
            "TUNEFLEET_WEBHOOK_CERT": str(cert),
            "TUNEFLEET_WEBHOOK_KEY": str(key),
            "TUNEFLEET_DEFAULT_S3_ENDPOINT": s3_endpoint,
            # Model pods fetch with the read-only Secret (the s3_secret fixture makes it). This
            # process has no read identity of its own: artifacts are not delivered as
            # ConfigMaps, and kwok pods show the store path.
            "TUNEFLEET_DEFAULT_SERVING_CREDENTIALS_SECRET": SERVING_SECRET,
            # No model here has a real GPU: the tests write stand-in output for kwok's models
            # (hack/local-cluster-values.yaml says the same to the chart's operator).
            "TUNEFLEET_STAND_IN_MODELS": "*",
            # The real node accounts no local storage (hack/local-cluster-values.yaml).
            "TUNEFLEET_FETCH_STORAGE_REQUESTS": "false",
        },
        log=work / "operator.log",
    )
    op.start()
    return op


SERVING_SECRET = "s3-reader"  # read-only: model pods' fetch (the chart's default serving Secret)
DELIVERY_SECRET = "tunefleet-delivery"  # read-only: the operator's delivery, in SYSTEM_NS
# The operator's registry read identity (the chart's delivery.oci.credentialsSecret), in
# SYSTEM_NS: it verifies volume images with it before model pods mount them.
OCI_DELIVERY_SECRET = "tunefleet-oci-reader"


def namespace_with_secrets(cluster: Any, s3: Any, name: str) -> str:
    """Namespace `name` made in `cluster` with the two Secrets a user gives it: the publish
    one (its name returned) and the read-only one model pods fetch with."""
    api = cluster.api_client()
    try:
        create_namespace(api, name)
    finally:
        api.close()
    create_s3_secret(
        cluster.kubectl, name, s3.reader_access_key, s3.reader_secret_key, SERVING_SECRET
    )
    return create_s3_secret(cluster.kubectl, name, s3.access_key, s3.secret_key)


def drop_namespace(cluster: Any, name: str) -> None:
    api = cluster.api_client()
    try:
        delete_namespace(api, name)
    finally:
        api.close()


@contextlib.contextmanager
def user_namespace(cluster: Any, s3: Any, name: str) -> Iterator[str]:
    """namespace_with_secrets for the length of a with block (a test's fixture), then dropped."""
    namespace_with_secrets(cluster, s3, name)
    try:
        yield name
    finally:
        drop_namespace(cluster, name)


def create_s3_secret(
    kubectl: Kubectl,
    namespace: str,
    access_key: str,
    secret_key: str,
    name: str = "s3-credentials",
) -> str:
    """The Secret a user creates for tuning Jobs (profile's credentialsSecret), or another."""
    kubectl(
        "create",
        "secret",
        "generic",
        name,
        "-n",
        namespace,
        f"--from-literal=AWS_ACCESS_KEY_ID={access_key}",
        f"--from-literal=AWS_SECRET_ACCESS_KEY={secret_key}",
        check=False,  # already there from an earlier run: same content
    )
    return name


def create_oci_secret(kubectl: Kubectl, namespace: str, name: str = OCI_DELIVERY_SECRET) -> str:
    """The local registry's read-only identity as a dockerconfigjson Secret (with its CA)."""
    from testbed.registry import Registry

    doc = Registry.from_state().secret(name, Registry.from_state().reader)
    kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(doc))
    return name


# --- a tuning pod's steps, carried out by the test ----------------------------------------

STAND_IN_NOTE = (
    "stand-in: no GPU here, so this results file is a hand-written sample in TunableOp's "
    "format, not tuning output"
)


# The stand-in torch's own marks (tests/unit/data/fake_torch): what its ROCm build and its 2.15
# CUDA persona write. A hand-written sample for a kwok model carries them too, so that the
# product knows it for stand-in output (artifacts/fit.py: served to stand-in models only) and
# its validators, solutions and identity fit the model's vendor, as a real tuner's would.
_STAND_IN_DEVICE = "Stand-in GPU (tunefleet test image: computes nothing)"
_STAND_IN_VALIDATORS = {
    "amd": {
        "PT_VERSION": "2.11.0+standin",
        "HIP_VERSION": "0-standin",
        "GCN_ARCH_NAME": "gfx942:sramecc+:xnack-",
        "ROCBLAS_VERSION": "0.0.0-standin",
        "HIPBLASLT_VERSION": "0-standin",
    },
    # CUDA torch before 2.14 has only Default: the 2.15 persona, with cuBLASLt candidates.
    "nvidia": {
        "PT_VERSION": "2.15.0+standin",
        "CUBLASLT_VERSION": "130401-standin",
        "CUDA_DEVICE": _STAND_IN_DEVICE,
    },
}
_STAND_IN_IDENTITY = {
    "amd": {"torch": "2.11.0+standin", "hip": "7.0.0-standin", "arch": "gfx942:sramecc+:xnack-"},
    "nvidia": {"torch": "2.15.0+standin", "cuda": "13.2", "arch": "sm_90"},
}
_CUBLASLT = (
    "Gemm_Cublaslt_id_{}_tile_20_stages_2_splitk_1_red_0_swizzle_0_custom_0_inner_0_cluster_0"
)


def model_vendor(gpu_model: str) -> str:
    """The vendor of one of the local fleet's models (hack/fleet.yaml; the real node's
    STANDIN-NO-GPU carries NVIDIA's label)."""
    return "amd" if gpu_model.upper().startswith("AMD") else "nvidia"


def stand_in_solution(vendor: str, which: int, salt: str = "") -> str:
    """The sample's winning solution for its GEMM `which` (0 or 1; the salt changes GEMM 1's):
    a hipBLASLt and a rocBLAS kernel on AMD, two cuBLASLt ones on NVIDIA."""
    if vendor == "amd":
        return "Gemm_Hipblaslt_1234" if which == 0 else f"Gemm_Rocblas_42{salt}"
    return _CUBLASLT.format("1234" if which == 0 else f"42{salt}")


def stand_in_tuner_output(
    out: Path, config: dict[str, Any], salt: str = "", vendor: str = ""
) -> None:
    """What the tune step leaves for publish (results.csv + manifest.json), without a GPU:
    the stand-in torch's marks, and validators and solutions of the model's vendor."""
    from tuner_job.manifest import ArtifactId
    from tuner_job.output import RunFacts, write_output
    from tuner_job.results import parse_results

    vendor = vendor or model_vendor(config["gpuModel"])
    validators = "".join(f"Validator,{k},{v}\n" for k, v in _STAND_IN_VALIDATORS[vendor].items())
    results = parse_results(
        validators
        + "GemmTunableOp_BFloat16_TN,tn_4096_4096_4096_ld_4096_4096_4096,"
        + f"{stand_in_solution(vendor, 0)},0.512\n"
        + "GemmTunableOp_BFloat16_TN,tn_128_14336_4096_ld_4096_4096_128,"
        + f"{stand_in_solution(vendor, 1, salt)},0.081\n"
    )
    write_output(
        out,
        results,
        ArtifactId(
            namespace=config["namespace"],
            profile=config["profile"],
            revision=config["revision"],
            gpu_model=config["gpuModel"],
        ),
        RunFacts(
            recorded=results.gemms,
            identity={"gpuName": _STAND_IN_DEVICE, **_STAND_IN_IDENTITY[vendor]},
            seconds=1.0,
            tool_version="tunefleet-e2e-stand-in",
        ),
    )


def container(pod: dict[str, Any], name: str) -> dict[str, Any]:
    spec = pod["spec"]
    return next(c for c in spec.get("initContainers", []) + spec["containers"] if c["name"] == name)


def tool_env(extra: dict[str, str]) -> dict[str, str]:
    """The environment a pod step gets here: our console scripts on PATH, S3 settings."""
    bin_dir = str(Path(sys.executable).parent)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}", **extra}


def tuning_config(kubectl: Kubectl, pod: dict[str, Any]) -> dict[str, Any]:
    """The tune step's configuration, from the ConfigMap its pod mounts."""
    (vol,) = [v for v in pod["spec"]["volumes"] if v["name"] == "config"]
    cm = json.loads(
        kubectl(
            "get",
            "configmap",
            "-n",
            pod["metadata"]["namespace"],
            vol["configMap"]["name"],
            "-o",
            "json",
        ).stdout
    )
    return dict(json.loads(cm["data"]["config.json"]))


def played_publish(command: list[str], out: Path, work: Path) -> list[str]:
    """A pod's publish command as it runs here: its output directory here, and, with no
    kubelet to tell the operator the tune step's imageID, the image recorded by reference."""
    cmd = list(command)
    cmd[cmd.index("--dir") + 1] = str(out)
    if "--image-id-file" in cmd:
        cmd[cmd.index("--image-id-file") + 1] = str(work / "no-image-id")
        cmd += ["--image-id-timeout-seconds", "0"]
    return cmd


def carry_out_publish(
    kubectl: Kubectl, pod: dict[str, Any], s3_env: dict[str, str], salt: str = ""
) -> dict[str, Any]:
    """Run the pod's own publish command for real, then record its outcome in the pod status."""
    config = tuning_config(kubectl, pod)
    work = Path(tempfile.mkdtemp(prefix="tunefleet-pod-"))
    cmd = played_publish(container(pod, "publish")["command"], work / "out", work)
    vendor = cmd[cmd.index("--gpu-vendor") + 1] if "--gpu-vendor" in cmd else ""
    stand_in_tuner_output(work / "out", config, salt, vendor)
    message = run_step_here("publish", cmd, tool_env(s3_env), work / "termination-log", 120)
    set_pod_outcome(kubectl, pod, succeeded=True, container_name="publish", message=message)
    return dict(json.loads(message))


def run_step_here(
    step: str, cmd: list[str], env: dict[str, str], termination_log: Path, timeout: float
) -> str:
    """Run one of our pod steps' commands in this process's place; it must succeed. Returns
    the termination message it wrote (what the kubelet would have put in the pod status)."""
    done = subprocess.run(
        [*cmd, "--termination-log", str(termination_log)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, f"{step} failed: {done.stderr}"
    return termination_log.read_text()


def set_pod_outcome(
    kubectl: Kubectl, pod: dict[str, Any], *, succeeded: bool, container_name: str, message: str
) -> None:
    """Tell kwok, our stand-in kubelet, how the pod ends (hack/lib/kwok-stages.yaml).

    kwok then writes the pod status a kubelet would: phase, every container's terminated state,
    and `message` as container_name's termination message.
    """
    annotations = {
        "kwok.tunefleet.io/outcome": "Succeeded" if succeeded else "Failed",
        f"kwok.tunefleet.io/termination-message.{container_name}": message,
    }
    if not succeeded:
        annotations["kwok.tunefleet.io/failed-container"] = container_name
        annotations["kwok.tunefleet.io/exit-code"] = "1"
    kubectl(
        "annotate",
        "pod",
        "-n",
        pod["metadata"]["namespace"],
        pod["metadata"]["name"],
        "--overwrite",
        *(f"{k}={v}" for k, v in annotations.items()),
    )


# --- the chart's Deployment on the real node ---------------------------------------------


@dataclass
class InCluster:
    """The operator as the chart deploys it; `kubectl` reaches it, nothing runs here."""

    cluster: Any
    replicas: int
    release: str = RELEASE
    namespace: str = SYSTEM_NS

    @property
    def name(self) -> str:
        """The chart's fullname: slot 0's Deployment, ServiceAccount, ClusterRole, Lease prefix."""
        return self.release if "tunefleet" in self.release else f"{self.release}-tunefleet"

    @property
    def selector(self) -> str:
        """The labels of the release's operator pods and Deployments (one per replica slot)."""
        return f"app.kubernetes.io/name=tunefleet,app.kubernetes.io/instance={self.release}"

    def pods(self) -> list[dict[str, Any]]:
        out = self.cluster.kubectl(
            "get", "pods", "-n", self.namespace, "-l",
            self.selector,
            "-o", "json",
        ).stdout  # fmt: skip
        return [
            p
            for p in json.loads(out)["items"]
            if not p["metadata"].get("deletionTimestamp")
            # The Deployments' replicas (one per slot), not the helm test's probe pod.
            and any(
                o.get("kind") == "ReplicaSet" for o in p["metadata"].get("ownerReferences") or []
            )
        ]

    def leader(self) -> str:
        """The holder of the Lease (pod name_pid)."""
        lease = json.loads(
            self.cluster.kubectl(
                "get", "lease", "-n", self.namespace, f"{self.name}-operator", "-o", "json"
            ).stdout
        )
        return str(lease["spec"].get("holderIdentity") or "")

    def logs(self, pod: str, previous: bool = False) -> str:
        args = ["logs", "-n", self.namespace, pod]
        if previous:
            args.append("--previous")
        return str(self.cluster.kubectl(*args, check=False).stdout)

    def uninstall(self) -> None:
        """Back to no replicas (the process mode's chart), so a later install() stands alone,
        and wait until they are gone: a replica draining (the chart's preStop sleep) still
        leads and reconciles, and would deliver, admit and write status beside the process
        operator that comes next. Gone, they have released the Lease, too."""
        self.cluster.kubectl(
            "scale", "deployment", "-n", self.namespace, "--replicas=0", "-l",
            self.selector,
            check=False,
        )  # fmt: skip

        def replicas() -> list[str]:  # terminating ones too
            out = self.cluster.kubectl(
                "get", "pods", "-n", self.namespace, "-l",
                self.selector,
                "-o", "json",
            ).stdout  # fmt: skip
            return [
                p["metadata"]["name"]
                for p in json.loads(out)["items"]
                if any(
                    o.get("kind") == "ReplicaSet"
                    for o in p["metadata"].get("ownerReferences") or []
                )
            ]

        wait_for(
            replicas, timeout=120, describe="the operator replicas gone", until=lambda n: not n
        )


def image_build() -> str:
    """The input hash of the tunefleet image `make images` built last (its archive's name):
    as a pod annotation it rolls the Deployment when the code changed under the same tag."""
    out = subprocess.run(
        [str(ROOT / "hack" / "images.sh"), "--list"], capture_output=True, text=True, check=True
    ).stdout
    line = next(line for line in out.splitlines() if line.startswith("tunefleet "))
    return Path(line.split()[-1]).stem


def chart_values_for_real_node(s3_pod_endpoint: str, replicas: int) -> list[str]:
    """The README's values for this cluster (hack/local-cluster-values.yaml: the real node,
    its taint, pull policy Never), plus what tests need on top: model pods fetch with the
    read-only Secret, the operator delivers artifacts as ConfigMaps with its read-only one."""
    values = {
        "operator": {
            "podAnnotations": {"tunefleet.io/image-build": image_build()},
            "replicas": replicas,
            "defaultS3Endpoint": s3_pod_endpoint,
            "defaultServingCredentialsSecret": SERVING_SECRET,
            "resyncSeconds": 600,
        },
        "delivery": {
            "credentialsSecret": DELIVERY_SECRET,
            "oci": {"credentialsSecret": OCI_DELIVERY_SECRET},
        },
    }
    path = Path(tempfile.mkdtemp(prefix="tunefleet-values-")) / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    return ["-f", str(LOCAL_CLUSTER_VALUES), "-f", str(path)]


def install_in_cluster(
    cluster: Any,
    s3: Any,
    replicas: int = 2,
    release: str = RELEASE,
    namespace: str = SYSTEM_NS,
    extra: tuple[str, ...] = (),
) -> InCluster:
    """helm upgrade --install the chart with its Deployment on the real node; wait for it.
    `extra`: more helm arguments (another release's watchNamespaces, crds.install, ...)."""
    cluster.kubectl("create", "namespace", namespace, check=False)
    create_s3_secret(
        cluster.kubectl, namespace, s3.reader_access_key, s3.reader_secret_key, DELIVERY_SECRET
    )
    create_oci_secret(cluster.kubectl, namespace)
    upgrade_release(
        cluster,
        *chart_values_for_real_node(s3.pod_endpoint, replicas),
        "--set",
        "webhook.url=",
        "--set",
        "webhook.caBundle=",
        *extra,
        "--wait",
        "--timeout",
        "180s",
        release=release,
        namespace=namespace,
    )
    # A webhook CA from an earlier process-mode install may still be in place: the release
    # just rewrote the configuration, and --wait saw every replica Ready.
    return InCluster(cluster, replicas, release, namespace)


# --- a whole tuning pod's steps on this machine, for kwok pods ---------------------------

FAKE_TORCH = ROOT / "tests" / "unit" / "data" / "fake_torch"
TUNED_LINE = "tuner_job: ["  # "[3/40] GemmTunableOp_...,tn_... in 0.1s": one GEMM tuned


@dataclass
class CarriedPod:
    """What one kwok tuning pod's steps did when this machine ran them."""

    index: int
    tune_rc: int
    tuned: list[str]  # GEMMs the tuning process finished (op,params)
    message: str  # publish's termination message
    work: Path


def _index(pod: dict[str, Any]) -> str:
    meta = pod["metadata"]
    return str(
        (meta.get("annotations") or {}).get("batch.kubernetes.io/job-completion-index")
        or (meta.get("labels") or {}).get("batch.kubernetes.io/job-completion-index")
        or "0"
    )


def carry_out_tuning_pod(
    kubectl: Kubectl,
    pod: dict[str, Any],
    s3_env: dict[str, str],
    torch_env: dict[str, str],
    *,
    kill_after_gemms: int | None = None,
    outcome: bool = True,
) -> CarriedPod:
    """Run a kwok tuning pod's own steps here, with the stand-in torch: sync (the sidecar),
    tune (`python -m tuner_job run`, the pod's argv), publish; then tell kwok how it ended.

    With kill_after_gemms, the tuning process group is SIGKILLed once that many GEMMs are in
    progress.csv (a node lost mid-tuning), the sidecar gets the kubelet's SIGTERM, and the pod
    is reported Failed: the Job makes a new pod for the index, which should resume.
    """
    index = _index(pod)
    work = Path(tempfile.mkdtemp(prefix=f"tunefleet-pod-{index}-"))
    exchange, out = work / "exchange", work / "out"
    exchange.mkdir()
    out.mkdir()
    config = tuning_config(kubectl, pod)
    config["exchange"]["dir"] = str(exchange)
    (work / "config.json").write_text(json.dumps(config))
    index_env = {"JOB_COMPLETION_INDEX": index}

    def here(cmd: list[str]) -> list[str]:
        cmd = list(cmd)
        for flag, value in (("--exchange", exchange), ("--dir", out)):
            if flag in cmd:
                cmd[cmd.index(flag) + 1] = str(value)
        return cmd

    sync = subprocess.Popen(
        here(container(pod, "sync")["command"]),
        env=tool_env({**s3_env, **index_env}),
        stdout=subprocess.DEVNULL,
        stderr=(work / "sync.log").open("w"),
        start_new_session=True,
    )
    tuner_env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("AWS_", "PYTORCH_", "TUNEFLEET_", "FAKE_TORCH_"))
    }
    tuner_env.update(torch_env)
    tuner_env.update(index_env)
    tuner_env["PYTHONPATH"] = os.pathsep.join([str(FAKE_TORCH), str(ROOT)])
    tune_args = container(pod, "tune").get("args") or []
    tuner = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tuner_job",
            "--termination-log",
            str(work / "tune-tl"),
            "run",
            "--config",
            str(work / "config.json"),
            "--out",
            str(out),
            "--",
            *tune_args,
        ],
        env=tuner_env,
        cwd=work,
        stdout=(work / "tune.out").open("w"),
        stderr=(work / "tune.log").open("w"),
        start_new_session=True,
    )
    killed = False
    if kill_after_gemms is not None:
        progress = exchange / "progress.csv"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and tuner.poll() is None:
            rows = progress.read_text().splitlines() if progress.exists() else []
            if sum(1 for r in rows if not r.startswith("Validator,")) >= kill_after_gemms:
                os.killpg(tuner.pid, signal.SIGKILL)
                killed = True
                break
            time.sleep(0.05)
    rc = tuner.wait(timeout=600)
    message, published = "", False
    if rc == 0 and not killed:
        cmd = played_publish(container(pod, "publish")["command"], out, work)
        env = tool_env({**s3_env, **index_env})
        message = run_step_here("publish", cmd, env, work / "publish-tl", 180)
        published = True
    sync.send_signal(signal.SIGTERM)  # the kubelet, once the pod's main container is done
    sync.wait(timeout=60)
    tuned = [
        line.split("] ", 1)[1].rsplit(" in ", 1)[0]
        for line in (work / "tune.log").read_text().splitlines()
        if line.startswith(TUNED_LINE) and "] " in line
    ]
    if outcome:
        if published:
            set_pod_outcome(kubectl, pod, succeeded=True, container_name="publish", message=message)
        else:
            reason = "tuner_job: killed (node lost)" if killed else (work / "tune-tl").read_text()
            set_pod_outcome(kubectl, pod, succeeded=False, container_name="tune", message=reason)
    return CarriedPod(int(index), rc, tuned, message, work)


def carry_out_merge(
    kubectl: Kubectl, pod: dict[str, Any], s3_env: dict[str, str]
) -> dict[str, Any]:
    """Run the merge Job's pod's own command here, then tell kwok it succeeded."""
    work = Path(tempfile.mkdtemp(prefix="tunefleet-merge-"))
    cmd = container(pod, "merge")["command"]
    message = run_step_here("merge", cmd, tool_env(s3_env), work / "tl", 300)
    set_pod_outcome(kubectl, pod, succeeded=True, container_name="merge", message=message)
    return dict(json.loads(message))
