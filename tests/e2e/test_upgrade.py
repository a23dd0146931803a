"""`helm upgrade` from the previous release to the working tree, as users upgrade (CHANGELOG.md,
"Upgrading"), with model pods being created throughout.

The previous release is the newest line of hack/releases.txt older than this tree's version:
its tag (v<version>) where this clone has it, else the commit recorded there. Its chart and
image come from a `git worktree` of that commit: its own hack/images.sh builds
ghcr.io/tunefleet/tunefleet:<version> (buildah's layer cache shared with `make images`) and
imports it into the real node. The test installs that chart as the session's release (on the
real node, hack/local-cluster-values.yaml as the README says, two replicas), makes two AMD
profiles Ready (stand-in publish steps, as the other e2e tests do) with running model pods,
then upgrades to the working tree's chart while a model pod is created every 0.5 s, and checks:

- every profile keeps its revision and its artifacts (status.artifacts[].sha256): nothing
  retunes, and no tuning Job is made;
- every pod created before, during and after the roll is injected (label
  tunefleet.io/admission, annotation tunefleet.io/status), pinned to the same artifacts;
- the pods that ran before still run, untouched;
- `kubectl tunefleet version` says the old release before and this one after, and the new
  replicas' first log line names it.

It leaves no release (the next test that wants one installs it) and deletes its namespace;
the CRD stays at the working tree's schema (the upgrade applies it; restored if the test
stopped before the upgrade did).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from testbed.builders.fleet import profile_doc
from testbed.builders.wrappers import make_model_pod
from testbed.cluster import ensure_images, state_dir, tool_path
from testbed.operator import (
    DELIVERY_SECRET,
    RELEASE,
    ROOT,
    SERVING_SECRET,
    SYSTEM_NS,
    InCluster,
    carry_out_publish,
    chart_values_for_real_node,
    create_oci_secret,
    create_s3_secret,
    helm,
)
from testbed.poll import eventually
from tests.support.kube import apply, get_json, jobs_of, tuning_pods
from tunefleet import __version__, naming
from tunefleet.api.conditions import TYPES, Type
from tunefleet.contracts.admission_record import (
    ADMISSION_LABEL,
    ARTIFACT_SHA_ANNOTATION,
    POD_MODEL_ANNOTATION,
    STATUS_ANNOTATION,
)

# A cold build of the previous release's image installs its dependencies (apt, pip) into
# layers of its own: minutes, once; warm, the whole test takes about three.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]

RELEASES = ROOT / "hack" / "releases.txt"
CRD = "tuningprofiles.tunefleet.io"
CRD_FILE = ROOT / "crds" / "tunefleet.io_tuningprofiles.yaml"
MI300X, MI325X = "AMD_Instinct_MI300X_OAM", "AMD_Instinct_MI325X_OAM"
AMD_MODEL_LABEL = "amd.com/gpu.product-name"
IMAGE = "registry.example.com/serve:1"  # the profiles' image, and so the model pods'
REPLICAS = 2
CREATE_EVERY_S = 0.5
MAX_CREATES = 300  # 150 s of creates at most, whatever the roll does
PROFILES = {"llm-a": [MI300X], "llm-b": [MI300X, MI325X]}
# A model pod that runs on a kwok node of its GPU model (`.selector({AMD_MODEL_LABEL: model})`,
# tolerating its taint; no GPU requested, so the fake fleet's GPUs are not used up).
MODEL_POD = make_model_pod(image=IMAGE).without("metadata", "namespace").toleration("amd.com/gpu")


# --- the previous release ------------------------------------------------------------------


def semver(text: str) -> tuple[int, ...]:
    m = re.match(r"^(\d+)\.(\d+)\.(\d+)", text)
    assert m, f"{RELEASES}: {text!r} is not a version"
    return tuple(int(g) for g in m.groups())


def git(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        ["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=120
    )
    if check and done.returncode != 0:
        raise AssertionError(f"git {' '.join(args)} failed: {done.stderr.strip()}")
    return done


def previous_release() -> tuple[str, str]:
    """(version, commit) of the newest release older than the working tree: its tag's commit
    if the tag is here, else the commit hack/releases.txt recorded."""
    listed = [
        line.split()
        for line in RELEASES.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    older = [(v, c) for v, c in listed if semver(v) < semver(__version__)]
    if not older:
        pytest.fail(
            f"{RELEASES} lists no release older than {__version__}: nothing to upgrade from"
        )
    version, recorded = older[-1]
    if shutil.which("git") is None or git("rev-parse", "--git-dir", check=False).returncode:
        pytest.fail(f"no git repository at {ROOT}: the upgrade test builds v{version} from git")
    tag = git("rev-parse", "-q", "--verify", f"refs/tags/v{version}^{{commit}}", check=False)
    commit = tag.stdout.strip() if tag.returncode == 0 else recorded
    if git("cat-file", "-e", f"{commit}^{{commit}}", check=False).returncode:
        pytest.fail(
            f"release {version}'s commit {commit} is not in this clone (a shallow one?): "
            f"`git fetch origin tag v{version}` or `git fetch --unshallow`"
        )
    return version, commit


def build_release_images(tree: Path, version: str) -> None:
    """The release's own hack/images.sh, run in its worktree, builds its tunefleet image and
    imports it into the real node.

    It shares buildah's storage (so its layer cache) with `make images`, but writes its image
    archives to a folder of its own: each images.sh deletes the other archives of an image's
    name when it saves one, and the two releases would otherwise rebuild each other's every
    run. The archives of images whose inputs did not change (base, pause, stand-ins: same
    name and key) are linked in, so they are not built twice."""
    shared = Path(os.environ.get("TUNEFLEET_CACHE") or Path.home() / ".cache" / "tunefleet")
    own = shared / "releases" / version
    archives = own / "images"
    archives.mkdir(parents=True, exist_ok=True)
    (shared / "buildah").mkdir(parents=True, exist_ok=True)
    if not (own / "buildah").is_symlink():
        (own / "buildah").symlink_to(shared / "buildah")
    for link in archives.glob("*.tar"):
        if link.is_symlink() and not link.exists():
            link.unlink()  # the shared archive was rebuilt under another key
    for archive in (shared / "images").glob("*.tar"):
        mine = archives / archive.name
        fresh = not mine.is_symlink() and not mine.exists()
        if fresh and not archive.name.startswith("tunefleet-"):
            mine.symlink_to(archive)
    done = subprocess.run(
        [str(tree / "hack" / "images.sh")],
        capture_output=True,
        text=True,
        timeout=1500,
        # The release's images.sh imports with `ctr` from PATH (0.1.0 did): a fresh machine has
        # it only in the tools directory this checkout builds.
        env={
            **os.environ,
            "PATH": tool_path(),
            "TUNEFLEET_CACHE": str(own),
            "TUNEFLEET_STATE": str(state_dir()),
        },
    )
    if done.returncode != 0:
        raise AssertionError(
            f"release {version}'s hack/images.sh (in {tree}) failed ({done.returncode}):\n"
            f"{done.stderr[-4000:]}"
        )


@pytest.fixture(scope="module")
def release(cluster: Any) -> Iterator[tuple[str, Path]]:
    """(version, worktree) of the previous release, its images built and on the real node
    (the cluster is up first: images.sh imports only into a running node)."""
    version, commit = previous_release()
    tree = Path(tempfile.mkdtemp(prefix=f"tunefleet-v{version}-")) / "tree"
    git("worktree", "add", "--detach", str(tree), commit)
    try:
        ensure_images()  # this tree's first: its archives (base, pause) are the release's too
        build_release_images(tree, version)
        # Again: where the stand-ins' inputs differ, the release imported its own under the
        # same names; this puts this tree's back (an import only, seconds).
        ensure_images()
        yield version, tree
    finally:
        git("worktree", "remove", "--force", str(tree), check=False)
        git("worktree", "prune", check=False)
        shutil.rmtree(tree.parent, ignore_errors=True)


# --- the cluster side ----------------------------------------------------------------------


def install_release(cluster: Any, s3: Any, version: str, tree: Path) -> None:
    """The release's chart, installed as the README says (its local-cluster values), as the
    session's release: it creates or keeps the CRD (at its own schema) as that release."""
    cluster.kubectl("create", "namespace", SYSTEM_NS, check=False)
    create_s3_secret(
        cluster.kubectl, SYSTEM_NS, s3.reader_access_key, s3.reader_secret_key, DELIVERY_SECRET
    )
    values = {
        "operator": {
            "podAnnotations": {"tunefleet.io/image-build": f"v{version}"},
            "replicas": REPLICAS,
            "defaultS3Endpoint": s3.pod_endpoint,
            "defaultServingCredentialsSecret": SERVING_SECRET,
            "resyncSeconds": 600,
        },
        "delivery": {"credentialsSecret": DELIVERY_SECRET},
    }
    path = tree.parent / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    chart = tree / "charts" / "tunefleet"
    try:
        helm(
            cluster.bin_dir, cluster.kubeconfig,
            "install", RELEASE, str(chart), "--namespace", SYSTEM_NS,
            "-f", str(tree / "hack" / "local-cluster-values.yaml"), "-f", str(path),
            "--wait", "--timeout", "180s",
        )  # fmt: skip
    except AssertionError as e:
        raise AssertionError(
            f"installing release {version}: {e}\n{replica_report(cluster)}"
        ) from None


def upgrade_to_this_tree(cluster: Any, s3: Any) -> None:
    """`helm upgrade` to the working tree's chart with the values the other e2e tests use."""
    create_oci_secret(cluster.kubectl, SYSTEM_NS)
    try:
        helm(
            cluster.bin_dir, cluster.kubeconfig,
            "upgrade", RELEASE, str(ROOT / "charts" / "tunefleet"), "--namespace", SYSTEM_NS,
            *chart_values_for_real_node(s3.pod_endpoint, REPLICAS),
            "--set", "webhook.url=", "--set", "webhook.caBundle=",
            "--wait", "--timeout", "240s",
        )  # fmt: skip
    except AssertionError as e:
        raise AssertionError(
            f"helm upgrade to {__version__}: {e}\n{replica_report(cluster)}"
        ) from None


def replicas(cluster: Any) -> list[dict[str, Any]]:
    """Every operator replica pod of the release, terminating ones too: name, image, ready."""
    out = cluster.kubectl_json(
        "get", "pods", "-n", SYSTEM_NS, "-l", InCluster(cluster, REPLICAS).selector
    )
    found = []
    for p in out["items"]:
        if not any(
            o.get("kind") == "ReplicaSet" for o in p["metadata"].get("ownerReferences") or []
        ):
            continue  # the helm test's probe pod
        statuses = (p.get("status") or {}).get("containerStatuses") or []
        found.append(
            {
                "name": p["metadata"]["name"],
                "image": p["spec"]["containers"][0]["image"],
                "terminating": bool(p["metadata"].get("deletionTimestamp")),
                "ready": bool(statuses) and all(s.get("ready") for s in statuses),
                "phase": (p.get("status") or {}).get("phase"),
                "waiting": [
                    (s.get("state") or {}).get("waiting", {}).get("reason")
                    for s in statuses
                    if (s.get("state") or {}).get("waiting")
                ],
            }
        )
    return found


def replica_report(cluster: Any) -> str:
    try:
        return "operator replicas: " + json.dumps(replicas(cluster))
    except Exception as e:  # the report must not hide the failure it explains
        return f"operator replicas: unreadable ({e})"


def image_of(version: str) -> str:
    return f"ghcr.io/tunefleet/tunefleet:{version}"


def plugin_version(cluster: Any) -> dict[str, Any]:
    """`kubectl tunefleet version -o json`, this tree's plugin, against the cluster."""
    done = subprocess.run(
        [sys.executable, "-m", "tunefleet.plugin.main", "version", "-n", SYSTEM_NS, "-o", "json",
         "--kubeconfig", cluster.kubeconfig],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, f"kubectl tunefleet version failed: {done.stderr}"
    return dict(json.loads(done.stdout))


def restore_crd(cluster: Any) -> None:
    """The working tree's schema back on the CRD (its metadata, Helm's ownership, kept)."""
    live = get_json(cluster, "crd", CRD)
    live["spec"] = yaml.safe_load(CRD_FILE.read_text())["spec"]
    live.pop("status", None)
    cluster.kubectl("replace", "-f", "-", input=json.dumps(live), check=False)


def make_ready(cluster: Any, s3: Any, namespace: str, secret: str, prefix: str) -> None:
    storage = {"uri": f"s3://{s3.bucket}/{prefix}", "credentialsSecret": {"name": secret}}
    for name, models in PROFILES.items():
        apply(
            cluster, namespace,
            profile_doc(name, gpu={"vendor": "amd", "models": models}, storage=storage),
        )  # fmt: skip
    for name, models in PROFILES.items():
        count = len(models)
        pods = eventually(
            lambda name=name: tuning_pods(cluster, namespace, name),
            lambda ps, n=count: len(ps) == n and all(p["spec"].get("nodeName") for p in ps),
            f"{name}'s {len(models)} tuning pod(s) scheduled",
            timeout=90,
        )
        for pod in pods:
            carry_out_publish(cluster.kubectl, pod, s3.env())
    for name in PROFILES:
        eventually(
            lambda name=name: get_json(cluster, "tp", "-n", namespace, name),
            lambda p: (p.get("status") or {}).get("phase") == "Ready",
            f"{name} Ready under the previous release",
            timeout=90,
        )


def snapshot(cluster: Any, namespace: str) -> dict[str, Any]:
    """What must not move: each profile's revision and artifacts, the Jobs there are."""
    profiles = {}
    for name in PROFILES:
        status = get_json(cluster, "tp", "-n", namespace, name).get("status") or {}
        profiles[name] = {
            "revision": status.get("revision"),
            "artifacts": {a["gpuModel"]: a["sha256"] for a in status.get("artifacts") or []},
        }
    jobs = {
        j["metadata"]["uid"]: j["metadata"]["name"]
        for name in PROFILES
        for j in jobs_of(cluster, namespace, name)
    }
    return {"profiles": profiles, "jobs": jobs}


def pods_of(cluster: Any, namespace: str) -> dict[str, dict[str, Any]]:
    items = get_json(cluster, "pods", "-n", namespace, "-l", naming.PROFILE_LABEL)["items"]
    return {p["metadata"]["name"]: p for p in items}


def admission(pod: dict[str, Any]) -> dict[str, str]:
    meta = pod["metadata"]
    anns = meta.get("annotations") or {}
    return {
        "label": (meta.get("labels") or {}).get(ADMISSION_LABEL, "<none: never admitted>"),
        "status": anns.get(STATUS_ANNOTATION, ""),
        "sha256": anns.get(ARTIFACT_SHA_ANNOTATION, ""),
        "model": anns.get(POD_MODEL_ANNOTATION, ""),
    }


# --- the test ------------------------------------------------------------------------------


def test_helm_upgrade_from_the_previous_release_retunes_nothing_and_admits_every_pod(
    cluster: Any,
    s3: Any,
    no_release: None,
    release: tuple[str, Path],
    namespace: str,
    s3_secret: str,
    prefix: str,
) -> None:
    version, tree = release
    assert version != __version__
    upgraded = False
    try:
        install_release(cluster, s3, version, tree)
        deployed = InCluster(cluster, REPLICAS)
        images = {r["image"] for r in replicas(cluster)}
        assert images == {image_of(version)}, replica_report(cluster)
        (op,) = plugin_version(cluster)["operators"]
        assert op["versions"] == [version], f"kubectl tunefleet version before: {op}"

        make_ready(cluster, s3, namespace, s3_secret, prefix)
        # Model pods running under the previous release, one per profile and model.
        running = {}
        for name, models in PROFILES.items():
            for model in models:
                pod = f"before-{name}-{model.split('_')[2].lower()}"
                doc = MODEL_POD.name(pod).profile(name).selector({AMD_MODEL_LABEL: model}).obj()
                cluster.kubectl("create", "-n", namespace, "-f", "-", input=yaml.safe_dump(doc))
                running[pod] = (name, model)
        eventually(
            lambda: pods_of(cluster, namespace),
            lambda ps: all(
                ps.get(n, {}).get("status", {}).get("phase") == "Running" for n in running
            ),
            "the model pods running under the previous release",
            timeout=60,
        )
        before = snapshot(cluster, namespace)
        before_pods = {n: p for n, p in pods_of(cluster, namespace).items() if n in running}
        for n, p in before_pods.items():
            profile, model = running[n]
            got = admission(p)
            assert (got["label"], got["sha256"]) == (
                "injected", before["profiles"][profile]["artifacts"][model]
            ), f"{n} under the previous release: {got}"  # fmt: skip

        # Model pods every 0.5 s from a few seconds before the upgrade until the new replicas
        # have taken over and the old ones are gone.
        created: dict[str, float] = {}
        refused: list[str] = []
        stop = threading.Event()
        targets = [(n, m) for n, models in PROFILES.items() for m in models]

        def create_during() -> None:
            for i in range(MAX_CREATES):
                if stop.is_set():
                    return
                profile, model = targets[i % len(targets)]
                name = f"during-{i:03d}"
                created[name] = time.monotonic()
                doc = MODEL_POD.name(name).profile(profile).selector({AMD_MODEL_LABEL: model})
                out = cluster.kubectl(
                    "create", "-n", namespace, "-f", "-",
                    input=yaml.safe_dump(doc.obj()), check=False,
                )  # fmt: skip
                if out.returncode != 0:
                    refused.append(f"{name}: {out.stderr.strip()}")
                time.sleep(CREATE_EVERY_S)

        creator = threading.Thread(target=create_during, daemon=True)
        creator.start()
        try:
            time.sleep(3)
            upgrade_started = time.monotonic()
            upgrade_to_this_tree(cluster, s3)
            upgraded = True
            new_image = image_of(__version__)
            eventually(
                lambda: replicas(cluster),
                lambda rs: (
                    len(rs) == REPLICAS
                    and all(
                        r["image"] == new_image and r["ready"] and not r["terminating"] for r in rs
                    )
                ),
                f"{REPLICAS} replicas of {new_image} ready and the old ones gone",
                timeout=120,
            )
            rolled = time.monotonic()
            leader = eventually(
                deployed.leader,
                lambda h: h.split("_")[0] in {r["name"] for r in replicas(cluster)},
                "a new replica holding the Lease",
                timeout=60,
            )
            time.sleep(5)  # pods admitted by the new replicas alone
        finally:
            stop.set()
            creator.join(timeout=60)

        # The new leader has written every profile's status at least once: it lists every
        # condition type this release knows (a type added by this release shows it; where none
        # was added, this holds at once and the quiet time below is what is left).
        eventually(
            lambda: {n: get_json(cluster, "tp", "-n", namespace, n) for n in PROFILES},
            lambda ps: all(
                {c["type"] for c in (p.get("status") or {}).get("conditions") or []}
                # FleetAdoption shows only on a fleet-mode profile with no public key.
                >= set(TYPES) - {Type.FLEET_ADOPTION}
                for p in ps.values()
            ),
            f"every profile's status written by {__version__} (conditions {list(TYPES)})",
            timeout=90,
        )
        time.sleep(10)  # a quiet spell: a retune or a new Job would start in it
        after = snapshot(cluster, namespace)

        # Nothing retuned: the same revision and artifacts, no Job made.
        assert after["profiles"] == before["profiles"], (
            "the upgrade moved a profile's revision or artifacts (a retune): before "
            f"{json.dumps(before['profiles'])}, after {json.dumps(after['profiles'])}"
        )
        new_jobs = {uid: n for uid, n in after["jobs"].items() if uid not in before["jobs"]}
        assert not new_jobs, f"tuning Jobs made by the upgrade: {sorted(new_jobs.values())}"
        made = [
            line
            for r in replicas(cluster)
            for line in deployed.logs(r["name"]).splitlines()
            if f"created tuning Job {namespace}/" in line
        ]
        assert not made, f"the new operator created tuning Jobs: {made}"

        # Every pod admitted and pinned to the artifact its profile had before, none untuned,
        # none refused; the pods that ran before still run, the same pods.
        pods = pods_of(cluster, namespace)
        during = {n: p for n, p in pods.items() if n.startswith("during-")}
        assert refused == [], f"pod creates refused during the upgrade: {refused}"
        missing = sorted(set(created) - set(during))
        assert not missing, f"pods created during the upgrade that do not exist: {missing}"
        wrong = {}
        for n, p in pods.items():
            got = admission(p)
            profile = p["metadata"]["labels"][naming.PROFILE_LABEL]
            model = p["spec"]["nodeSelector"][AMD_MODEL_LABEL]
            want = before["profiles"][profile]["artifacts"].get(model)
            if (got["label"], got["status"], got["sha256"]) != ("injected", "injected", want):
                wrong[n] = {**got, "want_sha256": want, "created_s": round(
                    created.get(n, upgrade_started) - upgrade_started, 1)}  # fmt: skip
        assert not wrong, (
            f"{len(wrong)} of {len(pods)} model pods not injected with their profile's artifact "
            f"(created_s: seconds after helm upgrade started): {json.dumps(wrong, indent=1)}"
        )
        for n, p in before_pods.items():
            now = pods[n]
            assert now["metadata"]["uid"] == p["metadata"]["uid"], f"{n} was replaced"
            assert now["status"].get("phase") == "Running", f"{n}: {now['status']}"
            assert admission(now) == admission(p), f"{n}'s admission changed: {admission(now)}"

        # The roll was covered: pods created while it went on, and after.
        in_roll = [n for n, t in created.items() if upgrade_started <= t <= rolled]
        after_roll = [n for n, t in created.items() if t > rolled]
        assert len(in_roll) >= 5 and after_roll, (
            f"too few pods created during the roll ({len(in_roll)}) or after it "
            f"({len(after_roll)}) to tell: the creates are slower than {CREATE_EVERY_S} s?"
        )

        # The new release says so: kubectl tunefleet version, and each replica's first line.
        (op,) = plugin_version(cluster)["operators"]
        assert op["versions"] == [__version__] and op["images"] == [new_image], op
        for r in replicas(cluster):
            log = deployed.logs(r["name"])
            assert f"tunefleet operator {__version__} starting" in log, (
                f"{r['name']}'s log does not name {__version__}: {log[:2000]}"
            )
        print(
            "helm upgrade",
            version,
            "->",
            __version__,
            json.dumps(
                {
                    "pods": len(pods),
                    "created_during_roll": len(in_roll),
                    "created_after_roll": len(after_roll),
                    "roll_s": round(rolled - upgrade_started, 1),
                    "leader": leader,
                    "jobs": len(after["jobs"]),
                }
            ),
        )
    finally:
        if not upgraded and cluster.kubectl("get", "crd", CRD, check=False).returncode == 0:
            restore_crd(cluster)
