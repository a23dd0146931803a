"""kubectl tunefleet on the local control plane: the installed console script, run as a user
runs it (KUBECONFIG and the S3 settings in its environment), against profiles the operator
made Ready with artifacts really published to the S3 server (stand-in results: no GPU here).

Pods run on kwok nodes, so their fetch init container does not run there: where a verdict
depends on what fetch said, the test runs the pod's own fetch command here, against the real
S3 server, and gives kwok its termination message (testbed/operator.py does the same for
tuning pods' publish step).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from testbed.builders.fleet import pod_doc, profile_doc
from testbed.operator import (
    STAND_IN_NOTE,
    Operator,
    container,
    free_port,
    stand_in_solution,
    tool_env,
)
from testbed.poll import eventually
from tests.support.fleet import publish_first_revision, publish_next_revision, ready_profile
from tests.support.kube import apply, create
from tests.support.kube import pod_of as stored

pytestmark = pytest.mark.e2e

PLUGIN = Path(sys.executable).parent / "kubectl-tunefleet"
H200 = "NVIDIA-H200"
CHANGED_GEMM = "tn_128_14336_4096_ld_4096_4096_128"  # the row carry_out_publish's salt changes
OUTCOME = "kwok.tunefleet.io/outcome"
FETCH = "tunefleet-fetch"


def plugin(cluster: Any, s3: Any, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KUBECONFIG": cluster.kubeconfig, **s3.env()}
    done = subprocess.run(
        [str(PLUGIN), *args], env=env, capture_output=True, text=True, timeout=180
    )
    print(f"$ kubectl tunefleet {' '.join(args)}  (exit {done.returncode})")
    print(done.stdout + done.stderr)
    return done


def ok(cluster: Any, s3: Any, *args: str) -> str:
    done = plugin(cluster, s3, *args)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    return done.stdout


def as_json(cluster: Any, s3: Any, *args: str) -> Any:
    return json.loads(ok(cluster, s3, *args, "-o", "json"))


def one_line_error(done: subprocess.CompletedProcess[str], code: int = 1) -> str:
    assert done.returncode == code, (done.returncode, done.stdout, done.stderr)
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("kubectl-tunefleet: error: "), done.stderr
    return lines[0]


def held_pod(cluster: Any, namespace: str, name: str, profile: str) -> dict[str, Any]:
    """A model pod whose init containers kwok keeps running until the test says how they end."""
    doc = pod_doc(name, profile)
    doc["metadata"]["annotations"] = {OUTCOME: "Initializing"}
    create(cluster, namespace, doc)
    return eventually(
        lambda: stored(cluster, namespace, name),
        lambda p: any(
            "running" in (s.get("state") or {})
            for s in (p.get("status") or {}).get("initContainerStatuses") or []
        ),
        f"{name}'s init containers running",
    )


def run_fetch(pod: dict[str, Any], s3: Any, **replace: str) -> str:
    """The pod's own fetch command, here, against the real S3 server: its termination message."""
    cmd = list(container(pod, FETCH)["command"])
    work = Path(tempfile.mkdtemp(prefix="tunefleet-fetch-"))
    cmd[cmd.index("--dest") + 1] = str(work / "results")
    for flag, value in replace.items():
        cmd[cmd.index(flag) + 1] = value
    done = subprocess.run(
        [*cmd, "--termination-log", str(work / "tl")],
        env=tool_env(s3.env()),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr  # fail open: exit 0 either way
    return (work / "tl").read_text().strip()


def finish_fetch(cluster: Any, namespace: str, name: str, message: str) -> dict[str, Any]:
    cluster.kubectl(
        "annotate",
        "pod",
        "-n",
        namespace,
        name,
        "--overwrite",
        f"kwok.tunefleet.io/termination-message.{FETCH}={message}",
        f"{OUTCOME}=Running",
    )
    return eventually(
        lambda: stored(cluster, namespace, name),
        lambda p: any(
            s["name"] == FETCH and "terminated" in (s.get("state") or {})
            for s in (p.get("status") or {}).get("initContainerStatuses") or []
        ),
        f"{name}'s fetch init container terminated",
    )


def test_status_and_why_tell_each_pod_what_happened_and_what_to_do(
    cluster: Any, operator: Operator, s3: Any, namespace: str
) -> None:
    print(STAND_IN_NOTE)
    ns = ["-n", namespace]
    prof = ready_profile(cluster, s3, namespace, "serve", [H200])
    art = prof["status"]["artifacts"][0]
    sha = art["sha256"]

    # status: one screen, the artifact with its counts, and the profile's Events.
    text = eventually(
        lambda: ok(cluster, s3, "status", "serve", *ns),
        lambda out: "Artifacts published" in out,
        "status showing the Ready Event",
    )
    assert f"TuningProfile {namespace}/serve: Ready" in text
    assert f"{H200}  {sha[:12]}  2/2 GEMMs tuned (0 Default)" in text
    assert "ArtifactsPublished" in text and art["uri"] in text
    assert "recorded 2" in text and "History:" in text
    assert text.index("Ready ") < text.index("TuningJobCreated")  # newest Event first
    report = as_json(cluster, s3, "status", "serve", *ns)
    assert report["phase"] == "Ready"
    assert report["models"][0]["artifact"]["sha256"] == sha
    assert report["models"][0]["artifact"]["current"] is True
    conditions = {c["type"]: c["status"] for c in report["conditions"]}
    assert conditions == {
        "Ready": "True",
        "Progressing": "False",
        "Failed": "False",
        "Degraded": "False",
    }
    assert report["jobs"][0]["state"] == "Succeeded"

    # why, injected and loaded: the pod's own fetch ran (here) and said what it wrote.
    held = held_pod(cluster, namespace, "loaded", "serve")
    early = as_json(cluster, s3, "why", "loaded", *ns)
    assert (early["verdict"], early["tuned"]) == ("injected", None)
    assert early["fetch"]["state"] == "running"
    finish_fetch(cluster, namespace, "loaded", run_fetch(held, s3))
    out = ok(cluster, s3, "why", "loaded", *ns)
    assert f"tuned: injected, artifact {sha[:12]} loaded for {H200}" in out
    assert "server (ENABLED=1, TUNING=0" in out
    verdict = as_json(cluster, s3, "why", "loaded", *ns)
    assert verdict["tuned"] is True and verdict["artifact"]["sha256"] == sha

    # why, injected but the fetch failed open at start-up: the real CLI's verification failure
    # (a manifest that is not the one status pinned), as kwok reports it.
    held = held_pod(cluster, namespace, "bad-manifest", "serve")
    message = run_fetch(held, s3, **{"--manifest-sha256": "0" * 64})
    assert "starting untuned" in message
    finish_fetch(cluster, namespace, "bad-manifest", message)
    out = ok(cluster, s3, "why", "bad-manifest", *ns)
    assert "not tuned: injected, but the fetch init container started it untuned" in out
    assert "manifest.json has SHA-256" in out and "does not verify" in out
    assert as_json(cluster, s3, "why", "bad-manifest", *ns)["verdict"] == "untuned-at-start"
    # ... and the profile no longer says Ready of it: Degraded names the pod and its cause.
    degraded = eventually(
        lambda: as_json(cluster, s3, "status", "serve", *ns),
        lambda report: report["phase"] == "Degraded",
        "status saying Degraded for the pod that started untuned",
    )
    said = {c["type"]: c for c in degraded["conditions"]}["Degraded"]
    assert said["status"] == "True" and "bad-manifest" in said["message"]

    # why, injected with an image warning.
    create(
        cluster, namespace, pod_doc("other-image", "serve", image="registry.example.com/other:9")
    )
    out = ok(cluster, s3, "why", "other-image", *ns)
    assert "Image warning:" in out and "registry.example.com/other:9" in out

    # why, untuned by the webhook: a profile without an artifact yet; its reason quoted.
    apply(cluster, namespace, profile_doc("pending", gpu={"vendor": "nvidia", "models": [H200]}))
    create(cluster, namespace, pod_doc("early", "pending"))
    reason = stored(cluster, namespace, "early")["metadata"]["annotations"]["tunefleet.io/status"]
    out = eventually(
        lambda: ok(cluster, s3, "why", "early", *ns),
        lambda out: "PodUntuned" in out,
        "why showing the PodUntuned Event",
    )
    assert "not tuned: the webhook admitted it untuned" in out
    assert f'"{reason.removeprefix("untuned: ")}"' in out
    assert f"wait until `kubectl tunefleet status pending -n {namespace}` shows Ready" in out
    verdict = as_json(cluster, s3, "why", "early", *ns)
    assert (verdict["verdict"], verdict["code"]) == ("untuned", "no_artifact")

    # why, a pod that never asked, then labelled after creation: the webhook never saw it.
    create(cluster, namespace, pod_doc("plain", None))
    assert "it never asked for tuning" in ok(cluster, s3, "why", "plain", *ns)
    cluster.kubectl("label", "pod", "-n", namespace, "plain", "tunefleet.io/profile=serve")
    out = ok(cluster, s3, "why", "plain", *ns)
    assert "not tuned: the tunefleet webhook never saw this pod" in out
    assert "recreate it while the tunefleet webhook is up" in out
    assert as_json(cluster, s3, "why", "plain", *ns)["verdict"] == "unadmitted"

    # Expected failures: one line, what to do, no traceback.
    line = one_line_error(plugin(cluster, s3, "status", "nope", *ns))
    assert line == (
        f"kubectl-tunefleet: error: TuningProfile 'nope' not found in namespace '{namespace}': "
        f"list them with `kubectl get tp -n {namespace}`"
    )
    assert "Pod 'nope' not found" in one_line_error(plugin(cluster, s3, "why", "nope", *ns))


def test_download_verifies_and_diff_shows_what_a_retune_changed(
    cluster: Any, operator: Operator, s3: Any, namespace: str
) -> None:
    print(STAND_IN_NOTE)
    ns = ["-n", namespace]
    first, old, v1 = publish_first_revision(cluster, s3, namespace, "retune")
    art = v1["status"]["artifacts"][0]

    # download: the verified results, one file per device, and the manifest status pins.
    dest = Path(tempfile.mkdtemp(prefix="kubectl-tunefleet-")) / "v1"
    out = ok(
        cluster,
        s3,
        "download",
        "retune",
        *ns,
        "--gpu-model",
        H200,
        "--dest",
        str(dest),
        "--devices",
        "2",
    )
    assert f"Verified {art['uri']}" in out and "manifest SHA-256 as pinned in status" in out
    names = sorted(p.name for p in dest.iterdir())
    assert names == ["manifest.json", "tunableop_results0.csv", "tunableop_results1.csv"]
    for f in ("tunableop_results0.csv", "tunableop_results1.csv"):
        assert hashlib.sha256((dest / f).read_bytes()).hexdigest() == old["sha256"]
        assert str(dest / f) in out
    manifest = (dest / "manifest.json").read_bytes()
    assert hashlib.sha256(manifest).hexdigest() == art["manifestSha256"]
    assert json.loads(manifest)["resultsSha256"] == old["sha256"]
    again = as_json(cluster, s3, "download", "retune", *ns, "--dest", str(dest))  # one model
    assert again["files"] == [str(dest / "tunableop_results0.csv")]
    assert again["manifestSha256"] == art["manifestSha256"]

    # S3 unreachable: one line naming the endpoint, nothing written.
    elsewhere = f"http://127.0.0.1:{free_port()}"
    empty = dest.parent / "nothing"
    line = one_line_error(
        plugin(
            cluster,
            s3,
            "download",
            "retune",
            *ns,
            "--dest",
            str(empty),
            "--endpoint-url",
            elsewhere,
            "--timeout",
            "20",
        )
    )
    assert f"cannot download the artifact (downloading {art['uri']}/" in line and elsewhere in line
    assert not empty.exists() or not any(empty.iterdir())

    # A spec change retunes; a different result is published.
    apply(cluster, namespace, profile_doc("retune", image="registry.example.com/serve:2"))
    v2 = publish_next_revision(cluster, s3, namespace, "retune", first)
    new_uri = v2["status"]["artifacts"][0]["uri"]
    assert "1 earlier artifact" in ok(cluster, s3, "status", "retune", *ns)
    assert as_json(cluster, s3, "status", "retune", *ns)["history"]["count"] == 1

    # diff of the two artifacts by URI: the one GEMM whose solution changed, with its times.
    done = plugin(cluster, s3, "diff", art["uri"], new_uri)
    assert done.returncode == 1, done.stderr  # they differ, as diff(1) says it
    assert "Changed (1): another solution won" in done.stdout
    assert f"~ GemmTunableOp_BFloat16_TN {CHANGED_GEMM}" in done.stdout
    before, after = stand_in_solution("nvidia", 1), stand_in_solution("nvidia", 1, "v2")
    assert f"{before} 0.081 ms -> {after} 0.081 ms (+0 ms, x1.00)" in done.stdout
    assert "Summary: 1 changed, 0 added, 0 removed, 1 same solution" in done.stdout
    report = json.loads(plugin(cluster, s3, "diff", art["uri"], new_uri, "-o", "json").stdout)
    (changed,) = report["changed"]
    assert (changed["params"], changed["before"]["solution"], changed["after"]["solution"]) == (
        CHANGED_GEMM,
        before,
        after,
    )
    assert report["summary"]["changed"] == 1 and report["validators"] == []

    # The local download against the profile's current artifact: the same difference.
    done = plugin(cluster, s3, "diff", str(dest), f"{namespace}/retune:{H200}")
    assert done.returncode == 1 and "Summary: 1 changed, 0 added, 0 removed" in done.stdout
    # The profile against its own current URI: identical, exit 0.
    done = plugin(cluster, s3, "diff", "retune", new_uri, *ns)
    assert done.returncode == 0 and "(identical)" in done.stdout, done.stderr

    line = one_line_error(plugin(cluster, s3, "diff", "retune", "Not_A/Ref!", *ns), code=2)
    assert "neither an artifact" in line
