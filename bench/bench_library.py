"""Fleet-wide reuse, sharding and resume, measured through the real programs and S3 server.

Each tuning pod runs as its processes do in a pod (testbed/library_pod.py): tunefleet-sync,
`python -m tuner_job run` with the STAND-IN torch, tunefleet-publish; tunefleet-merge for a
sharded Job; against the local SeaweedFS server. The stand-in computes nothing: each GEMM it
"tunes" costs FAKE_TORCH_TUNE_SLEEP seconds of sleep, so every wall time below is a stand-in
time (labelled so), useful for ratios and overheads, not for what a GPU takes. GEMM counts are
real counts (what the tuner recorded and what torch's offline tuner was asked to run).

(a) reuse: 10 profiles of 100 GEMMs sharing 80, tuned one after another with the library, vs
    each profile alone; (b) sharding: one profile of 2,000 GEMMs at parallelism 1, 2 and 4
    (shards as concurrent processes), wall-time ratios; (c) resume: a run killed halfway (its
    tuning process group and sidecar SIGKILLed, a lost node) and retried: GEMMs tuned twice vs
    the checkpoint interval.

    python -m bench.bench_library   # S3 from hack/cluster-up.sh --s3-only (started if needed)
"""

from __future__ import annotations

import json
import os
import platform
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "operator")]

from testbed.cluster import S3Settings, ensure_s3  # noqa: E402
from testbed.library_pod import (  # noqa: E402
    STANDIN_NOTE,
    JobSpec,
    Pod,
    merge,
    run_job,
    shapes,
    tuned_keys,
    wait_until,
)

ROCM = {"FAKE_TORCH_BACKEND": "rocm"}


def _delete(s3: S3Settings, prefix: str) -> None:
    client = s3.client()
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=s3.bucket, Prefix=prefix):
        for obj in page.get("Contents", []):
            client.delete_object(Bucket=s3.bucket, Key=obj["Key"])


def _spec(s3: S3Settings, prefix: str, profile: str, gemms: list[int], **over: Any) -> JobSpec:
    fields: dict[str, Any] = {
        "uri": f"s3://{s3.bucket}/{prefix}",
        "profile": profile,
        "gemms": shapes(gemms),
        "s3_env": s3.env(),
        "every_gemms": 25,
        "every_seconds": 30.0,
        "min_interval_s": 2.0,
        "poll_s": 0.5,
    }
    fields.update(over)
    return JobSpec(**fields)


def reuse(s3: S3Settings, prefix: str, work: Path, sleep_s: float = 0.005) -> dict[str, Any]:
    """10 profiles x 100 GEMMs, 80 shared by all, tuned one after another with the library."""
    profiles, per, shared = 10, 100, 80
    torch_env = {**ROCM, "FAKE_TORCH_TUNE_SLEEP": str(sleep_s)}
    tuned, recorded, reused = [], [], []
    for p in range(profiles):
        own = list(range(shared + p * (per - shared), shared + (p + 1) * (per - shared)))
        spec = _spec(s3, prefix, f"profile-{p}", [*range(shared), *own], torch_env=torch_env)
        run = Pod(spec, work / f"reuse-{p}").run()
        if run.publish is None or run.publish.returncode != 0:
            raise RuntimeError(f"profile-{p}: {run.tune.stderr[-2000:]}")
        m = run.manifest()
        tuned.append(len(run.tuned))
        recorded.append(m["recorded"])
        reused.append(m["reused"])
    with_reuse, alone = sum(tuned), sum(recorded)
    return {
        "profiles": profiles,
        "gemms_per_profile": per,
        "shared_gemms": shared,
        "gemms_tuned_with_reuse": with_reuse,
        "gemms_tuned_each_alone": alone,
        "ratio": round(with_reuse / alone, 3),
        "goal": "<= 0.30",
        "tuned_per_profile": tuned,
        "reused_per_profile": reused,
    }


def sharding(
    s3: S3Settings, prefix: str, work: Path, gemms: int = 2000, sleep_s: float = 0.02
) -> dict[str, Any]:
    """One profile of `gemms` GEMMs at parallelism 1, 2, 4; each in its own store prefix, so
    that no run reuses another's results."""
    torch_env = {**ROCM, "FAKE_TORCH_TUNE_SLEEP": str(sleep_s)}
    runs: list[dict[str, Any]] = []
    for n in (1, 2, 4):
        spec = _spec(s3, f"{prefix}/p{n}", "big", list(range(gemms)), shards=n, torch_env=torch_env)
        started = time.monotonic()
        pods = run_job(spec, work / f"shard-{n}")
        tuned_wall = time.monotonic() - started
        for r in pods:
            if r.publish is None or r.publish.returncode != 0:
                raise RuntimeError(f"parallelism {n}, shard {r.index}: {r.tune.stderr[-2000:]}")
        merge_s = 0.0
        if n > 1:
            t0 = time.monotonic()
            done = merge(spec, work / f"merge-{n}")
            merge_s = time.monotonic() - t0
            if done.returncode != 0:
                raise RuntimeError(f"merge at parallelism {n}: {done.stderr}")
            sha = json.loads(done.stdout)["sha256"]
        else:
            sha = pods[0].message()["sha256"]
        runs.append(
            {
                "parallelism": n,
                "gemms_tuned_per_shard": [len(r.tuned) for r in pods],
                "tuning_process_s_per_shard (stand-in)": [
                    round(r.manifest()["tuningSeconds"], 2) for r in pods
                ],
                "pods_wall_s (stand-in)": round(tuned_wall, 2),
                "merge_s": round(merge_s, 2),
                "job_wall_s (stand-in)": round(tuned_wall + merge_s, 2),
                "artifact_sha256": sha,
            }
        )
    base = runs[0]["job_wall_s (stand-in)"]
    return {
        "gemms": gemms,
        "per_gemm_sleep_s (stand-in)": sleep_s,
        "runs": runs,
        "same_artifact_at_every_parallelism": len({r["artifact_sha256"] for r in runs}) == 1,
        "wall_ratio_vs_parallelism_1 (stand-in)": {
            str(r["parallelism"]): round(r["job_wall_s (stand-in)"] / base, 3) for r in runs
        },
    }


def resume(
    s3: S3Settings, prefix: str, work: Path, gemms: int = 200, sleep_s: float = 0.1
) -> dict[str, Any]:
    """Killed halfway (tuning process group and sidecar SIGKILLed at once), then retried."""
    every = 25
    spec = _spec(
        s3,
        prefix,
        "resume",
        list(range(gemms)),
        every_gemms=every,
        every_seconds=30.0,
        torch_env={**ROCM, "FAKE_TORCH_TUNE_SLEEP": str(sleep_s)},
    )
    pod = Pod(spec, work / "resume-1")
    pod.start_sync()
    pod.start_tune()
    wait_until(lambda: pod.progress_gemms() >= gemms // 2, 600, "half of the GEMMs tuned")
    pod.kill(sidecar_too=True)
    first = pod.wait_tune()
    pod.stop_sync()
    before = set(tuned_keys(first.stderr))
    retry = Pod(spec, work / "resume-2").run()
    if retry.publish is None or retry.publish.returncode != 0:
        raise RuntimeError(f"retry: {retry.tune.stderr[-2000:]}")
    twice = before & set(retry.tuned)
    m = retry.manifest()
    return {
        "gemms": gemms,
        "checkpoint_every_gemms": every,
        "checkpoint_every_seconds": 30.0,
        "min_upload_interval_s": spec.min_interval_s,
        "gemms_tuned_before_the_kill": len(before),
        "gemms_resumed_by_the_retry": m["resumed"],
        "gemms_tuned_twice": len(twice),
        "bound": (
            f"one checkpoint interval: {every} GEMMs or {spec.every_seconds:.0f} s, uploads at "
            f"most every {spec.min_interval_s:.0f} s, progress looked at every {spec.poll_s} s"
        ),
        "retry_artifact_gemms": m["gemms"],
    }


def run(s3: S3Settings) -> dict[str, Any]:
    prefix = f"bench-library/{uuid.uuid4().hex[:10]}"
    results: dict[str, Any] = {
        "machine": f"{platform.node()} ({os.cpu_count()} CPUs, {platform.machine()})",
        "note": STANDIN_NOTE + "; wall times are labelled (stand-in)",
    }
    with tempfile.TemporaryDirectory(prefix="bench-library-") as tmp:
        work = Path(tmp)
        try:
            results["reuse"] = reuse(s3, f"{prefix}/reuse", work)
            results["sharding"] = sharding(s3, f"{prefix}/sharding", work)
            results["resume"] = resume(s3, f"{prefix}/resume", work)
        finally:
            _delete(s3, prefix + "/")
    return results


def main() -> None:
    print(json.dumps(run(ensure_s3()), indent=2))


if __name__ == "__main__":
    main()
