"""kubectl tunefleet without a cluster: status and why from fixture dicts (pods admitted by the
real webhook code, so a drift in its reasons or annotations fails here), diff on small CSVs,
download through tunefleet-fetch's checks on a directory store, and one-line errors."""

from __future__ import annotations

import copy
import datetime
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from testbed.builders.wrappers import make_artifact, make_object, make_pod, make_profile
from tests.support.fake_cluster import FakeCluster
from tunefleet.config import Config
from tunefleet.plugin import cluster as cluster_mod
from tunefleet.plugin import main as main_mod
from tunefleet.plugin.diff_cmd import diff_results, format_diff, parse_ref
from tunefleet.plugin.status_cmd import format_status, status_report
from tunefleet.plugin.why_cmd import explain, format_why
from tunefleet.webhook.admission import admit as inject
from tuner_job.files import sha256_hex
from tuner_job.manifest import ArtifactId
from tuner_job.output import RunFacts, build_output
from tuner_job.results import parse_results

NOW = datetime.datetime(2026, 11, 30, 12, 0, 0, tzinfo=datetime.UTC)
H100, H200 = "NVIDIA-H100-80GB-HBM3", "NVIDIA-H200"
SHA, SHA2 = "ab" * 32, "cd" * 32
KEY = "nvidia.com/gpu.product"


# What the publisher records of a finished tuning run of H200 at revision rev2, beside where
# its artifact is (make_artifact).
RUN = {
    "manifestSha256": "ef" * 32,
    "gemms": 412,
    "outcomes": {"tuned": 400, "default": 12},
    "recorded": 412,
    "reused": 300,
    "resumed": 10,
    "newlyTuned": 102,
    "shards": 4,
    "tunedAt": "2026-11-30T11:00:00Z",
    "tuningSeconds": 1234.5,
    "image": {
        "reference": "registry.example.com/serve:1",
        "id": "registry.example.com/serve@sha256:" + "1" * 64,
    },
    "revision": "rev2",
    "job": f"tune-llm-{H200.lower()}-1234",
}
ARTIFACT = make_artifact(H200, SHA, profile="llm").fields(**RUN)
ARTIFACT2 = make_artifact(H200, SHA2, profile="llm").fields(**RUN)
EARLIER = ARTIFACT2.revision("rev1")
ARTIFACT_H100 = (
    make_artifact(H100, SHA, profile="llm")
    .fields(**RUN)
    .fields(job=f"tune-llm-{H100.lower()}-1234")
)
# TuningProfile ml/llm, Ready: H200's artifact of rev2 served, one of rev1 in history.
LLM = (
    make_profile("llm")
    .uid("u1")
    .generation(3)
    .image("registry.example.com/serve:1")
    .gpu("nvidia", H200)
    .status(
        observedGeneration=3,
        phase="Ready",
        revision="rev2",
        conditions=[
            {
                "type": "Ready",
                "status": "True",
                "reason": "ArtifactsPublished",
                "message": "1 of 1 GPU models have an artifact.",
            },
            {
                "type": "Progressing",
                "status": "False",
                "reason": "TuningFinished",
                "message": "Tuning of revision rev2 has finished.",
            },
            {
                "type": "Failed",
                "status": "False",
                "reason": "NoFailures",
                "message": "No tuning Job of this revision failed.",
            },
        ],
    )
    .artifacts(ARTIFACT)
    .status(
        jobs=[{"gpuModel": H200, "name": "tune-llm-h200-1234", "state": "Succeeded", "message": ""}]
    )
    .history(EARLIER)
    .status(unadmittedPods=0, progress="")
)
TUNING = LLM.artifacts().phase("Tuning")


def event(
    reason: str, message: str, minutes_ago: int, type_: str = "Normal", **over: Any
) -> dict[str, Any]:
    when = (NOW - datetime.timedelta(minutes=minutes_ago)).strftime("%Y-%m-%dT%H:%M:%SZ")
    ev = {"type": type_, "reason": reason, "message": message, "lastTimestamp": when, "count": 1}
    ev.update(over)
    return ev


# --- status ------------------------------------------------------------------------------


def test_status_of_a_ready_profile_shows_the_artifact_jobs_history_and_events() -> None:
    events = [
        event("TuningJobCreated", "Created tuning Job tune-llm-h200-1234.", 70),
        event("Ready", "Artifacts published: NVIDIA-H200@abababababab", 59, count=2),
    ]
    report = status_report(LLM.obj(), events)
    text = format_status(report, NOW)
    assert text.splitlines()[:12] == [
        "TuningProfile ml/llm: Ready (revision rev2; generation 3, observed 3)",
        "Conditions:",
        "  Ready        True   ArtifactsPublished  1 of 1 GPU models have an artifact.",
        "  Progressing  False  TuningFinished      Tuning of revision rev2 has finished.",
        "  Failed       False  NoFailures          No tuning Job of this revision failed.",
        "Artifacts:",
        "  NVIDIA-H200  abababababab  400/412 GEMMs tuned (12 Default)",
        f"    uri       s3://bkt/p/ml/llm/NVIDIA-H200/{SHA}",
        "    GEMMs     recorded 412, reused 300, resumed 10, newly tuned 102, shards 4",
        "    tuned at  2026-11-30T11:00:00Z (60m ago), tuning 20.6m",
        "    image     registry.example.com/serve:1 (id registry.example.com/serve@sha256:"
        + "1" * 64
        + ")",
        "    revision  rev2 (current)",
    ]
    assert "  NVIDIA-H200  tune-llm-h200-1234  Succeeded  -" in text
    assert "History:          1 earlier artifact\n" in text
    assert "Unadmitted pods:  0\n" in text
    assert text.endswith(
        "Events (newest first):\n"
        "  59m  Normal  Ready             Artifacts published: NVIDIA-H200@abababababab (x2)\n"
        "  70m  Normal  TuningJobCreated  Created tuning Job tune-llm-h200-1234.\n"
    )
    # The json form carries the same content.
    data = json.loads(json.dumps(report))
    assert data["phase"] == "Ready" and data["history"]["count"] == 1
    art = data["models"][0]["artifact"]
    assert (art["sha256"], art["shortSha256"], art["current"]) == (SHA, SHA[:12], True)
    assert [e["reason"] for e in data["events"]] == ["Ready", "TuningJobCreated"]


def test_status_shows_each_cache_and_why_one_was_not_served() -> None:
    art = ARTIFACT.fields(
        kind="caches",
        caches=[{"kind": "torchCompile", "name": "torchcompile", "sha256": "cd" * 32,
                 "size": 3 << 20, "files": 41, "bytes": 9 << 20}],
        cachesSkipped=[{"kind": "cache", "name": "fi", "reason": "empty: the workload "
                        "wrote nothing under FI_DIR"}],
    ).obj()  # fmt: skip
    text = format_status(status_report(LLM.artifacts(art).obj(), []), NOW)
    assert "  NVIDIA-H200  abababababab  caches only (no TunableOp results)" in text
    rows = {" ".join(line.split()[:2]): " ".join(line.split()[2:]) for line in text.splitlines()}
    assert rows["cache torchcompile"] == (
        "torchCompile: 41 file(s), 3.0 MiB packed, sha256 cdcdcdcdcdcd"
    )
    assert rows["cache fi"] == "not served: empty: the workload wrote nothing under FI_DIR"


def test_status_shows_an_oci_bundle_its_signature_and_how_pods_get_it() -> None:
    digest, volume = "sha256:" + "e" * 64, "sha256:" + "f" * 64
    art = ARTIFACT.fields(
        bundle={"digest": digest, "signed": True, "volume": volume}, delivery="ImageVolume"
    ).obj()
    text = format_status(status_report(LLM.artifacts(art).obj(), []), NOW)
    lines = [" ".join(line.split()) for line in text.splitlines()]
    assert f"bundle {digest} (signed)" in lines
    assert f"volume image {volume}" in lines
    assert "served by ImageVolume" in lines
    unsigned = ARTIFACT.fields(bundle={"digest": digest}).obj()
    text = format_status(status_report(LLM.artifacts(unsigned).obj(), []), NOW)
    assert f"bundle {digest} (not signed)" in [" ".join(x.split()) for x in text.splitlines()]


def test_status_while_retuning_shows_earlier_artifacts_blocked_and_sharded_jobs() -> None:
    prof = (
        LLM.gpu("nvidia", H100, H200)
        .artifacts(ARTIFACT.revision("rev1"))
        .status(
            phase="Pending",
            progress=f"{H100}: pending; {H200}: 1/4 shards",
            unadmittedPods=2,
            jobs=[
                {
                    "gpuModel": H100,
                    "name": "tune-a",
                    "state": "Pending",
                    "reason": "Unschedulable",
                    "message": "no node has nvidia.com/gpu.product=X",
                },
                {
                    "gpuModel": H200,
                    "name": "tune-b",
                    "state": "Running",
                    "shards": "1/4",
                    "message": "",
                },
            ],
        )
        .obj()
    )
    text = format_status(status_report(prof, []), NOW)
    assert f"  {H100}  no artifact yet (phase Pending)" in text
    assert "    revision  rev1 (earlier; revision rev2 tunes)" in text
    assert f"  {H100}  tune-a  Pending  Unschedulable  no node has nvidia.com/gpu.product=X" in text
    assert f"  {H200.ljust(len(H100))}  tune-b  Running  shards 1/4" in text
    assert f"Progress:         {H100}: pending; {H200}: 1/4 shards" in text
    assert "Unadmitted pods:  2 (created while the webhook was unreachable" in text
    assert "'tunefleet.io/profile=llm,!tunefleet.io/admission'" in text
    assert text.endswith("Events (newest first):\n  (none)\n")


def test_status_of_a_new_profile_without_status_and_a_default_only_artifact() -> None:
    fresh = LLM.obj()
    del fresh["status"]
    report = status_report(fresh, [])
    text = format_status(report, NOW)
    assert text.startswith("TuningProfile ml/llm: Pending (generation 3, observed -)\n")
    assert "  Ready        Unknown  -" in text
    assert f"  {H200}  no artifact yet (phase Pending)" in text
    assert "  (none for this revision)" in text
    flat = ARTIFACT.fields(
        outcomes={"tuned": 0, "default": 412}, librarySkipped=2, librarySkippedReason="bad sha"
    ).obj()
    text = format_status(status_report(LLM.artifacts(flat).obj(), []), NOW)
    assert "0/412 GEMMs tuned (412 Default)" in text
    assert "note      no GEMM where a kernel beat Default" in text
    assert "library   2 entr(y/ies) skipped: bad sha" in text


def test_status_shows_the_ten_newest_events_of_many() -> None:
    events = [event("E", f"event {i}", minutes_ago=i) for i in range(1, 16)]
    report = status_report(LLM.obj(), list(reversed(events)))
    assert [e["message"] for e in report["events"]] == [f"event {i}" for i in range(1, 11)]
    # eventTime-only Events (events.k8s.io posters) sort in too.
    newer = {
        "type": "Warning",
        "reason": "X",
        "message": "newest",
        "eventTime": "2026-11-30T11:59:59.123456Z",
    }
    assert status_report(LLM.obj(), [*events, newer])["events"][0]["message"] == "newest"


def test_status_of_a_degraded_profile_shows_the_condition_and_its_message() -> None:
    message = (
        "1 model pod(s) run without the artifact: 1 fetch_failed (connection refused; pods: "
        "m-1). `kubectl tunefleet why <pod>` says more; once the cause is fixed, recreate them "
        "(e.g. kubectl rollout restart)."
    )
    prof = LLM.phase("Degraded").obj()
    prof["status"]["conditions"].append(
        {"type": "Degraded", "status": "True", "reason": "PodsStartedUntuned", "message": message}
    )
    report = status_report(prof, [])
    assert report["phase"] == "Degraded"
    assert [c["type"] for c in report["conditions"]] == [
        "Ready",
        "Progressing",
        "Failed",
        "Degraded",
    ]
    text = format_status(report, NOW)
    assert text.splitlines()[0] == (
        "TuningProfile ml/llm: Degraded (revision rev2; generation 3, observed 3)"
    )
    assert f"  Degraded     True   PodsStartedUntuned  {message}" in text.splitlines()
    # Served again: the condition stays, False.
    prof["status"]["phase"] = "Ready"
    prof["status"]["conditions"][-1] = {
        "type": "Degraded",
        "status": "False",
        "reason": "PodsServed",
        "message": "No model pod runs untuned for a cause of tunefleet's.",
    }
    text = format_status(status_report(prof, []), NOW)
    assert any(
        line.split()[:3] == ["Degraded", "False", "PodsServed"] for line in text.splitlines()
    )
    # A status written by an operator before 0.2.0 has no Degraded condition: none is shown
    # (not an "Unknown" row).
    old = status_report(LLM.obj(), [])
    assert [c["type"] for c in old["conditions"]] == ["Ready", "Progressing", "Failed"]
    assert "Degraded" not in format_status(old, NOW)


# --- why ---------------------------------------------------------------------------------

CFG = Config(image="tunefleet:1")


# Model pod ml/m-1 of profile llm: a server asking for two GPUs and a proxy in another image.
POD = (
    make_pod("m-1")
    .profile("llm")
    .selector({})
    .container("server", "registry.example.com/serve:1", gpus=2)
    .container("proxy", "envoy:1")
)


def admitted(pod: dict[str, Any], prof: dict[str, Any] | None) -> dict[str, Any]:
    """The pod as the webhook's own code admits it (fail open)."""
    decision = inject(pod, "llm", prof, CFG)
    assert decision.deny is None
    return dict(decision.pod)


def fetch_ended(pod: dict[str, Any], message: str, exit_code: int = 0) -> dict[str, Any]:
    pod = copy.deepcopy(pod)
    pod["status"] = {
        "initContainerStatuses": [
            {
                "name": "tunefleet-fetch",
                "state": {"terminated": {"exitCode": exit_code, "message": message}},
            }
        ]
    }
    return pod


LOADED = f"tunefleet-fetch: wrote 2 results file(s) with 412 tuned GEMMs (sha256 {SHA}) to /tunefleet/results/tunableop_results%d.csv"


def test_why_injected_and_loaded_names_the_artifact_and_the_containers() -> None:
    prof = LLM.obj()
    pod = fetch_ended(admitted(POD.obj(), prof), LOADED)
    report = explain(pod, prof, [])
    assert (report["verdict"], report["tuned"]) == ("injected", True)
    assert report["artifact"] == {
        "uri": f"s3://bkt/p/ml/llm/{H200}/{SHA}",
        "sha256": SHA,
        "gpuModel": H200,
    }
    assert [c["name"] for c in report["containers"]] == ["server"]  # proxy runs another image
    text = format_why(report, NOW)
    assert (
        text.splitlines()[0]
        == f"Pod ml/m-1: tuned: injected, artifact {SHA[:12]} loaded for {H200}"
    )
    assert (
        "  Containers:  server (ENABLED=1, TUNING=0, RECORD_UNTUNED=0, FILENAME=/tunefleet/results/tunableop_results%d.csv)"
        in text
    )
    assert "Fix:" not in text


def test_why_says_what_the_gate_said_of_the_pinned_artifact() -> None:
    """'not measured' says why, in status and in why (issue 40: only a workload that cannot be
    measured at all is unmeasured; a crash with the artifact is Rejected)."""
    prof = LLM.obj()
    prof["status"]["artifacts"][0]["promotion"] = {
        "verdict": "Unmeasured",
        "message": "not measured: the profile gives no workload command to time",
    }
    pod = fetch_ended(admitted(POD.obj(), prof), LOADED)
    report = explain(pod, prof, [])
    assert report["artifact"]["gate"] == (
        "Unmeasured: not measured: the profile gives no workload command to time"
    )
    assert "  Gate:" in format_why(report, NOW)
    del prof["status"]["artifacts"][0]["promotion"]
    assert "gate" not in explain(pod, prof, [])["artifact"]


def test_why_injected_but_not_yet_fetched_and_with_warnings_and_overrides() -> None:
    prof = LLM.obj()
    pod = POD.obj()
    pod["spec"]["containers"][0]["image"] = "registry.example.com/serve:2"
    pod["spec"]["containers"][0]["env"] = [{"name": "PYTORCH_TUNABLEOP_ENABLED", "value": "0"}]
    pod = admitted(pod, prof)
    pod["status"] = {
        "initContainerStatuses": [{"name": "tunefleet-fetch", "state": {"running": {}}}]
    }
    report = explain(pod, prof, [])
    assert (report["verdict"], report["tuned"], report["fetch"]["state"]) == (
        "injected",
        None,
        "running",
    )
    text = format_why(report, NOW)
    assert "tunefleet-fetch has not finished yet (running)" in text.splitlines()[0]
    assert (
        "Image warning:  container server runs registry.example.com/serve:2, but the artifact was tuned in"
        in text
    )
    assert (
        "Note:           container server sets PYTORCH_TUNABLEOP_ENABLED=0 itself: TunableOp is off in it"
        in text
    )


def test_why_untuned_at_start_quotes_fetch_and_names_the_fix() -> None:
    prof = LLM.obj()
    pod = admitted(POD.obj(), prof)
    corrupt = f"results.csv has SHA-256 {SHA2}, expected {SHA} (corrupted or truncated)"
    report = explain(fetch_ended(pod, f"tunefleet-fetch: starting untuned: {corrupt}"), prof, [])
    assert (report["verdict"], report["tuned"], report["reason"]) == (
        "untuned-at-start",
        False,
        corrupt,
    )
    text = format_why(report, NOW)
    assert (
        "not tuned: injected, but the fetch init container started it untuned (fail open)" in text
    )
    assert f'Reason:      "{corrupt}" (from tunefleet-fetch\'s termination message)' in text
    assert f"kubectl tunefleet download llm -n ml --gpu-model {H200} --dest <dir>" in text
    assert f"kubectl delete job -n ml tune-llm-{H200.lower()}-1234" in text

    creds = (
        "downloading s3://bkt/x/manifest.json failed: InvalidAccessKeyId (HTTP 403): no such key"
    )
    report = explain(fetch_ended(pod, f"tunefleet-fetch: starting untuned: {creds}"), prof, [])
    assert "S3 credentials were missing or refused" in report["fix"]
    refused = explain(
        fetch_ended(pod, f"tunefleet-fetch: refusing to start: {corrupt}", 1), prof, []
    )
    assert refused["verdict"] == "refused-at-start" and "failClosed" in refused["summary"]


@pytest.mark.parametrize(
    ("case", "code", "fix"),
    [
        ("no-profile", "no_profile", "create TuningProfile 'llm' in namespace ml"),
        ("invalid", "invalid_profile", "fix the profile's spec"),
        (
            "no-selector",
            "no_model_selector",
            f"add nodeSelector {{{KEY}: <one of {H100}, {H200}>}}",
        ),
        (
            "other-model",
            "model_not_tuned",
            f"add NVIDIA-A100 to TuningProfile 'llm''s spec.gpu.models, or select one of {H100}, {H200}",
        ),
        (
            "no-artifact",
            "no_artifact",
            "wait until `kubectl tunefleet status llm -n ml` shows Ready, then recreate the pod",
        ),
        (
            "default-only",
            "default_only",
            "set spec.serving.serveDefaultOnly: true on TuningProfile 'llm'",
        ),
    ],
)
def test_why_untuned_by_the_webhook_quotes_its_reason_and_gives_the_fix(
    case: str, code: str, fix: str
) -> None:
    prof: dict[str, Any] | None = (
        LLM.gpu("nvidia", H100, H200).artifacts(ARTIFACT_H100, ARTIFACT).obj()
    )
    pod = POD.selector({KEY: H200}).obj()
    if case == "no-profile":
        prof = None
    elif case == "invalid":
        assert prof is not None
        prof["spec"]["gpu"]["vendor"] = "intel"
    elif case == "no-selector":
        pod = POD.obj()
    elif case == "other-model":
        pod = POD.selector({KEY: "NVIDIA-A100"}).obj()
    elif case == "no-artifact":
        assert prof is not None
        prof["status"]["artifacts"] = [ARTIFACT_H100.obj()]
        prof["status"]["phase"] = "Tuning"
    elif case == "default-only":
        assert prof is not None
        prof["status"]["artifacts"][1]["outcomes"] = {"tuned": 0, "default": 412}
    pod = admitted(pod, prof)
    report = explain(pod, prof, [])
    reason = pod["metadata"]["annotations"]["tunefleet.io/status"].removeprefix("untuned: ")
    assert (report["verdict"], report["code"], report["reason"]) == ("untuned", code, reason)
    assert fix in report["fix"]
    text = format_why(report, NOW)
    assert text.splitlines()[0] == "Pod ml/m-1: not tuned: the webhook admitted it untuned"
    assert f'  Reason:   "{reason}" (from annotation tunefleet.io/status)' in text
    assert "kubectl get pod -n ml m-1 -o yaml | kubectl replace --force -f -" in text


def test_why_no_artifact_changes_its_fix_with_what_the_profile_has_now() -> None:
    waiting = TUNING.obj()
    pod = admitted(POD.obj(), waiting)
    assert "wait until" in explain(pod, waiting, [])["fix"]
    assert (
        "has an artifact for NVIDIA-H200 now (abababababab)" in explain(pod, LLM.obj(), [])["fix"]
    )
    failed = LLM.artifacts().phase("Failed").obj()
    assert explain(pod, failed, [])["fix"].startswith(
        "tuning failed (see `kubectl tunefleet status llm"
    )
    # A profile that came into being after the pod: recreate once Ready.
    orphan = admitted(POD.obj(), None)
    assert "exists now" in explain(orphan, LLM.obj(), [])["fix"]


def test_why_a_pod_the_webhook_never_saw_and_one_that_never_asked() -> None:
    prof = LLM.status(unadmittedPods=3).obj()
    pod = POD.obj()  # labelled, no admission label: the webhook never saw it
    report = explain(pod, prof, [])
    assert report["verdict"] == "unadmitted" and report["tuned"] is False
    text = format_why(report, NOW)
    assert "not tuned: the tunefleet webhook never saw this pod" in text
    assert "recreate it while the tunefleet webhook is up" in text
    assert "TuningProfile 'llm' counts 3 such pod(s)" in text
    plain = POD.obj()
    del plain["metadata"]["labels"]["tunefleet.io/profile"]
    report = explain(plain, None, [])
    assert report["verdict"] == "not-requested"
    text = format_why(report, NOW)
    assert "it never asked for tuning" in text and "Events" not in text


def test_why_shows_the_profiles_events_about_this_pod_and_how_to_recreate_it() -> None:
    prof = TUNING.obj()
    pod = (
        POD.name("model-7d9f-abcde")
        .meta(
            generateName="model-7d9f-",
            ownerReferences=[{"kind": "ReplicaSet", "name": "model-7d9f", "controller": True}],
        )
        .obj()
    )
    pod["metadata"]["labels"]["pod-template-hash"] = "7d9f"
    pod = admitted(pod, prof)
    events = [
        event("PodUntuned", "pod model-7d9f-* starts untuned: no artifact", 1, "Warning"),
        event("PodUntuned", "pod other-* starts untuned: no artifact", 2, "Warning"),
        event("Ready", "Artifacts published", 3),
    ]
    report = explain(pod, prof, events)
    assert [e["message"] for e in report["events"]] == [
        "pod model-7d9f-* starts untuned: no artifact"
    ]
    assert (
        "kubectl delete pod -n ml model-7d9f-abcde (its ReplicaSet model-7d9f makes a new one), or kubectl rollout restart deployment -n ml model"
        in report["fix"]
    )
    assert format_why(report, NOW).endswith(
        "Events on TuningProfile llm about this pod (newest first):\n"
        "  60s  Warning  PodUntuned  pod model-7d9f-* starts untuned: no artifact\n"
    )


def test_why_a_fetch_that_ended_without_a_word_points_at_its_log() -> None:
    pod = fetch_ended(admitted(POD.obj(), LLM.obj()), "", exit_code=0)
    report = explain(pod, LLM.obj(), [])
    assert report["verdict"] == "injected" and report["tuned"] is None
    text = format_why(report, NOW)
    assert "tunefleet-fetch ended (exit 0) without saying what it wrote" in text
    assert "tunefleet-fetch exited 0 and left no termination message (from pod status)" in text
    assert "kubectl logs -n ml m-1 -c tunefleet-fetch" in text


def test_why_notes_a_newer_artifact_than_the_pinned_one() -> None:
    pod = fetch_ended(admitted(POD.obj(), LLM.obj()), LOADED)
    newer = LLM.artifacts(ARTIFACT2).obj()
    notes = explain(pod, newer, [])["notes"]
    assert any("has a newer artifact for NVIDIA-H200 now (cdcdcdcdcdcd)" in n for n in notes)


# The profile with its artifact delivered as ConfigMap cm-x (uid cm-1).
DELIVERED = LLM.artifacts(ARTIFACT.delivered("ConfigMap", "cm-x", "cm-1"))


@pytest.mark.parametrize("seen", [{"cm-x": ""}, {"cm-x": "cm-2"}])
def test_why_a_pod_served_from_the_store_while_its_config_map_was_gone_reads_as_injected(
    seen: dict[str, str],
) -> None:
    prof = DELIVERED.obj()
    decision = inject(POD.obj(), "llm", prof, CFG, seen)
    assert decision.code == "store_fallback"
    pod = fetch_ended(dict(decision.pod), LOADED)
    assert pod["metadata"]["annotations"]["tunefleet.io/decision"] == "store_fallback"
    report = explain(pod, prof, [])
    assert (report["verdict"], report["tuned"], report["code"]) == (
        "injected",
        True,
        "store_fallback",
    )
    text = format_why(report, NOW)
    assert (
        text.splitlines()[0]
        == f"Pod ml/m-1: tuned: injected, artifact {SHA[:12]} loaded for {H200}"
    )
    assert (
        f"  Note:        admitted with decision store_fallback for {H200} (annotation "
        "tunefleet.io/decision): the artifact's ConfigMap was gone or not the one the operator "
        "made, so the tunefleet-fetch init container fetches the same artifact from the store, "
        "verified, instead" in text
    )
    assert "Fix:" not in text and "Degraded" not in text  # served: nothing to count
    # A pod mounted from its ConfigMap as made says nothing of the kind.
    mounted = explain(admitted_with(prof, {"cm-x": "cm-1"}), prof, [])
    assert mounted["code"] == "" and not any("store_fallback" in n for n in mounted["notes"])


def admitted_with(prof: dict[str, Any], seen: dict[str, str]) -> dict[str, Any]:
    decision = inject(POD.obj(), "llm", prof, CFG, seen)
    return dict(decision.pod)


def degraded(status: str, reason: str, message: str) -> dict[str, Any]:
    return {"type": "Degraded", "status": status, "reason": reason, "message": message}


def test_why_a_fetch_that_failed_open_says_what_the_degraded_condition_says() -> None:
    refused = "downloading s3://bkt/p/x/manifest.json failed: connection refused"
    counted = (
        f"1 model pod(s) run without the artifact: 1 fetch_failed ({refused}; pods: m-1). "
        "`kubectl tunefleet why <pod>` says more; once the cause is fixed, recreate them "
        "(e.g. kubectl rollout restart)."
    )
    prof = LLM.phase("Degraded").obj()
    prof["status"]["conditions"].append(degraded("True", "PodsStartedUntuned", counted))
    pod = fetch_ended(admitted(POD.obj(), prof), f"tunefleet-fetch: starting untuned: {refused}")
    report = explain(pod, prof, [])
    assert report["verdict"] == "untuned-at-start"
    note = (
        "this pod runs untuned for a cause of tunefleet's (fetch_failed): TuningProfile 'llm' is "
        f"Degraded (PodsStartedUntuned) and counts it: {counted}"
    )
    assert note in report["notes"]
    text = format_why(report, NOW)
    assert "  Profile:     llm (phase Degraded)" in text and f"  Note:        {note}" in text
    # Not counted yet: the condition as it is now, and that the next reconcile counts it.
    fresh = LLM.obj()
    fresh["status"]["conditions"].append(
        degraded("False", "PodsServed", "No model pod runs untuned for a cause of tunefleet's.")
    )
    (said,) = [n for n in explain(pod, fresh, [])["notes"] if "cause of tunefleet's" in n]
    assert "counts (PodsStartedUntuned) once the operator's next reconcile sees the pod" in said
    assert said.endswith("False, PodsServed: No model pod runs untuned for a cause of tunefleet's.")
    # A status an operator before 0.2.0 wrote has no Degraded condition to count it.
    (old,) = [n for n in explain(pod, LLM.obj(), [])["notes"] if "cause of tunefleet's" in n]
    assert "has no Degraded condition" in old
    # Not a cause of ours: a pod that loaded its artifact, or one refused at start (fail
    # closed: it does not run), gets no such note.
    for other in (
        fetch_ended(pod, LOADED),
        fetch_ended(pod, f"tunefleet-fetch: refusing to start: {refused}", 1),
    ):
        assert not any("cause of tunefleet's" in n for n in explain(other, prof, [])["notes"])


def fetch_status(pod: dict[str, Any], phase: str, fetch: dict[str, Any]) -> dict[str, Any]:
    """The pod with its phase and the status of its fetch init container."""
    pod = copy.deepcopy(pod)
    pod["status"] = {
        "phase": phase,
        "initContainerStatuses": [{"name": "tunefleet-fetch", **fetch}],
    }
    return pod


def test_why_a_fetch_that_was_oom_killed_says_so_with_its_limit_and_the_fix() -> None:
    """Before, it read `tunefleet-fetch ended (exit 137) without saying what it wrote`, the
    profile stayed Ready, and nothing said the pod never started."""
    died = "the tunefleet-fetch init container was OOMKilled (memory limit 128Mi); restarts: 4"
    counted = f"1 model pod(s) run without the artifact: 1 fetch_died ({died}; pods: m-1)."
    prof = LLM.phase("Degraded").obj()
    prof["status"]["conditions"].append(degraded("True", "PodsStartedUntuned", counted))
    pod = fetch_status(
        admitted(POD.obj(), prof),
        "Pending",
        {
            "restartCount": 4,
            "state": {"waiting": {"reason": "CrashLoopBackOff"}},
            "lastState": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}},
        },
    )
    report = explain(pod, prof, [])
    assert (report["verdict"], report["tuned"], report["reason"]) == ("fetch-died", False, died)
    text = format_why(report, NOW)
    assert text.splitlines()[0] == (
        "Pod ml/m-1: not started: injected, but the tunefleet-fetch init container died "
        "(OOMKilled) before it said what it did"
    )
    assert f"  Reason:      {died} (from tunefleet-fetch's state in the pod's status)" in text
    assert (
        "  Fix:         tunefleet-fetch streams a bundle of any size in a few tens of MiB, so an "
        "OOMKill at its memory limit (128Mi) means something lowered that limit (a LimitRange "
        "or a policy that rewrites pods in this namespace: let tunefleet's own stand), or a "
        "tunefleet before streamed fetches admitted the pod (it read bundles whole: upgrade); "
        "fetch's log before it died: `kubectl logs -n ml m-1 -c tunefleet-fetch --previous`; "
        "then recreate the pod: kubectl get pod -n ml m-1 -o yaml | kubectl replace --force -f -"
    ) in text
    assert (
        "  Note:        this pod does not run for a cause of tunefleet's (fetch_died): "
        f"TuningProfile 'llm' is Degraded (PodsStartedUntuned) and counts it: {counted}"
    ) in text
    assert "ended (exit 137) without saying" not in text
    # Killed without the kubelet's OOMKilled (exit 137), or crashed without a word: the same
    # verdict, each with its own fix.
    killed = fetch_status(pod, "Failed", {"state": {"terminated": {"exitCode": 137}}})
    report = explain(killed, prof, [])
    assert (
        report["verdict"] == "fetch-died" and "was killed (exit 137, SIGKILL)" in report["reason"]
    )
    assert "by the OOM killer (its memory limit: 128Mi) or by its node" in report["fix"]
    log = "Traceback (most recent call last):\nRuntimeError: boom"
    crashed = fetch_status(
        pod, "Pending", {"state": {"terminated": {"exitCode": 1, "message": log}}}
    )
    report = explain(crashed, prof, [])
    assert report["reason"].endswith(
        "exited 1 without its outcome line: RuntimeError: boom; restarts: 0"
    )
    assert report["fix"].startswith("fetch's log says why it exited 1: `kubectl logs -n ml m-1 -c")


def test_why_a_pod_evicted_over_the_caches_volume_quotes_the_kubelet_and_names_the_limit() -> None:
    kubelet = 'Usage of EmptyDir volume "tunefleet-caches" exceeds the limit "1Gi".'
    pod = fetch_status(
        admitted(POD.obj(), LLM.obj()),
        "Failed",
        {"state": {"terminated": {"exitCode": 0, "message": LOADED}}},
    )
    pod["status"].update(reason="Evicted", message=kubelet + " ")
    report = explain(pod, LLM.obj(), [])
    assert (report["verdict"], report["tuned"]) == ("fetch-died", False)
    text = format_why(report, NOW)
    assert text.splitlines()[0] == (
        "Pod ml/m-1: not running: injected, but the kubelet evicted it over what tunefleet added "
        "to it"
    )
    assert (
        f"  Reason:      the pod was evicted by the kubelet: {kubelet} (from the pod's status)"
        in text
    )
    assert (
        "  Fix:         the bundle, unpacked, with what the stack adds to its caches, is larger "
        "than the tunefleet-caches volume's sizeLimit (1Gi), which tunefleet sizes from the "
        "artifact's caches when it admits the pod (room for them, their largest archive, and as "
        "much again for the stack): the stack wrote more than that into its caches; bound what "
        "it writes there, or serve a smaller artifact"
    ) in text
    assert "this pod does not run for a cause of tunefleet's (fetch_died)" in text
    # Evicted over the pod's own container: not tunefleet's; said as before (loaded).
    pod["status"]["message"] = "Container server was using 30Gi, request is 1Gi."
    report = explain(pod, LLM.obj(), [])
    assert report["verdict"] == "injected" and report["tuned"] is True
    assert not any("cause of tunefleet's" in n for n in report["notes"])


def test_why_untuned_for_a_gone_config_map_by_an_older_operator_agrees_with_degraded() -> None:
    """config_map_replaced: what an operator before 0.2.0 decided (served.OURS counts it)."""
    prof = LLM.phase("Degraded").obj()
    gone = "the ConfigMap cm-x that holds the artifact for NVIDIA-H200 is gone"
    message = f"1 model pod(s) run without the artifact: 1 config_map_replaced ({gone}; pods: m-1)."
    prof["status"]["conditions"].append(degraded("True", "PodsStartedUntuned", message))
    pod = POD.obj()
    pod["metadata"]["labels"]["tunefleet.io/admission"] = "untuned"
    pod["metadata"]["annotations"] = {
        "tunefleet.io/decision": "config_map_replaced",
        "tunefleet.io/status": f"untuned: {gone}",
    }
    report = explain(pod, prof, [])
    assert (report["verdict"], report["code"]) == ("untuned", "config_map_replaced")
    assert "makes the artifact's ConfigMap again" in report["fix"]
    assert any(
        n.startswith("this pod runs untuned for a cause of tunefleet's (config_map_replaced): ")
        and n.endswith(message)
        for n in report["notes"]
    )
    # The profile's own choice (no artifact yet) is not counted: no such note.
    early = admitted(POD.obj(), TUNING.obj())
    assert not any("cause of tunefleet's" in n for n in explain(early, prof, [])["notes"])


# --- diff --------------------------------------------------------------------------------

A = (
    "Validator,PT_VERSION,2.11.0\n"
    "Validator,ROCM_VERSION,6.4.0\n"
    "GemmTunableOp_BFloat16_TN,tn_4096_4096_4096_ld_4096_4096_4096,Gemm_Hipblaslt_1234,0.5\n"
    "GemmTunableOp_BFloat16_TN,tn_128_14336_4096_ld_4096_4096_128,Gemm_Rocblas_42,0.08\n"
    "GemmTunableOp_BFloat16_TN,tn_64_64_64_ld_64_64_64,Default,0\n"
    "GemmTunableOp_Half_NN,nn_32_32_32_ld_32_32_32,Gemm_Rocblas_7,0.01\n"
    "GemmTunableOp_Half_NN,nn_16_16_16_ld_16_16_16,Gemm_Rocblas_9,0.002\n"
)
B = (
    "Validator,PT_VERSION,2.11.0\n"
    "Validator,HIP_VERSION,6.4.1\n"
    "GemmTunableOp_BFloat16_TN,tn_4096_4096_4096_ld_4096_4096_4096,Gemm_Hipblaslt_999,0.4\n"
    "GemmTunableOp_BFloat16_TN,tn_128_14336_4096_ld_4096_4096_128,Gemm_Rocblas_42,0.09\n"
    "GemmTunableOp_BFloat16_TN,tn_64_64_64_ld_64_64_64,Gemm_Rocblas_1,0.003\n"
    "GemmTunableOp_Half_NN,nn_16_16_16_ld_16_16_16,Gemm_Rocblas_9,0.002\n"
    "GemmTunableOp_Float_TT,tt_8_8_8_ld_8_8_8,Gemm_Rocblas_3,0.001\n"
)


# Side b as the CLI describes a profile's artifact: where it is and the GPU model it is of.
SIDE_B = {"source": "b/results.csv", "gpuModel": "AMD_Instinct_MI300X_OAM"}


def diff_report(a: str = A, b: str = B) -> dict[str, Any]:
    ra, rb = parse_results(a), parse_results(b)
    side_a = {"source": "a/results.csv", "gemms": ra.gemms, "sha256": sha256_hex(a.encode())}
    side_b = {**SIDE_B, "gemms": rb.gemms}
    return {"a": side_a, "b": side_b, **diff_results(ra, rb)}


def test_diff_lists_added_removed_changed_with_time_deltas_and_validators() -> None:
    report = diff_report()
    s = report["summary"]
    assert (s["added"], s["removed"], s["changed"], s["retimed"], s["unchanged"]) == (1, 1, 2, 1, 1)
    big = next(c for c in report["changed"] if c["params"].startswith("tn_4096"))
    assert big["before"] == {"solution": "Gemm_Hipblaslt_1234", "ms": 0.5}
    assert big["after"] == {"solution": "Gemm_Hipblaslt_999", "ms": 0.4}
    assert big["deltaMs"] == pytest.approx(-0.1) and big["ratio"] == pytest.approx(0.8)
    placeholder = next(c for c in report["changed"] if c["params"].startswith("tn_64"))
    assert placeholder["deltaMs"] is None and placeholder["ratio"] is None  # Default,0 is no time
    assert report["validators"] == [
        {"key": "HIP_VERSION", "before": None, "after": "6.4.1"},
        {"key": "ROCM_VERSION", "before": "6.4.0", "after": None},
    ]
    assert format_diff(report) == (
        f"--- a/results.csv (5 GEMMs, sha256 {sha256_hex(A.encode())[:12]})\n"
        "+++ b/results.csv (AMD_Instinct_MI300X_OAM, 5 GEMMs)\n"
        "Validators (2 differ: TunableOp loads a file only where every validator matches, so "
        "these serve different stacks):\n"
        "  ~ HIP_VERSION: (absent) -> 6.4.1\n"
        "  ~ ROCM_VERSION: 6.4.0 -> (absent)\n"
        "Changed (2): another solution won\n"
        "  ~ GemmTunableOp_BFloat16_TN tn_4096_4096_4096_ld_4096_4096_4096\n"
        "      Gemm_Hipblaslt_1234 0.5 ms -> Gemm_Hipblaslt_999 0.4 ms (-0.1 ms, x0.80)\n"
        "  ~ GemmTunableOp_BFloat16_TN tn_64_64_64_ld_64_64_64\n"
        "      Default 0 ms -> Gemm_Rocblas_1 0.003 ms (no time to compare)\n"
        "Added (1):\n"
        "  + GemmTunableOp_Float_TT tt_8_8_8_ld_8_8_8  Gemm_Rocblas_3 0.001 ms\n"
        "Removed (1):\n"
        "  - GemmTunableOp_Half_NN nn_32_32_32_ld_32_32_32  Gemm_Rocblas_7 0.01 ms\n"
        "Summary: 2 changed, 1 added, 1 removed, 2 same solution (1 with another time), "
        "2 validator(s) differ; the 4 GEMMs in both: 0.582 ms -> 0.495 ms, x0.85\n"
    )


def test_diff_of_identical_files_says_so() -> None:
    report = diff_report(A, A)
    assert report["summary"]["identical"] is True
    assert format_diff(report).endswith("(identical)\n")
    assert not diff_report(A, A.replace("0.08\n", "0.081\n"))["summary"]["identical"]  # retimed


def test_parse_ref_tells_artifacts_paths_and_profiles_apart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert parse_ref(f"s3://b/p/{SHA}").kind == "s3"
    assert parse_ref("./x").kind == "local" and parse_ref("/abs").kind == "local"
    ref = parse_ref(f"ml/llm:{H200}")
    assert (ref.kind, ref.namespace, ref.name, ref.gpu_model) == ("profile", "ml", "llm", H200)
    ref = parse_ref("llm")
    assert (ref.kind, ref.namespace, ref.gpu_model) == ("profile", None, None)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "llm").mkdir()
    assert parse_ref("llm").kind == "local"  # an existing path wins
    for bad in ("Bad_Name", "ml/llm:", "a/b/c", "llm:bad model"):
        with pytest.raises(ValueError, match="neither an artifact"):
            parse_ref(bad)


def run_main(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main_mod.main(list(args), connect=CLUSTER.connect)
    out, err = capsys.readouterr()
    return code, out, err


def error_line(err: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("kubectl-tunefleet: error: "), err
    assert "Traceback" not in err
    return lines[0]


def test_diff_cli_on_local_files_json_and_exit_codes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "results.csv").write_text(A)
    (tmp_path / "b.csv").write_text(B)
    code, out, err = run_main(
        capsys, "diff", str(tmp_path / "a"), str(tmp_path / "b.csv"), "-o", "json"
    )
    assert (code, err) == (1, "")
    data = json.loads(out)
    assert data["summary"]["changed"] == 2 and data["a"]["source"] == str(
        tmp_path / "a" / "results.csv"
    )
    assert data["added"][0]["params"] == "tt_8_8_8_ld_8_8_8"
    code, out, err = run_main(
        capsys, "diff", str(tmp_path / "a"), str(tmp_path / "a" / "results.csv")
    )
    assert code == 0 and "(identical)" in out
    # A directory `kubectl tunefleet download` wrote has tunableop_results0.csv.
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "tunableop_results0.csv").write_text(A)
    assert run_main(capsys, "diff", str(tmp_path / "d"), str(tmp_path / "a"))[0] == 0


# --- download and errors -------------------------------------------------------------------


class _Cluster:
    """What run_main connects kubectl-tunefleet to: cluster.connect, unless a test says."""

    def __init__(self) -> None:
        self.connect: main_mod.Connect = cluster_mod.connect


CLUSTER = _Cluster()


@pytest.fixture(autouse=True)
def _the_real_connect_unless_a_test_says() -> Iterator[None]:
    yield
    CLUSTER.connect = cluster_mod.connect


def use(monkeypatch: pytest.MonkeyPatch, fake: FakeCluster) -> None:
    CLUSTER.connect = lambda *a: fake


def published(root: Path, model: str = H200) -> dict[str, Any]:
    """An artifact in a directory store laid out as S3's keys are (file:// URI)."""
    results = parse_results(A)
    data, manifest = build_output(
        results,
        ArtifactId(namespace="ml", profile="llm", revision="rev2", gpu_model=model),
        RunFacts(recorded=results.gemms, identity={"gpuName": "test"}, seconds=1.0),
    )
    sha = sha256_hex(data)
    where = root / "ml" / "llm" / model / sha
    where.mkdir(parents=True)
    (where / "results.csv").write_bytes(data)
    (where / "manifest.json").write_bytes(manifest.to_json())
    return (
        make_artifact(model, sha, profile="llm")
        .fields(**RUN)
        .fields(job=f"tune-llm-{model.lower()}-1234")
        .uri(f"file://{where}")
        .fields(manifestSha256=sha256_hex(manifest.to_json()))
        .obj()
    )


def test_download_writes_verified_files_and_the_manifest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    art = published(tmp_path / "store")
    use(monkeypatch, FakeCluster({"ml/llm": LLM.artifacts(art).obj()}))
    dest = tmp_path / "out"
    code, out, err = run_main(capsys, "download", "llm", "--dest", str(dest), "--devices", "2")
    assert (code, err) == (0, "")
    assert sorted(p.name for p in dest.iterdir()) == [
        "manifest.json",
        "tunableop_results0.csv",
        "tunableop_results1.csv",
    ]
    assert sha256_hex((dest / "tunableop_results1.csv").read_bytes()) == art["sha256"]
    assert sha256_hex((dest / "manifest.json").read_bytes()) == art["manifestSha256"]
    assert out.splitlines()[0] == f"Verified {art['uri']}"
    assert f"  {dest / 'manifest.json'}" in out
    code, out, _ = run_main(
        capsys, "download", "llm", "--dest", str(dest), "--gpu-model", H200, "-o", "json"
    )
    assert code == 0 and json.loads(out)["files"] == [str(dest / "tunableop_results0.csv")]


def test_download_of_a_caches_artifact_unpacks_each_cache_or_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from tuner_job import caches as cc
    from tuner_job.manifest import ArtifactId
    from tuner_job.output import RunFacts, write_caches_output

    (tmp_path / "c" / "tc" / "inductor").mkdir(parents=True)
    (tmp_path / "c" / "tc" / "inductor" / "entry").write_bytes(b"graph")
    packed = cc.pack(cc.spec("torchCompile", "tc"), tmp_path / "c", tmp_path / "o")
    assert isinstance(packed, cc.Packed)
    capsys.readouterr()  # the tuner's own line about packing: not the plugin's output
    manifest = write_caches_output(
        tmp_path / "o",
        [packed],
        [],
        ArtifactId(namespace="ml", profile="llm", revision="rev2", gpu_model=H200),
        RunFacts(identity={"torch": "2.11.0"}, seconds=1.0),
    )
    where = tmp_path / "store" / "ml" / "llm" / H200 / manifest.results_sha256
    (where / "caches").mkdir(parents=True)
    for name in ("manifest.json", "caches.json"):
        (where / name).write_bytes((tmp_path / "o" / name).read_bytes())
    archive = where / "caches" / f"{packed.sha256}.tar.gz"
    archive.write_bytes((tmp_path / "o" / packed.payload).read_bytes())
    art = (
        make_artifact(H200, manifest.results_sha256, profile="llm")
        .fields(**RUN)
        .uri(f"file://{where}")
        .fields(manifestSha256=sha256_hex(manifest.to_json()), kind="caches")
        .obj()
    )
    use(monkeypatch, FakeCluster({"ml/llm": LLM.artifacts(art).obj()}))
    dest = tmp_path / "out"
    code, out, err = run_main(capsys, "download", "llm", "--dest", str(dest))
    assert (code, err) == (0, ""), out
    assert (dest / "caches" / "tc" / "inductor" / "entry").read_bytes() == b"graph"
    assert f"  {dest / 'caches' / 'tc'}" in out and "PYTORCH_TUNABLEOP_FILENAME" not in out
    archive.write_bytes(b"tampered")
    code, out, err = run_main(capsys, "download", "llm", "--dest", str(tmp_path / "bad"))
    assert code != 0 and "caches not served" in err
    assert not (tmp_path / "bad" / "caches" / "tc").exists()


def test_download_refuses_an_artifact_that_does_not_verify(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    art = published(tmp_path / "store")
    use(monkeypatch, FakeCluster({"ml/llm": LLM.artifacts(art).obj()}))
    where = Path(art["uri"].removeprefix("file://"))
    (where / "manifest.json").chmod(0o644)
    (where / "manifest.json").write_text(
        (where / "manifest.json").read_text().replace('"rev2"', '"rev3"')
    )
    dest = tmp_path / "out"
    code, out, err = run_main(capsys, "download", "llm", "--dest", str(dest))
    assert code == 1 and out == ""
    line = error_line(err)
    assert (
        f"artifact {art['uri']} failed verification, nothing was written: manifest.json has SHA-256"
        in line
    )
    assert not dest.exists() or not any(dest.iterdir())
    (where / "results.csv").unlink()
    line = error_line(run_main(capsys, "download", "llm", "--dest", str(dest))[2])
    assert "cannot download the artifact (no object at file://" in line and "--endpoint-url" in line


@pytest.mark.parametrize(
    ("args", "profiles", "code", "expected"),
    [
        (
            ["status", "x"],
            {},
            1,
            "TuningProfile 'x' not found in namespace 'ml': list them with `kubectl get tp -n ml`",
        ),
        (
            ["status", "x", "-n", "other"],
            {},
            1,
            "TuningProfile 'x' not found in namespace 'other': list them with `kubectl get tp -n other`",
        ),
        (
            ["why", "p"],
            {},
            1,
            "Pod 'p' not found in namespace 'ml': list them with `kubectl get pods -n ml`",
        ),
        (
            ["download", "llm", "--dest", "/tmp/x"],
            {"ml/llm": TUNING.obj()},
            1,
            "TuningProfile 'llm' has no artifact for NVIDIA-H200 yet (phase Tuning): wait until `kubectl tunefleet status llm -n ml` shows Ready",
        ),
        (
            ["download", "llm", "--dest", "/tmp/x"],
            {"ml/llm": LLM.gpu("nvidia", H100, H200).obj()},
            1,
            f"TuningProfile 'llm' tunes several GPU models ({H100}, {H200}): name one with --gpu-model (or ml/llm:<model> in diff)",
        ),
        (
            ["download", "llm", "--dest", "/tmp/x", "--gpu-model", "A100"],
            {"ml/llm": LLM.obj()},
            1,
            f"TuningProfile 'llm' does not tune GPU model 'A100': use one of {H200}",
        ),
        (
            ["diff", "/nonexistent/dir", "llm"],
            {},
            2,
            "/nonexistent/dir: no such file or directory (an artifact is s3://.../<sha256>, a profile [namespace/]profile[:gpuModel])",
        ),
        (
            ["diff", "ml/gone:M", "/nonexistent"],
            {},
            2,
            "TuningProfile 'gone' not found in namespace 'ml': list them with `kubectl get tp -n ml`",
        ),
        (
            ["diff", "s3://bkt/p/not-a-sha", "llm"],
            {},
            2,
            "s3://bkt/p/not-a-sha does not end in a SHA-256: name an artifact directory as status.artifacts[].uri shows it (s3://bucket/.../<gpu-model>/<sha256>)",
        ),
        (
            ["download", "llm"],
            {},
            2,
            "the following arguments are required: --dest: see `kubectl tunefleet download --help`",
        ),
        (
            ["download", "llm", "--dest", "d", "--devices", "0"],
            {},
            2,
            "argument --devices: must be 1..256, got '0': see `kubectl tunefleet download --help`",
        ),
        (
            [],
            {},
            2,
            "name a command: status, why, download, diff, retune, rollback, unpin or version: see `kubectl tunefleet --help`",
        ),
    ],
)
def test_expected_failures_are_one_line_that_says_what_to_do(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    profiles: dict[str, dict[str, Any]],
    code: int,
    expected: str,
) -> None:
    use(monkeypatch, FakeCluster(profiles, namespace="ml"))
    CLUSTER.connect = lambda kc, ctx, ns: FakeCluster(profiles, ns or "ml")
    got, out, err = run_main(capsys, *args)
    assert (got, out) == (code, "")
    assert error_line(err) == f"kubectl-tunefleet: error: {expected}"


def test_a_bad_results_file_and_an_unexpected_bug_are_one_line_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("Validator,PT_VERSION,2.11.0\r\n")
    code, _, err = run_main(capsys, "diff", str(bad), str(bad))
    assert (
        code == 2
        and f"{bad} is not a TunableOp results file: {bad}:1: CRLF line ending" in error_line(err)
    )

    def boom(*a: Any) -> Any:
        raise RuntimeError("unexpected\nmulti-line")

    CLUSTER.connect = boom
    code, _, err = run_main(capsys, "status", "x")
    assert code == 1
    assert error_line(err) == (
        "kubectl-tunefleet: error: internal error (RuntimeError: unexpected multi-line): rerun "
        "with KUBECTL_TUNEFLEET_DEBUG=1 for the traceback and report it"
    )


def test_kubeconfig_problems_and_an_unreachable_api_server(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, _, err = run_main(capsys, "status", "x", "--kubeconfig", str(tmp_path / "missing"))
    assert code == 1
    assert f"cannot use kubeconfig {tmp_path / 'missing'}" in error_line(err)
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [
                    {"name": "x", "context": {"cluster": "c", "user": "u", "namespace": "team"}}
                ],
                "current-context": "x",
            }
        )
    )
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    assert cluster_mod.connect(None, None, None).namespace == "team"  # the context's namespace
    assert cluster_mod.connect(None, None, "other").namespace == "other"
    code, _, err = run_main(capsys, "status", "x")
    assert code == 1
    line = error_line(err)
    assert line.startswith(
        "kubectl-tunefleet: error: cannot reach the API server at https://127.0.0.1:1 ("
    )
    assert line.endswith("check --kubeconfig/--context and that the cluster is up")
    code, _, err = run_main(capsys, "status", "x", "--context", "nope")
    assert code == 1 and "(context nope)" in error_line(err)


# --- capture -------------------------------------------------------------------------------


def test_status_shows_the_capture_section_and_a_retunes_artifact_as_current() -> None:
    from tunefleet import naming

    p = LLM.obj()
    retune_rev = naming.retune_revision("rev2", "d" * 16)
    p["status"]["artifacts"][0]["revision"] = retune_rev
    p["status"]["capture"] = [
        {
            "gpuModel": H200,
            "seen": 5,
            "tuned": 4,
            "untuned": 1,
            "coverage": 80,
            "lastCapture": "2026-11-30T11:57:00Z",
            "notLoadedPods": 1,
            "apart": {"stores": 1, "seen": 3},
            "retune": {
                "baseRevision": "rev2", "digest": "d" * 16, "revision": retune_rev,
                "shapes": 4, "reason": "Threshold", "requestedAt": "2026-11-30T11:30:00Z",
                "state": "Published",
            },
            "message": "1 new untuned shape(s), below the retune threshold",
        }
    ]  # fmt: skip
    text = format_status(status_report(p, []), NOW)
    assert f"    revision  {retune_rev} (current)" in text
    assert "Capture (production misses):" in text
    assert f"  {H200}  4/5 captured shapes tuned (80%), 1 untuned; last capture 3m ago" in text
    assert (
        f"retune   Published: 4 shape(s) (Threshold) under revision {retune_rev}, 30m ago" in text
    )
    assert "3 shape(s) from 1 other identit(y/ies)" in text
    assert "did not load the results while recording" in text
    assert "below the retune threshold" in text
    assert "Capture" not in format_status(status_report(LLM.obj(), []), NOW)  # off, none kept


def test_retune_asks_once_by_annotation_and_says_what_it_will_find(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from tunefleet.contracts.retune import ANNOTATION

    p = LLM.obj()
    p["status"]["capture"] = [{"gpuModel": H200, "seen": 3, "tuned": 1, "untuned": 2}]
    patches: list[dict[str, Any]] = []

    class Patching(FakeCluster):
        def patch_profile(self, ns: str, name: str, patch: dict[str, Any]) -> Any:
            patches.append(patch)
            return self.profile(ns, name)

    use(monkeypatch, Patching({"ml/llm": p}))
    code, out, _ = run_main(capsys, "retune", "llm", "-n", "ml")
    assert code == 0
    (patch,) = patches
    nonce = json.loads(patch["metadata"]["annotations"][ANNOTATION])[H200]
    assert f"(request {nonce})" in out
    assert f"{H200}: 2 of 3 captured shape(s) untuned" in out
    assert "spec.capture.enabled is false" in out
    code, out, err = run_main(capsys, "retune", "llm", "-n", "ml", "--gpu-model", "Other")
    assert code == 1 and "does not tune Other" in err


def test_two_retunes_of_different_models_at_once_both_land(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Another user's retune of H100 lands between this one's read and its write: the write,
    fenced by the resourceVersion it read, is refused, read again and merged, so the profile
    asks both (one value held one, and the later write dropped the other)."""
    from tests.support.fake_cluster import FencedCluster
    from tunefleet.contracts.retune import ANNOTATION, RetuneRequest, Retunes

    h100 = "NVIDIA-H100-80GB-HBM3"
    other = Retunes((RetuneRequest("other-1", h100),)).patch()
    fake = FencedCluster(
        LLM.gpu("nvidia", H200, h100).obj(),
        race=lambda c: c.patch_profile("ml", "llm", other),
    )
    use(monkeypatch, fake)
    code, out, err = run_main(capsys, "retune", "llm", "-n", "ml", "--gpu-model", H200)
    assert (code, err) == (0, "") and fake.conflicts == 1
    asked = Retunes.read(fake.prof)
    assert asked.nonce_for(h100) == "other-1"
    assert f"(request {asked.nonce_for(H200)})" in out
    assert json.loads(fake.prof["metadata"]["annotations"][ANNOTATION]).keys() == {H200, h100}


# --- version -------------------------------------------------------------------------------


# A replica slot's Deployment as the chart labels it (_helpers.tpl tunefleet.labels). No
# wrapper makes Deployments: a Job's (metadata, spec, status) made one.
VERSION_LABEL = "app.kubernetes.io/version"
CONTAINERS = ("spec", "template", "spec", "containers")
OPERATOR = (
    make_object("apps/v1", "Deployment", "tunefleet", "tunefleet-system")
    .labels(
        {
            "app.kubernetes.io/name": "tunefleet",
            "app.kubernetes.io/instance": "tunefleet",
            VERSION_LABEL: "0.2.0",
        }
    )
    .spec(replicas=1)
    .set(*CONTAINERS, value=[{"name": "operator", "image": "ghcr.io/tunefleet/tunefleet:0.2.0"}])
    .status(readyReplicas=1)
)
OPERATOR_0_1 = OPERATOR.label(VERSION_LABEL, "0.1.0").set(
    *CONTAINERS, value=[{"name": "operator", "image": "ghcr.io/tunefleet/tunefleet:0.1.0"}]
)
UNLABELLED = OPERATOR.without("metadata", "labels", VERSION_LABEL)


class Deployed(FakeCluster):
    """A cluster whose Deployments list answers with `deployments` (by namespace, or all)."""

    def __init__(self, deployments: list[dict[str, Any]], namespace: str = "ml") -> None:
        super().__init__({}, namespace)
        self.deployments_ = deployments
        self.asked: list[tuple[str | None, str]] = []

    def deployments(self, namespace: str | None, selector: str) -> list[dict[str, Any]]:
        self.asked.append((namespace, selector))
        return [
            d
            for d in self.deployments_
            if namespace is None or d["metadata"]["namespace"] == namespace
        ]


def test_version_prints_the_client_and_each_operator_release(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from tunefleet import __version__

    team_b = (
        OPERATOR_0_1.name("team-b-tunefleet")
        .namespace("team-b-system")
        .label("app.kubernetes.io/instance", "team-b")
    )
    fake = Deployed(
        [OPERATOR.obj(), OPERATOR.name("tunefleet-1").status(readyReplicas=0).obj(), team_b.obj()]
    )
    use(monkeypatch, fake)
    code, out, err = run_main(capsys, "version")
    assert (code, err) == (0, "")
    assert out.splitlines() == [
        f"Client:   kubectl-tunefleet {__version__}",
        "Operator: 0.1.0 (release team-b in team-b-system, 1/1 replicas ready, image "
        "ghcr.io/tunefleet/tunefleet:0.1.0)",
        "Operator: 0.2.0 (release tunefleet in tunefleet-system, 1/2 replicas ready, image "
        "ghcr.io/tunefleet/tunefleet:0.2.0)",
    ]
    # Every namespace, by the chart's name label, unless -n names one.
    assert fake.asked == [(None, "app.kubernetes.io/name=tunefleet")]
    code, out, _ = run_main(capsys, "version", "-n", "team-b-system", "-o", "json")
    data = json.loads(out)
    assert code == 0 and fake.asked[-1][0] == "team-b-system"
    assert data["client"] == {"version": __version__} and data["searched"] == "team-b-system"
    (op,) = data["operators"]
    assert (op["release"], op["versions"]) == ("team-b", ["0.1.0"])
    assert op["deployments"] == ["team-b-tunefleet"]


def test_version_mid_upgrade_and_without_the_chart_label() -> None:
    from tunefleet.plugin.version_cmd import format_version, image_tag, version_report

    rolling = version_report(
        [
            OPERATOR_0_1.obj(),
            OPERATOR.name("tunefleet-1").obj(),
        ]
    )
    assert "Operator: 0.1.0, 0.2.0 (rolling) (release tunefleet" in format_version(rolling)
    # A Deployment made by hand: its operator image's tag says the version.
    by_hand = [{"name": "operator", "image": "reg:5000/tf/op:1.2.3"}]
    bare = version_report([UNLABELLED.set(*CONTAINERS, value=by_hand).obj()])
    assert bare["operators"][0]["versions"] == ["1.2.3"]
    assert image_tag("reg:5000/tf/op@sha256:" + "a" * 64) == ""
    assert image_tag("reg:5000/tf/op:9.9.9@sha256:" + "a" * 64) == "9.9.9"
    digest_only = [{"name": "operator", "image": "op@sha256:" + "a" * 64}]
    unknown = version_report([UNLABELLED.set(*CONTAINERS, value=digest_only).obj()])
    assert unknown["operators"][0]["versions"] == ["unknown"]


def test_version_without_an_operator_says_so_and_exits_0(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from tunefleet import __version__

    use(monkeypatch, Deployed([]))
    code, out, err = run_main(capsys, "version")
    assert (code, err) == (0, "")
    assert out.splitlines() == [
        f"Client:   kubectl-tunefleet {__version__}",
        "Operator: not found: no tunefleet operator Deployment (label "
        "app.kubernetes.io/name=tunefleet) in any namespace; install it with `helm install "
        "tunefleet charts/tunefleet -n tunefleet-system --create-namespace`",
    ]
    use(monkeypatch, Deployed([OPERATOR.obj()]))
    code, out, _ = run_main(capsys, "version", "-n", "elsewhere")
    assert code == 0 and "in namespace elsewhere; install it" in out
    assert "or look in another namespace (drop -n)" in out
    code, out, _ = run_main(capsys, "version", "-o", "json")
    assert code == 0 and json.loads(out)["operators"][0]["versions"] == [__version__]


def test_version_client_only_and_when_the_cluster_cannot_be_read(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from tunefleet import __version__
    from tunefleet.plugin.errors import PluginError

    def unreachable(*a: Any) -> Any:
        raise AssertionError("--client must not connect")

    CLUSTER.connect = unreachable
    code, out, err = run_main(capsys, "version", "--client")
    assert (code, out, err) == (0, f"Client:   kubectl-tunefleet {__version__}\n", "")
    code, out, _ = run_main(capsys, "version", "--client", "-o", "json")
    assert code == 0 and json.loads(out) == {
        "client": {"version": __version__}, "operators": None, "searched": "*"
    }  # fmt: skip

    class Forbidden(FakeCluster):
        def deployments(self, namespace: str | None, selector: str) -> Any:
            raise PluginError(
                "not allowed to read Deployments in all namespaces: forbidden: ask for read "
                "access (get/list) to it, or use another --context"
            )

    use(monkeypatch, Forbidden({}))
    code, out, err = run_main(capsys, "version")
    assert code == 1 and out == f"Client:   kubectl-tunefleet {__version__}\n"
    assert error_line(err).endswith(
        "(or name the operator's namespace: kubectl tunefleet version -n NAMESPACE)"
    )
    # No cluster at all: the client's version, then the one-line error.
    CLUSTER.connect = cluster_mod.connect
    code, out, err = run_main(capsys, "version", "--kubeconfig", str(tmp_path / "missing"))
    assert code == 1 and out == f"Client:   kubectl-tunefleet {__version__}\n"
    assert f"cannot use kubeconfig {tmp_path / 'missing'}" in error_line(err)


# --- figures, the promotion gate and pins ----------------------------------------------------


def gain(stand_in: bool = False, **over: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "mode": "Eager",
        "figures": [
            {"name": "workload", "baselineSeconds": 12.5, "tunedSeconds": 10.0, "speedup": 1.25,
             "low": 1.2, "high": 1.3, "repetitions": 9},
            {"name": "gemms", "baselineSeconds": 0.8, "tunedSeconds": 0.9, "speedup": 0.89,
             "low": 0.85, "high": 0.93, "repetitions": 5},
        ],
    }  # fmt: skip
    if stand_in:
        doc["standIn"] = True
    doc.update(over)
    return doc


def test_status_shows_the_figures_the_verdict_the_pin_and_rejected_artifacts() -> None:
    from tunefleet.contracts import pin as pins

    art = ARTIFACT.fields(
        gain=gain(stand_in=True, mode="CUDAGraphs", note="budget ended"),
        promotion={"verdict": "Pinned", "message": "served by a pin"},
        pinned={"reason": "p99 regressed", "at": "2026-11-30T11:30:00Z"},
    )
    rejected = make_artifact(H200, "ef" * 32, profile="llm").fields(
        **RUN,
        gain=gain(stand_in=True),
        promotion={"verdict": "Rejected", "message": "gemms 0.89x is 11.0% below the 1.00x"},
    )
    p = LLM.artifacts(art).history(rejected, EARLIER).obj()
    p["metadata"]["annotations"] = {pins.ANNOTATION: pins.value({H200: pins.Pin(H200, SHA)})}
    text = format_status(status_report(p, []), NOW)
    assert (
        "    gain       workload 1.25x (1.20-1.30, 9 pairs): 12.5s -> 10s, saves 2.5s (stand-in)\n"
        "               gemms 0.89x (0.85-0.93, 5 pairs): 0.8s -> 0.9s, costs 0.1s more (stand-in)\n"
        "               GEMMs timed as run under CUDAGraphs\n"
        "               note: budget ended\n"
        "    promotion  Pinned: served by a pin\n"
        "    pinned     p99 regressed, since 2026-11-30T11:30:00Z (30m ago): `kubectl tunefleet "
        f"unpin llm -n ml --gpu-model {H200}` returns to the newest artifact that passed the gate\n"
    ) in text
    assert "    pin  " not in text  # the pin asked is the one served
    assert (
        "Rejected by the promotion gate (kept in history, never served):\n"
        f"  {H200}  efefefefefef  revision rev2  gemms 0.89x is 11.0% below the 1.00x (stand-in)\n"
    ) in text
    data = status_report(p, [])
    assert data["models"][0]["pin"]["sha256"] == SHA
    assert data["history"]["artifacts"][0]["promotion"]["verdict"] == "Rejected"


def test_status_shows_a_pin_not_served_and_no_figures_for_a_malformed_gain() -> None:
    from tunefleet.contracts import pin as pins

    p = LLM.artifacts(ARTIFACT.fields(gain={"figures": "many"}, promotion="odd")).obj()
    p["metadata"]["annotations"] = {pins.ANNOTATION: pins.value({H200: pins.Pin(H200, SHA2, "x")})}
    text = format_status(status_report(p, []), NOW)
    assert "gain" not in text and "promotion" not in text and "Rejected" not in text
    assert f"    pin       {SHA2[:12]} asked (x) but not served" in text
    # A figure that does not hold together is dropped, the rest shown; none left: not measured.
    broken = gain()
    broken["figures"][1]["low"] = 5.0  # above the speed-up
    text = format_status(status_report(LLM.artifacts(ARTIFACT.fields(gain=broken)).obj(), []), NOW)
    assert (
        "workload 1.25x" in text and "gemms" not in text.split("Tuning Jobs:")[0].split("gain")[1]
    )
    empty = ARTIFACT.fields(gain={"figures": [], "note": "no GPU"}).obj()
    text = format_status(status_report(LLM.artifacts(empty).obj(), []), NOW)
    assert "    gain      not measured: no GPU\n" in text


def test_diff_shows_each_sides_figures_from_the_profiles_status(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from tunefleet.plugin.diff_cmd import side_gain

    art = published(tmp_path / "store")
    art["gain"] = gain(stand_in=True)
    art["promotion"] = {"verdict": "Passed", "message": "passed"}
    use(monkeypatch, FakeCluster({"ml/llm": LLM.artifacts(art).obj()}))
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "results.csv").write_text(A)
    code, out, err = run_main(capsys, "diff", str(tmp_path / "a"), "llm")
    assert (code, err) == (0, "")
    assert (
        "Figures (measured where each was tuned; above 1x is faster than without):\n"
        "  --- (none recorded)\n"
        "  +++ workload 1.25x (1.20-1.30), gemms 0.89x (0.85-0.93) (stand-in)\n"
    ) in out
    code, out, _ = run_main(capsys, "diff", str(tmp_path / "a"), "llm", "-o", "json")
    data = json.loads(out)
    assert data["b"]["gain"]["standIn"] is True and data["b"]["promotion"]["verdict"] == "Passed"
    assert "gain" not in data["a"]
    # Found by SHA-256 in history too; a malformed gain shows nothing rather than failing.
    side = {"gpuModel": H200, "sha256": SHA2}
    assert side_gain(side, LLM.obj()) == {}
    old = LLM.history(ARTIFACT2.fields(gain={"figures": None})).obj()
    assert side_gain(side, old) == {"gain": {"figures": None}}
    report = {**diff_report(), "a": {"source": "x", **side_gain(side, old)}, "b": {"source": "y"}}
    assert "Figures" not in format_diff(report)
    assert "Figures" not in format_diff(diff_report())
